"""Float64 torch reference of moe_combine (tests only). Runs where the tensors are (CPU or
CUDA; the GPU suite keeps it on the GPU)."""

from __future__ import annotations

__all__ = ["reference"]


def reference(c, y, positions, weights, out) -> None:
    import torch

    acc = torch.zeros(out.shape, dtype=torch.float64, device=out.device)
    rows = y.shape[0]
    for k in range(c.top_k):
        pos = positions[:, k].long()
        valid = (pos >= 0) & (pos < rows)
        gathered = torch.zeros(out.shape, dtype=torch.float64, device=out.device)
        gathered[valid] = y[pos[valid]].double()
        acc += weights[:, k].double().unsqueeze(1) * gathered
    out.copy_(acc.to(out.dtype))
