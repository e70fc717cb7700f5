"""moe_combine: out[t] = sum over k of weights[t, k] * y[positions[t, k]].

y [rows, hidden] holds the expert outputs in dispatch order (out of moe_dispatch, after the
grouped GEMM); positions [tokens, top_k] come from moe_dispatch; weights [tokens, top_k] fp32.
The sum runs in fp32 in the fixed order k = 0..top_k-1, so the result is bitwise identical from
run to run whatever the order of rows inside an expert. A position outside [0, rows) (-1 for an
expert of another rank under tensor parallelism) contributes nothing; under TP > 1 the partial
outputs of the ranks are then summed by an all-reduce (a separate kernel).

Work split as rms_norm's: a row of the output over whole warps, 128-bit accesses; decode keeps
one token per block with few vectors per thread, prefill several tokens per block.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..archs import Arch
from ..errors import ConfigError
from .base import KernelFamily, choice
from .rms_norm import row_plan, row_split
from .spec import DTYPES, Dim, Launch, TensorArg, Variant
from .tuning import RMS_NORM_DECODE_WARPS_PER_SM

__all__ = ["MoeCombineConfig", "MoeCombine"]

DECODE_VECS_PER_THREAD = 2
PREFILL_VECS_PER_THREAD = 4
PREFILL_WARPS = 4


@dataclass(frozen=True)
class MoeCombineConfig:
    top_k: int
    hidden: int
    dtype: str = choice("bfloat16", "float16", default="bfloat16")


class MoeCombine(KernelFamily):
    name = "moe_combine"
    Config = MoeCombineConfig
    device_module = "rose_aot.kernels.moe_combine_device"

    def validate(self, c: MoeCombineConfig) -> None:
        if not 1 <= c.top_k <= 32:
            raise ConfigError(self.name, "top_k", f"must be 1..32 (got {c.top_k})")
        vec = 16 // DTYPES[c.dtype][0]
        if not 0 < c.hidden <= 16384 or c.hidden % vec:
            raise ConfigError(
                self.name, "hidden", f"{c.hidden} is not supported; use a multiple of {vec} up to 16384"
            )

    def args(self, c: MoeCombineConfig) -> tuple[TensorArg, ...]:
        tokens, rows = Dim("tokens"), Dim("rows")
        h, k = c.hidden, c.top_k
        return (
            TensorArg("y", c.dtype, (rows, h), (h, 1)),
            TensorArg("positions", "int32", (tokens, k), (k, 1), 4),
            TensorArg("weights", "float32", (tokens, k), (k, 1), 4),
            TensorArg("out", c.dtype, (tokens, h), (h, 1), 16, True),
        )

    def variants(self, c: MoeCombineConfig, arch: Arch) -> tuple[Variant, ...]:
        params = tuple(a.name for a in self.args(c))

        def variant(name, warps, per_thread, rows):
            return Variant(
                name,
                (32 * warps * rows, 1, 1),
                0,
                params,
                {"rows_per_block": rows, "warps_per_row": warps, "vecs_per_thread": per_thread},
            )

        decode = variant("decode", *row_split(c.hidden, c.dtype, DECODE_VECS_PER_THREAD), 1)
        warps, per_thread = row_split(c.hidden, c.dtype, PREFILL_VECS_PER_THREAD)
        prefill = variant("prefill", warps, per_thread, max(1, PREFILL_WARPS // warps))
        return (decode, prefill)

    def plan(self, c, arch, sizes, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        decode, prefill = self.variants(c, arch)
        tokens = sizes["tokens"]
        use_decode = (
            tokens * decode.constants["warps_per_row"] <= arch.sm_count * RMS_NORM_DECODE_WARPS_PER_SM
        )
        return row_plan(decode, prefill, tokens, force, use_decode)

    def reference(self, c: MoeCombineConfig, y, positions, weights, out) -> None:
        import torch

        acc = torch.zeros(out.shape, dtype=torch.float64)
        rows = y.shape[0]
        for k in range(c.top_k):
            pos = positions[:, k].long()
            valid = (pos >= 0) & (pos < rows)
            gathered = torch.zeros(out.shape, dtype=torch.float64)
            gathered[valid] = y[pos[valid]].double()
            acc += weights[:, k].double().unsqueeze(1) * gathered
        out.copy_(acc.to(out.dtype))
