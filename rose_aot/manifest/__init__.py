"""Deployment manifests: the TOML files that say which kernel points a bundle holds."""

from __future__ import annotations

from .schema import (
    MAX_POINTS_PER_ENTRY,
    Manifest,
    Point,
    find_manifests,
    load_manifest,
    load_manifests,
    parse_manifest,
)

__all__ = [
    "Point",
    "Manifest",
    "MAX_POINTS_PER_ENTRY",
    "load_manifest",
    "parse_manifest",
    "find_manifests",
    "load_manifests",
]
