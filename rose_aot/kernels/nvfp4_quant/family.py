"""nvfp4_quant: NVFP4 quantization, e2m1 data packed two per byte with an e4m3 scale per 16
elements, times a fp32 global scale read from a one-element tensor.

The NVFP4 member of the block-scaled formats, in its own family because its argument list has
the global scale (one family, one signature): definitions, layouts, work split and device code
are block_scaled_quant's (see block_scaled_quant/family.py):

  s = fp32(fp32(absmax * g) / 6); scale = e4m3(s) (nearest even, saturating);
  data = e2m1(fp32(x * fp32(g / scale))), +-0 where the scale is 0 (the block's factor, exact
  for 2^-100 <= g <= 2^100: g = 448 * 6 / amax for any tensor amax from 2^-88 to 2^111).

Arguments: x [tokens, hidden], global_scale [1] fp32, q [tokens, hidden/2] float4_e2m1fn_x2,
scales float8_e4m3fn ([rows_padded, groups_padded] swizzled_128x4, or [tokens, hidden/16]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..base import choice
from ..block_scaled_quant.family import BlockScaledQuant

__all__ = ["Nvfp4QuantConfig", "Nvfp4Quant"]


@dataclass(frozen=True)
class Nvfp4QuantConfig:
    hidden: int
    dtype: str = choice("bfloat16", "float16", default="bfloat16", doc="input dtype")
    scale_layout: str = choice("swizzled_128x4", "row_major", default="swizzled_128x4",
                               doc="layout of the scales")
    format: ClassVar[str] = "nvfp4"  # not a field: read by the shared device code and reference


class Nvfp4Quant(BlockScaledQuant):
    name = "nvfp4_quant"
    Config = Nvfp4QuantConfig
    device_module = "rose_aot.kernels.nvfp4_quant.device"
    shape_fields = ("hidden",)

