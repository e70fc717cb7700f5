"""act_and_mul_fp8_quant family: SiLU/GELU-and-mul fused with FP8 per-token-group quant."""

from .family import ActAndMulFp8Quant, ActAndMulFp8QuantConfig

__all__ = ["ActAndMulFp8Quant", "ActAndMulFp8QuantConfig"]
