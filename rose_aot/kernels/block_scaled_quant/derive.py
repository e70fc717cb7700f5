"""Manifest entries of block_scaled_quant derived from a config.json.

Block-scaled GEMMs exist on Blackwell only, so points are derived only when the deployment
targets an sm_10x arch (they are still built for every arch of the manifest; the sm_90a build
lets an H200 test them):
- NVFP4 (ModelOpt checkpoints: ``quantization_config.quant_algo == "NVFP4"``, group size 16):
  format nvfp4 over ``hidden_size`` (projection inputs) and over every gated MLP width of
  act_and_mul's derivation (down projection inputs);
- MXFP4 weights (``quant_method == "mxfp4"``, gpt-oss): the expert GEMMs run MXFP4 weights
  against MXFP8 activations on Blackwell (the w4a8 path), so format mxfp8 over ``hidden_size``
  and over the expert width ``intermediate_size``. (A w4a4 engine would want format mxfp4:
  a choice of the serving engine, not of the checkpoint.)
Scales in the 128x4 swizzled layout the GEMMs read. `view` as in act_and_mul/derive.py.
"""

from __future__ import annotations

from ..act_and_mul.derive import mlp_widths

__all__ = ["derive"]


def _format(view) -> str | None:
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


def derive(view, *, architecture: str, tp: int = 1, dtype: str = "bfloat16", archs=()) -> list:
    """block_scaled_quant entries (manifest.from_config.KernelEntry) for this model."""
    from ...manifest.from_config import KernelEntry

    if not any(a.startswith("sm_10") for a in archs):
        return []
    fmt = _format(view)
    if fmt is None:
        return []
    hidden = view.int("hidden_size", "the block-scaled activation quantization")
    widths = [(hidden, "hidden_size", "projection inputs")]
    if architecture == "GptOssForCausalLM":
        widths.append((view.int("intermediate_size", "the expert activation quantization"),
                       "intermediate_size", "expert down projection inputs"))
    else:
        widths += [(d, src, f"{what} down projection inputs")
                   for d, src, what in mlp_widths(view, architecture, tp)]
    block = 16 if fmt == "nvfp4" else 32
    out = []
    for width, source, what in widths:
        if width % block:
            view.fail(source, f"{width} is not a multiple of the {fmt} block {block}")
        if any(dict(e.fields)["hidden"] == width for e in out):
            continue
        out.append(
            KernelEntry(
                "block_scaled_quant",
                (("hidden", width), ("format", fmt), ("dtype", dtype),
                 ("scale_layout", "swizzled_128x4")),
                f"{fmt} quantization of the {what} for Blackwell block-scaled GEMMs.",
                (("hidden", source), ("format", "quantization_config")),
            )
        )
    return out
