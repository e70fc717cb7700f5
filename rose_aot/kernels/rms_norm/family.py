"""rms_norm: y = (w + weight_offset) * x * rsqrt(mean(x^2) + eps) over the hidden dimension.

With ``fused_residual`` the kernel first forms r = x + residual (rounded to the input dtype),
writes r back into ``residual`` and normalizes r: the usual pre-norm "add & norm" of a decoder
layer in one pass over memory.

Work split: a row is handled by a group of whole warps (rows of 1-2 warps share a 4-warp block),
each thread holding a few vectors of the row in registers (one pass over DRAM; statistics in fp32).
The sum of squares is a warp butterfly, then, for rows spread over several warps, one exchange
through shared memory. Vectors are the arch's widest access the row allows (128-bit on sm_90a,
256-bit on sm_100a). The prefill variant's loads carry torch.compile's cache policy (L1 and L2
evict_last on a first read, evict_first on its second read of x, from L1): 3-4% faster at 32768
tokens on the H200. Rows of 8-12 KiB and 14-16 KiB (hidden 4096-6144 and 7168-8192 in bf16) have a
third variant between the two, `mid`: for the plain 8-12 KiB rows, the decode block with the
weight loaded before x and x * w formed while the row's sum is exchanged; for 14-16 KiB rows the
decode block widened to 16 warps and held to 32 registers, so that 4 rows fit an SM where the
decode variant fits 3 (the plain rows' also with the weight loaded first; tuning.py). Loaded after
x, the weight's load waits for x's (ptxas issues it once x has arrived); some variants load it
first (tuning.py, WEIGHT_FIRST). Decode launches use programmatic dependent launch: up to 2048
threads the next kernel launches at the top of this one; larger ones, to 65536 threads, launch it
after their stores (`decode_late`; rows of 13 KiB and more do so at every size in their decode
variant: tuning.py, DECODE_LATE_PDL_MAX_THREADS).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...archs import Arch
from ...errors import ConfigError
from ..base import KernelFamily, choice
from ..rowwise import access_bytes, row_align, row_plan, row_split, vector_width
from ..spec import PDL_MAX_THREADS, DTYPES, Dim, TensorArg, Variant
from . import tuning

__all__ = ["RmsNormConfig", "RmsNorm"]

_FLOATS = ("bfloat16", "float16", "float32")
MAX_HIDDEN = 16384
# Vectors per thread, counted in 128-bit units (a 256-bit arch holds the same bytes per
# thread). A row is spread over many threads so that the per-thread dependency chain (square,
# sum, scale) is short and the block's registers few: at one token the kernel is pure latency,
# and at 32768 tokens 2 vectors per thread (16 warps for hidden 8192) with the cache hints and
# the second read of x were fastest on the H200; 4 and 8 per thread (the earlier prefill
# shape) were up to 4% slower at hidden 6144-8192
# (benchmarks/results/norm-cache-hints-experiment-h200.md). So every variant has this
# shape; they differ in PDL (decode), in cache hints and reading x twice (prefill), and in
# warps and registers per row (mid).
DECODE_BYTES_PER_THREAD = 2 * 16
PREFILL_BYTES_PER_THREAD = 2 * 16


@dataclass(frozen=True)
class RmsNormConfig:
    hidden: int
    dtype: str = choice(*_FLOATS, default="bfloat16", doc="input (and residual) dtype")
    out_dtype: str = choice(*_FLOATS, default="bfloat16", doc="output dtype (default: dtype)")
    weight_dtype: str = choice(*_FLOATS, default="bfloat16", doc="weight dtype (default: dtype)")
    eps: float = 1e-6
    weight_offset: float = 0.0  # 1.0 for Gemma-style (1 + w) weights
    fused_residual: bool = False
    prefill_warps: int = choice(
        0, 4, 8, 16, 32, default=0, doc="warps per prefill block; 0 = measured default (tuning.py)"
    )


class RmsNorm(KernelFamily):
    name = "rms_norm"
    Config = RmsNormConfig
    device_module = "rose_aot.kernels.rms_norm.device"
    plan_choices = ("decode", "decode_late", "mid", "prefill")
    shape_fields = ("hidden",)

    def make_config(self, **values):
        dtype = values.get("dtype", "bfloat16")
        values.setdefault("out_dtype", dtype)
        values.setdefault("weight_dtype", dtype)
        return super().make_config(**values)

    def validate(self, c: RmsNormConfig) -> None:
        vec = max(vector_width(c.dtype, 16), vector_width(c.out_dtype, 16))
        if not 0 < c.hidden <= MAX_HIDDEN or c.hidden % vec:
            raise ConfigError(
                self.name,
                "hidden",
                f"{c.hidden} is not supported; use a multiple of {vec} up to {MAX_HIDDEN}",
            )
        if c.eps <= 0:
            raise ConfigError(self.name, "eps", f"must be > 0 (got {c.eps})")
        if c.fused_residual and c.out_dtype != c.dtype:
            raise ConfigError(
                self.name, "out_dtype", "fused_residual needs out_dtype equal to dtype"
            )

    def _access(self, c: RmsNormConfig, arch: Arch) -> tuple[int, int]:
        """(bytes per access, elements per vector), the vector counted in the input dtype."""
        nbytes = access_bytes(
            arch, *(c.hidden * DTYPES[d].bits // 8 for d in (c.dtype, c.out_dtype, c.weight_dtype))
        )
        return nbytes, vector_width(c.dtype, nbytes)

    def args(self, c: RmsNormConfig, arch: Arch) -> tuple[TensorArg, ...]:
        tokens = Dim("tokens")
        nbytes, vec = self._access(c, arch)

        def rows(name, dtype, role):
            # Rows may be strided (e.g. a slice of a wider buffer); elements are contiguous.
            stride = Dim(f"{name}_row_stride", width=64, divisibility=vec)
            align = row_align(dtype, vec, nbytes)
            return TensorArg(name, dtype, (tokens, c.hidden), (stride, 1), align, role)

        weight = TensorArg(
            "weight", c.weight_dtype, (c.hidden,), (1,), row_align(c.weight_dtype, vec, nbytes)
        )
        if c.fused_residual:
            return (
                rows("x", c.dtype, "input"),
                rows("residual", c.dtype, "inout"),
                weight,
                rows("out", c.out_dtype, "output"),
            )
        return (rows("x", c.dtype, "input"), weight, rows("out", c.out_dtype, "output"))

    def variants(self, c: RmsNormConfig, arch: Arch) -> tuple[Variant, ...]:
        params = tuple(a.name for a in self.args(c, arch))
        nbytes, vec = self._access(c, arch)
        vectors = c.hidden // vec

        def variant(name, warps, per_thread, rows, pdl=0, reload_x=0, cache_hints=0,
                    min_blocks=0, weight_first=0, scale_before_sum=0, pdl_late=0, **rule):
            threads = 32 * warps * rows
            smem = 4 * warps * rows if warps > 1 else 0  # one fp32 partial sum per warp
            constants = {
                "rows_per_block": rows,
                "warps_per_row": warps,
                "vecs_per_thread": per_thread,
                "vec": vec,
                "decode_row_warps": tuning.DECODE_ROW_WARPS,
                "decode_warps_per_sm": tuning.DECODE_WARPS_PER_SM,
                "prefill_min_bytes": prefill_min_bytes,
                "reload_x": reload_x,
                "cache_hints": cache_hints,
                "min_blocks": min_blocks,  # > 0: compiled for that many blocks per SM
                # the weight's load issued before x's, and x * w formed before the row's sum
                # (tuning.py: WEIGHT_FIRST)
                "weight_first": weight_first,
                "scale_before_sum": scale_before_sum,
                **rule,  # the plan's own thresholds, recorded with the variant they choose
            }
            if pdl_late:
                # the next kernel launched after this one's stores (device_utils.pdl_epilogue)
                constants["pdl_late"] = 1
            return Variant(name, (threads, 1, 1), smem, params, constants, pdl=pdl)

        # Decode launches are latency-bound: programmatic dependent launch overlaps each one's
        # launch with its predecessor's tail (benchmarks/bench_pdl.py: a 20-kernel one-token
        # chain 44.8 vs 50.0 µs).
        warps, per_thread = row_split(vectors, DECODE_BYTES_PER_THREAD // nbytes)
        # Rows of 1-2 warps share a block of DECODE_BLOCK_WARPS (tuning.py: grids of one- and
        # two-warp blocks are bound by the rate the SMs take blocks in).
        rows = max(1, tuning.DECODE_BLOCK_WARPS // warps)
        row_bytes = c.hidden * DTYPES[c.dtype].bits // 8
        # Plain rows of 3-8 KiB leave decode at the grid rule's end (tuning.py,
        # PLAIN_GRID_RULE_ROW_BYTES); the others at 32 MiB moved per call.
        grid_rule_only = (not c.fused_residual
                          and tuning.PLAIN_GRID_RULE_ROW_BYTES[0] <= row_bytes
                          < tuning.PLAIN_GRID_RULE_ROW_BYTES[1])
        prefill_min_bytes = 0 if grid_rule_only else tuning.PREFILL_MIN_BYTES
        # The weight's load issued with x's where it was measured to pay (tuning.py,
        # WEIGHT_FIRST): decode of rows of one warp, of at least WEIGHT_FIRST_ROW_BYTES.
        long_row = row_bytes >= tuning.WEIGHT_FIRST_ROW_BYTES
        # Launches beyond PDL_MAX_THREADS threads use PDL with the next kernel launched after
        # the stores (tuning.py, DECODE_LATE_PDL_MAX_THREADS; rows of 1-3 warps too, since
        # 2026-12-02): rows of at least LATE_TRIGGER_ROW_BYTES do so at every size, in one
        # cubin; narrower rows keep the trigger at the top for the small launches and add
        # `decode_late`.
        late_only = row_bytes >= tuning.LATE_TRIGGER_ROW_BYTES
        decode = variant("decode", warps, per_thread, rows,
                         pdl=tuning.DECODE_LATE_PDL_MAX_THREADS if late_only else PDL_MAX_THREADS,
                         pdl_late=int(late_only),
                         weight_first=int(warps == 1 and long_row))
        decode_late = None
        if not late_only:
            decode_late = variant("decode_late", warps, per_thread, rows,
                                  pdl=tuning.DECODE_LATE_PDL_MAX_THREADS, pdl_late=1,
                                  weight_first=int(warps == 1 and long_row))
        low, high = tuning.MID_ROW_BYTES
        mid = None
        if low <= row_bytes <= high:
            # Between decode and prefill for rows of 14-16 KiB (tuning.py): 16 warps, at most
            # 32 registers so that 4 blocks fit an SM, no PDL (its launches exceed
            # PDL_MAX_THREADS), no hints, x kept in registers.
            mid = variant("mid", tuning.MID_WARPS, -(-vectors // (32 * tuning.MID_WARPS)), 1,
                          min_blocks=tuning.MID_MIN_BLOCKS, mid_max_bytes=tuning.MID_MAX_BYTES,
                          weight_first=int(not c.fused_residual),
                          scale_before_sum=int(not c.fused_residual))
        elif (not c.fused_residual
              and tuning.MID_BLOCK_ROW_BYTES[0] <= row_bytes <= tuning.MID_BLOCK_ROW_BYTES[1]):
            # Plain rows of 8-12 KiB (tuning.py): decode's block with the weight loaded first
            # and x * w formed before the row's sum, without PDL (its launches exceed
            # PDL_MAX_THREADS).
            mid = variant("mid", warps, per_thread, rows, mid_max_bytes=tuning.MID_MAX_BYTES,
                          weight_first=1, scale_before_sum=1)
        warps, per_thread = row_split(vectors, PREFILL_BYTES_PER_THREAD // nbytes)
        block_warps = tuning.prefill_warps(arch.name, c.prefill_warps)
        # Prefill loads with cache hints and reads x a second time after the row's sum (from
        # L1) rather than keeping it in registers; not with the fused residual, whose sum it
        # would have to re-read. Decode loads without hints: the hints (and the createpolicy
        # each needs) cost the latency-bound decode launches 1-5% at 1-128 tokens
        # (benchmarks/results/norm-cache-hints-experiment-h200.md).
        prefill = variant(
            "prefill", warps, per_thread, max(1, block_warps // warps),
            reload_x=int(not c.fused_residual), cache_hints=1,
            weight_first=int(long_row),  # tuning.py, WEIGHT_FIRST
        )
        return tuple(v for v in (decode, decode_late, mid, prefill) if v is not None)

    def op_suffix(self, c: RmsNormConfig) -> str:
        return "_residual" if c.fused_residual else ""

    def sample_sizes(self, c: RmsNormConfig) -> list[dict[str, int]]:
        # the base sizes, and 64 / 256 tokens: decode_late (a launch of 8192 threads or more),
        # mid (past the grid rule of the 8-12 KiB rows)
        return [{"tokens": t} for t in (1, 7, 64, 256, 1024, 65536)]

    def plan(self, c, variants, sizes, sm_count, force=None):
        self.check_force(force)
        tokens = sizes["tokens"]
        decode = variants["decode"].constants
        row_warps = decode["warps_per_row"]
        # Where the prefill block is the decode block (the same rows), it differs by its cache
        # hints, which pay only on very large calls.
        hinted_decode = variants["prefill"].constants["rows_per_block"] == decode["rows_per_block"]
        moved = tokens * self.bytes_per_token(c)
        grid_decode = tokens * row_warps <= sm_count * decode["decode_warps_per_sm"]
        use_decode = (  # measured rule, see tuning.py
            (row_warps <= decode["decode_row_warps"]
             and not (hinted_decode and moved >= decode["prefill_min_bytes"]))
            or grid_decode
        )
        if force is not None:
            # `mid` and `decode_late` exist for some rows only (tuning.py); forced elsewhere
            # each is the decode variant, the variant it would replace
            name = force if force in variants else "decode"
        elif ("mid" in variants and not grid_decode
              and moved < variants["mid"].constants["mid_max_bytes"]):
            name = "mid"
        elif use_decode:
            name = "decode"
            late = variants.get("decode_late")
            if late is not None:
                # past the early trigger's limit, the late one's (tuning.py)
                threads = -(-tokens // decode["rows_per_block"]) * variants["decode"].block[0]
                if variants["decode"].pdl < threads <= late.pdl:
                    name = "decode_late"
        else:
            name = "prefill"
        return row_plan(variants, tokens, name)

    @staticmethod
    def bytes_per_token(c: RmsNormConfig) -> int:
        """Bytes a call moves per token: the row read and the output written, and with the
        fused residual the residual read and written too (the weight is left out)."""
        rows_in_dtype = 3 if c.fused_residual else 1  # x (residual read, residual sum written)
        bits = DTYPES[c.dtype].bits * rows_in_dtype + DTYPES[c.out_dtype].bits
        return c.hidden * bits // 8
