"""all_reduce points of a model (``manifest from-config --tp N``): the tensor-parallel sum of
the attention and MLP outputs, plain and fused with the next residual add + RMSNorm."""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts
from .family import MAX_RANKS

__all__ = ["derive"]

_FLOATS = ("bfloat16", "float16", "float32")


def derive(model: ModelFacts) -> list[KernelEntry]:
    # One rank needs no all-reduce; more than MAX_RANKS ranks span nodes (not NVLink peers).
    if not 2 <= model.tp <= MAX_RANKS or model.dtype not in _FLOATS:
        return []
    offset = (("weight_offset", model.weight_offset),) if model.weight_offset else ()
    entries = [
        KernelEntry(
            "all_reduce",
            (("world_size", model.tp), ("dtype", model.dtype)),
            f"tensor-parallel sum over {model.tp} ranks (o_proj, down_proj outputs; any size).",
        ),
        KernelEntry(
            "all_reduce",
            (
                ("world_size", model.tp),
                ("dtype", model.dtype),
                ("fusion", "residual_rms_norm"),
                ("hidden", model.hidden),
                ("eps", model.eps),
                *offset,
            ),
            "decode layer end in one launch: all-reduce + residual add + the next RMSNorm.",
            (("hidden", "hidden_size"), ("eps", "rms_norm_eps")),
        ),
    ]
    moe = model.moe
    if moe is not None and model.dtype in ("bfloat16", "float16"):
        entries.append(
            KernelEntry(
                "all_reduce",
                (
                    ("world_size", model.tp),
                    ("dtype", model.dtype),
                    ("fusion", "moe_combine"),
                    ("hidden", moe.hidden),
                    ("top_k", moe.top_k),
                ),
                "tensor-parallel MoE decode: each rank's expert combine + the all-reduce in one "
                "launch (prefill: moe_combine, then the plain all-reduce).",
                (("hidden", "hidden_size"),),
            )
        )
    return entries
