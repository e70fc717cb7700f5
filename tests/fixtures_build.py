"""Session fixture: the shipped manifests built ONCE into a temporary directory.

Registered from conftest.py with ``pytest_plugins = ["fixtures_build"]``. The build is real
(spawned CuTeDSL workers, no mocks) and takes about 10 s on 2 cores; every test that needs a
bundle of the shipped manifests shares this one, and copies it before damaging it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MANIFEST_DIR = REPO / "manifests"
BUILD_JOBS = 2  # CI has 2 cores

__all__ = ["ShippedBuild", "shipped_build", "REPO", "MANIFEST_DIR", "BUILD_JOBS"]


@dataclass(frozen=True)
class ShippedBuild:
    path: Path  # the bundle file (treat as read-only: copy it before changing bytes)
    cache_dir: Path  # the ArtifactCache the build filled
    manifests: list  # the loaded rose_aot.manifest.Manifest objects
    summary: object  # rose_aot.builder.build.BuildSummary of the build
    progress: list  # (done, total, key, arch, cached) per progress callback, in call order

    @property
    def data(self) -> bytes:
        return self.path.read_bytes()


@pytest.fixture(scope="session")
def shipped_build(tmp_path_factory) -> ShippedBuild:
    from rose_aot.builder.build import ArtifactCache, build_bundle
    from rose_aot.manifest import load_manifests

    root = tmp_path_factory.mktemp("shipped-build")
    manifests = load_manifests([MANIFEST_DIR])
    events: list = []

    def progress(done, total, result):
        events.append((done, total, result.item.key, result.item.arch, result.cached))

    summary = build_bundle(
        manifests,
        root / "shipped.rosebundle",
        jobs=BUILD_JOBS,
        cache=ArtifactCache(root / "cache"),
        progress=progress,
    )
    return ShippedBuild(summary.output, root / "cache", manifests, summary, events)
