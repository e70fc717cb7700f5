"""Why bench_norms.py's rms_norm figures at 8192 tokens of hidden 2048/4096 exceed ab_norms.py's
in the same GPU call (17.8 vs 16.9 µs at 2048).

    python benchmarks/norm_order_probe.py build/bench-norms.rosebundle [--placements N]
        [--rep-ms 30,60] [--after-hinted]

Without --placements: the position in the measuring order, or where the output lies. With
bench_norms' own tensors (rms_norm_inputs, the float64 reference alive), times rose-aot and
Liger in turns, three times each, then rose-aot into a second output tensor, into a fresh
tensor per call (as Liger writes), and once more. Prints one line per (fused, hidden):
CUDA-graph replay medians in µs, in the order measured. Its run:
benchmarks/results/norm-narrow-hints-call4-probe-h200.log.

With --placements N: where the inputs lie. N sets of the same tensors (same values), each set
allocated while the sets before stay alive, so each lies in other memory; rose-aot and Liger
timed on each. Prints one line per (fused, hidden) with each set's times.

With --rep-ms A,B,...: how long each timed graph runs. bench_us's `rep_ms` (the length of the
replayed graph, bench_norms 60 ms, ab_norms 30 ms) taking each value in turn, three rounds, for
rose-aot and Liger on bench_norms' tensors.

With --after-hinted: whether a kernel with L2 cache hints that ran before changes them. On
bench_norms' tensors: rose-aot (the plan's decode variant, plain loads) and Liger; then one
call of rose-aot's prefill variant (evict_last on its first read of the rows) and the two
again; then the prefill variant timed (a graph of its calls) and the two again; then both
after the L2's evict_last lines are reset (common.reset_l2_priorities). Everything here is timed
without bench_us's own reset. The other modes time with it (since the run of --after-hinted;
the runs before had none).
"""
import argparse
import os
import sys

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("bundle", help="a bundle with rms_norm at hidden 2048 and 4096, plain and "
                                   "fused, such as build/bench-norms.rosebundle")
parser.add_argument("--placements", type=int, default=0, metavar="N",
                    help="time N placements of the inputs instead (default: the order probe)")
parser.add_argument("--rep-ms", default="", metavar="A,B,...",
                    help="time with each of these graph lengths (ms) in turn instead")
parser.add_argument("--after-hinted", action="store_true",
                    help="time before and after a hinted kernel ran on the same tensors instead")
args = parser.parse_args()
try:
    args.rep_ms = [int(v) for v in args.rep_ms.split(",") if v]
except ValueError:
    parser.error(f"--rep-ms takes integers, comma-separated (got {args.rep_ms!r})")
if any(v < 1 for v in args.rep_ms):
    parser.error("--rep-ms values must be >= 1")
if not os.path.isfile(args.bundle):
    parser.error(f"{args.bundle}: no such bundle file")
if args.placements < 0:
    parser.error("--placements must be >= 0")
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
from bench_norms import EPS, rms_norm_inputs  # noqa: E402
from common import bench_us, reset_l2_priorities  # noqa: E402
from liger_kernel.transformers.functional import liger_fused_add_rms_norm, liger_rms_norm  # noqa: E402

from rose_aot import open_bundle  # noqa: E402


def calls(ours, fused, x, r, w, out):
    """(rose-aot, Liger) on these tensors; both out of place, the residual updated in place."""
    if fused:
        return (lambda: ours(x, r, w, out),
                lambda: liger_fused_add_rms_norm(x, r, w, EPS, in_place=False))
    return lambda: ours(x, w, out), lambda: liger_rms_norm(x, w, EPS, in_place=False)


b = open_bundle(args.bundle)
b.preload()
for fused in (False, True):
    for h in (2048, 4096):
        t = 8192
        ours = b.kernel("rms_norm", hidden=h, eps=EPS, fused_residual=fused)
        if args.after_hinted:
            x, r, w, out, _ = rms_norm_inputs(t, h, fused)
            rose, lig = calls(ours, fused, x, r, w, out)
            hinted = ((lambda: ours(x, r, w, out, variant="prefill")) if fused
                      else (lambda: ours(x, w, out, variant="prefill")))

            def both(label):  # timed as they find the L2, then from a reset L2
                return (f"{label}: rose={bench_us(rose, reset_l2=False):.2f},"
                        f"{bench_us(rose, reset_l2=False):.2f} "
                        f"liger={bench_us(lig, reset_l2=False):.2f}")

            seq = [both("first")]
            hinted()
            torch.cuda.synchronize()
            seq.append(both("after-one-hinted-call"))
            seq.append(f"hinted={bench_us(hinted, reset_l2=False):.2f}")
            seq.append(both("after-hinted-graph"))
            reset_l2_priorities()
            seq.append(both("after-reset"))
            print(f"fused={int(fused)} h={h} T={t} " + " ".join(seq), flush=True)
            continue
        if args.rep_ms:
            x, r, w, out, _ = rms_norm_inputs(t, h, fused)
            rose, lig = calls(ours, fused, x, r, w, out)
            seq = []
            for _round in range(3):
                for rep in args.rep_ms:
                    seq.append(f"rep{rep}: rose={bench_us(rose, rep_ms=rep):.2f} "
                               f"liger={bench_us(lig, rep_ms=rep):.2f}")
            print(f"fused={int(fused)} h={h} T={t} " + " ".join(seq), flush=True)
            continue
        if args.placements:
            kept, seq = [], []
            for n in range(args.placements):
                x, r, w, out, _ = rms_norm_inputs(t, h, fused)
                kept.append((x, r, w, out))  # alive: the next set lies elsewhere
                rose, lig = calls(ours, fused, x, r, w, out)
                seq.append(f"set{n}: rose={bench_us(rose):.2f} liger={bench_us(lig):.2f}")
            print(f"fused={int(fused)} h={h} T={t} " + " ".join(seq), flush=True)
            continue
        x, r, w, out, ref = rms_norm_inputs(t, h, fused)  # bench_norms' own, reference alive
        o = torch.full_like(x, float("nan"))  # bench_norms' checked output, kept as there  # noqa: F841
        rose, lig = calls(ours, fused, x, r, w, out)
        seq = []
        for k in range(3):
            seq.append(("rose", bench_us(rose)))
            seq.append(("liger", bench_us(lig)))
        del ref
        out2 = torch.empty_like(x)
        rose2 = (lambda: ours(x, r, w, out2)) if fused else (lambda: ours(x, w, out2))
        seq.append(("rose_out2", bench_us(rose2)))
        # liger's output is a fresh tensor per call; rose into a fresh tensor per call too
        fresh = ((lambda: ours(x, r, w, torch.empty_like(x))) if fused
                 else (lambda: ours(x, w, torch.empty_like(x))))
        seq.append(("rose_fresh_out", bench_us(fresh)))
        seq.append(("rose", bench_us(rose)))
        print(f"fused={int(fused)} h={h} T={t} out-x={out.data_ptr() - x.data_ptr():#x} "
              f"out2-x={out2.data_ptr() - x.data_ptr():#x} "
              + " ".join(f"{k}={v:.2f}" for k, v in seq), flush=True)
