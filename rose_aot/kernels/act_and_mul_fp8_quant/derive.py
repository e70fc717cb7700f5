"""Manifest entries of act_and_mul_fp8_quant: see fp8_group_quant/derive.py (derive_fused)."""

from __future__ import annotations

from ..fp8_group_quant.derive import derive_fused as derive

__all__ = ["derive"]
