"""Float64 reference of act_and_mul_fp8_quant: act_and_mul in float64 (unrounded), then the
fp8_group_quant reference's quantization. No cutlass."""

from __future__ import annotations

from ..act_and_mul.reference import act_and_mul64
from ..fp8_group_quant.reference import quantize_groups

__all__ = ["reference"]


def reference(config, x, q, scales) -> None:
    qv, sv = quantize_groups(act_and_mul64(x, config.d, config.activation), config.group,
                             config.eps, config.ue8m0)
    q.copy_(qv)
    scales.copy_(sv)
