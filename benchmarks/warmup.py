"""Warmup cost per shipped model: rose-aot bundle vs the CuTeDSL JIT path for the same points.

Two halves, because the two paths run on different machines (exactly the production split):

  # build machine (CPU, CuTeDSL installed): per-model bundles, their build reports (compile
  # seconds per point), and the DSL's import time, measured in fresh processes
  python benchmarks/warmup.py build-side build/models manifests/*.toml

  # GPU machine (no CuTeDSL): per model, in fresh processes: import rose_aot (torch already
  # imported, as in a serving engine; from .pyc files, which the script writes first, as an
  # install does: byte_compile), the driver binding (cuda.bindings import + cuInit: once
  # per process, reported apart), open + verify the bundle, preload every kernel (which
  # verifies each cubin before it loads it: open_bundle checks artifacts at their first load)
  python benchmarks/warmup.py gpu-side build/models

  # any machine (no GPU needed): per model, in fresh processes: open + verify the bundle, the
  # CPU side of a preload (every artifact of the arch verified as a load would take it:
  # KernelBundle.check_artifacts), and a handle per point; the part of the GPU side's figures
  # that is not the driver's
  python benchmarks/warmup.py cpu-side build/models

The GPU side prints a markdown table and writes warmup.json to $OUT (or benchmarks/results):
medians of 5 cold processes per model, measured in rounds (each round one process per model,
so a slow spell of the host touches every model alike; warmup.json is rewritten after each
round, the table printed at the end); the JIT column is the DSL import plus the compile
seconds of the model's sm_90a points from its build report (what a replica pays at every start
without AOT).
The CPU side prints its table only.

ROSE_WARMUP_PRELOAD_THREADS=1,4 (a list of positive integers; default: preload()'s own choice,
see rose_aot.loader.runtime.PRELOAD_THREADS, on the GPU side and 1 on the CPU side) measures each
model with each preload thread count, alternating them over the cold processes, one row per
(model, threads); both sides.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

_repeats = os.environ.get("ROSE_WARMUP_REPEATS", "5")  # cold processes per model
if not _repeats.isdigit() or int(_repeats) < 1:
    sys.exit(f"ROSE_WARMUP_REPEATS must be a positive integer (got {_repeats!r})")
REPEATS = int(_repeats)
# ROSE_WARMUP_CONTEXT_FIRST=1: each probe creates its CUDA context before the clock starts, so
# preload_ms excludes it (the context's own cost is reported as context_ms). Off by default:
# the 2026-11-30 figures in docs/results-serving.md were measured with the context inside
# preload.
_context_first = os.environ.get("ROSE_WARMUP_CONTEXT_FIRST", "0")
if _context_first not in ("0", "1"):
    sys.exit(f"ROSE_WARMUP_CONTEXT_FIRST must be 0 or 1 (got {_context_first!r})")
CONTEXT_FIRST = _context_first == "1"
# ROSE_WARMUP_PRELOAD_THREADS: preload's thread counts to measure; "" = preload's default.
_threads = os.environ.get("ROSE_WARMUP_PRELOAD_THREADS", "")
PRELOAD_THREADS = [t.strip() for t in _threads.split(",")] if _threads.strip() else [""]
if not all(t.isdigit() and int(t) >= 1 for t in PRELOAD_THREADS if t):
    sys.exit("ROSE_WARMUP_PRELOAD_THREADS must be a comma-separated list of positive integers "
             f"(got {_threads!r})")

_GPU_PROBE = r"""
import json, sys, time
import torch
torch.cuda.init()
context_ms = None
if sys.argv[2] == "1":  # create the CUDA context before the clock (a serving process has one)
    tc = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    context_ms = (time.perf_counter() - tc) * 1e3
