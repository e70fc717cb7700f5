"""fp8_group_quant points of a model (``manifest from-config``), and the reader of the FP8
block group from config.json (:func:`read_fp8_group`).

A checkpoint with ``quantization_config.quant_method == "fp8"`` and ``weight_block_size``
[block_n, block_k] (DeepSeek-V3, the Qwen3 "-FP8" releases) runs its linear layers as FP8 block
GEMMs whose activations are quantized per token in groups of block_k:
- fp8_group_quant over ``hidden_size``: the input of the attention and MLP projections (and of
  the MoE dispatch);
- act_and_mul_fp8_quant (its own folder) over every gated MLP width: the down projections.
Scales go in the column-major TMA-aligned layout the DeepGEMM-style SM90 GEMMs read; with an
sm_10x target the power-of-two (UE8M0) scales the Blackwell FP8 GEMMs want are added.
Anything else (no quantization_config, another quant_method) gives no point.
"""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts, fp8_block_size

__all__ = ["read_fp8_group", "ue8m0_values", "derive"]


def read_fp8_group(view) -> int:
    """ModelFacts.fp8_group: weight_block_size[1] of an fp8 block checkpoint, else 0."""
    group = fp8_block_size(view)
    if group not in (0, 64, 128):
        view.fail("quantization_config.weight_block_size",
                  f"activation groups of {group} are not supported; 64 or 128")
    return group


def ue8m0_values(archs) -> list[bool] | bool:
    """fp32 scales for Hopper; power-of-two scales too when a Blackwell arch is targeted."""
    return [False, True] if any(a.startswith("sm_10") for a in archs) else False


def derive(model: ModelFacts) -> list[KernelEntry]:
    group = model.fp8_group
    if not group:
        return []
    return [
        KernelEntry(
            "fp8_group_quant",
            (("hidden", model.hidden), ("group", group), ("dtype", model.dtype),
             ("scale_layout", "col_major_tma"), ("ue8m0", ue8m0_values(model.archs))),
            f"per-token-group FP8 quantization of the projection inputs (1 x {group} groups, "
            "quantization_config.weight_block_size).",
            (("hidden", "hidden_size"), ("group", "quantization_config")),
        )
    ]
