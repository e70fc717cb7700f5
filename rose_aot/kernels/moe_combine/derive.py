"""moe_combine points of a model (``manifest from-config``)."""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts

__all__ = ["derive"]


def derive(model: ModelFacts) -> list[KernelEntry]:
    moe = model.moe
    if moe is None:
        return []
    return [
        KernelEntry(
            "moe_combine",
            (("top_k", moe.top_k), ("hidden", moe.hidden), ("dtype", model.dtype)),
            "weighted sum of each token's expert outputs, in a fixed order.",
            (("hidden", "hidden_size"),),
        )
    ]
