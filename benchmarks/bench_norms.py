"""qk_norm and rms_norm from a CPU-built bundle against torch eager, torch.compile (compiled for
each shape: no dynamic-shape kernels) and Liger.

    python benchmarks/bench_norms.py BUNDLE [--family qk_norm|rms_norm] [--tokens 1,128,...]

BUNDLE must hold the points of benchmarks/manifests/norms.toml
(`rose-aot build benchmarks/manifests/norms.toml -o build/bench-norms.rosebundle`).
Every implementation runs in this process, timed as a CUDA-graph replay (median); each of ours
is first checked against a float64 reference at the benchmarked shape. Prints a table and writes
norms.json plus one PNG per family to $OUT (or benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from common import (  # noqa: E402
    bench_us, compile_per_shape, copy_bandwidth_tbs, environment, int_list, out_dir, plot_families,
)

QK_SHAPES = [(32, 4, 128), (32, 8, 128), (8, 4, 256)]
HIDDENS = [2048, 4096, 7168]
TOKENS = [1, 16, 128, 1024, 8192, 32768]
EPS = 1e-6


def _torch_rms(x, w, eps):
    import torch

    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def qk_norm_torch(q, k, wq, wk):
    q.copy_(_torch_rms(q, wq, EPS))
    k.copy_(_torch_rms(k, wk, EPS))


def rms_norm_torch(x, w, out):
    out.copy_(_torch_rms(x, w, EPS))


def fused_rms_norm_torch(x, residual, w, out):
    residual.add_(x)
    out.copy_(_torch_rms(residual, w, EPS))


def _max_rel_err(got, want) -> float:
    got, want = got.double(), want.double()
    return ((got - want).abs() / want.abs().clamp(min=1.0)).max().item()


def bench_qk_norm(bundle, tokens_list, rows):
    import torch
    from liger_kernel.transformers.functional import liger_rms_norm

    compiled = compile_per_shape(qk_norm_torch)
    for hq, hk, d in QK_SHAPES:
        ours = bundle.kernel("qk_norm", num_q_heads=hq, num_k_heads=hk, head_dim=d, eps=EPS)
        rowwise = bundle.kernel("rms_norm", hidden=d, eps=EPS)
        for t in tokens_list:
            gen = torch.Generator(device="cuda").manual_seed(t)
            q = torch.randn(t, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            k = torch.randn(t, hk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            wq = 1 + 0.1 * torch.randn(d, device="cuda", generator=gen)
            wk = 1 + 0.1 * torch.randn(d, device="cuda", generator=gen)
            wq, wk = wq.bfloat16(), wk.bfloat16()
            # correctness at the benchmarked shape (float64 reference)
            q64, k64 = q.double(), k.double()
            ref_q = (q64 * torch.rsqrt(q64.pow(2).mean(-1, keepdim=True) + EPS) * wq.double())
            ref_k = (k64 * torch.rsqrt(k64.pow(2).mean(-1, keepdim=True) + EPS) * wk.double())
            qc, kc = q.clone(), k.clone()
            ours(qc, kc, wq, wk)
            err = max(_max_rel_err(qc, ref_q), _max_rel_err(kc, ref_k))
            assert err < 2**-7, f"qk_norm {hq}/{hk}/{d} T={t}: error {err}"
            q2, k2 = q.view(-1, d), k.view(-1, d)
            o2q, o2k = torch.empty_like(q2), torch.empty_like(k2)
            impls = {
                "rose_aot": lambda: ours(q, k, wq, wk),
                "torch_eager": lambda: qk_norm_torch(q, k, wq, wk),
                "torch_compile": lambda: compiled(q, k, wq, wk),
                "liger_per_head": lambda: (liger_rms_norm(q2, wq, EPS, in_place=True),
                                           liger_rms_norm(k2, wk, EPS, in_place=True)),
                "rose_aot_rowwise_rms_norm": lambda: (rowwise(q2, wq, o2q), rowwise(k2, wk, o2k)),
            }
            nbytes = 2 * t * (hq + hk) * d * 2
            rows.append(_measure("qk_norm", f"{hq}/{hk}/{d}", t, nbytes, impls))


def rms_norm_inputs(t: int, h: int, fused: bool) -> tuple:
    """x, residual, weight, out and the float64 reference of one rms_norm shape (bf16, seeded
    by the shape; the reference of the fused form normalizes the residual sum rounded to bf16)."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(t + h)
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, generator=gen)
    r = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = (1 + 0.1 * torch.randn(h, device="cuda", generator=gen)).bfloat16()
    out = torch.empty_like(x)
    base = (x.double() + r.double()).bfloat16().double() if fused else x.double()
    ref = base * torch.rsqrt(base.pow(2).mean(-1, keepdim=True) + EPS) * w.double()
    return x, r, w, out, ref


