"""Multi-GPU checks of the all_reduce family, one process per GPU (torchrun; see run.sh).

    ROSE_AOT_TEST_BUNDLE=build/test.rosebundle torchrun --standalone --nproc-per-node 2 \
        tests/multigpu/check_all_reduce.py

Every check prints PASS or FAIL per rank with the first bad element; the exit status is 0 only
when every check passed on this rank (torchrun fails if any rank fails). Checks:
- plain all-reduce, bf16 / fp16 / fp32, 2 KB .. 64 MB, the plan's choice and both variants
  forced: bitwise equal to the fp32 rank-order sum of the gathered inputs (what the kernel
  promises), bitwise equal across ranks, bitwise equal on a second call, input untouched,
  within tolerance of NCCL's all_reduce; in place as well;
- fused all-reduce + residual add + RMSNorm for every fused point of the bundle at 1..512
  tokens: residual bitwise equal to round(round(sum) + residual), out within tolerance of the
  unfused sequence (our all-reduce, then the bundle's rms_norm with the residual add) and of
  the float64 reference, both bitwise equal across ranks;
- fused MoE combine + all-reduce for every such point at 1..300 tokens with random, skewed (all
  experts on rank 0) and empty (tokens with no local expert) routing: within tolerance of
  moe_combine + all-reduce from the same bundle and of the float64 reference, bitwise equal
  across ranks and from call to call;
- CUDA graphs: one-shot, two-shot and both fused calls captured together, 1000 replays with
  fresh inputs checked every 100, the call epoch advanced by exactly the number of calls;
- the loader and rose_aot.distributed imported no cutlass module.
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
    gather,
    log,
    no_cutlass_loaded,
    setup,
)

KB, MB = 1024, 1024 * 1024
SIZES = [2 * KB, 2 * KB + 16, 8 * KB, 32 * KB, 128 * KB, 256 * KB - 16, 256 * KB, 1 * MB,
         4 * MB + 48, 16 * MB, 64 * MB]
DTYPES = ("bfloat16", "float16", "float32")
FUSED_TOKENS = (1, 3, 16, 128, 512)
GRAPH_REPLAYS = 1000


def fail_if(problems):
    problems = [p for p in problems if p]
    if problems:
        raise CheckFailed("; ".join(problems))


def random(shape, dtype, seed, device):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


def check_param_abi(bundle, keys, device_index):
    """The record's parameter sizes are what the driver reads from the cubin
    (cuFuncGetParamInfo), for every all_reduce variant: the scalar rank included (the loader
    passes one pointer per parameter, so only the sizes and the order must agree)."""
    from rose_aot.loader import driver

    arch = bundle.arch_for_device(device_index)
    problems, checked = [], 0
    for key in keys:
        record = bundle.record(key, arch)
        for v in record.variants:
            kernels = bundle.device_kernels(device_index, key, v.name)
            for entry, kernel in zip(v.entries, kernels):
                info = driver.function_param_info(kernel, entry)
                want = [p.size for p in v.params]
                if [size for _, size in info] != want:
                    problems.append(f"{key} {v.name}: driver sizes {info}, record {want}")
                checked += 1
    fail_if(problems)
    return f"{checked} kernel entries"


def check_plain(ar, dtype_name, nbytes, variant, rank, device, seed):
    import torch
    import torch.distributed as dist

    from rose_aot.kernels.all_reduce.reference import ordered_sum

    dtype = getattr(torch, dtype_name)
    n = nbytes // torch.empty((), dtype=dtype).element_size()
    x = random(n, dtype, seed * 100 + rank, device)
    x_before = x.clone()
    out = torch.full_like(x, float("nan"))
    ar(x, out, variant=variant)
    again = torch.full_like(x, float("nan"))
    ar(x, again, variant=variant)
    inplace = x.clone()
    ar(inplace, variant=variant)
    inputs = gather(x)
    want = ordered_sum(inputs)
    outs = gather(out)
    nccl = x.clone()
    dist.all_reduce(nccl)
    torch.cuda.synchronize()
    problems = [
        bitwise_problem("vs the fp32 rank-order sum", out, want),
        bitwise_problem("second call vs first", again, out),
        bitwise_problem("in place vs out of place", inplace, out),
        bitwise_problem("input changed", x, x_before),
        *[bitwise_problem(f"rank {r} vs rank 0", o, outs[0]) for r, o in enumerate(outs)],
        close_problem("vs NCCL all_reduce", out, nccl, dtype_name),
    ]
    fail_if(problems)
    same = int((out.view(-1) == nccl.view(-1)).sum().item())
    return f"{same}/{n} elements bitwise equal to NCCL's"


def check_fused(bundle, point, tokens, rank, device, ws, seed):
    import torch

    from rose_aot.distributed import AllReduce, FusedAllReduceRmsNorm
    from rose_aot.kernels import get_family
    from rose_aot.kernels.all_reduce.reference import ordered_sum

    c = point
    dtype = getattr(torch, c.dtype)
    fused = FusedAllReduceRmsNorm(bundle, dtype, hidden=c.hidden, eps=c.eps,
                                  weight_offset=c.weight_offset, workspace=ws)
    plain = AllReduce(bundle, dtype, workspace=ws)
    x = random((tokens, c.hidden), dtype, seed * 100 + rank, device)
    residual0 = random((tokens, c.hidden), dtype, seed * 100 + 77, device)  # same on all ranks
    weight = (1.0 + 0.1 * random(c.hidden, torch.float32, seed, device)).to(dtype)
    if c.weight_offset:
        weight = (0.1 * random(c.hidden, torch.float32, seed, device)).to(dtype)
    residual = residual0.clone()
    out = torch.full_like(x, float("nan"))
    fused(x, residual, weight, out)

    inputs = gather(x)
    summed = ordered_sum(inputs)
    want_residual = (summed.float() + residual0.float()).to(dtype)
    problems = [bitwise_problem("residual vs round(round(sum) + residual)", residual, want_residual)]

    # float64 reference on the CPU
    ref_res, ref_out = residual0.cpu().clone(), torch.empty_like(residual0.cpu())
    get_family("all_reduce").reference(c, [t.cpu() for t in inputs], ref_res, weight.cpu(), ref_out)
    problems.append(close_problem("out vs the float64 reference", out.cpu(), ref_out, c.dtype))

    # the unfused sequence from the same bundle: all-reduce, then rms_norm(fused_residual)
    norm_cfg = {"hidden": c.hidden, "dtype": c.dtype, "eps": c.eps, "fused_residual": True}
    if c.weight_offset:
        norm_cfg["weight_offset"] = c.weight_offset
    try:
        norm = bundle.kernel("rms_norm", **norm_cfg)
    except Exception as exc:  # noqa: BLE001
        problems.append(f"the bundle lacks the unfused rms_norm point ({exc}); build it from "
                        f"tests/manifests")
        norm = None
    detail = ""
    if norm is not None:
        seq_sum = torch.full_like(x, float("nan"))
        plain(x, seq_sum)
        seq_res, seq_out = residual0.clone(), torch.full_like(x, float("nan"))
        norm(seq_sum, seq_res, weight, seq_out)
        torch.cuda.synchronize()
        problems += [
            bitwise_problem("unfused all-reduce vs the rank-order sum", seq_sum, summed),
            bitwise_problem("residual vs the unfused sequence", residual, seq_res),
            close_problem("out vs the unfused sequence", out, seq_out, c.dtype),
        ]
        same = int((out == seq_out).sum().item())
        detail = f"out bitwise equal to the unfused sequence at {same}/{out.numel()}"
    outs, residuals = gather(out), gather(residual)
    problems += [bitwise_problem(f"out rank {r} vs rank 0", o, outs[0]) for r, o in enumerate(outs)]
    problems += [bitwise_problem(f"residual rank {r} vs rank 0", o, residuals[0])
                 for r, o in enumerate(residuals)]
    fail_if(problems)
    return detail


def combine_inputs(c, tokens, rank, world, device, seed, routing):
    """This rank's (y, positions, weights) for a tensor-parallel MoE step: routing and weights
    replicated on every rank; each (token, k) owned by one rank, whose position points at a
    row of its y, and -1 on the others. routing: "random", "skewed" (all on rank 0) or
    "empty" (nothing on any rank for even tokens)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)  # same on every rank
    owner = torch.randint(0, world, (tokens, c.top_k), generator=g, device=device)
    if routing == "skewed":
        owner.zero_()
    rows = tokens * c.top_k
    slot = torch.randperm(rows, generator=g, device=device).view(tokens, c.top_k).int()
    mine = owner == rank
    if routing == "empty":
        mine[0::2] = False
    positions = torch.where(mine, slot, torch.full_like(slot, -1))
    weights = torch.rand(tokens, c.top_k, generator=g, device=device)
    dtype = getattr(torch, c.dtype)
    y = random((rows, c.hidden), dtype, seed * 100 + rank, device)
    return y, positions, weights


