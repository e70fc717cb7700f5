"""moe_ep_combine points of a model (``manifest from-config --ep N``)."""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts
from ..moe_ep_dispatch.protocol import MAX_RANKS

__all__ = ["derive"]


def derive(model: ModelFacts) -> list[KernelEntry]:
    moe = model.moe
    ep = model.ep
    if moe is None or not 2 <= ep <= MAX_RANKS or model.dtype not in ("bfloat16", "float16"):
        return []
    return [
        KernelEntry(
            "moe_ep_combine",
            (("world_size", ep), ("top_k", moe.top_k), ("hidden", moe.hidden),
             ("dtype", model.dtype)),
            f"expert-parallel combine over {ep} ranks: expert outputs back to their tokens' "
            "ranks, weighted sum in a fixed order.",
            (("hidden", "hidden_size"),),
        )
    ]
