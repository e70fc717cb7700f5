"""moe_ep_dispatch: expert-parallel MoE dispatch over NVLink (tokens to the ranks owning
their experts, grouped by expert there)."""

from .family import MoeEpDispatch, MoeEpDispatchConfig

__all__ = ["MoeEpDispatch", "MoeEpDispatchConfig"]
