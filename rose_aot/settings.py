"""Settings read from the environment, in one typed place. Reading them has no side effects."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "default_jobs", "pdl_enabled", "DEFAULT_OUTPUT_DIR", "DEFAULT_MANIFEST_DIR"]

DEFAULT_OUTPUT_DIR = Path("build")
DEFAULT_MANIFEST_DIR = Path("manifests")


def cache_dir() -> Path:
    """ROSE_AOT_CACHE_DIR, else $XDG_CACHE_HOME/rose-aot, else ~/.cache/rose-aot."""
    if value := os.environ.get("ROSE_AOT_CACHE_DIR"):
        return Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rose-aot"


def default_jobs() -> int:
    """ROSE_AOT_JOBS, else the number of CPUs this process may use."""
    if value := os.environ.get("ROSE_AOT_JOBS"):
        return max(1, int(value))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def pdl_enabled() -> bool:
    """ROSE_AOT_PDL=0 launches every kernel without programmatic dependent launch (for A/B
    measurements and for drivers that mishandle it); default on for variants that record it."""
    return os.environ.get("ROSE_AOT_PDL", "1").strip().lower() not in ("0", "false", "no", "off")