def bench_rms_norm(bundle, tokens_list, rows, hiddens=HIDDENS):
    import torch
    from liger_kernel.transformers.functional import liger_fused_add_rms_norm, liger_rms_norm

    compiled = compile_per_shape(rms_norm_torch)
    compiled_fused = compile_per_shape(fused_rms_norm_torch)
    for fused in (False, True):
        for h in hiddens:
            ours = bundle.kernel("rms_norm", hidden=h, eps=EPS, fused_residual=fused)
            for t in tokens_list:
                x, r, w, out, ref = rms_norm_inputs(t, h, fused)
                o = torch.full_like(x, float("nan"))
                if fused:
                    ours(x, r.clone(), w, o)
                else:
                    ours(x, w, o)
                err = _max_rel_err(o, ref)
                assert err < 2**-7, f"rms_norm {h} fused={fused} T={t}: error {err}"
                if fused:
                    impls = {
                        "rose_aot": lambda: ours(x, r, w, out),
                        "torch_eager": lambda: fused_rms_norm_torch(x, r, w, out),
                        "torch_compile": lambda: compiled_fused(x, r, w, out),
                        "liger": lambda: liger_fused_add_rms_norm(x, r, w, EPS, in_place=False),
                    }
                    nbytes = 4 * t * h * 2
                else:
                    impls = {
                        "rose_aot": lambda: ours(x, w, out),
                        "torch_eager": lambda: rms_norm_torch(x, w, out),
                        "torch_compile": lambda: compiled(x, w, out),
                        "liger": lambda: liger_rms_norm(x, w, EPS, in_place=False),
                    }
                    nbytes = 2 * t * h * 2
                name = "rms_norm_fused_residual" if fused else "rms_norm"
                rows.append(_measure(name, str(h), t, nbytes, impls))


def _measure(family, shape, tokens, nbytes, impls):
    row = {"family": family, "shape": shape, "tokens": tokens, "bytes": nbytes, "us": {}}
    for name, fn in impls.items():
        fn()  # warm up: compile, autotune, module load
        row["us"][name] = bench_us(fn)
    print(
        f"  {family:24} {shape:10} T={tokens:<6} "
        + " ".join(f"{k}={v:8.2f}" for k, v in row["us"].items()),
        flush=True,
    )
    return row


def report(rows, copy_tbs, env, out, name=""):
    lines = [
        f"GPU {env['gpu']}, driver {env['driver']}, torch {env['torch']}, {env['date']}; "
        f"copy bandwidth {copy_tbs:.2f} TB/s (read + write). Times: µs per call, CUDA-graph "
        f"replay, median. TB/s and % of copy bandwidth are ours.",
        "",
        "| kernel | shape | tokens | rose-aot µs | TB/s | % copy | peers µs (speed-up of rose-aot) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ours = r["us"]["rose_aot"]
        tbs = r["bytes"] / (ours * 1e-6) / 1e12
        peers = ", ".join(
            f"{k} {v:.2f} ({v / ours:.2f}x)" for k, v in r["us"].items() if k != "rose_aot"
        )
        lines.append(
            f"| {r['family']} | {r['shape']} | {r['tokens']} | {ours:.2f} | {tbs:.2f} | "
            f"{100 * tbs / copy_tbs:.0f}% | {peers} |"
        )
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, f"norms{name}.md"), "w") as f:
        f.write(text + "\n")


def main() -> None:
    import torch

    from rose_aot import open_bundle

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--family", choices=["qk_norm", "rms_norm", "all"], default="all")
    parser.add_argument("--tokens", type=int_list, default=TOKENS)
    parser.add_argument("--hidden", type=int_list, default=HIDDENS,
                        help="rms_norm hidden sizes (the bundle must hold their points)")
    parser.add_argument("--name", default="", help="suffix of the result files")
    args = parser.parse_args()
    tokens, hiddens = args.tokens, args.hidden

    torch.manual_seed(0)
    out = out_dir(os.path.join(os.path.dirname(__file__), "results"))
    env = environment()
    copy_tbs = copy_bandwidth_tbs()
    print(f"{env} copy {copy_tbs:.3f} TB/s", flush=True)
    bundle = open_bundle(args.bundle)
    bundle.preload()
    rows = []
    if args.family in ("qk_norm", "all"):
        bench_qk_norm(bundle, tokens, rows)
    if args.family in ("rms_norm", "all"):
        bench_rms_norm(bundle, tokens, rows, hiddens)
    name = f"-{args.name}" if args.name else ""
    with open(os.path.join(out, f"norms-{args.family}{name}.json"), "w") as f:
        json.dump({"environment": env, "copy_tbs": copy_tbs, "rows": rows}, f, indent=1)
    report(rows, copy_tbs, env, out, name)
    plot_families(rows, out, name)


if __name__ == "__main__":
    main()
