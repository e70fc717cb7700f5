"""CuTeDSL device code of nvfp4_quant: block_scaled_quant's kernel with format nvfp4."""

from __future__ import annotations

from ..block_scaled_quant.device import host_function

__all__ = ["host_function"]
