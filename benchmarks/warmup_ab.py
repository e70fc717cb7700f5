"""Warmup of two versions side by side: cold processes of warmup.py's GPU probe (CUDA context and
driver binding before the clock; open + verify, then preload(), timed), alternating between
version A and version B, each a rose-aot source tree and a bundle it built.

    python benchmarks/warmup_ab.py --a OLD_TREE:OLD.rosebundle --b .:build/models/deepseek-v3.rosebundle

The host's own speed drifts from call to call (DeepSeek-V3's open + preload measured 11.8 to
17.3 ms in the same week on the same machine kind), so a change to the warmup is judged only
against its baseline measured in the same run, alternating. A TREE is a folder holding the
`rose_aot` package (a git worktree of the old commit; its C hot path is optional). Prints a
table of medians; --out writes every run as JSON. --a-threads / --b-threads compare ways of
preloading (preload(threads=N)) on one tree. --cpu ARCH needs no GPU: each process opens the
bundle and verifies ARCH's records and artifacts as a preload would, without the driver's loads
(warmup.py's cpu-side probe), so a change to the loader's CPU side can be judged on the build
machine; its "preload" column is that verification.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def _side(text: str) -> tuple[str, str]:
    tree, sep, bundle = text.partition(":")
    if not sep or not os.path.isdir(os.path.join(tree, "rose_aot")) or not os.path.isfile(bundle):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not TREE:BUNDLE with a rose_aot package in TREE and a bundle file")
    return os.path.abspath(tree), os.path.abspath(bundle)


def _threads(text: str) -> str:
    """--a-threads / --b-threads: a positive int, passed to the probe as text."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of threads")
    return str(int(text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=_side, required=True, help="TREE:BUNDLE of the baseline")
    parser.add_argument("--b", type=_side, required=True, help="TREE:BUNDLE of the change")
    parser.add_argument("--a-threads", type=_threads, metavar="N",
                        help="preload(threads=N) for A (default: preload()'s own default)")
    parser.add_argument("--b-threads", type=_threads, metavar="N",
                        help="preload(threads=N) for B (default: preload()'s own default)")
    parser.add_argument("--repeats", type=int, default=8, help="cold processes per version")
    parser.add_argument("--cpu", metavar="ARCH",
                        help="no GPU: time open + the CPU side of a preload of ARCH's kernels "
                             "(records and artifacts verified, nothing loaded)")
    parser.add_argument("--out", help="also write every run as JSON to this file")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.cpu is not None and not args.cpu.strip():
        parser.error("--cpu needs an arch of the bundles, such as sm_90a")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import check_out

    check_out(parser, args.out)
    from warmup import _CPU_PROBE, _GPU_PROBE, byte_compile  # the README's warmup probes

    for name in ("a", "b"):
        print(f"{name}: {byte_compile(getattr(args, name)[0])}", flush=True)

    # Each process imports rose_aot from its tree only: the tree first on the path, the rest
    # of the environment (torch, zstandard, cuda.bindings) as given.
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    for n in range(args.repeats):
        for name in ("a", "b"):
            tree, bundle = getattr(args, name)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, *inherited]))
            # argv: bundle, context first ("1") or the CPU side's arch, preload threads ("" =
            # preload()'s default, or 1 on the CPU side)
            threads = getattr(args, f"{name}_threads") or ""
            probe, second = (_CPU_PROBE, args.cpu) if args.cpu else (_GPU_PROBE, "1")
            done = subprocess.run([sys.executable, "-c", probe, bundle, second, threads],
                                  capture_output=True, text=True, env=env, cwd=tree)
            if done.returncode:
                last = (done.stderr.strip().splitlines() or ["?"])[-1]
                sys.exit(f"warmup_ab.py: version {name} failed: {last}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            if args.cpu:  # the CPU side of a preload in the preload column
                row["preload_ms"] = row.pop("preload_cpu_ms")
            row["total_ms"] = row["open_verify_ms"] + row["preload_ms"]
            runs[name].append(row)
            print(f"{name} {n + 1}/{args.repeats}: open {row['open_verify_ms']:.2f} preload "
                  f"{row['preload_ms']:.2f} ms", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"a": args.a, "b": args.b, "cpu_side_of": args.cpu,
                       "a_threads": args.a_threads or "default",
                       "b_threads": args.b_threads or "default", "runs": runs}, f, indent=1)
    side = f"; preload = its CPU side for {args.cpu}, no GPU" if args.cpu else ""
    print(f"\nmedians of {args.repeats} cold processes per version, alternating (ms{side})")
    print("| version | tree | bundle | preload threads | open + verify | preload | open + preload |")
    print("|---|---|---|---|---|---|---|")
    for name in ("a", "b"):
        tree, bundle = getattr(args, name)
        threads = getattr(args, f"{name}_threads") or "default"
        med = {k: statistics.median(r[k] for r in runs[name])
               for k in ("open_verify_ms", "preload_ms", "total_ms")}
        print(f"| {name} | {tree} | {os.path.basename(bundle)} | {threads} | "
              f"{med['open_verify_ms']:.2f} | {med['preload_ms']:.2f} | {med['total_ms']:.2f} |")


if __name__ == "__main__":
    main()
