"""rose-aot: ahead-of-time CuTeDSL kernel bundles for LLM inference.

Serving code needs only :func:`open_bundle` (it never imports cutlass) and, to refuse traffic
with a bundle that lacks a point, :func:`check_bundle`; the builder lives in ``rose_aot.builder``
and the command line in ``rose-aot``.
"""

from .errors import (
    ArgumentError,
    BuildError,
    BundleError,
    ConfigError,
    CoverageError,
    DeviceError,
    KernelNotFoundError,
    ManifestError,
    RoseAotError,
    ShardError,
)
from .loader import KernelBundle, KernelHandle, open_bundle
from .check import CoverageReport, check_bundle  # noqa: E402  (after the loader it names)

__all__ = [
    "open_bundle",
    "KernelBundle",
    "KernelHandle",
    "check_bundle",
    "CoverageReport",
    "RoseAotError",
    "ConfigError",
    "ManifestError",
    "BuildError",
    "BundleError",
    "ShardError",
    "CoverageError",
    "KernelNotFoundError",
    "ArgumentError",
    "DeviceError",
]

__version__ = "0.1.0"