t0 = time.perf_counter()
import rose_aot
t1 = time.perf_counter()
# Once per process, not per model: import cuda.bindings' driver module and cuInit (the loader
# does it on first use, inside the first preload, unless the process already has).
from rose_aot.loader import driver
driver.driver()
tb = time.perf_counter()
threads = int(sys.argv[3]) if sys.argv[3] else None  # None: preload()'s own default
bundle = rose_aot.open_bundle(sys.argv[1])
t2 = time.perf_counter()
kernels = bundle.preload(0, threads=threads)
torch.cuda.synchronize()
t3 = time.perf_counter()
assert "cutlass" not in sys.modules
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "driver_binding_ms": (tb - t1) * 1e3,
                  "open_verify_ms": (t2 - tb) * 1e3, "preload_ms": (t3 - t2) * 1e3,
                  "kernels": kernels, "context_ms": context_ms,
                  "threads": threads or "default"}))
"""

_CPU_PROBE = r"""
import json, sys, time
import torch
import rose_aot
arch = sys.argv[2]
# The calling thread alone unless told: preload's helper thread pays off only next to the
# driver's loads, and here there are none.
threads = int(sys.argv[3]) if sys.argv[3] else 1
t0 = time.perf_counter()
bundle = rose_aot.open_bundle(sys.argv[1])
t1 = time.perf_counter()
bundle.check_artifacts(arch, threads=threads)  # preload's verification, minus the driver
t2 = time.perf_counter()
handles = [bundle.handle(key) for key in bundle.points(arch)]
t3 = time.perf_counter()
kernels = sum(len(v.entries) for key in bundle.points(arch) for v in bundle.record(key, arch).variants)
assert "cutlass" not in sys.modules
print(json.dumps({"open_verify_ms": (t1 - t0) * 1e3, "preload_cpu_ms": (t2 - t1) * 1e3,
                  "handles_ms": (t3 - t2) * 1e3, "kernels": kernels, "handles": len(handles),
                  "threads": threads}))
