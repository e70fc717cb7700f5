"""Session fixture: one tiny manifest (3 points x 2 archs) built ONCE into a temporary directory.

Registered from conftest.py (``pytest_plugins``). The build is real (spawned CuTeDSL workers,
~7 s on 2 cores) and fills a cache that later builds of the same points (shards, subsets, CLI
runs) reuse, so the diff, check and shard tests compile almost nothing more. Tests copy the
bundle before changing bytes; they may add cache entries but never remove any.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["TINY_TOML", "TinyBuild", "tiny_build", "rewrite_bundle"]

TINY_TOML = """\
[deployment]
name = "tiny"
archs = ["sm_90a", "sm_100a"]

[[kernel]]
family = "rms_norm"
hidden = 1024
fused_residual = [false, true]

[[kernel]]
family = "qk_norm"
num_q_heads = 8
num_k_heads = 2
head_dim = 64
"""
TINY_JOBS = 2  # CI has 2 cores


@dataclass(frozen=True)
class TinyBuild:
    root: Path
    manifest: Path  # tiny.toml
    path: Path  # the bundle (read-only: copy before damaging)
    cache_dir: Path  # the ArtifactCache the build filled
    summary: object  # BuildSummary

    @property
    def data(self) -> bytes:
        return self.path.read_bytes()


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory) -> TinyBuild:
    from rose_aot.builder.build import ArtifactCache, build_bundle
    from rose_aot.manifest import load_manifest

    root = tmp_path_factory.mktemp("tiny-build")
    manifest = root / "tiny.toml"
    manifest.write_text(TINY_TOML, encoding="utf-8")
    summary = build_bundle(
        [load_manifest(manifest)],
        root / "tiny.rosebundle",
        jobs=TINY_JOBS,
        cache=ArtifactCache(root / "cache"),
    )
    return TinyBuild(root, manifest, summary.output, root / "cache", summary)


def rewrite_bundle(src: Path, dst: Path, edit_index=None, edit_blobs=None) -> Path:
    """Copy a bundle-format file through write_bundle, letting `edit_index(index)` and
    `edit_blobs(blobs)` change it in place: a well-formed file with other contents."""
    from rose_aot.bundle import BundleReader, write_bundle

    reader = BundleReader.open(src)
    index = reader.index
    blobs = {name: reader.blob(name) for name in reader.blob_names()}
    if edit_index:
        edit_index(index)
    if edit_blobs:
        edit_blobs(blobs)
    write_bundle(dst, index, blobs)
    return dst