def check_combine(bundle, c, tokens, routing, rank, world, device, ws, seed):
    import torch

    from rose_aot.distributed import AllReduce, FusedMoeCombineAllReduce
    from rose_aot.kernels import get_family
    from rose_aot.kernels.all_reduce.reference import ordered_sum

    dtype = getattr(torch, c.dtype)
    fused = FusedMoeCombineAllReduce(bundle, dtype, hidden=c.hidden, top_k=c.top_k, workspace=ws)
    plain = AllReduce(bundle, dtype, workspace=ws)
    y, positions, weights = combine_inputs(c, tokens, rank, world, device, seed, routing)
    out = torch.full((tokens, c.hidden), float("nan"), dtype=dtype, device=device)
    fused(y, positions, weights, out)
    again = torch.full_like(out, float("nan"))
    fused(y, positions, weights, again)
    problems = [bitwise_problem("second call vs first", again, out)]

    ys, poss = gather(y), gather(positions)
    ref = torch.empty(tokens, c.hidden, dtype=dtype)
    get_family("all_reduce").reference(
        c, [(yy.cpu(), pp.cpu(), weights.cpu()) for yy, pp in zip(ys, poss)], ref)
    # Each rank's partial combine is rounded to the dtype before the all-reduce (as in the
    # unfused moe_combine + all_reduce): two roundings from the float64 sum, not one. Measured
    # on 2 x H200: 0.0127 relative at 300 tokens x 7168 (bf16 one-step tolerance 0.0078).
    problems.append(
        close_problem("out vs the float64 reference", out.cpu(), ref, c.dtype, steps=2)
    )

    detail = ""
    try:
        combine = bundle.kernel("moe_combine", top_k=c.top_k, hidden=c.hidden, dtype=c.dtype)
    except Exception as exc:  # noqa: BLE001
        problems.append(f"the bundle lacks the unfused moe_combine point ({exc})")
        combine = None
    if combine is not None:
        partial = torch.full_like(out, float("nan"))
        combine(y, positions, weights, partial)
        seq = torch.full_like(out, float("nan"))
        plain(partial, seq)
        torch.cuda.synchronize()
        problems += [
            bitwise_problem("unfused all-reduce vs the rank-order sum of the partials", seq,
                            ordered_sum(gather(partial))),
            close_problem("out vs moe_combine + all_reduce", out, seq, c.dtype),
        ]
        same = int((out == seq).sum().item())
        detail = f"bitwise equal to moe_combine + all_reduce at {same}/{out.numel()}"
    outs = gather(out)
    problems += [bitwise_problem(f"out rank {r} vs rank 0", o, outs[0]) for r, o in enumerate(outs)]
    fail_if(problems)
    return detail


