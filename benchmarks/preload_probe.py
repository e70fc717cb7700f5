"""Where a preload's time goes, and which way of loading is cheapest, on the GPU machine.

    python benchmarks/preload_probe.py build/models/deepseek-v3.rosebundle [--repeats 5]
        [--ways preload,module] [--json] [--out FILE]

For one bundle, in fresh processes (torch imported and its CUDA context made first, as in a
serving process), each of these ways to load every sm_90a variant, the ways alternating over
the processes so that a drift of the machine touches each alike:

  preload         KernelBundle.preload(0), as shipped (PRELOAD_THREADS threads; see there)
  preload_serial  KernelBundle.preload(0, threads=1): verify and load in turn, one thread
  library         verify every artifact first (verify_ms), then only the driver calls of
                  context-independent libraries (cuLibraryLoadData, cuLibraryGetKernel,
                  cuKernelGetFunction: driver_ms), the loader's calls before 2026-11-30
  module          the same with the loader's calls now: cuModuleLoadData, cuModuleGetFunction
  module_threads2, module_threads4
                  `module` with the driver calls spread over 2 / 4 threads (each its share of
                  the variants, in turn; the context made current in each): does the driver
                  load modules in parallel?
  breakdown       open_bundle and preload(0, threads=1) with a timer around each phase (reading
                  the file, decoding the index JSON, the blob table and frame headers, checking
                  the points' records and plans, reading + hashing the cubins (blob_view), checking
                  cubins against their records, cuModuleLoadData, cuModuleGetFunction): where
                  the time of open + preload goes. The timers add a few µs per call.
  cpu_breakdown   the same phases without a GPU: open_bundle and check_artifacts("sm_90a"), the
                  verification a preload does, no torch and no driver (runs on the CPU build
                  machine: `--ways cpu_breakdown`)

Medians per way, with open_bundle's time in every process and the first
torch.cuda.get_device_capability (what preload asks to pick the arch); for breakdown, the
median of each phase too. A measurement tool: `library`, `module` and `breakdown` use the
loader's internals and keep nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WAYS = ("preload", "preload_serial", "library", "module", "module_threads2", "module_threads4",
        "breakdown", "cpu_breakdown")
# breakdown's phases: (name, module, attribute) of the function timed, in the order they run
PHASES = (
    ("read", "rose_aot.bundle.format", "_read_file"),
    ("index_json", "rose_aot.bundle.format", "_decode_index"),
    ("blob_table", "rose_aot.bundle.format", "_check_blob_table"),
    ("frame_headers", "rose_aot.bundle.format", "_check_frame_header"),
    ("records_and_plans", "rose_aot.loader.runtime", "KernelBundle._check_record"),
    # "decompress_sha256" (BundleReader._decompress) in the results before the loader read
    # cubins without a copy (51d7704)
    ("cubin_sha256", "rose_aot.bundle.format", "BundleReader.blob_view"),
    ("cubin_check", "rose_aot.kernels.record", "VariantRecord.check_cubin"),
    ("cuModuleLoadData", "rose_aot.loader.driver", "load_module"),
    ("cuModuleGetFunction", "rose_aot.loader.driver", "module_function"),
)

_PROBE = r"""
import json, sys, time
path, way, phases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
gpu = way != "cpu_breakdown"
capability_ms = None
if gpu:
    import torch
    torch.cuda.init()
    tc = time.perf_counter()
    torch.cuda.get_device_capability(0)
    capability_ms = (time.perf_counter() - tc) * 1e3
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
import importlib
import rose_aot
from rose_aot.loader import driver
cu = driver.driver() if gpu else None
spent = {}

