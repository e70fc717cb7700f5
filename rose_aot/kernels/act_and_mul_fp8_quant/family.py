"""act_and_mul_fp8_quant: act_and_mul followed by FP8 per-token-group quantization, one launch.

x [tokens, 2*d] (gate | up; rows may be strided) -> q [tokens, d] e4m3 + fp32 scales in the
fp8_group_quant layouts, the form in front of an FP8 down projection. y = act(gate) * up is kept
in fp32 (not rounded to the input dtype) and quantized as fp8_group_quant quantizes x; see
fp8_group_quant/family.py for scales, rounding, layouts and the non-finite policy.

Because y is computed in fp32 with the activation's approximations, codes and scales are not
bit-exact against a float64 reference: the GPU tests bound the difference (one e4m3 step per
code; scales to the fp32 error of y).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...archs import Arch
from ..act_and_mul.family import ACTIVATIONS
from ..base import KernelFamily, choice
from ..chunked_rows import chunked_plan
from ..fp8_group_quant.family import SCALE_LAYOUTS, quant_args, quant_variants, validate_quant
from ..spec import Launch, TensorArg, Variant

__all__ = ["ActAndMulFp8QuantConfig", "ActAndMulFp8Quant"]


@dataclass(frozen=True)
class ActAndMulFp8QuantConfig:
    d: int  # output width; the input row holds 2*d elements (gate, then up)
    activation: str = choice(*ACTIVATIONS, default="silu", doc="activation applied to x[:, :d]")
    group: int = choice(64, 128, default=128, doc="elements per scale")
    dtype: str = choice("bfloat16", "float16", default="bfloat16", doc="input dtype")
    scale_layout: str = choice(*SCALE_LAYOUTS, default="row_major", doc="layout of the scales")
    ue8m0: bool = False  # scales rounded up to a power of two
    eps: float = 1e-10  # lower bound of the absmax (all-zero groups)


class ActAndMulFp8Quant(KernelFamily):
    name = "act_and_mul_fp8_quant"
    Config = ActAndMulFp8QuantConfig
    plan_choices = ("decode", "mid", "bulk")
    device_module = "rose_aot.kernels.act_and_mul_fp8_quant.device"
    shape_fields = ("d",)

    def validate(self, c: ActAndMulFp8QuantConfig) -> None:
        validate_quant(self.name, c, "d", c.d)

    def args(self, c: ActAndMulFp8QuantConfig, arch: Arch) -> tuple[TensorArg, ...]:
        return quant_args(c, arch, c.d, 2 * c.d)

    def variants(self, c: ActAndMulFp8QuantConfig, arch: Arch) -> tuple[Variant, ...]:
        return quant_variants(c, arch, c.d, tuple(a.name for a in self.args(c, arch)),
                              decode_only=True)

    def plan(self, c, variants, sizes, sm_count, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        # The decode shape at every size: measured faster than the prefill shape everywhere,
        # 2.3-2.6x from 8192 tokens (act_and_mul/tuning.py), which is therefore not compiled;
        # beyond the PDL limits as `bulk`.
        chosen = chunked_plan(variants, sizes["tokens"], sm_count, None, force)
        return () if chosen is None else (chosen,)
