"""Float64 torch reference of moe_ep_combine (tests only): moe_combine's sum over each token's
expert outputs, wherever they were computed."""

from __future__ import annotations

__all__ = ["reference"]


def reference(c, rows, weights, valid, out) -> None:
    """rows: [tokens, top_k, hidden] the expert output of each copy (any values where not
    valid); weights [tokens, top_k]; valid [tokens, top_k] bool; writes out [tokens, hidden]."""
    import torch

    acc = torch.zeros(out.shape, dtype=torch.float64)
    for k in range(c.top_k):
        w = torch.where(valid[:, k], weights[:, k].double(), torch.zeros_like(weights[:, k].double()))
        r = torch.where(valid[:, k].unsqueeze(1), rows[:, k].double(), torch.zeros_like(rows[:, k].double()))
        acc += w.unsqueeze(1) * r
    out.copy_(acc.to(out.dtype))
