"""Float64 reference of FP8 per-token-group quantization (torch, CPU). No cutlass.

Follows the definition in family.py literally: the absmax and the scale are formed in float64
from the fp32 values the kernel sees, the scale is rounded to fp32 (or to a power of two with
an exact frexp test), and each code is the float8_e4m3fn rounding of the quotient rounded to
fp32, clamped to +-448 (torch's own float64 -> e4m3 conversion goes through fp32 too; the
explicit step keeps the reference independent of that detail).
"""

from __future__ import annotations

__all__ = ["group_scales64", "quantize_groups", "reference"]

FP8_MAX = 448.0


def _fp32(value: float) -> float:
    import torch

    return float(torch.tensor(value, dtype=torch.float32))


def group_scales64(absmax, eps: float, ue8m0: bool):
    """fp32 scales (as float64 tensor) from float64 group absmax values."""
    import torch

    m = absmax.clamp(min=_fp32(eps))
    if ue8m0:
        # m = f * 2**e with f in [0.5, 1): m / 448 = (f * 8/7) * 2**(e-9), and f * 8/7 <= 1
        # exactly when f <= 7/8, so ceil(log2(m / 448)) is e - 9 or e - 8.
        f, e = torch.frexp(m)
        p = torch.where(f <= 0.875, e - 9, e - 8)
        scale = torch.ldexp(torch.ones_like(m), p)
        return torch.where(torch.isinf(m), m, scale)
    return (m / FP8_MAX).float().double()


def quantize_groups(y, group: int, eps: float, ue8m0: bool):
    """(q e4m3 [T, H], scales float32 [T, H/group]) of float64 values y [T, H]."""
    import torch

    t, h = y.shape
    g = y.reshape(t, h // group, group)
    absmax = torch.where(torch.isnan(g), torch.zeros_like(g), g.abs()).amax(dim=-1)
    scale = group_scales64(absmax.float().double(), eps, ue8m0)
    q = (g / scale.unsqueeze(-1)).float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(t, h), scale.float()


def reference(config, x, q, scales) -> None:
    qv, sv = quantize_groups(x.double(), config.group, config.eps, config.ue8m0)
    q.copy_(qv)
    scales.copy_(sv)
