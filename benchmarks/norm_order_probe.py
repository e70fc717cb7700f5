"""Why bench_norms.py's rms_norm figures at 8192 tokens of hidden 2048/4096 exceed ab_norms.py's
in the same GPU call (17.8 vs 16.9 µs at 2048): the position in the measuring order, or where
the output lies. With bench_norms' own tensors (seeded, the float64 reference alive), times
rose-aot and Liger in turns, three times each, then rose-aot into a second output tensor, into a
fresh tensor per call (as Liger writes), and once more.

    python benchmarks/norm_order_probe.py build/bench-norms.rosebundle

Prints one line per (fused, hidden): CUDA-graph replay medians in µs, in the order measured.
Its run: benchmarks/results/norm-narrow-hints-call4-probe-h200.log.
"""
import os
import sys

if len(sys.argv) != 2 or not os.path.isfile(sys.argv[1]):
    sys.exit("usage: python benchmarks/norm_order_probe.py BUNDLE (a bundle with rms_norm at "
             "hidden 2048 and 4096, plain and fused, such as build/bench-norms.rosebundle)")
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
from bench_norms import EPS, rms_norm_inputs  # noqa: E402
from common import bench_us  # noqa: E402
from liger_kernel.transformers.functional import liger_fused_add_rms_norm, liger_rms_norm  # noqa: E402

from rose_aot import open_bundle  # noqa: E402

b = open_bundle(sys.argv[1]); b.preload()
for fused in (False, True):
    for h in (2048, 4096):
        t = 8192
        ours = b.kernel("rms_norm", hidden=h, eps=EPS, fused_residual=fused)
        x, r, w, out, ref = rms_norm_inputs(t, h, fused)  # bench_norms' own, reference alive
        o = torch.full_like(x, float("nan"))  # bench_norms' checked output, kept as there  # noqa: F841
        if fused:
            rose = lambda: ours(x, r, w, out)
            lig = lambda: liger_fused_add_rms_norm(x, r, w, EPS, in_place=False)
        else:
            rose = lambda: ours(x, w, out)
            lig = lambda: liger_rms_norm(x, w, EPS, in_place=False)
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
        print(f"fused={int(fused)} h={h} T={t} out-x={out.data_ptr() - x.data_ptr():#x} out2-x={out2.data_ptr() - x.data_ptr():#x} "
              + " ".join(f"{k}={v:.2f}" for k, v in seq), flush=True)
