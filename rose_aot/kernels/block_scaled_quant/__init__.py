"""block_scaled_quant family: MXFP8, MXFP4 and NVFP4 quantization with 128x4 swizzled scales."""

from .family import BLOCK, FORMATS, BlockScaledQuant, BlockScaledQuantConfig

__all__ = ["BlockScaledQuant", "BlockScaledQuantConfig", "FORMATS", "BLOCK"]
