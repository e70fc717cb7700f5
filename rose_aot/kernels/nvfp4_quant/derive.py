"""nvfp4_quant points of a model (``manifest from-config``): ModelOpt NVFP4 checkpoints on a
Blackwell target (see block_scaled_quant/derive.py for the reader and the widths)."""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts
from ..block_scaled_quant.derive import block_scaled_entries

__all__ = ["derive"]


def derive(model: ModelFacts) -> list[KernelEntry]:
    return block_scaled_entries(model, "nvfp4_quant", "nvfp4")
