"""Expert-parallel MoE dispatch + combine over NVLink: rose-aot's moe_ep_dispatch /
moe_ep_combine vs a torch implementation built on all_to_all_single (NCCL), same run, same
inputs. One process per GPU:

    ROSE_AOT_TEST_BUNDLE=build/test.rosebundle tests/multigpu/run.sh --bench-ep
    (= torchrun --standalone --nproc-per-node 2 benchmarks/bench_ep.py BUNDLE)

BUNDLE: `rose-aot build tests/manifests -o build/test.rosebundle` on a CPU machine (the points
of tests/manifests/ep-cases.toml). Shapes: hidden 7168 / 256 experts / top-8 (DeepSeek-V3)
and hidden 2048 / 128 experts / top-8 (Qwen3-30B-A3B), bf16, uniform random top-k routing, at
1, 128 and 4096 tokens per rank.

Times (µs, median over iterations, the slowest rank's median):
- rose-aot "step": dispatch + combine (the expert is the identity), 10 steps captured in one
  CUDA graph, replays timed with CUDA events; per step;
- rose-aot dispatch / combine alone: eager launches queued behind a GPU sleep (so the host
  launch cost is hidden), CUDA events between them;
- torch: sort by destination, all_to_all_single of the counts, the split sizes to the host
  (a sync: NCCL's variable all-to-all needs them), all_to_all_single of the rows and of the
  expert ids, group by local expert; combine the reverse and the weighted sum. Eager, CUDA
  events around each (host gaps included: they are part of that implementation).
Each point is checked against the torch result (tolerance) before it is timed. Writes
ep.json and ep.md to $OUT (or benchmarks/results).

Published references (other hardware, other settings; for orientation, not a comparison):
pplx-kernels README "Benchmark Results" (EP8 over NVLink, H100): dispatch 41.6 µs / combine
41.7 µs at 1 token per GPU, 83.6 / 102.3 µs at 128 tokens per GPU; DeepEP README (v1
"normal" kernels, 8 x H800 intranode, 4096 tokens, hidden 7168, top-8, fp8 dispatch / bf16
combine): 153 GB/s dispatch, 158 GB/s combine NVLink bottleneck bandwidth.
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

SHAPES = [(7168, 256, 8), (2048, 128, 8)]  # (hidden, experts, top_k)
TOKENS = [1, 128, 4096]
STEPS_PER_GRAPH = 10
WARMUP = 5
ITERS = 40


def slowest(value: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def time_graph(step) -> float:
    """Median µs per step of `step` captured STEPS_PER_GRAPH times in one CUDA graph."""
    import torch
    import torch.distributed as dist

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(STEPS_PER_GRAPH):
            step()
    torch.cuda.synchronize()
    dist.barrier()
    for _ in range(WARMUP):
        graph.replay()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(ITERS + 1)]
    events[0].record()
    for i in range(ITERS):
        graph.replay()
        events[i + 1].record()
    torch.cuda.synchronize()
    per = [events[i].elapsed_time(events[i + 1]) * 1e3 / STEPS_PER_GRAPH for i in range(ITERS)]
    return slowest(statistics.median(per))


def time_ops(ops, sleep: bool) -> list[float]:
    """Median µs of each op of a sequence run ITERS times, CUDA events between the ops; with
    `sleep`, queued behind a GPU sleep so that host launch gaps do not count."""
    import torch
    import torch.distributed as dist

    for _ in range(WARMUP):
        for op in ops:
            op()
    torch.cuda.synchronize()
    dist.barrier()
    events = [[torch.cuda.Event(enable_timing=True) for _ in range(len(ops) + 1)]
              for _ in range(ITERS)]
    if sleep:
        torch.cuda._sleep(50_000_000)  # ~25 ms: the host queues every launch meanwhile
    for i in range(ITERS):
        events[i][0].record()
        for j, op in enumerate(ops):
            op()
            events[i][j + 1].record()
    torch.cuda.synchronize()
    return [slowest(statistics.median(events[i][j].elapsed_time(events[i][j + 1]) * 1e3
                                      for i in range(ITERS))) for j in range(len(ops))]


class TorchA2A:
    """MoE dispatch / combine with torch ops and NCCL all_to_all_single (variable splits)."""

    def __init__(self, num_experts, top_k, hidden, rank, world):
        self.E, self.K, self.H, self.rank, self.W = num_experts, top_k, hidden, rank, world
        self.L = num_experts // world

    def dispatch(self, x, ids):
        import torch
        import torch.distributed as dist

        T = x.shape[0]
        flat = ids.reshape(-1).long()
        valid = (flat >= 0) & (flat < self.E)
        dest = torch.where(valid, flat // self.L, torch.full_like(flat, self.W))
        order = torch.argsort(dest, stable=True)
        counts = torch.bincount(dest, minlength=self.W + 1)[: self.W]
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts)
        both = torch.cat([counts, recv_counts]).tolist()  # host sync: NCCL needs the splits
        send, recv = both[: self.W], both[self.W:]
        n = sum(send)
        pairs = order[:n]
        rows = x[pairs // self.K]
        got = torch.empty(sum(recv), self.H, dtype=x.dtype, device=x.device)
        dist.all_to_all_single(got, rows, recv, send)
        got_ids = torch.empty(sum(recv), dtype=torch.long, device=x.device)
        dist.all_to_all_single(got_ids, flat[pairs], recv, send)
        local = got_ids - self.rank * self.L
        perm = torch.argsort(local, stable=True)
        out = got[perm]
        offsets = torch.zeros(self.L + 1, dtype=torch.long, device=x.device)
        offsets[1:] = torch.cumsum(torch.bincount(local, minlength=self.L), 0)
        return out, offsets, (T, pairs, send, recv, perm, valid)

    def combine(self, y, state, weights):
        import torch
        import torch.distributed as dist

        T, pairs, send, recv, perm, valid = state
        back = torch.empty_like(y)
        back[perm] = y
        ret = torch.empty(len(pairs), self.H, dtype=y.dtype, device=y.device)
        dist.all_to_all_single(ret, back, send, recv)
        per_pair = torch.zeros(T * self.K, self.H, dtype=torch.float32, device=y.device)
        per_pair[pairs] = ret.float()
        w = torch.where(valid, weights.reshape(-1), torch.zeros_like(weights.reshape(-1)))
        return (per_pair * w[:, None]).view(T, self.K, self.H).sum(1).to(y.dtype)


def nvlink_bytes(ids, rank, L, row_bytes) -> int:
    """Bytes this rank sends to other ranks in a dispatch (the combine returns as many); the
    ids are all valid here."""
    return int((ids // L != rank).sum().item()) * row_bytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--out", default=os.environ.get("OUT", os.path.join(HERE, "results")))
    args = parser.parse_args()
    tokens_list = [int(t) for t in args.tokens.split(",")]

    rank, world, local = setup()
    import torch
    import torch.distributed as dist

    from rose_aot import open_bundle
    from rose_aot.distributed import EpWorkspace, ExpertParallelMoe

    device = torch.device("cuda", local)
    bundle = open_bundle(args.bundle)
    log(rank, f"world {world}, {torch.cuda.get_device_name(local)}, torch {torch.__version__}")
    results = []
    keep = []  # symmetric workspaces stay allocated until the end (freeing is not collective)
    for hidden, experts, top_k in SHAPES:
        ws = EpWorkspace(num_experts=experts, top_k=top_k, hidden=hidden,
                         max_tokens=max(tokens_list))
        moe = ExpertParallelMoe(bundle, num_experts=experts, top_k=top_k, hidden=hidden,
                                max_tokens=max(tokens_list), workspace=ws)
        ref = TorchA2A(experts, top_k, hidden, rank, world)
        for tokens in tokens_list:
            g = torch.Generator(device=device).manual_seed(1000 * tokens + rank)
            x = torch.randn(tokens, hidden, generator=g, device=device).to(torch.bfloat16)
            ids = torch.rand(tokens, experts, generator=g, device=device).topk(
                top_k, dim=1).indices.int().contiguous()
            w = torch.rand(tokens, top_k, generator=g, device=device)
            bufs = moe.outputs(tokens)
            out = torch.empty(tokens, hidden, dtype=torch.bfloat16, device=device)

            def ep_dispatch():
                moe.dispatch(x, ids, bufs)

            def ep_combine():
                moe.combine(bufs.out, bufs, w, out)

            def ep_step():
                ep_dispatch()
                ep_combine()

            state = {}

            def torch_dispatch():
                state["d"] = ref.dispatch(x, ids)

            def torch_combine():
                state["out"] = ref.combine(state["d"][0], state["d"][2], w)

            ep_step()
            torch_dispatch()
            torch_combine()
            torch.cuda.synchronize()
            problem = _mg.close_problem("rose-aot vs torch a2a", out, state["out"], "bfloat16")
            n_rows = int(bufs.expert_offsets[-1].item())
            same_rows = n_rows == state["d"][0].shape[0]
            if problem or not same_rows:
                log(rank, f"MISMATCH hidden {hidden} tokens {tokens}: {problem}; rows {n_rows} "
                          f"vs torch {state['d'][0].shape[0]}")
            step = time_graph(ep_step)
            d_us, c_us = time_ops([ep_dispatch, ep_combine], sleep=True)
            td_us, tc_us = time_ops([torch_dispatch, torch_combine], sleep=False)
            sent = slowest(nvlink_bytes(ids, rank, experts // world, hidden * 2))
            row = {"hidden": hidden, "experts": experts, "top_k": top_k, "tokens": tokens,
                   "world": world, "rose_step_graph_us": step, "rose_dispatch_us": d_us,
                   "rose_combine_us": c_us, "torch_dispatch_us": td_us,
                   "torch_combine_us": tc_us, "torch_step_us": td_us + tc_us,
                   "nvlink_bytes_per_rank": sent,
                   "rose_dispatch_gbps": sent / (d_us * 1e3) if d_us else 0.0,
                   "rose_combine_gbps": sent / (c_us * 1e3) if c_us else 0.0,
                   "checked": not problem and same_rows}
            results.append(row)
            log(rank, f"hidden {hidden} E {experts} top{top_k} tokens {tokens}: rose step "
                      f"{step:.2f} µs (graph), dispatch {d_us:.2f}, combine {c_us:.2f}; torch "
                      f"a2a dispatch {td_us:.2f}, combine {tc_us:.2f}; "
                      f"{'ok' if row['checked'] else 'MISMATCH'}")
            dist.barrier()
        keep.append(ws)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "ep.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(local), "torch": torch.__version__,
                       "results": results}, f, indent=2)
        lines = ["| hidden | experts | tokens/rank | rose step µs (graph) | rose dispatch µs | "
                 "rose combine µs | dispatch GB/s | torch a2a dispatch µs | torch a2a combine "
                 "µs | checked |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in results:
            lines.append(f"| {r['hidden']} | {r['experts']} | {r['tokens']} | "
                         f"{r['rose_step_graph_us']:.2f} | {r['rose_dispatch_us']:.2f} | "
                         f"{r['rose_combine_us']:.2f} | {r['rose_dispatch_gbps']:.1f} | "
                         f"{r['torch_dispatch_us']:.2f} | {r['torch_combine_us']:.2f} | "
                         f"{'yes' if r['checked'] else 'NO'} |")
        with open(os.path.join(args.out, "ep.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
