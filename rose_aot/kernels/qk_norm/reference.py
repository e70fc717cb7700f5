"""Float64 torch reference of qk_norm (tests only)."""

from __future__ import annotations

__all__ = ["reference"]


def reference(c, q, k, q_weight, k_weight) -> None:
    """Normalizes q and k in place, like the kernel."""
    import torch

    for x, w in ((q, q_weight), (k, k_weight)):
        xs = x.double()
        rstd = torch.rsqrt(xs.pow(2).mean(dim=-1, keepdim=True) + c.eps)
        x.copy_((xs * rstd * (w.double() + c.weight_offset)).to(x.dtype))