def check_graphs(bundle, rank, world, device, ws, fused_point, combine_point):
    import torch

    from rose_aot.distributed import AllReduce, FusedAllReduceRmsNorm, FusedMoeCombineAllReduce
    from rose_aot.kernels.all_reduce.reference import ordered_sum

    dtype = torch.bfloat16
    ar = AllReduce(bundle, dtype, workspace=ws)
    small = torch.zeros(32 * KB, dtype=dtype, device=device)  # 64 KB: one-shot
    large = torch.zeros(2 * MB, dtype=dtype, device=device)  # 4 MB: two-shot
    out_small, out_large = torch.empty_like(small), torch.empty_like(large)
    calls_per_graph = 0
    plans = [ar.handle.plan(small, out_small, *ws.args(dtype))[0].variant,
             ar.handle.plan(large, out_large, *ws.args(dtype))[0].variant]
    if plans != ["one_shot", "two_shot"]:
        log(rank, f"note: the plan picks {plans} for 64 KB / 4 MB (tuning.py)")
    fused = None
    if fused_point is not None:
        c = fused_point
        fdtype = getattr(torch, c.dtype)
        fused = FusedAllReduceRmsNorm(bundle, fdtype, hidden=c.hidden, eps=c.eps,
                                      weight_offset=c.weight_offset, workspace=ws)
        fx = torch.zeros(16, c.hidden, dtype=fdtype, device=device)
        fres0 = random((16, c.hidden), fdtype, 5, device)
        fres = fres0.clone()
        fw = (1.0 + 0.1 * random(c.hidden, torch.float32, 6, device)).to(fdtype)
        fout = torch.empty_like(fx)
    combine = None
    if combine_point is not None:
        cc = combine_point
        combine = FusedMoeCombineAllReduce(bundle, getattr(torch, cc.dtype), hidden=cc.hidden,
                                           top_k=cc.top_k, workspace=ws)
        cy, cpos, cw = combine_inputs(cc, 8, rank, world, device, 11, "random")
        cout = torch.empty(8, cc.hidden, dtype=cy.dtype, device=device)

    def body():
        nonlocal calls_per_graph
        calls_per_graph = 0
        for i in range(10):
            ar(small, out_small)
            ar(large, out_large, variant="two_shot" if i % 2 else None)
            ar(small, out_small, variant="two_shot" if i % 3 == 0 else "one_shot")
            calls_per_graph += 3
            if fused is not None:
                fres.copy_(fres0)  # the fused call adds into the residual: restart it
                fused(fx, fres, fw, fout)
                calls_per_graph += 1
            if combine is not None:
                combine(cy, cpos, cw, cout)
                calls_per_graph += 1

    body()  # warm up: loads the kernels, resolves the plans
    torch.cuda.synchronize()
    cout_eager = cout.clone() if combine is not None else None
    epoch0 = ws.epoch()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    torch.cuda.synchronize()
    problems = []
    replays = 0
    for round_ in range(GRAPH_REPLAYS // 100):
        small.copy_(random(small.shape, dtype, 1000 + round_ * 10 + rank, device))
        large.copy_(random(large.shape, dtype, 2000 + round_ * 10 + rank, device))
        if fused is not None:
            fx.copy_(random(fx.shape, fx.dtype, 3000 + round_ * 10 + rank, device))
        for _ in range(100):
            graph.replay()
            replays += 1
        torch.cuda.synchronize()
        problems.append(bitwise_problem(f"64 KB after {replays} replays", out_small,
                                        ordered_sum(gather(small))))
        problems.append(bitwise_problem(f"4 MB after {replays} replays", out_large,
                                        ordered_sum(gather(large))))
        if fused is not None:
            want = (ordered_sum(gather(fx)).float() + fres0.float()).to(fx.dtype)
            problems.append(bitwise_problem(f"fused residual after {replays} replays", fres, want))
            outs = gather(fout)
            problems.append(bitwise_problem("fused out rank 1 vs rank 0", outs[-1], outs[0]))
        if combine is not None:  # static inputs: every replay must give the eager bits
            problems.append(bitwise_problem(f"combine after {replays} replays vs eager", cout,
                                            cout_eager))
        if any(problems):
            break
    epoch = ws.epoch()
    epochs = gather(torch.tensor([epoch], device=device))
    expected = epoch0 + replays * calls_per_graph
    if epoch != expected:
        problems.append(f"call epoch {epoch} after {replays} replays of {calls_per_graph} calls "
                        f"from {epoch0}; expected {expected}")
    if any(int(e.item()) != epoch for e in epochs):
        problems.append(f"epochs differ across ranks: {[int(e.item()) for e in epochs]}")
    fail_if(problems)
    return f"{replays} replays x {calls_per_graph} calls, epoch {epoch0} -> {epoch}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=os.environ.get("ROSE_AOT_TEST_BUNDLE"))
    parser.add_argument("--quick", action="store_true", help="fewer sizes (smoke run)")
    parser.add_argument("--timeout", type=float, default=240.0)
    args = parser.parse_args()

    rank, world, local = setup()
    import torch
    import torch.distributed as dist

    from rose_aot import open_bundle
    from rose_aot.distributed import AllReduce, SymmetricWorkspace
    from rose_aot.kernels import get_family

    device = torch.device("cuda", local)
    runner = Runner(rank, args.timeout)
    log(rank, f"world {world}, {torch.cuda.get_device_name(local)}, torch {torch.__version__}, "
              f"NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']} "
              f"TORCH_SYMM_MEM_DISABLE_MULTICAST={os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST']}")
    if not args.bundle or not os.path.isfile(args.bundle):
        log(rank, f"FAIL setup: bundle {args.bundle!r} not found; build it on a CPU machine with "
                  f"`rose-aot build tests/manifests -o build/test.rosebundle` and set "
                  f"ROSE_AOT_TEST_BUNDLE")
        return 2

    bundle = runner.run("open bundle", open_bundle, args.bundle)
    ws = runner.run("symmetric workspace (64 MB per half)", SymmetricWorkspace, None, 64 * MB)
    if bundle is None or ws is None:
        return 2
    family = get_family("all_reduce")
    points = [family.make_config(**p["config"]) for p in bundle.index["points"]
              if p["family"] == "all_reduce" and p["config"]["world_size"] == world]
    fused_points = [c for c in points if c.fusion == "residual_rms_norm"]
    combine_points = [c for c in points if c.fusion == "moe_combine"]
    log(rank, f"{len(points)} all_reduce points for world size {world} in the bundle")
    runner.run("parameter ABI vs the driver", check_param_abi, bundle,
               [family.key(c) for c in points], local)

    sizes = SIZES if not args.quick else [2 * KB, 256 * KB, 4 * MB + 48]
    seed = 1
    for dtype_name in DTYPES:
        ar = runner.run(f"all_reduce handle {dtype_name}",
                        lambda d=dtype_name: AllReduce(bundle, getattr(torch, d), workspace=ws))
        if ar is None:
            continue
        for nbytes in sizes:
            for variant in (None, "one_shot", "two_shot"):
                seed += 1
                runner.run(f"all_reduce {dtype_name} {nbytes} B {variant or 'plan'}",
                           check_plain, ar, dtype_name, nbytes, variant, rank, device, seed)

    for c in fused_points:
        for tokens in FUSED_TOKENS if not args.quick else (1, 128):
            seed += 1
            runner.run(f"fused {family.key(c)} tokens={tokens}",
                       check_fused, bundle, c, tokens, rank, device, ws, seed)
    if not fused_points:
        def missing():
            raise CheckFailed("the bundle has no fused all_reduce point for this world size")

        runner.run("fused points present", missing)

    for c in combine_points:
        for tokens, routing in ((1, "random"), (7, "skewed"), (16, "empty"), (128, "random"),
                                (300, "random")):
            if args.quick and tokens not in (1, 128):
                continue
            seed += 1
            runner.run(f"moe combine + all-reduce {family.key(c)} tokens={tokens} {routing}",
                       check_combine, bundle, c, tokens, routing, rank, world, device, ws, seed)

    bf16_fused = next((c for c in fused_points if c.dtype == "bfloat16"), None)
    bf16_combine = next((c for c in combine_points if c.dtype == "bfloat16"), None)
    runner.run("CUDA graph: one-shot + two-shot + fused norm + fused combine, 1000 replays",
               check_graphs, bundle, rank, world, device, ws, bf16_fused, bf16_combine)
    runner.run("no cutlass imported", lambda: fail_if([no_cutlass_loaded()]))

    failed = runner.failures()
    counts = torch.tensor([len(failed)], device=device)
    dist.all_reduce(counts)
    log(rank, f"SUMMARY: {len(runner.results) - len(failed)} passed, {len(failed)} failed on this "
              f"rank; {int(counts.item())} failures on all ranks")
    for name in failed:
        log(rank, f"  failed: {name}")
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
