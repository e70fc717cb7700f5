"""Timing helpers shared by the benchmark scripts (GPU machine only)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import stat
import subprocess
import sys


def multigpu_common():
    """tests/multigpu/common.py (process-group setup with NVLink multicast off, logging), loaded
    by path for the multi-GPU benchmarks: it has this module's name."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "multigpu",
                        "common.py")
    spec = importlib.util.spec_from_file_location("rose_multigpu_common", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # sets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1
    return module


def config_fields(items: list[str], error) -> dict:
    """FIELD=VALUE command-line arguments as a config dict: ints, floats and booleans as such,
    else the string (the family's own checks then refuse what does not fit); `error(message)`
    (an argparse parser's) for an item that is not FIELD=VALUE."""
    fields = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            error(f"a config field is FIELD=VALUE, got {item!r}")
        fields[name] = {"true": True, "false": False}.get(text.lower(), text)
        for kind in (int, float):
            try:
                fields[name] = kind(text)
                break
            except ValueError:
                pass
    return fields


def int_list(text: str) -> list[int]:
    """argparse type of a comma-separated list of positive integers ("1,128,8192")."""
    import argparse

    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers")
    return values


def file_label(stem: str):
    """argparse type of a --label that names output files STEM-LABEL.*: a plain file-name part
    (no folder, no leading dot), so that a label never writes outside the output folder."""
    import argparse
    import re

    def check(text: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", text):
            raise argparse.ArgumentTypeError(
                f"{text!r}: use letters, digits, '.', '_' and '-' (it names {stem}-LABEL.json)")
        return text

    return check


def bundle_points(path: str) -> tuple[list[dict], str]:
    """(the points of the bundle's index, "") or ([], why it cannot be read): read on the CPU,
    so that a script given the wrong bundle stops before any GPU work."""
    from rose_aot.bundle import BundleReader
    from rose_aot.errors import RoseAotError

    try:
        return BundleReader.open(path).index["points"], ""
    except RoseAotError as exc:
        return [], f"not a readable bundle ({exc})"


# Set once cuCtxResetPersistingL2Cache reports that the GPU has no L2 persistence to reset.
_L2_RESET_UNSUPPORTED = False


def missing_points(path: str, family: str, fields: tuple[str, ...], wanted, *,
                   keep=None, what: str | None = None) -> str:
    """What the bundle at `path` lacks of `wanted` (tuples of the values of config `fields`) among
    its `family` points, those `keep(config)` accepts ("" if nothing): read from its index on
    the CPU, so that an A/B script refuses a bundle before it costs device time."""
    points, unreadable = bundle_points(path)
    if unreadable:
        return unreadable
    have = {tuple(p["config"][f] for f in fields) for p in points
            if p["family"] == family and (keep is None or keep(p["config"]))}
    lack = sorted(w for w in set(wanted) if w not in have)
    if not lack:
        return ""
    return (f"no {what or family} point of ({', '.join(fields)}) "
            f"{', '.join(str(w) for w in lack)}; it has {sorted(have) or 'none'}")


def refuse_missing_points(parser, labelled, family: str, fields: tuple[str, ...], wanted, *,
                          keep=None, what: str | None = None) -> None:
    """An A/B script's check of its (label, path) bundles: the first that lacks a point of
    `wanted` (missing_points) ends the script with one argparse error naming it."""
    for label, path in labelled:
        lacking = missing_points(path, family, fields, wanted, keep=keep, what=what)
        if lacking:
            parser.error(f"{label}={path}: {lacking}")


def preloaded_bundles(labelled) -> dict:
    """{label: the bundle at path, opened and preloaded on the current device} for an A/B's
    (label, path) pairs."""
    from rose_aot import open_bundle

    bundles = {}
    for label, path in labelled:
        bundles[label] = open_bundle(path)
        bundles[label].preload()
    return bundles


def median_in_rounds(runs: dict, rounds: int, rep_ms: int = 30) -> dict[str, float]:
    """Each run's median CUDA-graph time (µs) over `rounds` rounds, the runs timed in turn and in
    the reverse order every other round (an A/B in one process)."""
    import statistics

    times = {k: [] for k in runs}
    for rnd in range(rounds):
        for k in (list(runs) if rnd % 2 == 0 else list(runs)[::-1]):
            times[k].append(bench_us(runs[k], rep_ms=rep_ms))
    return {k: statistics.median(v) for k, v in times.items()}


def print_medians(prefix: str, runs: dict, rounds: int, suffix: str = "") -> None:
    """One line of an A/B script: `prefix`, each run's median_in_rounds time as LABEL=µs, then
    `suffix`."""
    times = median_in_rounds(runs, rounds)
    line = " ".join(f"{label}={us:8.2f}" for label, us in times.items())
    print(f"{prefix} {line}{suffix}", flush=True)


def reset_l2_priorities() -> None:
    """Return every L2 line that an earlier kernel kept with an evict_last hint (PTX createpolicy,
    Triton's eviction_policy="evict_last", rose-aot's hinted variants) to normal priority
    (cuCtxResetPersistingL2Cache). Such lines outlive the kernel that marked them: on the H200 one
    call of rms_norm's hinted variant on the same tensors made every later kernel on them 4-7%
    faster at 8192 tokens of hidden 2048-4096, rose-aot's and Liger's alike (2048 plain: 17.98 ->
    17.26 µs, Liger 19.66 -> 18.24; benchmarks/results/norm-narrow-hints-call8-probe-h200.log),
    so without the reset a figure depended on which peer ran before it."""
    import torch
    from rose_aot.loader import driver

    global _L2_RESET_UNSUPPORTED
    if _L2_RESET_UNSUPPORTED:
        return
    torch.cuda.synchronize()
    driver.make_primary_context_current(torch.cuda.current_device())
    cu = driver.driver()
    result = cu.cuCtxResetPersistingL2Cache()
    if result[0] == cu.CUresult.CUDA_ERROR_NOT_SUPPORTED:  # a GPU without L2 persistence
        _L2_RESET_UNSUPPORTED = True
        print("benchmarks: this GPU does not support cuCtxResetPersistingL2Cache; timings "
              "start from the L2 as earlier kernels left it", file=sys.stderr, flush=True)
        return
    driver.check(result, "cuCtxResetPersistingL2Cache")


def bench_us(fn, rep_ms: int = 60, reset_l2: bool = True) -> float:
    """Median GPU time of one call in µs, replayed in a CUDA graph (triton's do_bench_cudagraph).
    With `reset_l2` (the default), from an L2 whose lines no earlier kernel kept with an
    evict_last hint (reset_l2_priorities): the kernel's own hints count, its predecessors' not."""
    import triton.testing

    if reset_l2:
        reset_l2_priorities()
    return triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median") * 1e3


def compile_per_shape(fn):
    """torch.compile(fn) specialised to every shape it sees (dynamic=False), the peer's best
    case. By default dynamo recompiles a function seen at a second shape into one dynamic-shape
    kernel, which on these benchmarks' later shapes was up to 27x slower than the static one;
    the recompile limits are raised so that no shape falls back to eager."""
    import torch
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 4096)
    return torch.compile(fn, dynamic=False)


def copy_bandwidth_tbs(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus written.

    Timed with CUDA events around `iters` back-to-back copies (median of 5): a copy this large
    needs no graph, and do_bench_cudagraph reported ~2.7 TB/s for it, below what our own
    kernels reach, so it is not used here.
    """
    import statistics

    import torch

    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    samples = []
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e-3 / iters)
    return 2 * nbytes / statistics.median(samples) / 1e12


def environment() -> dict:
    import torch

    driver = "?"
    try:
        lines = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=True,
        ).stdout.split()
        driver = lines[0] if lines else "?"  # one line per GPU: all run one driver
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


def check_out(parser, out: str | None) -> None:
    """A probe's --out, checked before any run: a file in an existing, writable folder, else
    parser.error (one line, exit 2) instead of a traceback after minutes of measuring."""
    if out is None:
        return
    folder = os.path.dirname(os.path.abspath(out))
    if os.path.isdir(out) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        parser.error(f"--out {out!r} is not a file that can be written")


def write_rows(rows: list[dict], out: str | None, payload: dict, as_json: bool) -> bool:
    """A probe's --out and --json: {**payload, "rows": rows} written to `out` when given, the
    rows printed as JSON when `as_json`. True when printed (the caller prints no table)."""
    if out:
        with open(out, "w") as f:
            json.dump({**payload, "rows": rows}, f, indent=2)
    if as_json:
        print(json.dumps(rows, indent=2))
    return as_json


def shape_order(shape: str) -> list[tuple]:
    """Sort key of a benchmark shape such as "silu/2048" or "32/8/128": its "/"-separated parts,
    numbers compared as numbers (so 2048 comes before 14336)."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in shape.split("/")]


def plot_families(rows: list[dict], out: str, suffix: str = "") -> list[str]:
    """One PNG per family (`<family><suffix>.png` in `out`): per shape (in `shape_order`) a
    log-log panel of µs per call against tokens, one line per implementation (points where it
    ran). `rows` are the benchmarks' rows ({"family", "shape", "tokens", "us": {impl: µs}}).
    Returns the files written; none, with a note, when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        print("NOTE: matplotlib not installed; no plots", flush=True)
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for family in sorted({r["family"] for r in rows}):
        fam = [r for r in rows if r["family"] == family]
        shapes = sorted({r["shape"] for r in fam}, key=shape_order)
        fig, axes = plt.subplots(1, len(shapes), figsize=(4.5 * len(shapes), 4), squeeze=False)
        for ax, shape in zip(axes[0], shapes):
            pts = sorted((r for r in fam if r["shape"] == shape), key=lambda r: r["tokens"])
            impls = list(dict.fromkeys(k for p in pts for k in p["us"]))
            for impl in impls:
                have = [p for p in pts if impl in p["us"]]
                ax.plot([p["tokens"] for p in have], [p["us"][impl] for p in have], "o-",
                        label=impl)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("tokens")
            ax.set_ylabel("µs per call (CUDA graph, median)")
            ax.set_title(f"{family} {shape}")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out, f"{family}{suffix}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def check_rows(rows: list[dict], copy_tbs: float) -> None:
    """ValueError, in words, unless `rows` and `copy_tbs` are a bench_act_quant.py result's:
    every row with its family, shape, tokens, bytes and a positive rose_aot time."""
    if not isinstance(rows, list) or not rows:
        raise ValueError("no benchmark rows")
    if not isinstance(copy_tbs, (int, float)) or not copy_tbs > 0:
        raise ValueError(f"copy bandwidth must be a positive number (got {copy_tbs!r})")
    for i, r in enumerate(rows):
        missing = [k for k in ("family", "shape", "tokens", "bytes", "us") if k not in r]
        if missing:
            raise ValueError(f"row {i} lacks {', '.join(missing)}")
        ours = r["us"].get("rose_aot") if isinstance(r["us"], dict) else None
        if not isinstance(ours, (int, float)) or not ours > 0:
            raise ValueError(f"row {i}: rose_aot time must be a positive number (got {ours!r})")


RESULT_MAX_BYTES = 64 << 20


def read_result(path: str) -> dict:
    """A bench_act_quant.py result read from `path`, its rows checked (check_rows); OSError or
    ValueError, in words, otherwise. Only a regular file of at most RESULT_MAX_BYTES is read (a
    device such as /dev/zero would never end)."""
    with open(path, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError("not a regular file")
        text = f.read(RESULT_MAX_BYTES + 1)
    if len(text) > RESULT_MAX_BYTES:
        raise ValueError(f"larger than {RESULT_MAX_BYTES} bytes, more than any result")
    data = json.loads(text)
    if not isinstance(data, dict) or not {"rows", "copy_tbs"} <= data.keys():
        raise ValueError("not a bench_act_quant.py result (no 'rows' and 'copy_tbs')")
    check_rows(data["rows"], data["copy_tbs"])
    return data


def summary_table(rows: list[dict], copy_tbs: float) -> str:
    """The compact table of benchmark rows (docs/results-act-quant.md): per (family, shape), the
    plan's µs at each token count with its speed-up over torch.compile in brackets (where it
    ran), then the share of the copy bandwidth at 8192 and 32768 tokens (where measured)."""
    check_rows(rows, copy_tbs)
    tokens = sorted({r["tokens"] for r in rows})
    groups: dict[tuple, dict] = {}
    for r in rows:
        groups.setdefault((r["family"], r["shape"]), {})[r["tokens"]] = r
    head = "| kernel | shape | " + " | ".join(f"{t} tok µs" for t in tokens)
    big = [t for t in (8192, 32768) if t in tokens]
    if big:
        head += " | % copy at " + " / ".join(str(t) for t in big)
    head += " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for (family, shape), by_tokens in sorted(groups.items(),
                                             key=lambda kv: (kv[0][0], shape_order(kv[0][1]))):
        cells = []
        for t in tokens:
            r = by_tokens.get(t)
            if r is None:
                cells.append("-")
                continue
            ours = r["us"]["rose_aot"]
            peer = r["us"].get("torch_compile")
            cells.append(f"{ours:.2f}" + (f" ({peer / ours:.2f}x)" if peer else ""))
        line = f"| {family} | {shape} | " + " | ".join(cells)
        if big:
            shares = []
            for t in big:
                r = by_tokens.get(t)
                shares.append("-" if r is None else
                              f"{100 * r['bytes'] / (r['us']['rose_aot'] * 1e-6) / 1e12 / copy_tbs:.0f}%")
            line += " | " + " / ".join(shares)
        lines.append(line + " |")
    return "\n".join(lines)
