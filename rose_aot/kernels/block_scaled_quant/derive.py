"""block_scaled_quant points of a model (``manifest from-config``), and the reader of the
checkpoint's block-scaled format from config.json (:func:`read_block_scaled`).

Block-scaled GEMMs exist on Blackwell only, so points are derived only when the deployment
targets an sm_10x arch (they are then built for every arch of the manifest; the sm_90a build
lets an H200 test them):
- NVFP4 (ModelOpt checkpoints: ``quantization_config.quant_algo == "NVFP4"``, group size 16):
  nvfp4_quant points (its derive.py) over ``hidden_size`` (projection inputs) and over every
  gated MLP width (down projection inputs);
- MXFP4 weights (``quant_method == "mxfp4"``, gpt-oss): the expert GEMMs run MXFP4 weights
  against MXFP8 activations on Blackwell (the w4a8 path), so format mxfp8 over ``hidden_size``
  and over the expert width ``intermediate_size`` (carried in ModelFacts.moe). A w4a4 engine
  would want format mxfp4: a choice of the serving engine, not of the checkpoint.
Scales in the 128x4 swizzled layout the GEMMs read.
"""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts

__all__ = ["read_block_scaled", "block_scaled_entries", "derive"]


def read_block_scaled(view) -> str | None:
    """ModelFacts.block_scaled: "nvfp4", "mxfp8" (activations of MXFP4 weights) or None."""
    quant = view.data.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    if str(quant.get("quant_algo", "")).upper() == "NVFP4":
        group = quant.get("group_size", 16)
        if group != 16:
            view.fail("quantization_config.group_size", f"NVFP4 uses groups of 16 (got {group!r})")
        return "nvfp4"
    if quant.get("quant_method") == "mxfp4":
        return "mxfp8"
    return None


def block_scaled_entries(model: ModelFacts, family: str, fmt: str) -> list[KernelEntry]:
    """Entries of `family` (block_scaled_quant or nvfp4_quant) when the checkpoint's
    block-scaled format is `fmt` and a Blackwell arch is targeted."""
    if model.block_scaled != fmt or not any(a.startswith("sm_10") for a in model.archs):
        return []
    widths = [(model.hidden, "hidden_size", "projection inputs")]
    widths += [(d, src, f"{what} down projection inputs") for d, src, what in model.mlp_widths]
    if not model.mlp_widths and model.moe is not None:
        widths.append((model.moe.intermediate_size, "intermediate_size",
                       "expert down projection inputs"))
    fmt_field = () if family == "nvfp4_quant" else (("format", fmt),)
    out, seen = [], set()
    for width, source, what in widths:
        if width in seen:
            continue
        seen.add(width)
        out.append(
            KernelEntry(
                family,
                (("hidden", width), *fmt_field, ("dtype", model.dtype),
                 ("scale_layout", "swizzled_128x4")),
                f"{fmt} quantization of the {what} for Blackwell block-scaled GEMMs.",
                (("hidden", source),),
            )
        )
    return out


def derive(model: ModelFacts) -> list[KernelEntry]:
    return block_scaled_entries(model, "block_scaled_quant", "mxfp8")
