"""Sweep of launch shapes for qk_norm and rms_norm: every variant forced at every token count.

    python benchmarks/tune_norms.py BUNDLE

BUNDLE: `rose-aot build benchmarks/manifests/tuning.toml -o build/tune-norms.rosebundle`.
Writes tuning.json to $OUT (or benchmarks/results) and prints, per shape, the fastest prefill
warps per block at >= 8192 tokens and the token count where prefill overtakes decode. The
choices in rose_aot/kernels/rms_norm/tuning.py and rose_aot/kernels/qk_norm/tuning.py are read
off this output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from common import bench_us, environment, out_dir  # noqa: E402

TOKENS = [1, 16, 128, 512, 1024, 2048, 4096, 8192, 32768]


def _inputs(family, point, tokens):
    import torch

    c = point["config"]
    if family == "qk_norm":
        d = c["head_dim"]
        q = torch.randn(tokens, c["num_q_heads"], d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(tokens, c["num_k_heads"], d, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(d, device="cuda", dtype=torch.bfloat16)
        return (q, k, w, w)
    h = c["hidden"]
    x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(h, device="cuda", dtype=torch.bfloat16)
    if c["fused_residual"]:
        return (x, torch.randn_like(x), w, torch.empty_like(x))
    return (x, w, torch.empty_like(x))


def main() -> None:
    from rose_aot import open_bundle

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    args = parser.parse_args()
    bundle = open_bundle(args.bundle)
    bundle.preload()
    rows = []
    for point in bundle.index["points"]:
        family, config = point["family"], point["config"]
        handle = bundle.kernel(family, **config)
        for tokens in TOKENS:
            tensors = _inputs(family, point, tokens)
            for variant in ("decode", "prefill"):
                if variant == "decode" and config["prefill_warps"] != 4:
                    continue  # the decode variant does not depend on prefill_warps
                handle(*tensors, variant=variant)
                us = bench_us(lambda: handle(*tensors, variant=variant), rep_ms=30)
                rows.append({"family": family, "config": config, "tokens": tokens,
                             "variant": variant, "us": us})
                print(f"{handle.key} T={tokens} {variant}: {us:.2f} µs", flush=True)
    out = out_dir(os.path.join(os.path.dirname(__file__), "results"))
    with open(os.path.join(out, "tuning.json"), "w") as f:
        json.dump({"environment": environment(), "rows": rows}, f, indent=1)
    summarize(rows)


def _shape(row) -> str:
    c = dict(row["config"])
    c.pop("prefill_warps")
    return f"{row['family']}(" + ",".join(f"{k}={v}" for k, v in c.items()
                                          if k not in ("dtype", "weight_dtype", "out_dtype",
                                                       "eps", "weight_offset")) + ")"


def summarize(rows) -> None:
    """Best prefill warps per shape (sum of µs over tokens >= 8192) and decode/prefill times."""
    shapes = sorted({_shape(r) for r in rows})
    for shape in shapes:
        mine = [r for r in rows if _shape(r) == shape]
        totals = {}
        for r in mine:
            if r["variant"] == "prefill" and r["tokens"] >= 8192:
                w = r["config"]["prefill_warps"]
                totals[w] = totals.get(w, 0.0) + r["us"]
        best = min(totals, key=totals.get)
        print(f"{shape}: prefill warps per block -> {best} "
              f"({', '.join(f'{w}: {t:.1f}' for w, t in sorted(totals.items()))} µs at >= 8192)")
        for tokens in sorted({r["tokens"] for r in mine}):
            dec = [r["us"] for r in mine if r["tokens"] == tokens and r["variant"] == "decode"]
            pre = {r["config"]["prefill_warps"]: r["us"] for r in mine
                   if r["tokens"] == tokens and r["variant"] == "prefill"}
            print(f"    T={tokens:<6} decode {dec[0]:8.2f}  prefill "
                  + " ".join(f"w{w}={u:.2f}" for w, u in sorted(pre.items())))


if __name__ == "__main__":
    main()
