"""pytest entry of the multi-GPU checks: runs tests/multigpu/run.sh (torchrun, one process per
GPU) and fails with its output unless every check passed on every rank. Skipped without two
CUDA devices or without ROSE_AOT_TEST_BUNDLE."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]

HERE = Path(__file__).resolve().parent


def _devices() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        return 0


@pytest.mark.skipif(_devices() < 2, reason="needs 2 CUDA devices")
@pytest.mark.skipif(not os.environ.get("ROSE_AOT_TEST_BUNDLE"), reason="needs ROSE_AOT_TEST_BUNDLE")
def test_all_reduce_on_two_gpus():
    _run_checks()


@pytest.mark.skipif(_devices() < 2, reason="needs 2 CUDA devices")
@pytest.mark.skipif(not os.environ.get("ROSE_AOT_TEST_BUNDLE"), reason="needs ROSE_AOT_TEST_BUNDLE")
def test_expert_parallel_moe_on_two_gpus():
    _run_checks("--ep")


def _run_checks(*flags):
    env = {**os.environ, "NPROC": "2", "PYTHON": sys.executable}
    result = subprocess.run(["bash", str(HERE / "run.sh"), *flags], capture_output=True,
                            text=True, env=env, timeout=1200)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-20000:]
    assert "FAIL" not in result.stdout, output[-20000:]
    assert result.stdout.count("SUMMARY:") == 2, output[-20000:]
