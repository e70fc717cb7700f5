"""rms_norm: RMSNorm over the hidden dimension, optionally fused with the residual add."""

from .family import RmsNorm, RmsNormConfig

__all__ = ["RmsNorm", "RmsNormConfig"]