def timed(name, function):
    def run(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + (time.perf_counter() - start) * 1e3
    return run

if way in ("breakdown", "cpu_breakdown"):
    for name, module, attribute in phases:
        owner = importlib.import_module(module)
        *path_to, leaf = attribute.split(".")
        for part in path_to:
            owner = getattr(owner, part)
        setattr(owner, leaf, timed(name, getattr(owner, leaf)))
t0 = time.perf_counter()
bundle = rose_aot.open_bundle(path)
t1 = time.perf_counter()
out = {"way": way, "open_ms": (t1 - t0) * 1e3}
if gpu:
    out["capability_ms"] = capability_ms
    driver.make_primary_context_current(0)
tasks = bundle._variants("sm_90a")

def entries(task):
    key, arch, name = task
    return bundle.record(key, arch).variant(name).entries

keep = []
t2 = time.perf_counter()
if way == "preload":
    bundle.preload(0)
elif way in ("preload_serial", "breakdown"):
    bundle.preload(0, threads=1)
elif way == "cpu_breakdown":
    bundle.check_artifacts("sm_90a")  # what a preload verifies, without the driver
elif way.startswith("module_threads"):
    import threading
    images = [bundle.verified_image(*t) for t in tasks]
    tv = time.perf_counter()
    out["verify_ms"] = (tv - t2) * 1e3
    count = int(way[len("module_threads"):])
    loaded = [None] * len(tasks)

    def load_share(first):
        driver.make_primary_context_current(0)
        for i in range(first, len(tasks), count):
            mod = driver.check(cu.cuModuleLoadData(images[i]), "cuModuleLoadData")
            loaded[i] = [driver.check(cu.cuModuleGetFunction(mod, e.encode()), "function")
                         for e in entries(tasks[i])]

    workers = [threading.Thread(target=load_share, args=(n,)) for n in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert all(f is not None for f in loaded), "a loader thread failed"
    keep.append(loaded)
    out["driver_ms"] = (time.perf_counter() - tv) * 1e3
elif way in ("library", "module"):
    images = [bundle.verified_image(*t) for t in tasks]
    tv = time.perf_counter()
    out["verify_ms"] = (tv - t2) * 1e3
    for task, image in zip(tasks, images):
        if way == "module":
            mod = driver.check(cu.cuModuleLoadData(image), "cuModuleLoadData")
            keep.append([driver.check(cu.cuModuleGetFunction(mod, e.encode()), "function")
                         for e in entries(task)])
        else:
            lib = driver.check(cu.cuLibraryLoadData(image, None, None, 0, None, None, 0),
                               "cuLibraryLoadData")
            keep.append([driver.check(cu.cuKernelGetFunction(driver.check(
                cu.cuLibraryGetKernel(lib, e.encode()), "get kernel")), "function")
                for e in entries(task)])
    out["driver_ms"] = (time.perf_counter() - tv) * 1e3
else:
    raise SystemExit(f"unknown way {way}")
if gpu:
    torch.cuda.synchronize()
out["load_ms"] = (time.perf_counter() - t2) * 1e3
out["variants"] = len(tasks)
if way in ("breakdown", "cpu_breakdown"):
    out["phases"] = {name: spent.get(name, 0.0) for name, _, _ in phases}
assert "cutlass" not in sys.modules
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--out", help="also write the JSON rows to this file")
    args = parser.parse_args()
    # benchmarks/common.py, imported here only: a module-level `import common` would shadow
    # tests/multigpu's module of that name when the CPU tests load this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import check_out, write_rows

    check_out(parser, args.out)
    ways = [w for w in args.ways.split(",") if w]
    unknown = [w for w in ways if w not in WAYS]
    if unknown or args.repeats < 1:
        sys.exit(f"preload_probe.py: ways are {', '.join(WAYS)}; repeats >= 1")
    if not os.path.isfile(args.bundle):
        sys.exit(f"preload_probe.py: {args.bundle} is not a file; build the bundles with "
                 "`python benchmarks/warmup.py build-side build/models manifests/*.toml`")
    runs: dict[str, list[dict]] = {w: [] for w in ways}
    for _ in range(args.repeats):
        for way in ways:
            done = subprocess.run([sys.executable, "-c", _PROBE, args.bundle, way,
                                   json.dumps(PHASES)], capture_output=True, text=True)
            if done.returncode:
                last = (done.stderr.strip().splitlines() or ["?"])[-1]
                sys.exit(f"preload_probe.py: way {way} failed: {last}")
            runs[way].append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = []
    for way, rs in runs.items():
        row = {"way": way, "variants": rs[0]["variants"], "repeats": len(rs)}
        for field in ("open_ms", "load_ms", "verify_ms", "driver_ms", "capability_ms"):
            if field in rs[0]:
                row[field] = round(statistics.median(r[field] for r in rs), 2)
        if "phases" in rs[0]:
            row["phases"] = {name: round(statistics.median(r["phases"][name] for r in rs), 2)
                             for name, _, _ in PHASES}
        rows.append(row)
    if write_rows(rows, args.out, {"bundle": args.bundle}, args.json):
        return
    print(f"{args.bundle}: medians of {args.repeats} cold processes (ms)")
    print("| way | variants | open | load (all) | verify | driver | first capability query |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        capability = f"{r['capability_ms']:.3f}" if "capability_ms" in r else ""
        print(f"| {r['way']} | {r['variants']} | {r['open_ms']:.2f} | {r['load_ms']:.2f} | "
              f"{r.get('verify_ms', '')} | {r.get('driver_ms', '')} | {capability} |")
    for r in rows:
        if "phases" in r:
            second = "preload(0, threads=1)" if r["way"] == "breakdown" else "check_artifacts"
            print(f"\n{r['way']}: open + {second} = {r['open_ms'] + r['load_ms']:.2f} "
                  f"ms, medians per phase (ms):")
            print("| " + " | ".join(r["phases"]) + " |")
            print("|" + "---|" * len(r["phases"]))
            print("| " + " | ".join(f"{v:.2f}" for v in r["phases"].values()) + " |")


if __name__ == "__main__":
    main()
