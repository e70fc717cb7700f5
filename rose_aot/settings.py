"""Settings read from the environment, in one typed place. Reading them has no side effects."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "cache_dir",
    "default_jobs",
    "max_manifest_points",
    "max_build_items",
    "fuzz_examples",
    "debug",
    "pdl_enabled",
    "DEFAULT_OUTPUT_DIR",
    "DEFAULT_MANIFEST_DIR",
    "MAX_MANIFEST_POINTS",
    "MAX_BUILD_ITEMS",
]

DEFAULT_OUTPUT_DIR = Path("build")
DEFAULT_MANIFEST_DIR = Path("manifests")
# A deployment uses a handful of points; past these a manifest is a typo (lists multiplied out)
# or hostile, and would compile for hours. Raise them with the environment variables below.
MAX_MANIFEST_POINTS = 4096  # distinct points of one manifest
MAX_BUILD_ITEMS = 16384  # distinct (point, arch) items of one build (all its manifests)


def _int_env(name: str, default: int, minimum: int = 1) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        number = int(value.strip())
    except ValueError:
        number = None
    if number is None or number < minimum:
        from .errors import SettingsError

        raise SettingsError(
            f"{name}={value[:40]!r} is not an integer >= {minimum}; set it to a number "
            "or unset it"
        )
    return number


def max_manifest_points() -> int:
    """ROSE_AOT_MAX_MANIFEST_POINTS, else MAX_MANIFEST_POINTS."""
    return _int_env("ROSE_AOT_MAX_MANIFEST_POINTS", MAX_MANIFEST_POINTS)


def max_build_items() -> int:
    """ROSE_AOT_MAX_BUILD_ITEMS, else MAX_BUILD_ITEMS."""
    return _int_env("ROSE_AOT_MAX_BUILD_ITEMS", MAX_BUILD_ITEMS)


def fuzz_examples(default: int) -> int:
    """ROSE_AOT_FUZZ_EXAMPLES (the test suite's fuzz cases per target), else `default`."""
    return _int_env("ROSE_AOT_FUZZ_EXAMPLES", default)


def debug() -> bool:
    """ROSE_AOT_DEBUG=1: the command line shows the traceback of an unexpected error."""
    return os.environ.get("ROSE_AOT_DEBUG", "") not in ("", "0")


def cache_dir() -> Path:
    """ROSE_AOT_CACHE_DIR, else $XDG_CACHE_HOME/rose-aot, else ~/.cache/rose-aot."""
    if value := os.environ.get("ROSE_AOT_CACHE_DIR"):
        return Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rose-aot"


def default_jobs() -> int:
    """ROSE_AOT_JOBS, else the number of CPUs this process may use."""
    if os.environ.get("ROSE_AOT_JOBS"):
        return max(1, _int_env("ROSE_AOT_JOBS", 1, minimum=0))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def pdl_enabled() -> bool:
    """ROSE_AOT_PDL=0 launches every kernel without programmatic dependent launch (for A/B
    measurements and for drivers that mishandle it); default on for variants that record it."""
    return os.environ.get("ROSE_AOT_PDL", "1").strip().lower() not in ("0", "false", "no", "off")
