"""MoE dispatch and combine from a CPU-built bundle against a torch reference (eager, compile).

    python benchmarks/bench_moe.py BUNDLE
    python benchmarks/bench_moe.py BUNDLE --combine-sweep [--sweep-tokens 1,2,4,8,16,32,64,128]

BUNDLE: `rose-aot build benchmarks/manifests/moe.toml -o build/bench-moe.rosebundle`.
GPU time per call, CUDA-graph replay, median (the torch reference is written to be capturable).
Also times the dispatch variants forced at every token count to locate the small/decode/prefill
crossovers ("small" forced beyond its capacity is the plan's own choice: see the family). Writes
moe.json and moe.md to $OUT (or benchmarks/results).

--combine-sweep runs only the decode-size combine comparison instead: every moe_combine point
of the bundle (top-2/4/8) at each sweep token count, the plan's choice and every variant forced,
against torch.compile specialised to each shape (dynamic=False). Writes moe-combine-sweep.json
and moe-combine-sweep.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from common import (  # noqa: E402
    bench_us,
    compile_per_shape,
    copy_bandwidth_tbs,
    environment,
    int_list,
    out_dir,
)

EXPERTS, TOP_K = 128, 8
TOKENS = [1, 4, 16, 32, 48, 64, 128, 256, 512, 1024, 8192]


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


def combine_sweep(bundle, token_counts, out, env, copy_tbs, top_ks=None) -> None:
    """Every moe_combine point of the bundle at decode sizes: plan, each variant forced, and
    torch.compile compiled for each shape (its best case: no dynamic-shape kernels)."""
    import torch

    compiled = compile_per_shape(torch_combine)
    arch = bundle.arch_for_device(torch.cuda.current_device())
    points = sorted(
        (p["config"]["top_k"], p["config"]["hidden"], p["config"]["dtype"])
        for p in bundle.index["points"]
        if p["family"] == "moe_combine" and p["arch"] == arch
        and (top_ks is None or p["config"]["top_k"] in top_ks)
    )
    if not points:
        sys.exit(f"bench_moe.py: the bundle has no moe_combine point for {arch}"
                 + (f" with top_k in {top_ks}" if top_ks else ""))
    rows_out = []
    for top_k, hidden, dtype in points:
        combine = bundle.kernel("moe_combine", top_k=top_k, hidden=hidden, dtype=dtype)
        variants = [v.name for v in combine.record(torch.cuda.current_device()).variants]
        for tokens in token_counts:
            gen = torch.Generator(device="cuda").manual_seed(tokens * 64 + top_k)
            rows = tokens * top_k
            y = torch.randn(rows, hidden, device="cuda", generator=gen).to(getattr(torch, dtype))
            pos = torch.randperm(rows, device="cuda", generator=gen).view(tokens, top_k)
            pos = pos.to(torch.int32)
            w = torch.rand(tokens, top_k, device="cuda", generator=gen)
            c_out = torch.empty(tokens, hidden, device="cuda", dtype=y.dtype)
            plan = combine.plan(y, pos, w, c_out)
            row = {"top_k": top_k, "hidden": hidden, "dtype": dtype, "tokens": tokens,
                   "plan": plan[0].variant, "us": {}}
            combine(y, pos, w, c_out)
            row["us"]["combine"] = bench_us(lambda: combine(y, pos, w, c_out))
            for variant in variants:
                row["us"][f"combine_{variant}"] = bench_us(
                    lambda: combine(y, pos, w, c_out, variant=variant)
                )
            compiled(y, pos, w)
            row["us"]["combine_torch_compile"] = bench_us(lambda: compiled(y, pos, w))
            print(f"K={top_k} H={hidden} T={tokens} plan={row['plan']} "
                  + " ".join(f"{k}={v:.2f}" for k, v in row["us"].items()), flush=True)
            rows_out.append(row)
    with open(os.path.join(out, "moe-combine-sweep.json"), "w") as f:
        json.dump({"environment": env, "copy_tbs": copy_tbs, "rows": rows_out}, f, indent=1)
    names = [k for k in rows_out[0]["us"] if k != "combine_torch_compile"] if rows_out else []
    lines = [
        f"GPU {env['gpu']}, driver {env['driver']}, torch {env['torch']}, {env['date']}. µs per "
        f"call, CUDA-graph replay, median; bf16 unless noted. torch.compile: dynamic=False, "
        f"compiled for each shape. Speed-up = torch.compile / combine (plan).",
        "",
        "| top_k | hidden | tokens | plan | " + " | ".join(n.replace("combine_", "") for n in names)
        + " | torch.compile | speed-up |",
        "|---" * (len(names) + 6) + "|",
    ]
    for r in rows_out:
        u = r["us"]
        lines.append(
            f"| {r['top_k']} | {r['hidden']} | {r['tokens']} | {r['plan']} | "
            + " | ".join(f"{u[n]:.2f}" for n in names)
            + f" | {u['combine_torch_compile']:.2f} | "
            f"{u['combine_torch_compile'] / u['combine']:.2f}x |"
        )
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, "moe-combine-sweep.md"), "w") as f:
        f.write(text + "\n")


def main() -> None:
    import torch

    from rose_aot import open_bundle

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--combine-sweep", action="store_true",
                        help="only the combine comparison at decode sizes (top-2/4/8)")
    parser.add_argument("--sweep-tokens", type=int_list, default=[1, 2, 4, 8, 16, 32, 64, 128],
                        help="token counts of --combine-sweep (comma-separated)")
    parser.add_argument("--sweep-top-k", type=int_list, default=None,
                        help="only these top_k values in --combine-sweep (comma-separated; "
                             "default: every combine point of the bundle)")
    args = parser.parse_args()
    out = out_dir(os.path.join(os.path.dirname(__file__), "results"))
    env = environment()
    copy_tbs = copy_bandwidth_tbs()
    print(f"{env} copy {copy_tbs:.3f} TB/s", flush=True)
    bundle = open_bundle(args.bundle)
    bundle.preload()
    if args.combine_sweep:
        tokens = args.sweep_tokens
        combine_sweep(bundle, tokens, out, env, copy_tbs, args.sweep_top_k)
        return
    dispatch_compiled = compile_per_shape(torch_dispatch)
    combine_compiled = compile_per_shape(torch_combine)
    rows_out = []
    for hidden in (2048, 7168):  # 7168: also the small/decode switch region (16..64 tokens)
        dispatch = bundle.kernel("moe_dispatch", num_experts=EXPERTS, top_k=TOP_K, hidden=hidden)
        combine = bundle.kernel("moe_combine", top_k=TOP_K, hidden=hidden)
        family = dispatch.family
        for tokens in TOKENS if hidden == 2048 else [1, 16, 32, 48, 64, 128, 8192]:
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
