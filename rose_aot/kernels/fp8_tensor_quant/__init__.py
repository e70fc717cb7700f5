"""fp8_tensor_quant family: dynamic per-tensor FP8 e4m3 quantization (one fp32 scale)."""

from .family import Fp8TensorQuant, Fp8TensorQuantConfig

__all__ = ["Fp8TensorQuant", "Fp8TensorQuantConfig"]
