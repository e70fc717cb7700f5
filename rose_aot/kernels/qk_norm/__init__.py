"""qk_norm: per-head RMSNorm of Q and K in one launch."""

from .family import QkNorm, QkNormConfig

__all__ = ["QkNorm", "QkNormConfig"]
