"""rms_norm points of a model (``manifest from-config``): the decoder norms, plain and fused
with the residual add, plus any other RMSNorm width the architecture has."""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts

__all__ = ["derive"]

_EPS_SOURCE = ("eps", "rms_norm_eps")


def derive(model: ModelFacts) -> list[KernelEntry]:
    offset = (("weight_offset", model.weight_offset),) if model.weight_offset else ()
    entries = [
        KernelEntry(
            "rms_norm",
            (
                ("hidden", model.hidden),
                ("dtype", model.dtype),
                ("eps", model.eps),
                *offset,
                ("fused_residual", [False, True]),
            ),
            model.norm_comment + "; the fused form adds the residual first.",
            (("hidden", "hidden_size"), _EPS_SOURCE),
        )
    ]
    for width, source, comment in model.extra_norms:
        entries.append(
            KernelEntry(
                "rms_norm",
                (("hidden", width), ("dtype", model.dtype), ("eps", model.eps)),
                comment + ".",
                (("hidden", source), _EPS_SOURCE),
            )
        )
    return entries
