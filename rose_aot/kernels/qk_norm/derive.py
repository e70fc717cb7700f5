"""qk_norm points of a model (``manifest from-config``): per-head Q/K norms (Qwen3, Gemma 3),
with the heads of one rank under tensor parallelism."""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts

__all__ = ["derive"]


def derive(model: ModelFacts) -> list[KernelEntry]:
    if model.qk_heads is None:
        return []
    q, kv, head_dim = model.qk_heads
    offset = (("weight_offset", model.weight_offset),) if model.weight_offset else ()
    ranks = f" (the heads of one of {model.tp} tensor-parallel ranks)" if model.tp > 1 else ""
    return [
        KernelEntry(
            "qk_norm",
            (
                ("num_q_heads", q),
                ("num_k_heads", kv),
                ("head_dim", head_dim),
                ("dtype", model.dtype),
                ("eps", model.eps),
                *offset,
            ),
            "q_norm / k_norm over each head" + ranks + ".",
            (
                ("num_q_heads", "num_attention_heads"),
                ("num_k_heads", "num_key_value_heads"),
                ("head_dim", "head_dim"),
                ("eps", "rms_norm_eps"),
            ),
        )
    ]
