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

__all__ = ["RmsNormConfig", "RmsNorm", "row_split"]

_FLOATS = ("bfloat16", "float16", "float32")
MAX_HIDDEN = 16384
# Upper bound of 128-bit vectors one thread keeps in registers (8 x 16 B = 32 fp32 values).
MAX_VECS_PER_THREAD = 8
# Warps per block of the prefill variant (the seed's recipe steps up from one warp per block).
PREFILL_WARPS = 8


@dataclass(frozen=True)
class RmsNormConfig:
    hidden: int
    dtype: str = choice(*_FLOATS, default="bfloat16", doc="input (and residual) dtype")
    out_dtype: str = choice(*_FLOATS, default="bfloat16", doc="output dtype (default: dtype)")
    weight_dtype: str = choice(*_FLOATS, default="bfloat16", doc="weight dtype (default: dtype)")
    eps: float = 1e-6
    weight_offset: float = 0.0  # 1.0 for Gemma-style (1 + w) weights
    fused_residual: bool = False


def vector_width(dtype: str) -> int:
    """Elements per 128-bit access."""
    return 16 // DTYPES[dtype][0]


def row_split(hidden: int, dtype: str) -> tuple[int, int]:
    """(warps per row, vectors per thread) for a row of `hidden` elements.

    Prefers the fewest warps whose threads cover the row exactly with at most
    MAX_VECS_PER_THREAD vectors each, so no thread needs a bounds check; otherwise the last
    vectors of a row are predicated.
    """
    vectors = hidden // vector_width(dtype)
    for warps in range(1, 33):
        per_thread = vectors // (32 * warps)
        if vectors % (32 * warps) == 0 and per_thread <= MAX_VECS_PER_THREAD:
            return warps, per_thread
    warps = min(32, -(-vectors // (32 * MAX_VECS_PER_THREAD)))
    return warps, -(-vectors // (32 * warps))


class RmsNorm(KernelFamily):
    name = "rms_norm"
    Config = RmsNormConfig
    device_module = "rose_aot.kernels.rms_norm_device"

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
        warps, per_thread = row_split(c.hidden, c.dtype)
        params = tuple(a.name for a in self.args(c))

        def variant(name, rows):
            threads = 32 * warps * rows
            smem = 4 * warps * rows if warps > 1 else 0
            return Variant(
                name,
                (threads, 1, 1),
                smem,
                params,
                {"rows_per_block": rows, "warps_per_row": warps, "vecs_per_thread": per_thread},
            )

        prefill_rows = max(1, PREFILL_WARPS // warps)
        if prefill_rows == 1:
            return (variant("prefill", 1),)
        return (variant("decode", 1), variant("prefill", prefill_rows))

    def plan(self, c, arch, sizes, force=None) -> tuple[Launch, ...]:
        tokens = sizes["tokens"]
        if tokens == 0:
            return ()
        variants = {v.name: v for v in self.variants(c, arch)}
        warps, _ = row_split(c.hidden, c.dtype)
        if force is not None:
            name = force if force in variants else "prefill"
        elif "decode" in variants and tokens * warps < arch.sm_count:
            name = "decode"  # fewer warps of work than SMs: one row per block
        else:
            name = "prefill"
        v = variants[name]
        rows = v.constants["rows_per_block"]
        return (Launch(name, (-(-tokens // rows), 1, 1), v.block, v.smem),)

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
