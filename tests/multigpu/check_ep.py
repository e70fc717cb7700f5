"""Multi-GPU checks of expert-parallel MoE (moe_ep_dispatch + moe_ep_combine), one process per
GPU (torchrun; see run.sh):

    ROSE_AOT_TEST_BUNDLE=build/test.rosebundle tests/multigpu/run.sh --ep [--quick]

Every rank runs the same checks in the same order and prints PASS or FAIL with the first bad
element; the exit status is 0 only when every check passed on this rank. For every
moe_ep_dispatch point of the bundle with this world size (bf16 and float8), with its
moe_ep_combine point, at several token counts per rank and routings (random top-k; skewed:
every copy of every rank to expert 0; empty: one rank has no tokens; invalid: every id out of
range; mixed: a third of the ids invalid; uneven token counts across ranks):

- dispatch, against the single-GPU dispatch of the all-gathered tokens (moe_dispatch's layout
  rule): expert_offsets equal; every received copy is bitwise the sender's row (and scales),
  inside its expert's segment, each row used once; padding rows zero; send_slots -1 exactly
  for invalid ids;
- combine, after an "expert" that scales each row by a per-expert constant: bitwise equal to
  the bundle's single-GPU moe_combine over the gathered tokens (same rows, same fixed k
  order), within tolerance of an fp32 torch sum, bitwise equal on a second step;
- CUDA graph: dispatch + expert + combine captured once, 1000 replays with fresh tokens every
  100 replays (checked against the single-GPU combine), the step epoch advanced by exactly the
  number of replays on every rank;
- no cutlass module imported.
A hang (a flag that never arrives) ends the process after a timeout, naming the check.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (  # noqa: E402  (sets the no-multicast environment first)
    CheckFailed,
    Runner,
    bitwise_problem,
    close_problem,
    log,
    no_cutlass_loaded,
    setup,
)

GRAPH_REPLAYS = 1000
MAX_TOKENS = 4096
# (tokens on rank 0, tokens on the other ranks, routing)
CASES = [
    (1, 1, "random"),
    (7, 7, "skewed"),
    (128, 128, "random"),
    (64, 0, "empty"),
    (16, 16, "invalid"),
    (300, 300, "mixed"),
    (5, 200, "random"),
    (4096, 4096, "random"),
    (4096, 4096, "skewed"),
]
QUICK = [(1, 1, "random"), (64, 0, "empty"), (128, 128, "skewed")]


def fail_if(problems):
    problems = [p for p in problems if p]
    if problems:
        raise CheckFailed("; ".join(problems))


def gather_var(t, counts):
    """Every rank's `t` (first dimension counts[r] on rank r), as a list in rank order."""
    import torch
    import torch.distributed as dist

    most = max(counts)
    padded = torch.zeros((most, *t.shape[1:]), dtype=t.dtype, device=t.device)
    padded[: t.shape[0]] = t
    if t.dtype in (torch.float8_e4m3fn,):
        padded = padded.view(torch.uint8)
    out = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(out, padded.contiguous())
    if t.dtype in (torch.float8_e4m3fn,):
        out = [o.view(t.dtype) for o in out]
    return [o[:n] for o, n in zip(out, counts)]


