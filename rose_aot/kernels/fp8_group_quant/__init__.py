"""fp8_group_quant family: per-token-group FP8 e4m3 quantization with fp32 / UE8M0 scales."""

from .family import FP8_MAX, SCALE_LAYOUTS, Fp8GroupQuant, Fp8GroupQuantConfig

__all__ = ["Fp8GroupQuant", "Fp8GroupQuantConfig", "SCALE_LAYOUTS", "FP8_MAX"]
