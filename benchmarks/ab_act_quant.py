"""A/B of activation / quantization bundles built from different trees, in one process.

    python benchmarks/ab_act_quant.py base=build/exp/base.rosebundle el=build/exp/el.rosebundle

Each LABEL=BUNDLE (opened by this checkout's loader) must hold the points of the experiment of
benchmarks/results/norm-cache-hints-experiment-h200.md: act_and_mul SiLU at d 2048, 7168 and
14336; fp8_group_quant (group 128, column-major scales) at hidden 2048, 4096 and 7168; MXFP4
(swizzled scales) at hidden 4096 and 7168. Per shape, every bundle's outputs must be
bit-identical to the first bundle's (a tree that changes only performance); then two rounds in
alternating order, CUDA-graph replay medians (30 ms each), with per-shape torch.compile for
act_and_mul. Prints one line per shape.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))

from ab_norms import labelled_bundle  # noqa: E402
from common import bench_us, bundle_points, compile_per_shape  # noqa: E402

POINTS = (
    [("act_and_mul", dict(d=d, activation="silu"), (128, 8192, 32768)) for d in (2048, 7168, 14336)]
    + [("fp8_group_quant", dict(hidden=h, group=128, scale_layout="col_major_tma"), (8192, 32768))
       for h in (2048, 4096, 7168)]
    + [("block_scaled_quant", dict(hidden=h, format="mxfp4", scale_layout="swizzled_128x4"),
        (8192, 32768)) for h in (4096, 7168)]
)


def _inputs(family, values, t):
    import torch

    from bench_act_quant import _scales

    if family == "act_and_mul":
        d = values["d"]
        return [torch.randn(t, 2 * d, device="cuda", dtype=torch.bfloat16),
                torch.empty(t, d, device="cuda", dtype=torch.bfloat16)]
    h = values["hidden"]
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    if family == "fp8_group_quant":
        return [x, torch.empty(t, h, device="cuda", dtype=torch.float8_e4m3fn),
                _scales(t, h // 128, "col_major_tma")]
    q = torch.empty(t, h // 2, device="cuda", dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    s = torch.zeros(-(-t // 128) * 128, -(-(h // 32) // 4) * 4, device="cuda",
                    dtype=torch.uint8).view(torch.float8_e8m0fnu)
    return [x, q, s]


def missing_points(path: str) -> str:
    """The experiment's points the bundle lacks ("" if none), read from its index on the CPU."""
    points, unreadable = bundle_points(path)
    if unreadable:
        return unreadable
    lack = [f"{family}({', '.join(f'{k}={v}' for k, v in values.items())})"
            for family, values, _ in POINTS
            if not any(p["family"] == family and all(p["config"].get(k) == v
                                                     for k, v in values.items()) for p in points)]
    return f"no point {', '.join(lack)}" if lack else ""


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", nargs="+", type=labelled_bundle, metavar="LABEL=BUNDLE")
    args = parser.parse_args(argv)
    for label, path in args.bundles:
        lacking = missing_points(path)
        if lacking:
            parser.error(f"{label}={path}: {lacking}")
    import torch

    from bench_act_quant import act_torch

    from rose_aot import open_bundle

    bundles = {}
    for label, path in args.bundles:
        bundles[label] = open_bundle(path)
        bundles[label].preload()
    compiled = compile_per_shape(act_torch)
    for family, values, tokens_list in POINTS:
        handles = {k: b.kernel(family, **values) for k, b in bundles.items()}
        name = f"{family}:{'/'.join(str(v) for v in values.values())}"
        for t in tokens_list:
            call = _inputs(family, values, t)
            outputs = {}
            for k, handle in handles.items():
                fresh = [call[0], *(a.clone() for a in call[1:])]
                handle(*fresh)
                torch.cuda.synchronize()
                outputs[k] = [a.view(torch.uint8) if a.element_size() == 1 else a
                              for a in fresh[1:]]
            first = next(iter(outputs.values()))
            for k, out in outputs.items():
                assert all(torch.equal(a, b) for a, b in zip(out, first)), (name, k, t)
            peer = (lambda: compiled(*call, "silu")) if family == "act_and_mul" else None
            times = {k: [] for k in (["compile"] if peer else []) + list(handles)}
            for rnd in range(2):
                if peer:
                    times["compile"].append(bench_us(peer, rep_ms=30))
                for k in (list(handles) if rnd % 2 == 0 else list(handles)[::-1]):
                    handle = handles[k]
                    times[k].append(bench_us(lambda: handle(*call), rep_ms=30))
            print(f"{name:40s} T={t:6d} "
                  + " ".join(f"{k}={statistics.median(v):8.2f}" for k, v in times.items()),
                  flush=True)


if __name__ == "__main__":
    main()