def make_inputs(c, tokens, routing, rank, device, seed):
    import torch

    g = torch.Generator(device=device).manual_seed(seed * 100 + rank)
    E, K, H = c.num_experts, c.top_k, c.hidden
    x = torch.randn(tokens, H, generator=g, device=device)
    scales = None
    if c.dtype == "float8_e4m3fn":
        x = x.clamp(-400, 400).to(torch.float8_e4m3fn)
        scales = torch.rand(tokens, H // c.scale_group, generator=g, device=device) + 0.5
    else:
        x = x.to(getattr(torch, c.dtype))
    ids = torch.rand(tokens, E, generator=g, device=device).topk(K, dim=1).indices.int()
    if routing == "skewed":
        ids.zero_()
    elif routing == "invalid":
        ids.fill_(-1)
        ids[1::2] = E + 3
    elif routing == "mixed":
        bad = torch.rand(tokens, K, generator=g, device=device) < 0.33
        ids = torch.where(bad, torch.full_like(ids, -7), ids)
    weights = torch.rand(tokens, K, generator=g, device=device)
    return x, scales, ids.contiguous(), weights


def expert_scale(ids):
    """The per-expert constant of the test "expert": exact in bf16 (1 + m / 8, m < 7)."""
    return 1.0 + 0.125 * (ids.long().clamp(min=0) % 7).float()


def run_expert(out, offsets, first_expert, rows_used=None):
    """y = out * expert_scale(expert of the row) in bf16: a stand-in for the grouped GEMM."""
    import torch

    rows = out.shape[0]
    idx = torch.arange(rows, device=out.device)
    local = torch.searchsorted(offsets[1:].long().contiguous(), idx, right=True)
    scale = expert_scale(local + first_expert)
    return (out.float() * scale[:, None]).to(torch.bfloat16)


def single_gpu_combine(bundle, c, all_x, all_ids, all_w):
    """The bundle's single-GPU moe_combine over every rank's tokens: y holds one row per
    (token, k) copy, the expert applied to the token; positions -1 for invalid ids."""
    import torch

    x = torch.cat(all_x)
    ids = torch.cat(all_ids)
    w = torch.cat(all_w)
    T, K = ids.shape
    valid = (ids >= 0) & (ids < c.num_experts)
    y = (x.float().repeat_interleave(K, dim=0) * expert_scale(ids.reshape(-1))[:, None]).to(
        torch.bfloat16)
    positions = torch.where(valid, torch.arange(T * K, device=x.device).view(T, K).int(),
                            torch.full_like(ids, -1))
    combine = bundle.kernel("moe_combine", top_k=K, hidden=c.hidden, dtype="bfloat16")
    out = torch.full((T, c.hidden), float("nan"), dtype=torch.bfloat16, device=x.device)
    combine(y, positions.contiguous(), w.contiguous(), out)
    # fp32 torch sum for a tolerance check of the same quantity
    yv = torch.where(valid.reshape(-1, 1), y.float(), torch.zeros_like(y, dtype=torch.float32))
    ref = (yv.view(T, K, -1) * torch.where(valid, w, torch.zeros_like(w))[:, :, None]).sum(1)
    return out, ref


def check_dispatch(c, ws, bufs, counts, all_x, all_ids, all_scales, send_slots, rank):
    """Rank `rank`'s received rows against the single-GPU layout of the gathered tokens."""
    import torch

    W, E = c.world_size, c.num_experts
    L = E // W
    cap = ws.slots
    dev = bufs.out.device
    problems = []
    # send_slots on this rank: -1 exactly for invalid ids, the owner rank otherwise
    ids = all_ids[rank]
    valid = (ids >= 0) & (ids < E)
    mine = send_slots[rank]
    if not torch.equal(mine >= 0, valid):
        problems.append("send_slots is -1 where the id is valid or >= 0 where it is not")
    elif valid.any() and not torch.equal((mine[valid] // cap).long(), ids[valid].long() // L):
        problems.append("send_slots names the wrong destination rank")
    # expert counts and offsets (moe_dispatch's rule: each segment padded to the alignment)
    cnt = torch.zeros(L, dtype=torch.long, device=dev)
    for s_ids in all_ids:
        v = s_ids[(s_ids >= r0(rank, L)) & (s_ids < r0(rank, L) + L)].long() - r0(rank, L)
        cnt += torch.bincount(v, minlength=L)
    a = c.expert_alignment
    padded = (cnt + a - 1) // a * a
    want_off = torch.zeros(L + 1, dtype=torch.long, device=dev)
    want_off[1:] = torch.cumsum(padded, 0)
    offsets = bufs.expert_offsets.long()
    if not torch.equal(offsets, want_off):
        first = int((offsets != want_off).nonzero()[0])
        problems.append(f"expert_offsets[{first}] = {int(offsets[first])}, want "
                        f"{int(want_off[first])}")
        return problems
    used = []
    recv_pos = ws.recv_pos.long()
    for s in range(W):
        s_ids = all_ids[s]
        hit = (s_ids >= r0(rank, L)) & (s_ids < r0(rank, L) + L)
        if not hit.any():
            continue
        t_idx, k_idx = hit.nonzero(as_tuple=True)
        slot = send_slots[s][t_idx, k_idx].long() - rank * cap
        if (slot < 0).any() or (slot >= cap).any():
            problems.append(f"sender {s}: slots outside [0, {cap}) for this rank")
            continue
        rows = recv_pos[s * cap + slot]
        j = s_ids[t_idx, k_idx].long() - r0(rank, L)
        inside = (rows >= offsets[j]) & (rows < offsets[j] + cnt[j])
        if not inside.all():
            bad = int((~inside).nonzero()[0])
            problems.append(f"sender {s}: copy (t={int(t_idx[bad])}, k={int(k_idx[bad])}) of "
                            f"expert {int(j[bad])} at row {int(rows[bad])}, outside "
                            f"[{int(offsets[j[bad]])}, {int(offsets[j[bad]] + cnt[j[bad]])})")
            continue
        got = bufs.out[rows]
        want = all_x[s][t_idx]
        if got.dtype == torch.float8_e4m3fn:
            got, want = got.view(torch.uint8), want.view(torch.uint8)
        p = bitwise_problem(f"rows from sender {s}", got, want)
        if p:
            problems.append(p)
        if bufs.out_scales is not None:
            p = bitwise_problem(f"scales from sender {s}", bufs.out_scales[rows],
                                all_scales[s][t_idx])
            if p:
                problems.append(p)
        used.append(rows)
    if used:
        rows = torch.cat(used)
        if rows.unique().numel() != rows.numel() or rows.numel() != int(cnt.sum()):
            problems.append(f"{rows.numel()} copies landed on {rows.unique().numel()} distinct "
                            f"rows; {int(cnt.sum())} expected")
    elif int(cnt.sum()):
        problems.append(f"{int(cnt.sum())} copies expected, none found")
    if a > 1:
        for jj in range(L):
            lo, hi = int(offsets[jj] + cnt[jj]), int(offsets[jj + 1])
            if hi > lo:
                pad = bufs.out[lo:hi].contiguous()
                raw = pad.view(torch.uint8 if pad.element_size() == 1 else torch.int16)
                if raw.any():  # any bit set: not +0 (NaN poison, -0 and values included)
                    problems.append(f"padding rows [{lo}, {hi}) of expert {jj} are not zero")
                    break
                if bufs.out_scales is not None and bufs.out_scales[lo:hi].view(torch.int32).any():
                    problems.append(f"padding scales [{lo}, {hi}) of expert {jj} are not zero")
                    break
    return problems


def r0(rank, L):
    return rank * L


def check_point(bundle, ws, c, combine_dtype, t0, t_other, routing, rank, world, device, seed):
    import torch
    import torch.distributed as dist

    from rose_aot.distributed import ExpertParallelMoe

    moe = ExpertParallelMoe(bundle, num_experts=c.num_experts, top_k=c.top_k, hidden=c.hidden,
                            max_tokens=ws.max_tokens, dtype=c.dtype, combine_dtype=combine_dtype,
                            scale_group=c.scale_group, expert_alignment=c.expert_alignment,
                            workspace=ws)
    tokens = t0 if rank == 0 else t_other
    counts = [t0] + [t_other] * (world - 1)
    x, scales, ids, weights = make_inputs(c, tokens, routing, rank, device, seed)
    bufs = moe.outputs(max(counts))
    # poison: an unwritten output fails
    if bufs.out.dtype == torch.float8_e4m3fn:
        bufs.out.view(torch.uint8).fill_(0x7F)
    else:
        bufs.out.fill_(float("nan"))
    if bufs.out_scales is not None:
        bufs.out_scales.fill_(float("nan"))
    bufs.expert_offsets.fill_(-5)
    bufs.send_slots.fill_(-9)
    epoch0 = ws.epoch()
    moe.dispatch(x, ids, bufs, scales)
    torch.cuda.synchronize()
    all_x = gather_var(x, counts)
    all_ids = gather_var(ids, counts)
    all_w = gather_var(weights, counts)
    all_scales = gather_var(scales, counts) if scales is not None else None
    send_slots = gather_var(bufs.send_slots[:tokens].contiguous(), counts)
    try:
        problems = check_dispatch(c, ws, bufs, counts, all_x, all_ids, all_scales, send_slots, rank)
    except Exception as exc:  # noqa: BLE001 - reported below; the combine must still run, or
        # every rank's next dispatch waits forever for this step's combine (the protocol)
        problems = [f"checking the dispatch raised {type(exc).__name__}: {exc}"]

    L = c.num_experts // world
    y = run_expert(bufs.out, bufs.expert_offsets, rank * L)
    out = torch.full((tokens, c.hidden), float("nan"), dtype=torch.bfloat16, device=device)
    moe.combine(y, bufs, weights, out)
    # a second step with the same inputs: bitwise the same result
    moe.dispatch(x, ids, bufs, scales)
    y2 = run_expert(bufs.out, bufs.expert_offsets, rank * L)
    again = torch.full_like(out, float("nan"))
    moe.combine(y2, bufs, weights, again)
    torch.cuda.synchronize()
    if ws.epoch() != epoch0 + 2:
        problems.append(f"epoch {ws.epoch()} after two steps from {epoch0}")
    ref, ref32 = single_gpu_combine(bundle, c, all_x, all_ids, all_w)
    start = sum(counts[:rank])
    mine_ref, mine32 = ref[start:start + tokens], ref32[start:start + tokens]
    problems += [
        bitwise_problem("combine vs single-GPU moe_combine of the gathered tokens", out, mine_ref),
        bitwise_problem("second step vs first", again, out),
        close_problem("combine vs the fp32 torch sum", out, mine32, "bfloat16"),
    ]
    dist.barrier()
    fail_if(problems)
    return f"{tokens} tokens here, {sum(counts)} in all"


def check_graph(bundle, ws, c, rank, world, device):
    import torch
    import torch.distributed as dist

    from rose_aot.distributed import ExpertParallelMoe

    moe = ExpertParallelMoe(bundle, num_experts=c.num_experts, top_k=c.top_k, hidden=c.hidden,
                            max_tokens=ws.max_tokens, dtype=c.dtype, scale_group=c.scale_group,
                            expert_alignment=c.expert_alignment, workspace=ws)
    tokens = 32 if rank == 0 else 17
    counts = [32] + [17] * (world - 1)
    x, scales, ids, weights = make_inputs(c, tokens, "random", rank, device, 900)
    bufs = moe.outputs(tokens)
    out = torch.empty(tokens, c.hidden, dtype=torch.bfloat16, device=device)
    L = c.num_experts // world

    def step():
        moe.dispatch(x, ids, bufs, scales)
        y = run_expert(bufs.out, bufs.expert_offsets, rank * L)
        moe.combine(y, bufs, weights, out)

    step()  # warm-up: loads kernels, resolves plans
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    epoch0 = ws.epoch()
    problems, replays = [], 0
    for round_ in range(GRAPH_REPLAYS // 100):
        nx, ns, nids, nw = make_inputs(c, tokens, "skewed" if round_ == 3 else "random", rank,
                                       device, 1000 + round_)
        x.copy_(nx)
        ids.copy_(nids)
        weights.copy_(nw)
        if scales is not None:
            scales.copy_(ns)
        for _ in range(100):
            graph.replay()
            replays += 1
        torch.cuda.synchronize()
        ref, _ = single_gpu_combine(bundle, c, gather_var(x, counts), gather_var(ids, counts),
                                    gather_var(weights, counts))
        start = sum(counts[:rank])
        problems.append(bitwise_problem(f"combine after {replays} replays", out,
                                        ref[start:start + tokens]))
        if any(problems):
            break
    epoch = ws.epoch()
    epochs = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(epochs, torch.tensor([epoch], device=device))
    if epoch != epoch0 + replays:
        problems.append(f"epoch {epoch} after {replays} replays from {epoch0}")
    if any(int(e.item()) != epoch for e in epochs):
        problems.append(f"epochs differ across ranks: {[int(e.item()) for e in epochs]}")
    fail_if(problems)
    return f"{replays} replays, epoch {epoch0} -> {epoch}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=os.environ.get("ROSE_AOT_TEST_BUNDLE"))
    parser.add_argument("--quick", action="store_true", help="fewer cases (smoke run)")
    parser.add_argument("--timeout", type=float, default=240.0)
    args = parser.parse_args()

    rank, world, local = setup()
    import torch
    import torch.distributed as dist

    from rose_aot import open_bundle
    from rose_aot.distributed import EpWorkspace
    from rose_aot.kernels import get_family

    device = torch.device("cuda", local)
    runner = Runner(rank, args.timeout)
    log(rank, f"world {world}, {torch.cuda.get_device_name(local)}, torch {torch.__version__}, "
              f"NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']} "
              f"TORCH_SYMM_MEM_DISABLE_MULTICAST={os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST']}")
    if not args.bundle or not os.path.isfile(args.bundle):
        log(rank, f"FAIL setup: bundle {args.bundle!r} not found; build it on a CPU machine with "
                  f"`rose-aot build tests/manifests -o build/test.rosebundle`")
        return 2
    bundle = runner.run("open bundle", open_bundle, args.bundle)
    if bundle is None:
        return 2
    D = get_family("moe_ep_dispatch")
    points = [D.make_config(**p["config"]) for p in bundle.index["points"]
              if p["family"] == "moe_ep_dispatch" and p["config"]["world_size"] == world]
    combines = {(p["config"]["top_k"], p["config"]["hidden"])
                for p in bundle.index["points"]
                if p["family"] == "moe_ep_combine" and p["config"]["world_size"] == world
                and p["config"]["dtype"] == "bfloat16"}
    log(rank, f"{len(points)} moe_ep_dispatch points for world size {world}")
    if not points:
        runner.run("moe_ep_dispatch points present",
                   lambda: fail_if([f"the bundle has no moe_ep_dispatch point for {world} ranks"]))

    # One workspace per MoE shape, created in the same order on every rank.
    workspaces = {}
    seed = 1
    for c in points:
        if (c.top_k, c.hidden) not in combines:
            runner.run(f"{D.key(c)} combine point present", lambda c=c: fail_if(
                [f"no moe_ep_combine(top_k={c.top_k}, hidden={c.hidden}) for {world} ranks"]))
            continue
        shape = (c.num_experts, c.top_k, c.hidden, c.dtype, c.scale_group)
        ws = workspaces.get(shape)
        if ws is None:
            max_tokens = MAX_TOKENS if not args.quick else 128
            ws = runner.run(f"EpWorkspace {shape} max_tokens={max_tokens}", lambda: EpWorkspace(
                num_experts=c.num_experts, top_k=c.top_k, hidden=c.hidden,
                max_tokens=max_tokens, dtype=c.dtype, scale_group=c.scale_group))
            if ws is None:
                continue
            log(rank, repr(ws))
            workspaces[shape] = ws
        for t0, t1, routing in (QUICK if args.quick else CASES):
            if max(t0, t1) > ws.max_tokens:
                continue
            seed += 1
            runner.run(f"{D.key(c)} tokens={t0}/{t1} {routing}", check_point, bundle, ws, c,
                       "bfloat16", t0, t1, routing, rank, world, device, seed)
    graph_point = next((c for c in points if c.dtype == "bfloat16" and c.hidden == 7168
                        and (c.top_k, c.hidden) in combines), None)
    graph_point = graph_point or next((c for c in points if (c.top_k, c.hidden) in combines), None)
    if graph_point is not None:
        shape = (graph_point.num_experts, graph_point.top_k, graph_point.hidden,
                 graph_point.dtype, graph_point.scale_group)
        if shape in workspaces:
            runner.run(f"CUDA graph {D.key(graph_point)}: dispatch + expert + combine, "
                       f"{GRAPH_REPLAYS} replays", check_graph, bundle, workspaces[shape],
                       graph_point, rank, world, device)
    runner.run("no cutlass imported", lambda: fail_if([no_cutlass_loaded()]))

    failed = runner.failures()
    total = torch.tensor([len(failed)], device=device)
    dist.all_reduce(total)
    log(rank, f"SUMMARY: {len(runner.results) - len(failed)} passed, {len(failed)} failed on this "
              f"rank; {int(total.item())} failures on all ranks")
    for name in failed:
        log(rank, f"  failed: {name}")
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
