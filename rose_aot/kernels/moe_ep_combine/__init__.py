"""moe_ep_combine: expert-parallel MoE combine over NVLink (the return path of
moe_ep_dispatch, weighted sum in a fixed order)."""

from .family import MoeEpCombine, MoeEpCombineConfig

__all__ = ["MoeEpCombine", "MoeEpCombineConfig"]
