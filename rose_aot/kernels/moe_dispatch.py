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
combine reads rows through `positions`, so its result does not depend on it.

Launch plans (the seed's deployment 1):
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

from ..archs import Arch
from ..errors import ArgumentError, ConfigError
from .base import KernelFamily, choice
from .spec import DTYPES, Dim, Launch, TensorArg, Variant

__all__ = ["MoeDispatchConfig", "MoeDispatch"]

_TOKEN_DTYPES = ("bfloat16", "float16", "float8_e4m3fn")
BLOCK_THREADS = 256
# Decode (one cooperative launch) while there are at most this many (token, k) pairs per SM of
# the target. Measured on the H200, 128 experts, top-8, hidden 2048
# (benchmarks/results/moe-h200.md): decode 6.35 vs prefill 7.23 µs at 128 tokens (1024 pairs),
# 8.61 vs 8.23 µs at 256 tokens (2048 pairs); 8 x 132 SMs = 1056 pairs puts the switch between.
DECODE_MAX_PAIRS_PER_SM = 8


def shared_bytes(local_experts: int) -> int:
    """Dynamic shared memory of every variant: counts, block bases, offsets, warp scratch."""
    per_array = -(-4 * (local_experts + 1) // 16) * 16
    return 3 * per_array + 64


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
    device_module = "rose_aot.kernels.moe_dispatch_device"
    size_names = ("tokens", "rows")

    def make_config(self, **values):
        if values.get("dtype") == "float8_e4m3fn":
            values.setdefault("scale_group", 128)
        config = super().make_config(**values)
        if config.local_experts == 0:  # canonical key: the range is always explicit
            config = dataclasses.replace(
                config, local_experts=config.num_experts - config.expert_start
            )
        return config

    def validate(self, c: MoeDispatchConfig) -> None:
        if not 1 <= c.num_experts <= 1024:
            raise ConfigError(self.name, "num_experts", f"must be 1..1024 (got {c.num_experts})")
        if not 1 <= c.top_k <= min(32, c.num_experts):
            raise ConfigError(self.name, "top_k", f"must be 1..min(32, num_experts) (got {c.top_k})")
        vec = 16 // DTYPES[c.dtype][0]
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
        if c.dtype == "float8_e4m3fn":
            if c.scale_group <= 0 or c.hidden % c.scale_group or c.scale_group % 4:
                raise ConfigError(
                    self.name, "scale_group", "float8 needs a scale_group dividing hidden (e.g. 128)"
                )
        elif c.scale_group != 0:
            raise ConfigError(self.name, "scale_group", "only float8 tokens carry scales; use 0")

    def local(self, c: MoeDispatchConfig) -> int:
        return c.local_experts or c.num_experts - c.expert_start

    def max_rows(self, c: MoeDispatchConfig, tokens: int) -> int:
        """Rows `out` needs at most: every copy plus the padding of every local expert."""
        return tokens * c.top_k + self.local(c) * (c.expert_alignment - 1)

    def args(self, c: MoeDispatchConfig) -> tuple[TensorArg, ...]:
        tokens, rows = Dim("tokens"), Dim("rows")
        vec = 16 // DTYPES[c.dtype][0]
        h, k = c.hidden, c.top_k
        x_stride = Dim("x_row_stride", width=64, divisibility=vec)
        args = [
            TensorArg("x", c.dtype, (tokens, h), (x_stride, 1)),
            TensorArg("topk_ids", "int32", (tokens, k), (k, 1), 4),
        ]
        if c.scale_group:
            g = h // c.scale_group
            args.append(TensorArg("x_scales", "float32", (tokens, g), (g, 1), 16))
        args.append(TensorArg("out", c.dtype, (rows, h), (h, 1), 16, True))
        if c.scale_group:
            g = h // c.scale_group
            args.append(TensorArg("out_scales", "float32", (rows, g), (g, 1), 16, True))
        args += [
            TensorArg("expert_offsets", "int32", (self.local(c) + 1,), (1,), 4, True),
            TensorArg("positions", "int32", (tokens, k), (k, 1), 4, True),
        ]
        return tuple(args)

    def workspace(self, c: MoeDispatchConfig) -> tuple[TensorArg, ...]:
        e = self.local(c)
        return (
            # [0]: grid barrier word (phase bit + arrivals); the rest pads to 16 bytes.
            TensorArg("barrier", "int32", (4,), (1,), 16, True),
            # Per-expert row counts, summed across blocks by the prefill router; zero between
            # launches (the copy kernel clears them).
            TensorArg("counts", "int32", (e,), (1,), 4, True),
            # First padding row of each expert, for the copy phase.
            TensorArg("pad_start", "int32", (e,), (1,), 4, True),
        )

    def variants(self, c: MoeDispatchConfig, arch: Arch) -> tuple[Variant, ...]:
        params = tuple(a.name for a in self.kernel_args(c))
        block = (BLOCK_THREADS, 1, 1)
        smem = shared_bytes(self.local(c))
        return (
            Variant("decode", block, smem, params, {"phase": "decode"}),
            Variant("prefill_route", block, smem, params, {"phase": "route"}),
            Variant("prefill_copy", block, smem, params, {"phase": "copy"}),
        )

    def plan(self, c, arch, sizes, force=None) -> tuple[Launch, ...]:
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
        warps = BLOCK_THREADS // 32
        work = pairs + self.local(c)  # a warp per (token, k) copy plus one per expert's padding
        block = (BLOCK_THREADS, 1, 1)
        decode = pairs <= arch.sm_count * DECODE_MAX_PAIRS_PER_SM
        if force is not None:
            decode = force == "decode"
        smem = shared_bytes(self.local(c))
        if decode:
            grid = max(1, min(arch.sm_count, -(-work // warps)))
            return (Launch("decode", (grid, 1, 1), block, smem, cooperative=True),)
        route_grid = max(1, min(arch.sm_count, -(-pairs // BLOCK_THREADS)))
        return (
            Launch("prefill_route", (route_grid, 1, 1), block, smem, cooperative=True),
            Launch("prefill_copy", (-(-work // warps), 1, 1), block, smem),
        )

    def reference(self, c: MoeDispatchConfig, *tensors) -> None:
        """Writes out/out_scales/expert_offsets/positions with rows inside each expert in
        (token, k) order. The kernel's order inside an expert may differ: compare through
        `positions` (tests do)."""
        import torch

        if c.scale_group:
            x, ids, xs, out, out_s, offsets, positions = tensors
        else:
            x, ids, out, offsets, positions = tensors
            xs = out_s = None
        e_local = self.local(c)
        k = ids.shape[1]
        local = (ids.long() - c.expert_start).reshape(-1)
        flat = ids.reshape(-1)
        valid = (flat >= 0) & (flat < c.num_experts) & (local >= 0) & (local < e_local)
        pairs = torch.nonzero(valid).squeeze(1)  # valid (token, k) pairs in (token, k) order
        experts = local[pairs]
        counts = torch.bincount(experts, minlength=e_local)
        padded = (counts + c.expert_alignment - 1) // c.expert_alignment * c.expert_alignment
        starts = torch.zeros(e_local + 1, dtype=torch.long)
        starts[1:] = torch.cumsum(padded, 0)
        offsets.copy_(starts.to(offsets.dtype))
        order = torch.argsort(experts, stable=True)
        pairs, experts = pairs[order], experts[order]
        first = torch.cumsum(counts, 0) - counts  # first sorted index of each expert
        rows = starts[experts] + torch.arange(pairs.numel()) - first[experts]
        flat_positions = torch.full((flat.numel(),), -1, dtype=torch.long)
        flat_positions[pairs] = rows
        positions.copy_(flat_positions.view(positions.shape).to(positions.dtype))
        out[rows] = x[pairs // k]
        if xs is not None:
            out_s[rows] = xs[pairs // k]
        for e in range(e_local):
            out[int(starts[e]) + int(counts[e]) : int(starts[e + 1])] = 0
            if out_s is not None:
                out_s[int(starts[e]) + int(counts[e]) : int(starts[e + 1])] = 0
