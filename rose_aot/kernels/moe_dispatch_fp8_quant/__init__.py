"""moe_dispatch_fp8_quant family: MoE dispatch with on-the-fly FP8 per-token-group quantization."""

from .family import MoeDispatchFp8Quant, MoeDispatchFp8QuantConfig

__all__ = ["MoeDispatchFp8Quant", "MoeDispatchFp8QuantConfig"]
