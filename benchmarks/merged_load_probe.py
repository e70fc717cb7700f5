"""Would one module per bundle load faster than a module per variant? The driver's part, on the GPU.

    python benchmarks/merge_probe.py build/models/*.rosebundle --write build/merged     # CPU
    python benchmarks/merged_load_probe.py build/merged [--repeats 7] [--json] [--out FILE]

For each folder merge_probe.py --write made (a bundle's cubins, the one-module cubin ptxas
built from all their PTX, load.json naming the entries), in fresh processes with the primary
context of GPU 0 current, the driver calls a preload makes, timed:

  variants  cuModuleLoadData of every variant's cubin and cuModuleGetFunction of its entries
            (what the loader does today)
  merged    cuModuleLoadData of the one module and cuModuleGetFunction of every entry

The two alternate over the processes; medians in ms. The images are read before the clock
starts: only the driver's part is timed (no decompression, hashing or record checks).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WAYS = ("variants", "merged")

_PROBE = r"""
import json, sys, time
from pathlib import Path
from cuda.bindings import driver as cu

def check(result, what):
    if result[0] != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"{what}: {result[0]}")
    return result[1] if len(result) > 1 else None

folder, way = Path(sys.argv[1]), sys.argv[2]
load = json.loads((folder / "load.json").read_text())
files = load["variants"] if way == "variants" else [load["merged"]]
images = [((folder / name).read_bytes(), entries) for name, entries in files]
check(cu.cuInit(0), "cuInit")
context = check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(0), "cuDeviceGet")), "retain")
check(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent")
check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
keep = []
start = time.perf_counter()
for image, entries in images:
    module = check(cu.cuModuleLoadData(image), "cuModuleLoadData")
    keep.append([check(cu.cuModuleGetFunction(module, e.encode()), e) for e in entries])
ms = (time.perf_counter() - start) * 1e3
print(json.dumps({"ms": ms, "modules": len(images), "functions": sum(map(len, keep)),
                  "bytes": sum(len(image) for image, _ in images)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="what merge_probe.py --write wrote")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--out", help="also write the JSON rows to this file")
    args = parser.parse_args()
    # benchmarks/common.py, imported here only: a module-level `import common` would shadow
    # tests/multigpu's module of that name when the CPU tests load this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import check_out, write_rows

    check_out(parser, args.out)
    if args.repeats < 1:
        sys.exit("merged_load_probe.py: --repeats must be at least 1")
    bundles = sorted(p.parent for p in args.folder.glob("*/load.json"))
    if not bundles:
        sys.exit(f"merged_load_probe.py: no */load.json under {args.folder}; write them with "
                 "`python benchmarks/merge_probe.py build/models/*.rosebundle --write "
                 f"{args.folder}`")
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.repeats):
        for folder in bundles:
            for way in WAYS:
                done = subprocess.run([sys.executable, "-c", _PROBE, str(folder), way],
                                      capture_output=True, text=True)
                if done.returncode:
                    last = (done.stderr.strip().splitlines() or ["?"])[-1]
                    sys.exit(f"merged_load_probe.py: {folder.name} {way} failed: {last}")
                runs.setdefault((folder.name, way), []).append(
                    json.loads(done.stdout.strip().splitlines()[-1]))
    rows = []
    for folder in bundles:
        row = {"bundle": folder.name, "repeats": args.repeats}
        for way in WAYS:
            got = runs[(folder.name, way)]
            row[way] = {"ms": round(statistics.median(r["ms"] for r in got), 2),
                        "modules": got[0]["modules"], "functions": got[0]["functions"],
                        "bytes": got[0]["bytes"]}
        rows.append(row)
    if write_rows(rows, args.out, {"folder": str(args.folder)}, args.json):
        return
    print(f"driver calls of a preload, medians of {args.repeats} cold processes per way (ms)")
    print("| bundle | modules | bytes | ms | one module: bytes | ms | saved |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        v, m = r["variants"], r["merged"]
        print(f"| {r['bundle']} | {v['modules']} | {v['bytes']} | {v['ms']:.2f} | "
              f"{m['bytes']} | {m['ms']:.2f} | {v['ms'] - m['ms']:.2f} |")


if __name__ == "__main__":
    main()
