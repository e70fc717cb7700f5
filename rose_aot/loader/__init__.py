"""The serving-side loader: opens a bundle and launches its kernels through cuda-python.

Never imports cutlass and never compiles.
"""

from .runtime import KernelBundle, KernelHandle, open_bundle

__all__ = ["KernelBundle", "KernelHandle", "open_bundle"]
