"""fp8_token_quant points of a model (``manifest from-config``): none yet.

Dynamic per-token activation scales come from checkpoint formats whose config.json field for
them is not read by ModelFacts yet (compressed-tensors ``input_activations.strategy: token``,
fbgemm_fp8); the fp8 block checkpoints read today use per-token-group scales
(fp8_group_quant). Points of this family come from manifests written by hand.
"""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts

__all__ = ["derive"]


def derive(model: ModelFacts) -> list[KernelEntry]:
    return []
