"""moe_dispatch points of a model (``manifest from-config``): dispatch to the routed experts;
under tensor parallelism one point per rank's expert range; float8 tokens too where the
checkpoint quantizes activations in blocks (DeepSeek-V3)."""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts

__all__ = ["derive"]


def derive(model: ModelFacts) -> list[KernelEntry]:
    moe = model.moe
    if moe is None:
        return []
    dispatch = [
        ("num_experts", moe.num_experts),
        ("top_k", moe.top_k),
        ("hidden", moe.hidden),
        ("dtype", model.dtype),
    ]
    comment = "token dispatch to the routed experts, grouped by expert"
    if moe.tp > 1:
        dispatch += [
            ("expert_start", [r * moe.experts_per_rank for r in range(moe.tp)]),
            ("local_experts", moe.experts_per_rank),
        ]
        comment += f" (the experts of each of {moe.tp} tensor-parallel ranks)"
    entries = [
        KernelEntry("moe_dispatch", tuple(dispatch), comment + ".", (("hidden", "hidden_size"),))
    ]
    if moe.fp8_block:
        fp8 = [(k, "float8_e4m3fn" if k == "dtype" else v) for k, v in dispatch]
        entries.append(
            KernelEntry(
                "moe_dispatch",
                (*fp8, ("scale_group", moe.fp8_block)),
                f"the same dispatch of float8 tokens with one fp32 scale per {moe.fp8_block} "
                "elements (quantization_config.weight_block_size).",
                (("hidden", "hidden_size"), ("scale_group", "quantization_config")),
            )
        )
    return entries
