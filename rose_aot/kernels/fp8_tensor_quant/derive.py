"""fp8_tensor_quant points of a model (``manifest from-config``): none yet.

Dynamic per-tensor activation scales belong to FP8 checkpoints without weight blocks
(``quant_method: fp8``, ``activation_scheme: dynamic``, no ``weight_block_size``), a case
ModelFacts does not read yet (it reads the block size only); points of this family come from
manifests written by hand.
"""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts

__all__ = ["derive"]


def derive(model: ModelFacts) -> list[KernelEntry]:
    return []
