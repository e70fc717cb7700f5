"""Float64 reference of dynamic per-token FP8 quantization (torch, CPU; no cutlass): the
per-token-group reference with one group per row (fp8_group_quant/reference.py)."""

from __future__ import annotations

from ..fp8_group_quant.reference import quantize_groups

__all__ = ["reference"]


def reference(config, x, q, scales) -> None:
    qv, sv = quantize_groups(x.double(), config.hidden, config.eps, False)
    q.copy_(qv)
    scales.copy_(sv)
