"""moe_dispatch: tokens to their experts' rows, grouped by expert."""

from .family import MoeDispatch, MoeDispatchConfig

__all__ = ["MoeDispatch", "MoeDispatchConfig"]
