"""rose-aot: ahead-of-time CuTeDSL kernel bundles for LLM inference.

Serving code needs only :func:`open_bundle` (it never imports cutlass); the builder lives in
``rose_aot.builder`` and the command line in ``rose-aot``.
"""

from .errors import (
    ArgumentError,
    BuildError,
    BundleError,
    ConfigError,
    DeviceError,
    KernelNotFoundError,
    ManifestError,
    RoseAotError,
)
from .loader import KernelBundle, KernelHandle, open_bundle

__all__ = [
    "open_bundle",
    "KernelBundle",
    "KernelHandle",
    "RoseAotError",
    "ConfigError",
    "ManifestError",
    "BuildError",
    "BundleError",
    "KernelNotFoundError",
    "ArgumentError",
    "DeviceError",
]

__version__ = "0.1.0"
