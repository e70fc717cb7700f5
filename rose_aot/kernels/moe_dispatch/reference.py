"""Float64 torch reference of moe_dispatch (tests only)."""

from __future__ import annotations

__all__ = ["reference"]


def reference(c, *tensors) -> None:
    """Writes out/out_scales/expert_offsets/positions with rows inside each expert in
    (token, k) order. The kernel's order inside an expert may differ: compare through
    `positions` (tests do)."""
    import torch

    if c.scale_group:
        x, ids, xs, out, out_s, offsets, positions = tensors
    else:
        x, ids, out, offsets, positions = tensors
        xs = out_s = None
    e_local = c.local_experts  # make_config always makes the range explicit
    k = ids.shape[1]
    local = (ids.long() - c.expert_start).reshape(-1)
    flat = ids.reshape(-1)
    valid = (flat >= 0) & (flat < c.num_experts) & (local >= 0) & (local < e_local)
    pairs = torch.nonzero(valid).squeeze(1)  # valid (token, k) pairs in (token, k) order
    experts = local[pairs]
    counts = torch.bincount(experts, minlength=e_local)
    padded = (counts + c.expert_alignment - 1) // c.expert_alignment * c.expert_alignment
    starts = torch.zeros(e_local + 1, dtype=torch.long)
    starts[1:] = torch.cumsum(padded, 0)
    offsets.copy_(starts.to(offsets.dtype))
    order = torch.argsort(experts, stable=True)
    pairs, experts = pairs[order], experts[order]
    first = torch.cumsum(counts, 0) - counts  # first sorted index of each expert
    rows = starts[experts] + torch.arange(pairs.numel()) - first[experts]
    flat_positions = torch.full((flat.numel(),), -1, dtype=torch.long)
    flat_positions[pairs] = rows
    positions.copy_(flat_positions.view(positions.shape).to(positions.dtype))
    out[rows] = x[pairs // k]
    if xs is not None:
        out_s[rows] = xs[pairs // k]
    for e in range(e_local):
        out[int(starts[e]) + int(counts[e]) : int(starts[e + 1])] = 0
        if out_s is not None:
            out_s[int(starts[e]) + int(counts[e]) : int(starts[e + 1])] = 0
