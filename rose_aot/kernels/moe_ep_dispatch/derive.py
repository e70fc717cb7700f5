"""moe_ep_dispatch points of a model (``manifest from-config --ep N``): expert-parallel
dispatch over N ranks of one node; float8 tokens too where the checkpoint quantizes
activations in blocks (DeepSeek-V3)."""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts
from .protocol import MAX_RANKS

__all__ = ["derive"]


def derive(model: ModelFacts) -> list[KernelEntry]:
    moe = model.moe
    ep = model.ep
    if moe is None or not 2 <= ep <= MAX_RANKS or model.dtype not in ("bfloat16", "float16"):
        return []
    fields = [
        ("world_size", ep),
        ("num_experts", moe.num_experts),
        ("top_k", moe.top_k),
        ("hidden", moe.hidden),
        ("dtype", model.dtype),
    ]
    entries = [
        KernelEntry(
            "moe_ep_dispatch",
            tuple(fields),
            f"expert-parallel dispatch over {ep} ranks (NVLink): tokens to the rank owning "
            f"their expert ({moe.num_experts // ep} experts each), grouped by expert there.",
            (("hidden", "hidden_size"),),
        )
    ]
    if moe.fp8_block:
        fp8 = [(k, "float8_e4m3fn" if k == "dtype" else v) for k, v in fields]
        entries.append(
            KernelEntry(
                "moe_ep_dispatch",
                (*fp8, ("scale_group", moe.fp8_block)),
                f"the same of float8 tokens with one fp32 scale per {moe.fp8_block} elements.",
                (("hidden", "hidden_size"), ("scale_group", "quantization_config")),
            )
        )
    return entries
