"""Float64/float32 reference of nvfp4_quant: block_scaled_quant's, with format nvfp4."""

from __future__ import annotations

from ..block_scaled_quant.reference import reference

__all__ = ["reference"]
