"""Shared fixtures. GPU tests skip cleanly where torch sees no CUDA device."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytest_plugins = ["fixtures_build", "fixtures_tiny"]


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shipped_bundle_path() -> Path:
    """The bundle of the shipped manifests, built on a CPU machine (`rose-aot build`).

    ROSE_AOT_TEST_BUNDLE overrides the path (the GPU machine gets a carried bundle)."""
    path = Path(os.environ.get("ROSE_AOT_TEST_BUNDLE", REPO / "build" / "bundle.rosebundle"))
    if not path.is_file():
        pytest.fail(f"{path} does not exist; build it first with `rose-aot build`")
    return path
