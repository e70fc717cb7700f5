"""act_and_mul_fp8_quant points of a model (``manifest from-config``): every gated MLP width of
an FP8 block checkpoint (see fp8_group_quant/derive.py), the input of its down projection."""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts
from ..fp8_group_quant.derive import ue8m0_values

__all__ = ["derive"]


def derive(model: ModelFacts) -> list[KernelEntry]:
    group = model.fp8_group
    act = model.mlp_activation
    if not group or act is None:
        return []
    return [
        KernelEntry(
            "act_and_mul_fp8_quant",
            (("d", d), ("activation", act), ("group", group), ("dtype", model.dtype),
             ("scale_layout", "col_major_tma"), ("ue8m0", ue8m0_values(model.archs))),
            f"{act}(gate) * up of the {what}, quantized for the FP8 down projection.",
            (("d", source), ("group", "quantization_config")),
        )
        for d, source, what in model.mlp_widths
    ]
