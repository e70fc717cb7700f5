"""Timing helpers shared by the benchmark scripts (GPU machine only)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess


def bench_us(fn, rep_ms: int = 60) -> float:
    """Median GPU time of one call in µs, replayed in a CUDA graph (triton's do_bench_cudagraph)."""
    import triton.testing

    return triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median") * 1e3


def copy_bandwidth_tbs(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus written."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = bench_us(lambda: dst.copy_(src), rep_ms=200)
    return 2 * nbytes / (us * 1e-6) / 1e12


def environment() -> dict:
    import torch

    driver = "?"
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return {
        "gpu": torch.cuda.get_device_name(),
        "driver": driver,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }


def out_dir(default: str) -> str:
    path = os.environ.get("OUT") or default
    os.makedirs(path, exist_ok=True)
    return path
