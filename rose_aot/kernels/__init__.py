"""Kernel families. Importing this package never imports cutlass: device code lives in the
``*_device`` modules, which only the builder and tests load."""

from __future__ import annotations

from ..errors import ConfigError
from .base import KernelFamily, config_digest, config_json, point_key
from .moe_combine import MoeCombine
from .moe_dispatch import MoeDispatch
from .qk_norm import QkNorm
from .rms_norm import RmsNorm

__all__ = ["FAMILIES", "get_family", "KernelFamily", "point_key", "config_json", "config_digest"]

FAMILIES: dict[str, KernelFamily] = {
    f.name: f for f in (RmsNorm(), QkNorm(), MoeDispatch(), MoeCombine())
}


def get_family(name: str) -> KernelFamily:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ConfigError(
            str(name), "family", f"unknown kernel family {name!r}; known: {', '.join(sorted(FAMILIES))}"
        ) from None
