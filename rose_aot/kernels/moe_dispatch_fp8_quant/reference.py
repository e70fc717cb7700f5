"""Float64 reference of moe_dispatch_fp8_quant (tests only): the moe_dispatch reference, then
the fp8_group_quant reference over the rows it wrote."""

from __future__ import annotations

__all__ = ["reference"]


def reference(c, x, ids, out, out_scales, offsets, positions) -> None:
    """Rows inside each expert in (token, k) order (compare through positions)."""
    import torch

    from ..fp8_group_quant.reference import quantize_groups
    from ..moe_dispatch import reference as dispatch_reference
    from ..moe_dispatch.family import MoeDispatchConfig

    plain = MoeDispatchConfig(
        num_experts=c.num_experts, top_k=c.top_k, hidden=c.hidden, dtype=c.dtype,
        expert_alignment=c.expert_alignment, expert_start=c.expert_start,
        local_experts=c.local_experts,
    )
    rows = torch.zeros(out.shape, dtype=x.dtype)
    dispatch_reference.reference(plain, x, ids, rows, offsets, positions)
    used = int(offsets[-1])
    q, s = quantize_groups(rows[:used].double(), c.group, c.eps, c.ue8m0)
    out[:used] = q
    out_scales[:used] = s
