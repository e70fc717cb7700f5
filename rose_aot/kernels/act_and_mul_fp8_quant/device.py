"""CuTeDSL device code of act_and_mul_fp8_quant: the fp8_group_quant kernel with the gated
activation applied to each loaded (gate, up) vector pair."""

from __future__ import annotations

from ...archs import Arch
from ..fp8_group_quant.device import build
from ..spec import Variant

__all__ = ["host_function"]


def host_function(config, variant: Variant, arch: Arch):
    return build(config, variant, arch, config.d, config.activation)
