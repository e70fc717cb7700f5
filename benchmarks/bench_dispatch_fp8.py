"""Fused MoE dispatch + FP8 group quantization (moe_dispatch_fp8_quant) against moe_dispatch
followed by fp8_group_quant (two launches, from the same bundle) and against torch eager /
torch.compile of the same math (argsort dispatch, then per-group absmax quantization).

    python benchmarks/bench_dispatch_fp8.py BUNDLE [--tokens 1,16,...] [--hidden 2048,...]
        [--no-peers] [--label NAME]

BUNDLE: `rose-aot build benchmarks/manifests/moe_fp8.toml -o build/bench-moe-fp8.rosebundle`.
GPU time per call, CUDA-graph replay, median; 128 experts, top-8, bf16 tokens, group 128. The
fused kernel is also timed with each variant forced ("small" and "small_wide" beyond their
capacity are the plan's choice). Before timing, the fused output is checked bitwise against the unfused pair at the
benchmarked shape (through positions); a mismatch aborts the run. Bytes counted: x read once +
e4m3 rows and fp32 scales written. Writes moe_fp8.json and moe_fp8.md (moe_fp8-NAME.* with
--label) to $OUT (or benchmarks/results). --hidden keeps the shapes of those widths; --no-peers
skips torch eager and torch.compile (an A/B of experimental bundles: the fused kernel, the
unfused pair and dispatch alone are still timed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_moe import torch_dispatch  # noqa: E402
from common import (  # noqa: E402
    bench_us,
    compile_per_shape,
    copy_bandwidth_tbs,
    environment,
    file_label,
    int_list,
    out_dir,
)

EXPERTS, TOP_K, GROUP = 128, 8, 128
TOKENS = [1, 4, 16, 32, 64, 96, 128, 256, 1024, 8192]
SHAPES = [(2048, "row_major"), (7168, "row_major"), (7168, "col_major_tma")]


def torch_group_quant(y, group):
    """fp8_group_quant's rule in torch (fp32 math)."""
    import torch

    t, h = y.shape
    g = y.float().view(t, h // group, group)
    scale = g.abs().amax(-1, keepdim=True).clamp(min=1e-10) / 448.0
    q = (g / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(t, h), scale.squeeze(-1)


def torch_dispatch_quant(x, ids, num_experts, group):
    out, offsets, positions = torch_dispatch(x, ids, num_experts)
    q, s = torch_group_quant(out, group)
    return q, s, offsets, positions


def _scales(rows, groups, layout):
    import torch

    if layout == "row_major":
        return torch.empty(rows, groups, device="cuda")
    return torch.empty(groups, -(-rows // 4) * 4, device="cuda").t()[:rows]


def main() -> None:
    import torch

    from rose_aot import open_bundle

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--tokens", type=int_list, default=TOKENS)
    parser.add_argument("--hidden", type=int_list, default=None,
                        help="only the shapes of these widths (default: every shape)")
    parser.add_argument("--no-peers", action="store_true",
                        help="skip torch eager and torch.compile")
    parser.add_argument("--label", type=file_label("moe_fp8"), default=None,
                        help="name the outputs moe_fp8-LABEL.{json,md}")
    args = parser.parse_args()
    tokens_list = args.tokens
    shapes = [s for s in SHAPES if args.hidden is None or s[0] in args.hidden]
    if not shapes:
        parser.error(f"--hidden: no shape of width {args.hidden}; the shapes are {SHAPES}")
    stem = "moe_fp8" + (f"-{args.label}" if args.label else "")
    out = out_dir(os.path.join(os.path.dirname(__file__), "results"))
    env = environment()
    copy_tbs = copy_bandwidth_tbs()
    print(f"{env} copy {copy_tbs:.3f} TB/s", flush=True)
    bundle = open_bundle(args.bundle)
    bundle.preload()
    compiled = compile_per_shape(torch_dispatch_quant)
    rows_out = []
    for hidden, layout in shapes:
        groups = hidden // GROUP
        fused = bundle.kernel("moe_dispatch_fp8_quant", num_experts=EXPERTS, top_k=TOP_K,
                              hidden=hidden, group=GROUP, scale_layout=layout)
        dispatch = bundle.kernel("moe_dispatch", num_experts=EXPERTS, top_k=TOP_K, hidden=hidden)
        quant = bundle.kernel("fp8_group_quant", hidden=hidden, group=GROUP, scale_layout=layout)
        for tokens in tokens_list:
            gen = torch.Generator(device="cuda").manual_seed(tokens)
            x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
            ids = torch.argsort(torch.rand(tokens, EXPERTS, device="cuda", generator=gen), 1)
            ids = ids[:, :TOP_K].to(torch.int32).contiguous()
            rows = fused.family.max_rows(fused.config, tokens)  # alignment 1: tokens * top_k
            q = torch.empty(rows, hidden, device="cuda", dtype=torch.float8_e4m3fn)
            s = _scales(rows, groups, layout)
            offsets = torch.empty(EXPERTS + 1, device="cuda", dtype=torch.int32)
            pos = torch.empty(tokens, TOP_K, device="cuda", dtype=torch.int32)
            routed = torch.empty(rows, hidden, device="cuda", dtype=torch.bfloat16)
            q2 = torch.empty_like(q)
            s2 = _scales(rows, groups, layout)
            offsets2, pos2 = torch.empty_like(offsets), torch.empty_like(pos)

            def unfused():
                dispatch(x, ids, routed, offsets2, pos2)
                quant(routed, q2, s2)

            fused(x, ids, q, s, offsets, pos)
            unfused()
            torch.cuda.synchronize()
            valid = pos >= 0
            a, b = pos[valid].long(), pos2[valid].long()
            if not (torch.equal(offsets, offsets2)
                    and torch.equal(q[a].view(torch.uint8), q2[b].view(torch.uint8))
                    and torch.equal(s[a].contiguous().view(torch.int32),
                                    s2[b].contiguous().view(torch.int32))):
                raise SystemExit(f"fused != dispatch + fp8_group_quant at H={hidden} {layout} "
                                 f"T={tokens}")
            nbytes = tokens * hidden * 2 + rows * (hidden + 4 * groups)
            row = {"hidden": hidden, "layout": layout, "tokens": tokens, "bytes": nbytes, "us": {}}
            u = row["us"]
            u["fused"] = bench_us(lambda: fused(x, ids, q, s, offsets, pos))
            for variant in ("small", "small_wide", "decode", "prefill"):
                u[f"fused_{variant}"] = bench_us(
                    lambda: fused(x, ids, q, s, offsets, pos, variant=variant)
                )
            u["dispatch_then_quant"] = bench_us(unfused)
            u["dispatch_only"] = bench_us(lambda: dispatch(x, ids, routed, offsets2, pos2))
            if not args.no_peers:
                u["torch_eager"] = bench_us(lambda: torch_dispatch_quant(x, ids, EXPERTS, GROUP))
                compiled(x, ids, EXPERTS, GROUP)
                u["torch_compile"] = bench_us(lambda: compiled(x, ids, EXPERTS, GROUP))
            print(f"H={hidden} {layout} T={tokens} " + " ".join(f"{k}={v:.2f}" for k, v in u.items()),
                  flush=True)
            rows_out.append(row)
    with open(os.path.join(out, stem + ".json"), "w") as f:
        json.dump({"environment": env, "copy_tbs": copy_tbs, "rows": rows_out}, f, indent=1)
    lines = [
        f"GPU {env['gpu']}, driver {env['driver']}, torch {env['torch']}, {env['date']}; copy "
        f"bandwidth {copy_tbs:.2f} TB/s. µs per call, CUDA-graph replay, median; 128 experts, "
        f"top-8, bf16 tokens, FP8 groups of {GROUP}. TB/s counts x read once plus codes and "
        f"scales written. torch.compile: compiled for each shape (dynamic=False).",
        "",
        "| hidden | scales | tokens | fused µs (plan) | small | small_wide | decode | prefill | TB/s | "
        "dispatch + fp8_group_quant | dispatch alone | torch eager | torch.compile | "
        "vs unfused | vs torch.compile |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows_out:
        u = r["us"]
        tbs = r["bytes"] / (u["fused"] * 1e-6) / 1e12
        peers = ("-", "-", "-")  # --no-peers
        if "torch_compile" in u:
            peers = (f"{u['torch_eager']:.2f}", f"{u['torch_compile']:.2f}",
                     f"{u['torch_compile'] / u['fused']:.2f}x")
        lines.append(
            f"| {r['hidden']} | {r['layout']} | {r['tokens']} | {u['fused']:.2f} | "
            f"{u['fused_small']:.2f} | {u['fused_small_wide']:.2f} | "
            f"{u['fused_decode']:.2f} | {u['fused_prefill']:.2f} | "
            f"{tbs:.2f} | {u['dispatch_then_quant']:.2f} | {u['dispatch_only']:.2f} | "
            f"{peers[0]} | {peers[1]} | {u['dispatch_then_quant'] / u['fused']:.2f}x | {peers[2]} |"
        )
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, stem + ".md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
