"""moe_dispatch_fp8_quant points of a model (``manifest from-config``): an FP8 block checkpoint
(quantization_config quant_method fp8 with weight_block_size; DeepSeek-V3, Qwen3 -FP8 MoE)
runs its experts as FP8 grouped GEMMs on 1 x block_k quantized activations, so the dispatch
quantizes the tokens it copies: group = weight_block_size[1], scales column-major TMA-aligned
(what DeepGEMM-style grouped GEMMs read), power-of-two scales too when an sm_10x arch is
targeted; under tensor parallelism one point per rank's expert range."""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts
from ..fp8_group_quant.derive import ue8m0_values

__all__ = ["derive"]


def derive(model: ModelFacts) -> list[KernelEntry]:
    moe, group = model.moe, model.fp8_group
    if moe is None or not group:
        return []
    fields = [
        ("num_experts", moe.num_experts),
        ("top_k", moe.top_k),
        ("hidden", moe.hidden),
        ("group", group),
        ("dtype", model.dtype),
        ("scale_layout", "col_major_tma"),
        ("ue8m0", ue8m0_values(model.archs)),
    ]
    comment = (f"token dispatch to the routed experts fused with their FP8 quantization (1 x "
               f"{group} groups, quantization_config.weight_block_size)")
    if moe.tp > 1:
        fields += [
            ("expert_start", [r * moe.experts_per_rank for r in range(moe.tp)]),
            ("local_experts", moe.experts_per_rank),
        ]
        comment += f", for the experts of each of {moe.tp} tensor-parallel ranks"
    return [
        KernelEntry(
            "moe_dispatch_fp8_quant", tuple(fields), comment + ".",
            (("hidden", "hidden_size"), ("group", "quantization_config")),
        )
    ]
