"""All-reduce on several GPUs of one node: rose-aot vs NCCL vs torch symmetric memory, and the
fused all-reduce + residual add + RMSNorm vs separate launches. One process per GPU:

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    torchrun --standalone --nproc-per-node 2 benchmarks/bench_multigpu.py BUNDLE

(or `ROSE_AOT_TEST_BUNDLE=BUNDLE tests/multigpu/run.sh --bench`). BUNDLE: built on a CPU
machine with `rose-aot build tests/manifests -o build/test.rosebundle` (the all_reduce and
rms_norm points of tests/manifests/multigpu-cases.toml).

GPU time per call: 10 calls captured in one CUDA graph; the graph is replayed back to back
(the collectives keep the ranks in step), each replay timed with CUDA events; the median
replay / 10, and the slowest rank's median is reported. Writes multigpu.json and multigpu.md
to $OUT (or benchmarks/results). Runs in about a minute on two H200s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

sys.path.insert(0, HERE)
from common import multigpu_common  # noqa: E402

_mg = multigpu_common()  # sets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1
log, setup = _mg.log, _mg.setup

KB, MB = 1024, 1024 * 1024
SIZES = [8 * KB, 16 * KB, 32 * KB, 64 * KB, 128 * KB, 256 * KB, 512 * KB, 1 * MB, 2 * MB,
         4 * MB, 8 * MB, 16 * MB, 32 * MB, 64 * MB]
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128]
HIDDEN = 7168
TOP_K = 8
SWEEP_SIZES = [8 * KB, 64 * KB, 256 * KB, 1 * MB, 4 * MB, 16 * MB, 64 * MB]
SWEEP_CAPS = [8, 16, 32, 64, 132]
CALLS_PER_GRAPH = 10
WARMUP_REPLAYS = 5
TIMED_REPLAYS = 40


def time_graph(fn) -> float:
    """Median µs per call of `fn` (one collective call), over all ranks the slowest median."""
    import torch
    import torch.distributed as dist

    fn()  # eager warm-up: loads kernels, resolves plans, initialises communicators
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    torch.cuda.synchronize()
    dist.barrier()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(TIMED_REPLAYS + 1)]
    for _ in range(WARMUP_REPLAYS):
        graph.replay()
    events[0].record()
    for i in range(TIMED_REPLAYS):
        graph.replay()
        events[i + 1].record()
    torch.cuda.synchronize()
    per_call = [events[i].elapsed_time(events[i + 1]) * 1e3 / CALLS_PER_GRAPH
                for i in range(TIMED_REPLAYS)]
    median = torch.tensor([statistics.median(per_call)], device="cuda")
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    del graph
    return float(median.item())


class BlockCap:
    """The all_reduce family with the plan's block cap replaced (benchmark only): the kernels
    work for any grid up to MAX_BLOCKS (grid-stride loops, flags per block), so the best cap
    per size can be measured without recompiling. Installed on a handle, it replaces the
    family the handle plans with; `handle._resolved` is cleared so the next call re-plans."""

    def __init__(self, family, blocks: int):
        self.family = family
        self.blocks = blocks

    def __getattr__(self, name):
        return getattr(self.family, name)

    def plan(self, c, variants, sizes, sm_count, force=None):
        from rose_aot.kernels.all_reduce.family import MAX_BLOCKS
        from rose_aot.kernels.spec import Launch

        launches = self.family.plan(c, variants, sizes, sm_count, force)
        out = []
        for launch in launches:
            v = variants[launch.variant]
            per_block = v.threads * (v.constants["world_size"] if launch.variant == "two_shot" else 1)
            need = -(-(sizes["n"] // v.constants["vec"]) // per_block)
            blocks = max(1, min(need, self.blocks, sm_count, MAX_BLOCKS))
            out.append(Launch(launch.variant, (blocks, 1, 1)))
        return tuple(out)


def sweep_blocks(ar, ws, sizes, caps, rank):
    """µs per call of both variants at every block cap: data for tuning.py."""
    import torch

    handle = ar.handle
    family = handle.family
    results = []
    try:
        for nbytes in sizes:
            x = torch.randn(nbytes // 2, device="cuda").to(torch.bfloat16)
            out = torch.empty_like(x)
            for variant in ("one_shot", "two_shot"):
                for cap in caps:
                    handle.family = BlockCap(family, cap)
                    handle._resolved.clear()
                    grid = handle.plan(x, out, *ws.args(x.dtype), variant=variant)[0].grid[0]
                    us = time_graph(lambda: ar(x, out, variant=variant))
                    results.append({"bytes": nbytes, "variant": variant, "cap": cap,
                                    "grid": grid, "us": us})
                    if rank == 0:
                        log(rank, f"sweep {nbytes} B {variant} cap {cap} grid {grid}: {us:.2f} µs")
    finally:
        handle.family = family
        handle._resolved.clear()
    return results


def bus_gbs(nbytes: int, us: float, world: int) -> float:
    """NCCL-tests bus bandwidth of an all-reduce: algbw x 2(W-1)/W."""
    return nbytes / (us * 1e-6) * 2 * (world - 1) / world / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--quick", action="store_true", help="a few sizes only (smoke run)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the block-count sweep")
    args = parser.parse_args()
    rank, world, local = setup()

    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    from rose_aot import open_bundle
    from rose_aot.distributed import (
        AllReduce,
        FusedAllReduceRmsNorm,
        FusedMoeCombineAllReduce,
        SymmetricWorkspace,
    )

    info = {
        "gpu": torch.cuda.get_device_name(local),
        "world_size": world,
        "torch": torch.__version__,
        "nccl": str(torch.cuda.nccl.version()),
        "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
        "method": f"{CALLS_PER_GRAPH} calls per CUDA graph, {TIMED_REPLAYS} timed replays, "
                  f"median per call, slowest rank",
    }
    if rank == 0:
        log(rank, json.dumps(info))
    sizes = SIZES if not args.quick else [8 * KB, 256 * KB, 4 * MB]
    tokens_list = TOKENS if not args.quick else [1, 128]
    bundle = open_bundle(args.bundle)
    ws = SymmetricWorkspace(None, max(sizes))
    dtype = torch.bfloat16
    ar = AllReduce(bundle, dtype, workspace=ws)
    group_name = dist.group.WORLD.group_name

    rows = []
    keep = []  # symmetric tensors stay allocated until the end (freeing is not collective)
    for nbytes in sizes:
        n = nbytes // 2
        x = torch.randn(n, device="cuda").to(dtype)
        out = torch.empty_like(x)
        zeros = torch.zeros(n, dtype=dtype, device="cuda")
        sx = symm_mem.empty(n, dtype=dtype, device=f"cuda:{local}")
        sx.zero_()
        symm_mem.rendezvous(sx, group_name)
        keep.append(sx)
        row = {"bytes": nbytes}
        row["rose_plan"] = time_graph(lambda: ar(x, out))
        row["rose_plan_variant"] = ar.handle.plan(x, out, *ws.args(dtype))[0].variant
        row["rose_one_shot"] = time_graph(lambda: ar(x, out, variant="one_shot"))
        row["rose_two_shot"] = time_graph(lambda: ar(x, out, variant="two_shot"))
        row["nccl"] = time_graph(lambda: dist.all_reduce(zeros))
        row["symm_one_shot"] = time_graph(
            lambda: torch.ops.symm_mem.one_shot_all_reduce(sx, "sum", group_name))
        row["symm_two_shot"] = time_graph(
            lambda: torch.ops.symm_mem.two_shot_all_reduce_(sx, "sum", group_name))
        rows.append(row)
        if rank == 0:
            log(rank, " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in row.items()))

    sweep = []
    if not args.no_sweep:
        sweep = sweep_blocks(ar, ws, [s for s in sizes if s in SWEEP_SIZES] or sizes[:1],
                             SWEEP_CAPS, rank)

    # The switch point the plan should use: the smallest size from which two-shot is never
    # slower than one-shot.
    suggested = None
    for i, row in enumerate(rows):
        if all(r["rose_two_shot"] <= r["rose_one_shot"] for r in rows[i:]):
            suggested = row["bytes"]
            break

    fused_rows = []
    norm = bundle.kernel("rms_norm", hidden=HIDDEN, dtype="bfloat16", eps=1e-6,
                         fused_residual=True)
    fused = FusedAllReduceRmsNorm(bundle, dtype, hidden=HIDDEN, eps=1e-6, workspace=ws)
    weight = (1.0 + 0.1 * torch.randn(HIDDEN, device="cuda")).to(dtype)
    for tokens in tokens_list:
        x = (0.01 * torch.randn(tokens, HIDDEN, device="cuda")).to(dtype)
        residual = torch.randn(tokens, HIDDEN, device="cuda").to(dtype)
        summed = torch.empty_like(x)
        out = torch.empty_like(x)
        nccl_x = x.clone()

        def separate():
            ar(x, summed)
            norm(summed, residual, weight, out)

        def nccl_then_norm():
            dist.all_reduce(nccl_x)
            norm(nccl_x, residual, weight, out)

        row = {"tokens": tokens, "hidden": HIDDEN,
               "fused": time_graph(lambda: fused(x, residual, weight, out)),
               "rose_ar_then_rms_norm": time_graph(separate),
               "nccl_then_rms_norm": time_graph(nccl_then_norm)}
        fused_rows.append(row)
        if rank == 0:
            log(rank, " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in row.items()))

    # Tensor-parallel MoE decode: each rank's combine (top-8, its half of the experts) + the
    # all-reduce in one launch, vs moe_combine then the all-reduce.
    combine_rows = []
    combine = FusedMoeCombineAllReduce(bundle, dtype, hidden=HIDDEN, top_k=TOP_K, workspace=ws)
    moe_combine = bundle.kernel("moe_combine", top_k=TOP_K, hidden=HIDDEN, dtype="bfloat16")
    for tokens in tokens_list:
        g = torch.Generator(device="cuda").manual_seed(tokens)
        rows_y = tokens * TOP_K
        owner = torch.randint(0, world, (tokens, TOP_K), generator=g, device="cuda")
        slot = torch.randperm(rows_y, generator=g, device="cuda").view(tokens, TOP_K).int()
        positions = torch.where(owner == rank, slot, torch.full_like(slot, -1))
        weights = torch.rand(tokens, TOP_K, generator=g, device="cuda")
        y = torch.randn(rows_y, HIDDEN, device="cuda").to(dtype)
        out = torch.empty(tokens, HIDDEN, dtype=dtype, device="cuda")
        partial = torch.empty_like(out)

        def separate():
            moe_combine(y, positions, weights, partial)
            ar(partial, out)

        def nccl_separate():
            moe_combine(y, positions, weights, partial)
            dist.all_reduce(partial)

        row = {"tokens": tokens, "hidden": HIDDEN, "top_k": TOP_K,
               "fused": time_graph(lambda: combine(y, positions, weights, out)),
               "moe_combine_then_rose_ar": time_graph(separate),
               "moe_combine_then_nccl": time_graph(nccl_separate)}
        combine_rows.append(row)
        if rank == 0:
            log(rank, " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in row.items()))

    if rank == 0:
        write(info, rows, fused_rows, suggested, world, combine_rows, sweep)
    dist.barrier()
    dist.destroy_process_group()


def write(info, rows, fused_rows, suggested, world, combine_rows=(), sweep=()) -> None:
    out = os.environ.get("OUT") or os.path.join(HERE, "results")
    os.makedirs(out, exist_ok=True)
    goals = []
    small = [r for r in rows if r["bytes"] <= 1 * MB]
    peers = ("nccl", "symm_one_shot", "symm_two_shot")
    behind = [(r["bytes"], p) for r in small for p in peers if r["rose_plan"] > r[p]]
    goals.append(("at or below every peer at every size <= 1 MB", not behind,
                  f"behind at {behind}" if behind else ""))
    slow = [r["bytes"] for r in rows if r["bytes"] <= 256 * KB and r["nccl"] / r["rose_plan"] < 1.5]
    goals.append((">= 1.5x faster than NCCL at <= 256 KB", not slow,
                  f"below 1.5x at {slow}" if slow else ""))
    big = [r for r in rows if r["bytes"] == 64 * MB]
    if big:
        ours, nccl = bus_gbs(64 * MB, big[0]["rose_plan"], world), bus_gbs(64 * MB, big[0]["nccl"], world)
        goals.append((">= 90% of NCCL's bus bandwidth at 64 MB", ours >= 0.9 * nccl,
                      f"{ours:.0f} vs {nccl:.0f} GB/s ({100 * ours / nccl:.0f}%)"))
    slower_combine = [r["tokens"] for r in combine_rows
                      if r["fused"] >= r["moe_combine_then_rose_ar"]]
    if combine_rows:
        goals.append(("fused MoE combine + all-reduce faster than the two launches at 1-128 tokens",
                      not slower_combine,
                      f"not faster at {slower_combine}" if slower_combine else ""))
    slower = [r["tokens"] for r in fused_rows if r["fused"] >= r["rose_ar_then_rms_norm"]]
    goals.append(("fused AR+residual+RMSNorm faster than separate launches at 1-128 tokens",
                  not slower, f"not faster at {slower}" if slower else ""))
    data = {"info": info, "all_reduce_bf16": rows, "fused_7168_bf16": fused_rows,
            "moe_combine_all_reduce_7168_top8_bf16": list(combine_rows),
            "block_cap_sweep_bf16": list(sweep),
            "suggested_two_shot_min_bytes": suggested,
            "goals": [{"goal": g, "met": bool(m), "detail": d} for g, m, d in goals]}
    with open(os.path.join(out, "multigpu.json"), "w") as f:
        json.dump(data, f, indent=1)
    lines = [f"# All-reduce on {world} x {info['gpu']}", "",
             f"torch {info['torch']}, NCCL {info['nccl']}, {info['env']}; {info['method']}.", "",
             "## bf16 sum all-reduce, µs per call", "",
             "| bytes | rose (plan) | plan picks | rose one-shot | rose two-shot | NCCL | "
             "symm_mem one_shot | symm_mem two_shot_ | rose bus GB/s | NCCL bus GB/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {_size(r['bytes'])} | {r['rose_plan']:.2f} | {r['rose_plan_variant']} | "
            f"{r['rose_one_shot']:.2f} | {r['rose_two_shot']:.2f} | {r['nccl']:.2f} | "
            f"{r['symm_one_shot']:.2f} | {r['symm_two_shot']:.2f} | "
            f"{bus_gbs(r['bytes'], r['rose_plan'], world):.0f} | "
            f"{bus_gbs(r['bytes'], r['nccl'], world):.0f} |")
    lines += ["", f"Suggested `two_shot_min_bytes` for world size {world} (smallest size from "
              f"which forced two-shot is never slower than one-shot): {suggested}", "",
              f"## Fused all-reduce + residual add + RMSNorm, hidden {HIDDEN}, bf16, µs per call",
              "", "| tokens | fused (1 launch) | rose AR + rms_norm (2) | NCCL AR + rms_norm (2) |",
              "|---|---|---|---|"]
    for r in fused_rows:
        lines.append(f"| {r['tokens']} | {r['fused']:.2f} | {r['rose_ar_then_rms_norm']:.2f} | "
                     f"{r['nccl_then_rms_norm']:.2f} |")
    if combine_rows:
        lines += ["", f"## Fused MoE combine (top-{TOP_K}) + all-reduce, hidden {HIDDEN}, bf16, "
                  f"µs per call", "",
                  "| tokens | fused (1 launch) | moe_combine + rose AR (2) | moe_combine + NCCL (2) |",
                  "|---|---|---|---|"]
        for r in combine_rows:
            lines.append(f"| {r['tokens']} | {r['fused']:.2f} | "
                         f"{r['moe_combine_then_rose_ar']:.2f} | {r['moe_combine_then_nccl']:.2f} |")
    if sweep:
        lines += ["", "## Block-count sweep (bf16; µs per call; grid = min(work, cap, SMs))", "",
                  "| bytes | variant | " + " | ".join(f"cap {c}" for c in SWEEP_CAPS) + " | best |",
                  "|---|---|" + "---|" * (len(SWEEP_CAPS) + 1)]
        for nbytes in sorted({r["bytes"] for r in sweep}):
            for variant in ("one_shot", "two_shot"):
                cells = {r["cap"]: r for r in sweep if r["bytes"] == nbytes and r["variant"] == variant}
                if not cells:
                    continue
                best = min(cells.values(), key=lambda r: r["us"])
                lines.append(f"| {_size(nbytes)} | {variant} | "
                             + " | ".join(f"{cells[c]['us']:.2f} (grid {cells[c]['grid']})"
                                          if c in cells else "-" for c in SWEEP_CAPS)
                             + f" | cap {best['cap']} |")
    lines += ["", "## Goals (issue 12)", ""]
    lines += [f"- {'MET' if m else 'MISSED'}: {g}{' (' + d + ')' if d else ''}" for g, m, d in goals]
    with open(os.path.join(out, "multigpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    print(f"wrote {out}/multigpu.json and multigpu.md", flush=True)


def _size(nbytes: int) -> str:
    return f"{nbytes // MB} MB" if nbytes >= MB else f"{nbytes // KB} KB"


if __name__ == "__main__":
    main()
