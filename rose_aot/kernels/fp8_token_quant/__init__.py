"""fp8_token_quant family: dynamic per-token FP8 e4m3 quantization (one fp32 scale per token)."""

from .family import Fp8TokenQuant, Fp8TokenQuantConfig

__all__ = ["Fp8TokenQuant", "Fp8TokenQuantConfig"]
