"""Shared by the multi-GPU checks and the benchmark: process-group setup with NVLink multicast
off, a per-check watchdog, bitwise / tolerance comparisons that name the first bad element.

Run under torchrun (one process per GPU). Never imports cutlass.
"""

from __future__ import annotations

import os

# Before torch.distributed / NCCL / symmetric memory initialise, in every process, whatever the
# launcher did: NVLink multicast (NVLS) must never run on the lent machines.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import faulthandler  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Relative tolerance per dtype against max(1, |want|), where a result may legitimately differ
# (NCCL's own summation order for more than 2 ranks; rsqrt.approx and the sum-of-squares order
# in RMSNorm): about two units in the last place of the format.
TOLERANCE = {"bfloat16": 2**-7, "float16": 2**-9, "float32": 1e-5}


class CheckFailed(AssertionError):
    pass


def setup():
    """(rank, world_size, local device) with the NCCL process group initialised."""
    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
        raise SystemExit("run under torchrun (one process per GPU): see tests/multigpu/run.sh")
    local = int(os.environ["LOCAL_RANK"])
    if torch.cuda.device_count() <= local:
        raise SystemExit(f"LOCAL_RANK {local} but only {torch.cuda.device_count()} CUDA devices")
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    return dist.get_rank(), dist.get_world_size(), local


def log(rank: int, text: str) -> None:
    print(f"[rank {rank}] {text}", flush=True)


class Runner:
    """Runs named checks in the same order on every rank; a check that hangs (a kernel
    spinning on a flag that never comes) ends the process after `timeout` seconds with its
    name and every thread's stack, instead of hanging the job."""

    def __init__(self, rank: int, timeout: float = 240.0):
        self.rank = rank
        self.timeout = timeout
        self.results: list[tuple[str, str, float, str]] = []

    def _watchdog(self, name: str):
        def fire():
            log(self.rank, f"FAIL {name}: TIMEOUT after {self.timeout:.0f} s (a kernel or a "
                           f"collective hangs); stacks follow")
            faulthandler.dump_traceback(all_threads=True)
            sys.stdout.flush()
            os._exit(3)

        timer = threading.Timer(self.timeout, fire)
        timer.daemon = True
        timer.start()
        return timer

    def run(self, name: str, fn, *args, **kwargs):
        start = time.perf_counter()
        timer = self._watchdog(name)
        status, detail, value = "PASS", "", None
        try:
            value = fn(*args, **kwargs)
            if isinstance(value, str) and value:
                detail = value
        except CheckFailed as exc:
            status, detail = "FAIL", str(exc)
        except Exception as exc:  # noqa: BLE001 - every error is a failed check, reported
            status = "FAIL"
            detail = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        finally:
            timer.cancel()
        seconds = time.perf_counter() - start
        self.results.append((name, status, seconds, detail))
        log(self.rank, f"{status} {name} ({seconds:.2f} s){': ' + detail if detail else ''}")
        return value

    def failures(self) -> list[str]:
        return [name for name, status, _, _ in self.results if status != "PASS"]


def bits(t):
    """The raw bits of a float tensor (NaN-safe bitwise comparison)."""
    import torch

    return t.contiguous().view(
        {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def bitwise_problem(what: str, got, want) -> str | None:
    """None if `got` and `want` are bitwise equal, else a message naming the first mismatch."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{what}: shape/dtype {tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} {want.dtype}"
    diff = bits(got) != bits(want)
    count = int(diff.sum().item())
    if not count:
        return None
    first = diff.reshape(-1).nonzero()[0].item()
    g, w = got.reshape(-1)[first].item(), want.reshape(-1)[first].item()
    return (f"{what}: {count} of {got.numel()} elements differ bitwise; first at flat index "
            f"{first}: got {g!r}, want {w!r}")


def close_problem(what: str, got, want, dtype_name: str, steps: int = 1) -> str | None:
    """None if |got - want| <= steps * tol * max(1, |want|) everywhere (and no NaN), else a
    message. `steps`: the roundings to the dtype between the kernel and the float64 reference."""
    import torch

    g, w = got.double(), want.double()
    if torch.isnan(g).any():
        first = torch.isnan(g).reshape(-1).nonzero()[0].item()
        return f"{what}: NaN in the output (unwritten element?) at flat index {first}"
    err = (g - w).abs() / w.abs().clamp(min=1.0)
    tol = TOLERANCE[dtype_name] * steps
    if (err > tol).any():
        first = (err > tol).reshape(-1).nonzero()[0].item()
        return (f"{what}: max relative error {err.max().item():.3g} > {tol:.3g}; first at flat "
                f"index {first}: got {g.reshape(-1)[first].item()}, want "
                f"{w.reshape(-1)[first].item()}")
    return None


def gather(t):
    """Every rank's copy of `t` (NCCL all_gather), as a list in rank order."""
    import torch
    import torch.distributed as dist

    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return out


def no_cutlass_loaded() -> str | None:
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("cutlass", "cutlass_dsl"))
    return f"cutlass modules were imported: {loaded[:5]}" if loaded else None
