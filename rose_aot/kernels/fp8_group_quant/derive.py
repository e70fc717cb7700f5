"""Manifest entries of the FP8 group quantization families derived from a config.json.

A checkpoint with ``quantization_config.quant_method == "fp8"`` and ``weight_block_size``
[block_n, block_k] (DeepSeek-V3, the Qwen3 "-FP8" releases) runs its linear layers as FP8 block
GEMMs whose activations are quantized per token in groups of block_k. Points:
- fp8_group_quant over ``hidden_size``: the input of the attention and MLP projections (and
  of the MoE dispatch);
- act_and_mul_fp8_quant (derived here, registered as its own family) over every gated MLP width
  of act_and_mul's derivation: the input of the down projections, activation fused.
Scales go in the column-major TMA-aligned layout the DeepGEMM-style SM90 GEMMs read; with an
sm_100a target the power-of-two (UE8M0) scales the Blackwell FP8 GEMMs want are added.
Anything else (no quantization_config, another quant_method, a dequantized checkpoint) gives no
point. `view` as in act_and_mul/derive.py.
"""

from __future__ import annotations

from ..act_and_mul.derive import activation, mlp_widths

__all__ = ["fp8_block", "derive", "derive_fused"]


def fp8_block(view) -> int:
    """Elements per activation scale (weight_block_size[1]) of an fp8 block checkpoint, else 0."""
    quant = view.data.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "fp8":
        return 0
    block = quant.get("weight_block_size")
    if (
        not isinstance(block, list)
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        view.fail("quantization_config.weight_block_size", "must be two positive integers for fp8")
    if block[1] not in (64, 128):
        view.fail("quantization_config.weight_block_size",
                  f"activation groups of {block[1]} are not supported; 64 or 128")
    return block[1]


def _ue8m0(archs) -> list[bool] | bool:
    return [False, True] if any(a.startswith("sm_10") for a in archs) else False


def derive(view, *, architecture: str, tp: int = 1, dtype: str = "bfloat16", archs=()) -> list:
    """fp8_group_quant entries (manifest.from_config.KernelEntry) for this model."""
    from ...manifest.from_config import KernelEntry

    group = fp8_block(view)
    if not group:
        return []
    hidden = view.int("hidden_size", "the FP8 activation quantization")
    return [
        KernelEntry(
            "fp8_group_quant",
            (("hidden", hidden), ("group", group), ("dtype", dtype),
             ("scale_layout", "col_major_tma"), ("ue8m0", _ue8m0(archs))),
            f"per-token-group FP8 quantization of the projection inputs (1 x {group} groups, "
            "quantization_config.weight_block_size).",
            (("hidden", "hidden_size"), ("group", "quantization_config")),
        )
    ]


def derive_fused(view, *, architecture: str, tp: int = 1, dtype: str = "bfloat16",
                 archs=()) -> list:
    """act_and_mul_fp8_quant entries for this model: the down projections' inputs."""
    from ...manifest.from_config import KernelEntry

    group = fp8_block(view)
    act = activation(view, architecture) if group else None
    if act is None:
        return []
    out = []
    for d, source, what in mlp_widths(view, architecture, tp):
        if d % group:
            view.fail(source, f"the {what} width {d} is not a multiple of the FP8 group {group}")
        out.append(
            KernelEntry(
                "act_and_mul_fp8_quant",
                (("d", d), ("activation", act), ("group", group), ("dtype", dtype),
                 ("scale_layout", "col_major_tma"), ("ue8m0", _ue8m0(archs))),
                f"{act}(gate) * up of the {what}, quantized for the FP8 down projection.",
                (("d", source), ("group", "quantization_config")),
            )
        )
    return out