"""

_DSL_IMPORT_PROBE = r"""
import time
t0 = time.perf_counter()
import cutlass.cute
print((time.perf_counter() - t0) * 1e3)
"""


def _run(what: str, argv: list[str], capture: bool = True) -> str:
    """Run one step in its own process; a failure ends the script with one line naming the
    step and the last line the process printed (no traceback of the parent)."""
    try:
        done = subprocess.run(argv, capture_output=capture, text=True)
    except OSError as exc:
        sys.exit(f"warmup.py: {what}: cannot start {argv[0]}: {exc.strerror}")
    if done.returncode:
        lines = (done.stderr or "").strip().splitlines() or [f"exit status {done.returncode}"]
        sys.exit(f"warmup.py: {what} failed: {lines[-1]}")
    return done.stdout or ""


def build_side(out_dir: Path, manifests: list[str]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for manifest in manifests:
        name = Path(manifest).stem
        # the rose-aot next to this interpreter (a virtual environment need not be on PATH)
        rose_aot = Path(sys.executable).with_name("rose-aot")
        _run(f"building {manifest}",
             [str(rose_aot) if rose_aot.exists() else "rose-aot", "build", manifest, "--arch",
              "sm_90a", "-o", str(out_dir / f"{name}.rosebundle"), "-q"], capture=False)
    samples = [
        float(_run("the CuTeDSL import", [sys.executable, "-c", _DSL_IMPORT_PROBE]))
        for _ in range(REPEATS)
    ]
    info = {"dsl_import_ms": statistics.median(samples), "samples_ms": samples,
            "machine": "build machine (CPU)", "date": time.strftime("%Y-%m-%d")}
    (out_dir / "dsl-import.json").write_text(json.dumps(info, indent=2))
    print(f"DSL import: {info['dsl_import_ms']:.0f} ms (median of {REPEATS})")


def byte_compile(tree: str | None = None) -> str:
    """Byte-compile the rose_aot package that the probes import (the one in `tree`, else the
    one on this interpreter's path), as `pip install` does for an installed package: a serving
    image imports rose_aot from .pyc files. Without them every cold process compiles the
    sources again (where PYTHONDONTWRITEBYTECODE is set, as on the lent machines, none are
    ever written), which measured 85 ms of an 87 ms import on the build machine. Returns what
    to print: the package compiled, or why it could not be."""
    if tree is None:
        spec = importlib.util.find_spec("rose_aot")
        package = spec.submodule_search_locations[0] if spec else None
    else:
        package = os.path.join(tree, "rose_aot")
    if package is None or not os.path.isdir(package):
        return f"byte-compiled: NOT {package} (no such package); imports below compile the sources"
    done = subprocess.run([sys.executable, "-m", "compileall", "-q", package],
                          capture_output=True, text=True)
    if done.returncode:
        last = (done.stdout + done.stderr).strip().splitlines() or ["?"]
        return f"byte-compiled: NOT {package} ({last[-1]}); imports below compile the sources"
    return f"byte-compiled: {package}"


def _measure(what: str, probe: str, args: list[str]) -> dict[str, list[dict]]:
    """REPEATS cold processes of `probe` per preload thread setting, the settings alternating
    (so a drift of the machine touches each alike); its JSON lines, by setting."""
    runs: dict[str, list[dict]] = {t: [] for t in PRELOAD_THREADS}
    for _ in range(REPEATS):
        for threads in PRELOAD_THREADS:
            out = _run(what, [sys.executable, "-c", probe, *args, threads])
            runs[threads].append(json.loads(out.strip().splitlines()[-1]))
    return runs


def gpu_side(models_dir: Path) -> None:
    import torch

    bundles = sorted(models_dir.glob("*.rosebundle"))
    if not (models_dir / "dsl-import.json").is_file() or not bundles:
        sys.exit(f"{models_dir} has no bundles and dsl-import.json; run "
                 f"`python benchmarks/warmup.py build-side {models_dir} manifests/*.toml` first")
    # Every build report (the JIT column) before the first cold process, not at the end.
    reports = {}
    for bundle in bundles:
        try:
            reports[bundle] = json.loads(Path(str(bundle) + ".report.json").read_text())
        except (OSError, ValueError) as exc:
            sys.exit(f"warmup.py: {bundle}: no readable build report ({exc}); build the models "
                     f"with `python benchmarks/warmup.py build-side {models_dir} "
                     f"manifests/*.toml`")
    if not torch.cuda.is_available():
        sys.exit("warmup.py gpu-side needs a CUDA GPU")
    dsl = json.loads((models_dir / "dsl-import.json").read_text())["dsl_import_ms"]
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    compiled = byte_compile()
    print(compiled, flush=True)
    doc = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "dsl_import_ms": dsl, "repeats": REPEATS,
           "context_first": CONTEXT_FIRST, "byte_compiled": compiled, "rows": []}
    # The models are measured in rounds, each cold process of a round another model, so that
    # a slow spell of the host (the lent machines have them: docs/results-serving.md, "These
    # figures depend on the host") touches every model alike, not the model measured during it. warmup.json is
    # rewritten after each round (medians of the rounds so far), so a run cut by its time
    # limit keeps what it measured.
    runs: dict[tuple[Path, str], list[dict]] = {(b, t): [] for b in bundles
                                                for t in PRELOAD_THREADS}
    for n in range(REPEATS):
        for bundle in bundles:
            for threads in PRELOAD_THREADS:
                out_text = _run(f"opening {bundle}", [sys.executable, "-c", _GPU_PROBE,
                                                      str(bundle), "1" if CONTEXT_FIRST else "0",
                                                      threads])
                runs[bundle, threads].append(json.loads(out_text.strip().splitlines()[-1]))
        doc["rows"] = [_gpu_row(b, reports[b], r, dsl) for (b, _), r in runs.items()]
        doc["repeats"] = n + 1
        (out / "warmup.json").write_text(json.dumps(doc, indent=2))
        print(f"round {n + 1}/{REPEATS}: {len(bundles) * len(PRELOAD_THREADS)} cold processes",
              file=sys.stderr, flush=True)
    print("| model | points | kernels | preload threads | import rose_aot ms | "
          "driver binding ms (once per process) | open + verify ms | preload ms | "
          "AOT per model ms (open + preload) | JIT (DSL import + compile) ms | x faster |"
          + (" CUDA context ms |" if CONTEXT_FIRST else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if CONTEXT_FIRST else ""))
    for r in doc["rows"]:
        print(f"| {r['model']} | {r['points']} | {r['kernels']} | {r['preload_threads']} | "
              f"{r['import_ms']:.1f} | {r['driver_binding_ms']:.1f} | "
              f"{r['open_verify_ms']:.2f} | {r['preload_ms']:.2f} | "
              f"{r['aot_after_import_ms']:.2f} | {r['jit_ms']:.0f} | {r['speedup']:.0f} |"
              + (f" {r['context_ms']:.0f} |" if CONTEXT_FIRST else ""), flush=True)


def _gpu_row(bundle: Path, report: dict, runs: list[dict], dsl_ms: float) -> dict:
    """One model's row: medians of its cold processes; the JIT column is the DSL import plus
    the compile seconds of its sm_90a points from its build report."""
    compile_ms = 1e3 * sum(v["compile_seconds"] for item in report["items"]
                           for v in item["variants"] if item["arch"] == "sm_90a")
    keys = ("import_ms", "driver_binding_ms", "open_verify_ms", "preload_ms")
    med = {k: statistics.median(r[k] for r in runs)
           for k in keys + (("context_ms",) if CONTEXT_FIRST else ())}
    aot_ms = med["open_verify_ms"] + med["preload_ms"]
    jit_ms = dsl_ms + compile_ms
    return {
        "model": bundle.stem,
        "points": len(report["items"]),
        "kernels": runs[0]["kernels"],
        "preload_threads": runs[0]["threads"],
        **{k: round(v, 2) for k, v in med.items()},
        "aot_after_import_ms": round(aot_ms, 2),
        "jit_ms": round(jit_ms, 1),
        "speedup": round(jit_ms / aot_ms, 1),
        # every process's open + preload, in round order: where a host runs in two modes,
        # both show
        "aot_each_ms": [round(r["open_verify_ms"] + r["preload_ms"], 2) for r in runs],
    }


def cpu_side(models_dir: Path, arch: str = "sm_90a") -> None:
    bundles = sorted(models_dir.glob("*.rosebundle"))
    if not bundles:
        sys.exit(f"{models_dir} has no bundles; run "
                 f"`python benchmarks/warmup.py build-side {models_dir} manifests/*.toml` first")
    print(byte_compile(), flush=True)
    print(f"| model | points | kernels | preload threads | open + verify ms | "
          f"preload, CPU side ms | open + preload CPU side ms | a handle per point ms |  "
          f"(median of {REPEATS} cold processes, {arch})")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for bundle in bundles:
        measured = _measure(f"opening {bundle}", _CPU_PROBE, [str(bundle), arch])
        for runs in measured.values():
            med = {k: statistics.median(r[k] for r in runs)
                   for k in ("open_verify_ms", "preload_cpu_ms", "handles_ms")}
            total = statistics.median(r["open_verify_ms"] + r["preload_cpu_ms"] for r in runs)
            print(f"| {bundle.stem} | {runs[0]['handles']} | {runs[0]['kernels']} | "
                  f"{runs[0]['threads']} | {med['open_verify_ms']:.2f} | "
                  f"{med['preload_cpu_ms']:.2f} | {total:.2f} | {med['handles_ms']:.2f} |",
                  flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sides = parser.add_subparsers(dest="side", required=True, metavar="SIDE")
    build = sides.add_parser("build-side", help="build machine: per-model bundles, their "
                             "build reports, the DSL's import time")
    build.add_argument("models_dir", type=Path, help="folder for the bundles (made if missing)")
    build.add_argument("manifests", nargs="+", help="one deployment manifest per model")
    for side, what in (("gpu-side", "GPU machine: import, open, verify and preload, cold"),
                       ("cpu-side", "any machine: open and verify, cold, without the driver")):
        sides.add_parser(side, help=what).add_argument(
            "models_dir", type=Path, help="the folder build-side wrote")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.side == "build-side":
        build_side(args.models_dir, args.manifests)
    elif args.side == "gpu-side":
        gpu_side(args.models_dir)
    else:
        cpu_side(args.models_dir)


if __name__ == "__main__":
    main()
