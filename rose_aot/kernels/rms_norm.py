"""rms_norm: y = (w + weight_offset) * x * rsqrt(mean(x^2) + eps) over the hidden dimension.

With ``fused_residual`` the kernel first forms r = x + residual (rounded to the input dtype),
writes r back into ``residual`` and normalizes r: the usual pre-norm "add & norm" of a decoder
layer in one pass over memory.

Work split: a row is handled by a group of whole warps, each thread holding a few 128-bit vectors
of the row in registers (one pass over global memory; statistics in fp32). The sum of squares is
a warp butterfly, then, for rows spread over several warps, one exchange through shared memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..archs import Arch
from ..errors import ConfigError
from .base import KernelFamily, choice
from .spec import DTYPES, Dim, Launch, TensorArg, Variant
from .tuning import RMS_NORM_DECODE_ROW_WARPS, RMS_NORM_DECODE_WARPS_PER_SM, prefill_warps

__all__ = ["RmsNormConfig", "RmsNorm", "row_split", "row_plan"]

_FLOATS = ("bfloat16", "float16", "float32")
MAX_HIDDEN = 16384
# 128-bit vectors per thread. Decode spreads a row over many threads so that the per-thread
# dependency chain (square, sum, scale) is short: at one token the kernel is pure latency.
# Prefill keeps more of the row per thread (8 x 16 B = 32 fp32 values in registers) so that a
# block covers several rows and the grid stays a few waves deep.
DECODE_VECS_PER_THREAD = 2
PREFILL_VECS_PER_THREAD = 8


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


def vector_width(dtype: str) -> int:
    """Elements per 128-bit access."""
    return 16 // DTYPES[dtype][0]


def row_split(hidden: int, dtype: str, max_vecs: int) -> tuple[int, int]:
    """(warps per row, vectors per thread) for a row of `hidden` elements.

    Prefers the fewest warps whose threads cover the row exactly with at most `max_vecs`
    vectors each, so no thread needs a bounds check; otherwise the last vectors of a row are
    predicated.
    """
    vectors = hidden // vector_width(dtype)
    for warps in range(1, 33):
        per_thread = vectors // (32 * warps)
        if vectors % (32 * warps) == 0 and per_thread <= max_vecs:
            return warps, per_thread
    warps = min(32, -(-vectors // (32 * max_vecs)))
    return warps, -(-vectors // (32 * warps))


def row_plan(
    decode: Variant, prefill: Variant, tokens: int, force: str | None, use_decode: bool
) -> tuple[Launch, ...]:
    """The one launch of a row-wise family: the forced variant, else the rule's choice; a grid
    of blocks of `rows_per_block` rows covering every token."""
    if tokens == 0:
        return ()
    if force is not None:
        use_decode = force == "decode"
    v = decode if use_decode else prefill
    rows = v.constants["rows_per_block"]
    return (Launch(v.name, (-(-tokens // rows), 1, 1), v.block, v.smem),)


class RmsNorm(KernelFamily):
    name = "rms_norm"
    Config = RmsNormConfig
    device_module = "rose_aot.kernels.rms_norm_device"
    shape_fields = ("hidden",)

    def make_config(self, **values):
        dtype = values.get("dtype", "bfloat16")
        values.setdefault("out_dtype", dtype)
        values.setdefault("weight_dtype", dtype)
        return super().make_config(**values)

    def validate(self, c: RmsNormConfig) -> None:
        vec = max(vector_width(c.dtype), vector_width(c.out_dtype))
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

    def args(self, c: RmsNormConfig) -> tuple[TensorArg, ...]:
        tokens = Dim("tokens")

        def rows(name, dtype, writes):
            # Rows may be strided (e.g. a slice of a wider buffer); elements are contiguous.
            stride = Dim(f"{name}_row_stride", width=64, divisibility=vector_width(dtype))
            return TensorArg(name, dtype, (tokens, c.hidden), (stride, 1), 16, writes)

        weight = TensorArg("weight", c.weight_dtype, (c.hidden,), (1,), 16)
        if c.fused_residual:
            return (
                rows("x", c.dtype, False),
                rows("residual", c.dtype, True),
                weight,
                rows("out", c.out_dtype, True),
            )
        return (rows("x", c.dtype, False), weight, rows("out", c.out_dtype, True))

    def variants(self, c: RmsNormConfig, arch: Arch) -> tuple[Variant, ...]:
        params = tuple(a.name for a in self.args(c))

        def variant(name, warps, per_thread, rows):
            threads = 32 * warps * rows
            smem = 4 * warps * rows if warps > 1 else 0
            return Variant(
                name,
                (threads, 1, 1),
                smem,
                params,
                {"rows_per_block": rows, "warps_per_row": warps, "vecs_per_thread": per_thread},
            )

        decode = variant("decode", *row_split(c.hidden, c.dtype, DECODE_VECS_PER_THREAD), 1)
        warps, per_thread = row_split(c.hidden, c.dtype, PREFILL_VECS_PER_THREAD)
        block_warps = prefill_warps(self.name, arch.name, c.prefill_warps)
        prefill = variant("prefill", warps, per_thread, max(1, block_warps // warps))
        return (decode, prefill)

    def plan(self, c, arch, sizes, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        decode, prefill = self.variants(c, arch)
        tokens = sizes["tokens"]
        row_warps = decode.constants["warps_per_row"]
        use_decode = (  # measured rule, see tuning.py
            row_warps <= RMS_NORM_DECODE_ROW_WARPS
            or tokens * row_warps <= arch.sm_count * RMS_NORM_DECODE_WARPS_PER_SM
        )
        return row_plan(decode, prefill, tokens, force, use_decode)

    def reference(self, c: RmsNormConfig, *tensors) -> None:
        import torch

        if c.fused_residual:
            x, residual, weight, out = tensors
            r = (x.double() + residual.double()).to(residual.dtype)
            residual.copy_(r)
            xs = r.double()
        else:
            x, weight, out = tensors
            xs = x.double()
        rstd = torch.rsqrt(xs.pow(2).mean(dim=-1, keepdim=True) + c.eps)
        out.copy_((xs * rstd * (weight.double() + c.weight_offset)).to(out.dtype))
