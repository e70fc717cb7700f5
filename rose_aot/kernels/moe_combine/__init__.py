"""moe_combine: weighted sum of each token's expert outputs."""

from .family import MoeCombine, MoeCombineConfig

__all__ = ["MoeCombine", "MoeCombineConfig"]
