"""nvfp4_quant family: NVFP4 (e2m1 + e4m3 scale per 16 + fp32 global scale)."""

from .family import Nvfp4Quant, Nvfp4QuantConfig

__all__ = ["Nvfp4Quant", "Nvfp4QuantConfig"]
