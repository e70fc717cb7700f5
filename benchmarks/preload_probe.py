"""Where a preload's time goes, and which way of loading is cheapest, on the GPU machine.

    python benchmarks/preload_probe.py build/models/deepseek-v3.rosebundle [--repeats 5]
        [--ways preload,module] [--json] [--out FILE]

For one bundle, in fresh processes (torch imported and its CUDA context made first, as in a
serving process), each of these ways to load every sm_90a variant, the ways alternating over
the processes so that a drift of the machine touches each alike:

  preload         KernelBundle.preload(0), as shipped (PRELOAD_THREADS: helper threads verify
                  the artifacts ahead while the calling thread loads them)
  preload_serial  KernelBundle.preload(0, threads=1): verify and load in turn, one thread
  library         verify every artifact first (verify_ms), then only the driver calls of
                  context-independent libraries (cuLibraryLoadData, cuLibraryGetKernel,
                  cuKernelGetFunction: driver_ms), the loader's calls before 2026-11-30
  module          the same with the loader's calls now: cuModuleLoadData, cuModuleGetFunction

Medians per way, with open_bundle's time in every process and the first
torch.cuda.get_device_capability (what preload asks to pick the arch). A measurement tool:
`library` and `module` use the loader's internals and keep nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WAYS = ("preload", "preload_serial", "library", "module")

_PROBE = r"""
import json, sys, time
import torch
torch.cuda.init()
tc = time.perf_counter()
torch.cuda.get_device_capability(0)
capability_ms = (time.perf_counter() - tc) * 1e3
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
import rose_aot
from rose_aot.loader import driver
cu = driver.driver()
path, way = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
bundle = rose_aot.open_bundle(path)
t1 = time.perf_counter()
out = {"way": way, "open_ms": (t1 - t0) * 1e3, "capability_ms": capability_ms}
driver.make_primary_context_current(0)
tasks = bundle._variants("sm_90a")

def entries(task):
    key, arch, name = task
    return bundle._records[(key, arch)].variant(name).entries

keep = []
t2 = time.perf_counter()
if way == "preload":
    bundle.preload(0)
elif way == "preload_serial":
    bundle.preload(0, threads=1)
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
torch.cuda.synchronize()
out["load_ms"] = (time.perf_counter() - t2) * 1e3
out["variants"] = len(tasks)
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
            env = dict(os.environ)
            if way == "eager":
                env["CUDA_MODULE_LOADING"] = "EAGER"
            done = subprocess.run([sys.executable, "-c", _PROBE, args.bundle, way],
                                  capture_output=True, text=True, env=env)
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
        rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"bundle": args.bundle, "rows": rows}, f, indent=2)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{args.bundle}: medians of {args.repeats} cold processes (ms)")
    print("| way | variants | open | load (all) | verify | driver | first capability query |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['way']} | {r['variants']} | {r['open_ms']:.2f} | {r['load_ms']:.2f} | "
              f"{r.get('verify_ms', '')} | {r.get('driver_ms', '')} | {r['capability_ms']:.3f} |")


if __name__ == "__main__":
    main()
