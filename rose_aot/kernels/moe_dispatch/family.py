"""moe_dispatch: copy each token to the experts its router chose, grouped by expert.

Inputs: x [tokens, hidden] and topk_ids [tokens, top_k] (int32). Outputs:
- out [rows, hidden]: each local expert's rows contiguous, expert after expert; each expert's
  segment padded to a multiple of `expert_alignment` rows (for grouped GEMMs), padding zeroed;
- expert_offsets [local_experts + 1]: where each expert's segment starts; the last entry is the
  number of rows used;
- positions [tokens, top_k]: the row of `out` holding each (token, k) copy, or -1.
For float8 tokens, x_scales [tokens, hidden / scale_group] (fp32) travel with their rows into
out_scales.

Rule for expert ids: an id outside [0, num_experts), or outside this rank's range
[expert_start, expert_start + local_experts) under tensor parallelism, is skipped: its position
is -1 and nothing is written for it. The order of rows inside an expert is unspecified (atomics);
combine reads rows through `positions`, so its result does not depend on it. (The "small"
variants happen to place them in (token, k) order, like the reference; do not rely on it.)

Launch plans (the seed's deployment 1), chosen by the number of (token, k) pairs:
- small (up to SMALL_MAX_PAIRS pairs): ONE plain launch, no grid barrier, programmatic dependent
  launch. Every block routes the few pairs itself (its warps rank them in (token, k) order with
  warp match instructions, each warp a share, so every block computes the same rows; a prefix
  sum over the experts gives the offsets); block 0 alone writes expert_offsets and positions;
  each warp copies 32 x SMALL_VECS_PER_LANE vectors of one row, so a row is spread over many
  SMs. The first slice of x is loaded before the routing, hiding its latency.
  (moe_dispatch_fp8_quant adds "small_wide", the same with room for SMALL_WIDE_MAX_PAIRS pairs.)
- decode: ONE cooperative launch, grid <= the target's SM count. Block 0 routes with shared-memory
  counters and a prefix sum, then a grid barrier (release/acquire on a self-resetting global
  word), then every block copies rows.
- prefill: a cooperative routing kernel over up to one block per SM (per-block shared-memory
  counters, aggregated in global memory; a grid barrier; each block places its tokens), then a
  copy kernel over many blocks, a warp per row, 128-bit accesses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...archs import Arch
from ...errors import ArgumentError, ConfigError
from ..base import KernelFamily, choice
from ..rowwise import access_bytes, row_align, vector_width
from ..spec import PDL_MAX_THREADS, DTYPES, Dim, Launch, TensorArg, Variant
from .tuning import (
    BLOCK_THREADS,
    DECODE_MAX_PAIRS_PER_SM,
    SMALL_BLOCK_THREADS,
    SMALL_BLOCKS_PER_SM,
    SMALL_MAX_PAIRS,
    SMALL_VECS_PER_LANE,
)

__all__ = ["MoeDispatchConfig", "MoeDispatch"]

_TOKEN_DTYPES = ("bfloat16", "float16", "float8_e4m3fn")


def shared_bytes(local_experts: int, warps: int) -> int:
    """Dynamic shared memory of every variant: per-expert counts, block bases and offsets
    (E + 1 int32 each, 16-byte aligned), then one int32 per warp for the block scan. The device
    code allocates exactly these through SharedMemory, which checks the total."""
    per_array = -(-4 * (local_experts + 1) // 16) * 16
    return 3 * per_array + 4 * warps


def small_shared_bytes(local_experts: int, warps: int, max_pairs: int) -> int:
    """Dynamic shared memory of a small variant: per-expert counts, offsets and padding
    prefix (E + 1 int32 each), the counts of ranking warps 1.. (E + 1 int32 per warp), each
    pair's expert and rank (max_pairs int32 each), then one int32 per warp for the block scan;
    every array 16-byte aligned, allocated in this order."""
    per_expert = -(-4 * (local_experts + 1) // 16) * 16
    more = -(-4 * (local_experts + 1) * (warps - 1) // 16) * 16
    per_pair = -(-4 * max_pairs // 16) * 16
    return 3 * per_expert + more + 2 * per_pair + 4 * warps


@dataclass(frozen=True)
class MoeDispatchConfig:
    num_experts: int
    top_k: int
    hidden: int
    dtype: str = choice(*_TOKEN_DTYPES, default="bfloat16")
    expert_alignment: int = choice(1, 16, 32, 64, 128, 256, default=1)
    expert_start: int = 0  # first expert of this rank (tensor parallelism)
    local_experts: int = 0  # experts of this rank; 0 = all from expert_start
    scale_group: int = 0  # float8 only: elements per fp32 scale of x_scales


class MoeDispatch(KernelFamily):
    name = "moe_dispatch"
    Config = MoeDispatchConfig
    device_module = "rose_aot.kernels.moe_dispatch.device"
    size_names = ("tokens", "rows")
    plan_choices = ("small", "decode", "prefill")
    # (name, pairs it takes at most) of the small variants, in plan order (tuning.py)
    small_variants = (("small", SMALL_MAX_PAIRS),)

    def make_config(self, **values):
        if values.get("dtype") == "float8_e4m3fn" and hasattr(self.Config, "scale_group"):
            values.setdefault("scale_group", 128)
        config = super().make_config(**values)
        if config.local_experts == 0:  # canonical key: the range is always explicit
            config = dataclasses.replace(
                config, local_experts=config.num_experts - config.expert_start
            )
        return config

    def validate(self, c: MoeDispatchConfig) -> None:
        self.validate_routing(c)
        if c.dtype == "float8_e4m3fn":
            if c.scale_group <= 0 or c.hidden % c.scale_group or c.scale_group % 4:
                raise ConfigError(
                    self.name, "scale_group", "float8 needs a scale_group dividing hidden (e.g. 128)"
                )
        elif c.scale_group != 0:
            raise ConfigError(self.name, "scale_group", "only float8 tokens carry scales; use 0")

    def validate_routing(self, c) -> None:
        """Experts, top-k, hidden and the expert range (shared with moe_dispatch_fp8_quant)."""
        if not 1 <= c.num_experts <= 1024:
            raise ConfigError(self.name, "num_experts", f"must be 1..1024 (got {c.num_experts})")
        if not 1 <= c.top_k <= min(32, c.num_experts):
            raise ConfigError(self.name, "top_k", f"must be 1..min(32, num_experts) (got {c.top_k})")
        vec = vector_width(c.dtype, 16)
        if not 0 < c.hidden <= 16384 or c.hidden % vec:
            raise ConfigError(
                self.name, "hidden", f"{c.hidden} is not supported; use a multiple of {vec} up to 16384"
            )
        if not 0 <= c.expert_start < c.num_experts:
            raise ConfigError(self.name, "expert_start", f"must be in [0, {c.num_experts})")
        if c.local_experts and not c.expert_start + c.local_experts <= c.num_experts:
            raise ConfigError(
                self.name,
                "local_experts",
                f"expert_start + local_experts must be <= num_experts ({c.num_experts})",
            )

    def local(self, c: MoeDispatchConfig) -> int:
        return c.local_experts or c.num_experts - c.expert_start

    def max_rows(self, c: MoeDispatchConfig, tokens: int) -> int:
        """Rows `out` needs at most: every copy plus the padding of every local expert."""
        return tokens * c.top_k + self.local(c) * (c.expert_alignment - 1)

    def _access(self, c: MoeDispatchConfig, arch: Arch) -> tuple[int, int]:
        nbytes = access_bytes(arch, c.hidden * DTYPES[c.dtype].bits // 8)
        return nbytes, vector_width(c.dtype, nbytes)

    def args(self, c: MoeDispatchConfig, arch: Arch) -> tuple[TensorArg, ...]:
        tokens, rows = Dim("tokens"), Dim("rows")
        nbytes, vec = self._access(c, arch)
        align = row_align(c.dtype, vec, nbytes)
        h, k = c.hidden, c.top_k
        x_stride = Dim("x_row_stride", width=64, divisibility=vec)
        args = [
            TensorArg("x", c.dtype, (tokens, h), (x_stride, 1), align),
            TensorArg("topk_ids", "int32", (tokens, k), (k, 1), 4),
        ]
        if c.scale_group:
            g = h // c.scale_group
            args.append(TensorArg("x_scales", "float32", (tokens, g), (g, 1), 16, layout="row_major"))
        args.append(TensorArg("out", c.dtype, (rows, h), (h, 1), align, "output"))
        if c.scale_group:
            g = h // c.scale_group
            args.append(
                TensorArg("out_scales", "float32", (rows, g), (g, 1), 16, "output", "row_major")
            )
        args += [
            TensorArg("expert_offsets", "int32", (self.local(c) + 1,), (1,), 4, "output"),
            TensorArg("positions", "int32", (tokens, k), (k, 1), 4, "output"),
        ]
        return tuple(args)

    def workspace(self, c: MoeDispatchConfig, arch: Arch) -> tuple[TensorArg, ...]:
        e = self.local(c)
        return (
            # [0]: grid barrier word (phase bit + arrivals); the rest pads to 16 bytes.
            TensorArg("barrier", "int32", (4,), (1,), 16, "workspace"),
            # Per-expert row counts, summed across blocks by the prefill router; zero between
            # launches (the copy kernel clears them).
            TensorArg("counts", "int32", (e,), (1,), 4, "workspace"),
            # First padding row of each expert, for the copy phase.
            TensorArg("pad_start", "int32", (e,), (1,), 4, "workspace"),
        )

    def variants(self, c: MoeDispatchConfig, arch: Arch) -> tuple[Variant, ...]:
        params = tuple(a.name for a in self.kernel_args(c, arch))
        block = (BLOCK_THREADS, 1, 1)
        smem = shared_bytes(self.local(c), BLOCK_THREADS // 32)
        _, vec = self._access(c, arch)
        common = {"vec": vec, "decode_max_pairs_per_sm": DECODE_MAX_PAIRS_PER_SM}
        # Pairs per thread the decode router keeps in registers: every token count the plan
        # sends to decode on this arch; larger (forced) launches take the general loop.
        reg_pairs = -(-arch.sm_count * DECODE_MAX_PAIRS_PER_SM // BLOCK_THREADS)
        small_threads = SMALL_BLOCK_THREADS
        small = tuple(
            Variant(
                name, (small_threads, 1, 1),
                small_shared_bytes(self.local(c), small_threads // 32, max_pairs), params,
                {"vec": vec, "phase": "small", "max_pairs": max_pairs,
                 "vecs_per_lane": SMALL_VECS_PER_LANE, "blocks_per_sm": SMALL_BLOCKS_PER_SM},
                pdl=PDL_MAX_THREADS,
            )
            for name, max_pairs in self.small_variants
        )
        return (
            *small,
            Variant("decode", block, smem, params,
                    {**common, "phase": "decode", "register_pairs": reg_pairs}, cooperative=True,
                    pdl=PDL_MAX_THREADS),
            Variant("prefill_route", block, smem, params, {**common, "phase": "route"},
                    cooperative=True),
            Variant("prefill_copy", block, smem, params, {**common, "phase": "copy"}),
        )

    def op_suffix(self, c: MoeDispatchConfig) -> str:
        return "_scaled" if c.scale_group else ""

    def sample_sizes(self, c: MoeDispatchConfig) -> list[dict[str, int]]:
        beyond = [pairs // c.top_k + 1 for _, pairs in self.small_variants]
        return [
            {"tokens": t, "rows": self.max_rows(c, t)}
            for t in sorted({1, 7, *beyond, 1024, 65536})
        ]

    def plan(self, c, variants, sizes, sm_count, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        tokens, rows = sizes["tokens"], sizes["rows"]
        if tokens == 0:
            return ()
        need = self.max_rows(c, tokens)
        if rows < need:
            raise ArgumentError(
                f"{self.name}: out has {rows} rows but {tokens} tokens x top_k {c.top_k} with "
                f"{self.local(c)} experts padded to {c.expert_alignment} need up to {need}; "
                f"allocate out with max_rows(config, tokens) rows"
            )
        pairs = tokens * c.top_k
        # The first small variant that takes the pairs. A small variant forced beyond its
        # capacity (its shared arrays) gets the size's own plan, and one forced below the
        # capacity of those before it runs itself.
        smalls = [name for name, _ in self.small_variants]
        for i, name in enumerate(smalls):
            v = variants[name]
            if pairs <= v.constants["max_pairs"] and force in (None, *smalls[: i + 1]):
                return (Launch(name, (self._small_grid(c, v, tokens, sm_count), 1, 1)),)
        decode_v = variants["decode"]
        threads = decode_v.threads
        warps = threads // 32
        work = pairs + self.local(c)  # a warp per (token, k) copy plus one per expert's padding
        decode = pairs <= sm_count * decode_v.constants["decode_max_pairs_per_sm"]
        if force in ("decode", "prefill"):
            decode = force == "decode"
        if decode:
            # Cooperative: every block resident, so at most one block per SM.
            return (Launch("decode", (max(1, min(sm_count, -(-work // warps))), 1, 1)),)
        route_grid = max(1, min(sm_count, -(-pairs // variants["prefill_route"].threads)))
        copy_warps = variants["prefill_copy"].threads // 32
        return (
            Launch("prefill_route", (route_grid, 1, 1)),
            Launch("prefill_copy", (-(-work // copy_warps), 1, 1)),
        )

    def _small_grid(self, c: MoeDispatchConfig, v, tokens: int, sm_count: int) -> int:
        """One warp per unit (32 x vecs_per_lane vectors of one copy, or with `token_units` of
        one token row for all its copies), capped per SM; padding rows (known only on the
        device) go to the same warps in a grid-stride loop."""
        k = v.constants
        units_per_row = -(-(c.hidden // k["vec"]) // (32 * k["vecs_per_lane"]))
        rows = tokens if k.get("token_units") else tokens * c.top_k
        warps = v.threads // 32
        blocks = -(-rows * units_per_row // warps)
        return max(1, min(blocks, sm_count * k["blocks_per_sm"]))
