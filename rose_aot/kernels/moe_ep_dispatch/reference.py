"""Torch reference of moe_ep_dispatch (tests only): the dispatch of every rank's
tokens at once, as rank `rank` sees it. The data is copied, not computed, so the reference is
exact."""

from __future__ import annotations

__all__ = ["reference", "expected_layout"]


def expected_layout(c, all_ids, rank: int):
    """(expert_offsets, [(sender, token, k, local expert)] in out order) of rank `rank`, for
    the [tokens, top_k] expert ids of every rank (sender order, then the sender's copies in
    (token, k) order inside each expert: the kernel's order inside an expert may differ only
    within one sender)."""
    import torch

    W = c.world_size
    L = c.num_experts // W
    counts = torch.zeros(L, dtype=torch.long)
    copies = []
    for j in range(L):
        e = rank * L + j
        for s, ids in enumerate(all_ids):
            hits = (ids.long() == e).nonzero().tolist()
            for t, k in hits:
                copies.append((s, t, k, j))
            counts[j] += len(hits)
    padded = (counts + c.expert_alignment - 1) // c.expert_alignment * c.expert_alignment
    offsets = torch.zeros(L + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(padded, 0)
    return offsets, copies


def reference(c, all_x, all_ids, rank, out, offsets, all_scales=None, out_scales=None) -> None:
    """Writes rank `rank`'s out (rows of each expert in sender, then (token, k) order; padding
    zero), expert_offsets and, for float8, out_scales."""
    starts, copies = expected_layout(c, all_ids, rank)
    offsets.copy_(starts.to(offsets.dtype))
    out.zero_()
    if out_scales is not None:
        out_scales.zero_()
    row = {}
    for s, t, k, j in copies:
        r = int(starts[j]) + row.get(j, 0)
        row[j] = row.get(j, 0) + 1
        out[r] = all_x[s][t]
        if out_scales is not None:
            out_scales[r] = all_scales[s][t]
