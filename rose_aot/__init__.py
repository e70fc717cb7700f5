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


# check_bundle and CoverageReport come with the manifest reader (TOML) they compare against:
# imported when first named, not by every serving process's `import rose_aot`.
_LAZY = ("check_bundle", "CoverageReport")


def __getattr__(name: str):
    if name in _LAZY:
        from . import check

        return getattr(check, name)
    raise AttributeError(f"module 'rose_aot' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
