"""act_and_mul: out = act(x[:, :d]) * x[:, d:], the gated MLP activation (SwiGLU / GeGLU).

x [tokens, 2*d] (rows may be strided, e.g. a slice of a wider buffer) -> out [tokens, d].
``activation``: ``silu`` (a * sigmoid(a)), ``gelu`` (exact, erf form: 0.5 a (1 + erf(a/sqrt 2))),
``gelu_tanh`` (0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3)))). Math in fp32, one rounding to
the output dtype. The device code evaluates the forms that stay accurate in fp32 for negative a:
silu and gelu_tanh as a / (1 + exp(-k)), gelu as 0.5 a erfc(-a / sqrt 2).

Work split (chunked_rows.py): each thread loads full-width vectors of a and b, so every global
access is 128-bit on sm_90a and 256-bit on sm_100a when d allows. One shape at every token count:
one token spread over many small blocks (one vector per thread), measured level with or faster
than a prefill shape of 4 vectors per thread in wide blocks at every width and token count on
the H200 (tuning.py). Its three variants differ only in programmatic dependent launch
(chunked_rows.decode_variants: `decode`, `mid`, `bulk`). The prefill shape is not compiled: a
variant the plan never picks would only cost every serving process a cubin to load.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...archs import Arch
from ...errors import ConfigError
from ..base import KernelFamily, choice
from ..chunked_rows import chunk_split, chunked_plan, decode_variants
from ..rowwise import access_bytes, vector_width
from ..spec import DTYPES, Dim, Launch, TensorArg, Variant
from .tuning import DECODE_MAX_VECS, DECODE_THREADS

__all__ = ["ActAndMulConfig", "ActAndMul", "ACTIVATIONS"]

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
_DTYPES = ("bfloat16", "float16")
MAX_D = 32768


@dataclass(frozen=True)
class ActAndMulConfig:
    d: int  # output width; the input row holds 2*d elements (gate, then up)
    activation: str = choice(*ACTIVATIONS, default="silu", doc="activation applied to x[:, :d]")
    dtype: str = choice(*_DTYPES, default="bfloat16", doc="input dtype")
    out_dtype: str = choice(*_DTYPES, default="bfloat16", doc="output dtype (default: dtype)")


def _bits(dtype: str) -> int:
    return DTYPES[dtype].bits


class ActAndMul(KernelFamily):
    name = "act_and_mul"
    Config = ActAndMulConfig
    plan_choices = ("decode", "mid", "bulk")
    device_module = "rose_aot.kernels.act_and_mul.device"
    shape_fields = ("d",)

    def make_config(self, **values):
        values.setdefault("out_dtype", values.get("dtype", "bfloat16"))
        return super().make_config(**values)

    def validate(self, c: ActAndMulConfig) -> None:
        # 16-byte vectors must tile both halves of the input row and the output row.
        vec = max(128 // _bits(c.dtype), 128 // _bits(c.out_dtype))
        if not 0 < c.d <= MAX_D or c.d % vec:
            raise ConfigError(
                self.name, "d", f"{c.d} is not supported; use a multiple of {vec} up to {MAX_D}"
            )

    def vec(self, c: ActAndMulConfig, arch: Arch) -> int:
        """Elements per access, the same for input and output (both 16-bit dtypes)."""
        return vector_width(c.dtype, access_bytes(arch, c.d * _bits(c.dtype) // 8))

    def args(self, c: ActAndMulConfig, arch: Arch) -> tuple[TensorArg, ...]:
        tokens = Dim("tokens")
        vec = self.vec(c, arch)
        # Rows may be strided views; a row stride must keep every vector aligned.
        x_stride = Dim("x_row_stride", width=64, divisibility=vec)
        out_stride = Dim("out_row_stride", width=64, divisibility=vec)
        align = vec * _bits(c.dtype) // 8
        return (
            TensorArg("x", c.dtype, (tokens, 2 * c.d), (x_stride, 1), align, role="input"),
            TensorArg("out", c.out_dtype, (tokens, c.d), (out_stride, 1), align, role="output"),
        )

    def variants(self, c: ActAndMulConfig, arch: Arch) -> tuple[Variant, ...]:
        params = tuple(a.name for a in self.args(c, arch))
        vec = self.vec(c, arch)
        vectors = c.d // vec
        # the chunks of a row in grid x: measured faster (chunked_rows.chunk_grid)
        split = chunk_split(vectors, DECODE_THREADS, DECODE_MAX_VECS, chunks_in_x=True)
        shape = Variant("decode", (split.threads, 1, 1), params=params,
                        constants={**split.constants(), "vec": vec})
        return decode_variants(shape, bulk=True)

    def plan(self, c, variants, sizes, sm_count, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        # The decode shape at every size: measured level with or faster than the prefill
        # shape everywhere (tuning.py).
        chosen = chunked_plan(variants, sizes["tokens"], sm_count, None, force)
        return () if chosen is None else (chosen,)
