"""moe_combine: out[t] = sum over k of weights[t, k] * y[positions[t, k]].

y [rows, hidden] holds the expert outputs in dispatch order (out of moe_dispatch, after the
grouped GEMM); positions [tokens, top_k] come from moe_dispatch; weights [tokens, top_k] fp32.
The sum runs in fp32 in the fixed order k = 0..top_k-1, so the result is bitwise identical from
run to run whatever the order of rows inside an expert. A position outside [0, rows) (-1 for an
expert of another rank under tensor parallelism) contributes nothing; under TP > 1 the partial
outputs of the ranks are then summed by an all-reduce (a separate kernel).

Work split as rms_norm's: a row of the output over whole warps, the arch's widest accesses;
decode keeps one token per block with few vectors per thread, prefill several tokens per block.
Below one token per SM, split gives each token's row to several one-warp blocks (grid = tokens x
chunks of the row), so a decode step's few tokens use every SM (see tuning.py); split_wide
does the same with 8 / top_k vectors per thread (fewer blocks): the plan's choice for top-2 and
top-4 from 16 tokens while its launch is small enough for programmatic dependent launch;
split_block, 4-warp blocks with one vector per thread, beyond that (tuning.py), as
split_block_late up to 65536 threads (and at top-4 beyond): PDL with the next kernel launched
after its stores. All run the same device code, so their results are bitwise equal.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...archs import Arch
from ...errors import ConfigError
from ..base import KernelFamily, choice
from ..rowwise import access_bytes, row_align, row_plan, row_split, vector_width
from ..spec import PDL_MAX_THREADS, DTYPES, Dim, Launch, TensorArg, Variant
from . import tuning

__all__ = ["MoeCombineConfig", "MoeCombine"]

# Bytes of a row each thread holds per k (counted in 128-bit units, see rms_norm).
DECODE_BYTES_PER_THREAD = 2 * 16
PREFILL_BYTES_PER_THREAD = 4 * 16
PREFILL_WARPS = 4
# Decode while the grid has at most this many warps per SM (rms_norm's measured rule).
DECODE_WARPS_PER_SM = 32


@dataclass(frozen=True)
class MoeCombineConfig:
    top_k: int
    hidden: int
    dtype: str = choice("bfloat16", "float16", default="bfloat16")


class MoeCombine(KernelFamily):
    name = "moe_combine"
    Config = MoeCombineConfig
    device_module = "rose_aot.kernels.moe_combine.device"
    plan_choices = ("decode", "prefill", "split", "split_wide", "split_block", "split_block_late")

    def validate(self, c: MoeCombineConfig) -> None:
        if not 1 <= c.top_k <= 32:
            raise ConfigError(self.name, "top_k", f"must be 1..32 (got {c.top_k})")
        vec = vector_width(c.dtype, 16)
        if not 0 < c.hidden <= 16384 or c.hidden % vec:
            raise ConfigError(
                self.name, "hidden", f"{c.hidden} is not supported; use a multiple of {vec} up to 16384"
            )

    def _access(self, c: MoeCombineConfig, arch: Arch) -> tuple[int, int]:
        nbytes = access_bytes(arch, c.hidden * DTYPES[c.dtype].bits // 8)
        return nbytes, vector_width(c.dtype, nbytes)

    def args(self, c: MoeCombineConfig, arch: Arch) -> tuple[TensorArg, ...]:
        tokens, rows = Dim("tokens"), Dim("rows")
        nbytes, vec = self._access(c, arch)
        align = row_align(c.dtype, vec, nbytes)
        h, k = c.hidden, c.top_k
        return (
            TensorArg("y", c.dtype, (rows, h), (h, 1), align),
            TensorArg("positions", "int32", (tokens, k), (k, 1), 4),
            TensorArg("weights", "float32", (tokens, k), (k, 1), 4),
            TensorArg("out", c.dtype, (tokens, h), (h, 1), align, "output"),
        )

    def variants(self, c: MoeCombineConfig, arch: Arch) -> tuple[Variant, ...]:
        params = tuple(a.name for a in self.args(c, arch))
        nbytes, vec = self._access(c, arch)
        vectors = c.hidden // vec

        def variant(name, warps, per_thread, rows, chunks=1, pdl=0, **extra):
            constants = {
                "rows_per_block": rows,
                "warps_per_row": warps,
                "vecs_per_thread": per_thread,
                "vec": vec,
                # blocks per token, each owning `32 x warps x per_thread` vectors of the row
                "chunks": chunks,
                "decode_warps_per_sm": DECODE_WARPS_PER_SM,
                **extra,
            }
            return Variant(name, (32 * warps * rows, 1, 1), 0, params, constants, pdl=pdl)

        decode = variant(
            "decode", *row_split(vectors, DECODE_BYTES_PER_THREAD // nbytes), 1, pdl=PDL_MAX_THREADS
        )
        warps, per_thread = row_split(vectors, PREFILL_BYTES_PER_THREAD // nbytes)
        prefill = variant("prefill", warps, per_thread, max(1, PREFILL_WARPS // warps))

        def split_variant(name, warps, per_thread, pdl=PDL_MAX_THREADS, **extra):
            # one token's row over `chunks` blocks of `warps` warps, `per_thread` vectors each
            chunk = 32 * warps * per_thread
            return variant(name, warps, per_thread, 1, chunks=-(-vectors // chunk), pdl=pdl,
                           **extra)

        split = split_variant(
            "split", tuning.SPLIT_WARPS, 1,
            split_max_tokens_per_sm=tuning.SPLIT_MAX_TOKENS_PER_SM,
            split_max_blocks_per_sm=tuning.SPLIT_MAX_BLOCKS_PER_SM,
        )
        split_wide = split_variant(
            "split_wide", tuning.SPLIT_WARPS, max(1, tuning.SPLIT_WIDE_LOADS // c.top_k),
            wide_top_k=tuning.SPLIT_WIDE_TOP_K,
            wide_min_tokens=tuning.SPLIT_WIDE_MIN_TOKENS,
            wide_over_cap_top_k=tuning.SPLIT_WIDE_OVER_CAP_TOP_K,
        )
        # split_block's launches (always above PDL_MAX_THREADS threads in the plan) take
        # split_block_late up to SPLIT_BLOCK_PDL_MAX_THREADS threads: PDL with the next kernel
        # launched after its stores; beyond, split_block (no PDL), but at
        # SPLIT_BLOCK_LATE_BEYOND_TOP_K split_block_late without the attribute (tuning.py).
        # split_block is compiled only where it takes some split launch on the arch's device.
        split_block_late = split_variant("split_block_late", tuning.SPLIT_BLOCK_WARPS, 1,
                                         pdl=tuning.SPLIT_BLOCK_PDL_MAX_THREADS, pdl_late=1,
                                         late_beyond_top_k=tuning.SPLIT_BLOCK_LATE_BEYOND_TOP_K)
        split_tokens = arch.sm_count * tuning.SPLIT_MAX_TOKENS_PER_SM - 1  # the most split takes
        per_token = split_block_late.constants["chunks"] * split_block_late.block[0]
        if (split_tokens * per_token <= tuning.SPLIT_BLOCK_PDL_MAX_THREADS
                or c.top_k == tuning.SPLIT_BLOCK_LATE_BEYOND_TOP_K):
            return (decode, prefill, split, split_wide, split_block_late)
        split_block = split_variant("split_block", tuning.SPLIT_BLOCK_WARPS, 1)
        return (decode, prefill, split, split_wide, split_block, split_block_late)

    def sample_sizes(self, c: MoeCombineConfig) -> list[dict[str, int]]:
        # the base sizes, and 16 / 64 / 131 tokens: split_wide, split_block_late and, at wide
        # rows, split_block beyond its twin's PDL limit on a 132-SM device
        return [{"tokens": t} for t in (1, 7, 16, 64, 131, 1024, 65536)]

    def plan(self, c, variants, sizes, sm_count, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        tokens = sizes["tokens"]
        split = variants["split"].constants
        wide = variants["split_wide"].constants
        choice = force
        if force is None and tokens < sm_count * split["split_max_tokens_per_sm"]:  # tuning.py
            over_cap = tokens * split["chunks"] > sm_count * split["split_max_blocks_per_sm"]
            if c.top_k <= wide["wide_top_k"] and tokens >= wide["wide_min_tokens"]:
                # split_wide while its launch is small enough for programmatic dependent launch
                # (the fewest threads, overlapped with the kernel before), else split_block
                wide_v = variants["split_wide"]
                wide_threads = tokens * wide["chunks"] * wide_v.block[0]
                choice = "split_wide" if wide_threads <= wide_v.pdl else "split_block"
            elif not over_cap:
                choice = "split"
            elif c.top_k <= wide["wide_over_cap_top_k"]:
                choice = "split_wide"
            else:
                # top_k above wide_over_cap_top_k (top-8) over split's block limit:
                # split_block, a quarter of split's blocks (tuning.py: 8-21% faster than decode
                # at every such top-8 point of the sweep)
                choice = "split_block"
        if choice in ("split_block", "split_block_late"):
            # split_block's launch: split_block_late within its PDL limit, at its
            # late_beyond_top_k or where the point has no split_block; split_block beyond it or
            # where the bundle predates the late twin (forced: the one asked for, else the other)
            late = variants.get("split_block_late")
            if late is None:
                choice = "split_block"
            elif force is None:
                threads = tokens * late.constants["chunks"] * late.block[0]
                if (threads <= late.pdl or "split_block" not in variants
                        or c.top_k == late.constants["late_beyond_top_k"]):
                    choice = "split_block_late"
            elif choice not in variants:
                choice = "split_block_late"
        if choice in ("split", "split_wide", "split_block", "split_block_late"):
            chunks = variants[choice].constants["chunks"]
            return (Launch(choice, (tokens * chunks, 1, 1)),) if tokens else ()
        decode = variants["decode"].constants
        use_decode = tokens * decode["warps_per_row"] <= sm_count * decode["decode_warps_per_sm"]
        return row_plan(variants, tokens, force or ("decode" if use_decode else "prefill"))
