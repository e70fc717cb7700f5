"""Kernel families: one folder each (config + plan, device code, reference, tuning, manifest
derivation), registered below in one line. Importing this package never imports cutlass:
device code lives in each family's ``device`` module, which only the builder and tests load."""

from __future__ import annotations

from ..errors import ConfigError
from .all_reduce import AllReduce
from .base import KernelFamily, config_digest, config_json, kernel_source_digest, point_key
from .act_and_mul import ActAndMul
from .act_and_mul_fp8_quant import ActAndMulFp8Quant
from .block_scaled_quant import BlockScaledQuant
from .fp8_group_quant import Fp8GroupQuant
from .fp8_token_quant import Fp8TokenQuant
from .fp8_tensor_quant import Fp8TensorQuant
from .nvfp4_quant import Nvfp4Quant
from .moe_combine import MoeCombine
from .moe_dispatch import MoeDispatch
from .moe_dispatch_fp8_quant import MoeDispatchFp8Quant
from .moe_ep_combine import MoeEpCombine
from .moe_ep_dispatch import MoeEpDispatch
from .qk_norm import QkNorm
from .rms_norm import RmsNorm

__all__ = [
    "FAMILIES",
    "get_family",
    "KernelFamily",
    "point_key",
    "config_json",
    "config_digest",
    "kernel_source_digest",
]

# The registry: adding a family is its folder plus one line here.
FAMILIES: dict[str, KernelFamily] = {
    f.name: f
    for f in (
        RmsNorm(),
        QkNorm(),
        MoeDispatch(),
        MoeDispatchFp8Quant(),
        MoeCombine(),
        ActAndMul(),
        Fp8GroupQuant(),
        Fp8TokenQuant(),
        Fp8TensorQuant(),
        ActAndMulFp8Quant(),
        BlockScaledQuant(),
        Nvfp4Quant(),
        AllReduce(),
        MoeEpDispatch(),
        MoeEpCombine(),
    )
}


def get_family(name: str) -> KernelFamily:
    if not isinstance(name, str):
        raise ConfigError(
            repr(name), "family", f"a family name must be a string, got {type(name).__name__}"
        )
    try:
        return FAMILIES[name]
    except KeyError:
        raise ConfigError(
            str(name), "family", f"unknown kernel family {name!r}; known: {', '.join(sorted(FAMILIES))}"
        ) from None
