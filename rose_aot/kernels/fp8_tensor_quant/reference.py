"""Float64 reference of dynamic per-tensor FP8 quantization (torch, CPU; no cutlass): the
per-token-group reference with one group holding the whole tensor
(fp8_group_quant/reference.py). The workspace is the loader's: the reference leaves it alone."""

from __future__ import annotations

from ..fp8_group_quant.reference import quantize_groups

__all__ = ["reference"]


def reference(config, x, q, scale) -> None:
    t, h = x.shape
    if t == 0:
        return
    qv, sv = quantize_groups(x.double().reshape(1, t * h), t * h, config.eps, False)
    q.copy_(qv.reshape(t, h))
    scale.copy_(sv.reshape(1))
