"""MoE dispatch and combine from a CPU-built bundle against a torch reference (eager, compile).

    python benchmarks/bench_moe.py BUNDLE

BUNDLE: `rose-aot build benchmarks/manifests/moe.toml -o build/bench-moe.rosebundle`.
GPU time per call, CUDA-graph replay, median (the torch reference is written to be capturable).
Also times the dispatch variants forced at every token count to locate the small/decode/prefill
crossovers ("small" forced beyond its capacity is the plan's own choice: see the family). Writes moe.json and moe.md to $OUT (or benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from common import bench_us, copy_bandwidth_tbs, environment, out_dir  # noqa: E402

EXPERTS, TOP_K = 128, 8
TOKENS = [1, 4, 16, 32, 64, 128, 256, 512, 1024, 8192]


def torch_dispatch(x, ids, num_experts):
    import torch

    k = ids.shape[1]
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    out = x.index_select(0, order // k)
    counts = torch.zeros(num_experts, dtype=torch.long, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    offsets = torch.cumsum(counts, 0)
    positions = torch.empty_like(flat)
    positions[order] = torch.arange(flat.numel(), device=x.device)
    return out, offsets, positions.view(ids.shape)


def torch_combine(y, positions, weights):
    t, k = positions.shape
    rows = y.index_select(0, positions.reshape(-1).long()).view(t, k, -1).float()
    return (rows * weights.unsqueeze(-1)).sum(1).to(y.dtype)


def main() -> None:
    import torch

    from rose_aot import open_bundle

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    args = parser.parse_args()
    out = out_dir(os.path.join(os.path.dirname(__file__), "results"))
    env = environment()
    copy_tbs = copy_bandwidth_tbs()
    print(f"{env} copy {copy_tbs:.3f} TB/s", flush=True)
    bundle = open_bundle(args.bundle)
    bundle.preload()
    dispatch_compiled = torch.compile(torch_dispatch)
    combine_compiled = torch.compile(torch_combine)
    rows_out = []
    for hidden in (2048, 7168):  # 7168: also the small/decode switch region (16..64 tokens)
        dispatch = bundle.kernel("moe_dispatch", num_experts=EXPERTS, top_k=TOP_K, hidden=hidden)
        combine = bundle.kernel("moe_combine", top_k=TOP_K, hidden=hidden)
        family = dispatch.family
        for tokens in TOKENS if hidden == 2048 else [1, 16, 32, 64, 128, 8192]:
            gen = torch.Generator(device="cuda").manual_seed(tokens)
            x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
            ids = torch.argsort(torch.rand(tokens, EXPERTS, device="cuda", generator=gen), 1)
            ids = ids[:, :TOP_K].to(torch.int32).contiguous()
            rows = family.max_rows(dispatch.config, tokens)
            d_out = torch.empty(rows, hidden, device="cuda", dtype=torch.bfloat16)
            offsets = torch.empty(EXPERTS + 1, device="cuda", dtype=torch.int32)
            pos = torch.empty(tokens, TOP_K, device="cuda", dtype=torch.int32)
            w = torch.rand(tokens, TOP_K, device="cuda", generator=gen)
            c_out = torch.empty(tokens, hidden, device="cuda", dtype=torch.bfloat16)
            dispatch(x, ids, d_out, offsets, pos)
            nbytes = (1 + TOP_K) * tokens * hidden * 2
            row = {"hidden": hidden, "tokens": tokens, "bytes": nbytes, "us": {}}
            row["us"]["dispatch"] = bench_us(lambda: dispatch(x, ids, d_out, offsets, pos))
            for variant in ("small", "decode", "prefill"):
                row["us"][f"dispatch_{variant}"] = bench_us(
                    lambda: dispatch(x, ids, d_out, offsets, pos, variant=variant)
                )
            row["us"]["dispatch_torch_eager"] = bench_us(lambda: torch_dispatch(x, ids, EXPERTS))
            dispatch_compiled(x, ids, EXPERTS)
            row["us"]["dispatch_torch_compile"] = bench_us(
                lambda: dispatch_compiled(x, ids, EXPERTS)
            )
            combine(d_out, pos, w, c_out)
            row["us"]["combine"] = bench_us(lambda: combine(d_out, pos, w, c_out))
            row["us"]["combine_torch_eager"] = bench_us(lambda: torch_combine(d_out, pos, w))
            combine_compiled(d_out, pos, w)
            row["us"]["combine_torch_compile"] = bench_us(lambda: combine_compiled(d_out, pos, w))
            print(f"H={hidden} T={tokens} " + " ".join(f"{k}={v:.2f}" for k, v in row["us"].items()),
                  flush=True)
            rows_out.append(row)
    with open(os.path.join(out, "moe.json"), "w") as f:
        json.dump({"environment": env, "copy_tbs": copy_tbs, "rows": rows_out}, f, indent=1)
    lines = [
        f"GPU {env['gpu']}, driver {env['driver']}, torch {env['torch']}, {env['date']}; copy "
        f"bandwidth {copy_tbs:.2f} TB/s. µs per call, CUDA-graph replay, median; 128 experts, "
        f"top-8, bf16. TB/s counts the minimum bytes (1 + top_k) x tokens x hidden x 2.",
        "",
        "| hidden | tokens | dispatch µs (plan) | small | decode | prefill | TB/s | % copy | "
        "torch eager | torch.compile | combine µs | TB/s | torch eager | torch.compile |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows_out:
        u = r["us"]
        d_tbs = r["bytes"] / (u["dispatch"] * 1e-6) / 1e12
        c_tbs = r["bytes"] / (u["combine"] * 1e-6) / 1e12
        lines.append(
            f"| {r['hidden']} | {r['tokens']} | {u['dispatch']:.2f} | {u['dispatch_small']:.2f} | "
            f"{u['dispatch_decode']:.2f} | "
            f"{u['dispatch_prefill']:.2f} | {d_tbs:.2f} | {100 * d_tbs / copy_tbs:.0f}% | "
            f"{u['dispatch_torch_eager']:.2f} | {u['dispatch_torch_compile']:.2f} | "
            f"{u['combine']:.2f} | {c_tbs:.2f} | {u['combine_torch_eager']:.2f} | "
            f"{u['combine_torch_compile']:.2f} |"
        )
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, "moe.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
