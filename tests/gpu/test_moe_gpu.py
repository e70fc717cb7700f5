"""MoE dispatch and combine from a CPU-built bundle against float64 references, on the GPU.

Every moe_dispatch point of the bundle, both launch variants forced at every size, with random,
skewed (all tokens to the same experts), sparse (most experts empty) and out-of-range routing.
Rows inside an expert may come in any order, so outputs are checked through `positions`.
"""

from __future__ import annotations

import pytest

from rose_aot import open_bundle
from rose_aot.kernels import get_family

pytestmark = pytest.mark.gpu

TOKENS = (1, 3, 64, 128, 1000, 8192)
ROUTINGS = ("random", "skewed", "sparse", "out_of_range")


@pytest.fixture(scope="module")
def bundle(shipped_bundle_path):
    return open_bundle(shipped_bundle_path)


def _points(bundle, family):
    import torch

    arch = bundle.arch_for_device(torch.cuda.current_device())
    return [p["config"] for p in bundle.index["points"] if p["arch"] == arch and p["family"] == family]


def _routing(kind, tokens, c, gen):
    import torch

    if kind == "skewed":  # every token picks experts 0..k-1 (of this rank): all load on k experts
        base = torch.arange(c.top_k, dtype=torch.int32) + c.expert_start
        return base.repeat(tokens, 1)
    if kind == "sparse":  # only two experts in use
        picks = torch.randint(0, 2, (tokens, c.top_k), generator=gen, dtype=torch.int32)
        return picks + c.expert_start
    ids = torch.argsort(torch.rand(tokens, c.num_experts, generator=gen), dim=1)[:, : c.top_k]
    ids = ids.to(torch.int32)
    if kind == "out_of_range":
        ids[::3, 0] = -1
        ids[1::5, -1] = c.num_experts + 5
    return ids


def _dispatch_case(bundle, values, tokens, routing, variant):
    import torch

    family = get_family("moe_dispatch")
    c = family.make_config(**values)
    gen = torch.Generator().manual_seed(tokens * 31 + len(routing))
    e_local = family.local(c)
    x = torch.randn(tokens, c.hidden, generator=gen).to(getattr(torch, c.dtype))
    ids = _routing(routing, tokens, c, gen)
    rows = family.max_rows(c, tokens) + 5
    host = [x, ids]
    if c.scale_group:
        host.append(torch.rand(tokens, c.hidden // c.scale_group, generator=gen) + 0.5)
    out = torch.full((rows, c.hidden), float("nan")).to(x.dtype)
    host.append(out)
    if c.scale_group:
        host.append(torch.full((rows, c.hidden // c.scale_group), float("nan")))
    host += [torch.full((e_local + 1,), -7, dtype=torch.int32),
             torch.full((tokens, c.top_k), -7, dtype=torch.int32)]
    expect = [t.clone() for t in host]
    family.reference(c, *expect)
    dev = [t.cuda() for t in host]
    handle = bundle.kernel("moe_dispatch", **values)
    handle(*dev, variant=variant)
    torch.cuda.synchronize()
    got = [t.cpu() for t in dev]
    where = f"{family.key(c)} T={tokens} {routing} {variant}"
    # The argument order the handle took them in: its record for this device's arch.
    names = [a.name for a in handle.record(torch.cuda.current_device()).args]
    assert len(names) == len(dev), where
    g, e = dict(zip(names, got)), dict(zip(names, expect))
    assert torch.equal(g["expert_offsets"], e["expert_offsets"]), where
    pos, ref_pos = g["positions"], e["positions"]
    assert torch.equal(pos < 0, ref_pos < 0), f"{where}: skipped pairs differ"
    valid = pos >= 0
    # each copy lands inside its own expert's segment, every row used once
    local = ids.long() - c.expert_start
    offsets = g["expert_offsets"].long()
    rows_used = pos[valid].long()
    assert rows_used.unique().numel() == rows_used.numel(), f"{where}: two copies share a row"
    seg_lo, seg_hi = offsets[local[valid]], offsets[local[valid] + 1]
    assert ((rows_used >= seg_lo) & (rows_used < seg_hi)).all(), f"{where}: row outside its expert"
    # the copies are bitwise the token rows; padding is zero; rows past the end untouched
    t_idx = torch.arange(tokens).unsqueeze(1).expand_as(pos)[valid]
    assert torch.equal(g["out"][rows_used].view(torch.uint8), x[t_idx].view(torch.uint8)), where
    used = torch.zeros(rows, dtype=torch.bool)
    used[rows_used] = True
    total = int(offsets[-1])
    pad = ~used[:total]
    assert (g["out"][:total][pad].float() == 0).all(), f"{where}: padding not zeroed"
    assert g["out"][total:].float().isnan().all(), f"{where}: wrote past the used rows"
    if c.scale_group:
        assert torch.equal(g["out_scales"][rows_used], host[2][t_idx]), f"{where}: scales"
        assert (g["out_scales"][:total][pad] == 0).all(), f"{where}: scale padding"
    return dev, g


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("routing", ROUTINGS)
def test_dispatch_every_point(bundle, tokens, routing):
    points = _points(bundle, "moe_dispatch")
    assert points, "the bundle has no moe_dispatch point"
    for values in points:
        for variant in ("decode", "prefill"):
            _dispatch_case(bundle, values, tokens, routing, variant)


@pytest.mark.parametrize("tokens", TOKENS)
def test_combine_every_point_bitwise_repeatable(bundle, tokens):
    import torch

    family = get_family("moe_combine")
    points = _points(bundle, "moe_combine")
    assert points, "the bundle has no moe_combine point"
    for values in points:
        c = family.make_config(**values)
        gen = torch.Generator().manual_seed(tokens + c.top_k)
        rows = tokens * c.top_k + 3
        y = torch.randn(rows, c.hidden, generator=gen).to(getattr(torch, c.dtype))
        pos = torch.randperm(rows, generator=gen)[: tokens * c.top_k].view(tokens, c.top_k)
        pos = pos.to(torch.int32)
        pos[::4, 0] = -1  # a copy on another rank
        w = torch.rand(tokens, c.top_k, generator=gen)
        out = torch.full((tokens, c.hidden), float("nan")).to(y.dtype)
        # unrounded float64 reference: the kernel rounds once to bf16 (half an ulp)
        expect = torch.empty(tokens, c.hidden, dtype=torch.float64)
        family.reference(c, y, pos, w, expect)
        dev = [t.cuda() for t in (y, pos, w, out)]
        handle = bundle.kernel("moe_combine", **values)
        for variant in ("decode", "prefill"):
            dev[3].fill_(float("nan"))
            handle(*dev, variant=variant)
            first = dev[3].clone()
            dev[3].fill_(float("nan"))
            handle(*dev, variant=variant)
            torch.cuda.synchronize()
            assert torch.equal(first, dev[3]), f"{family.key(c)} {variant}: not bitwise repeatable"
            got = first.cpu().double()
            assert not got.isnan().any(), f"{family.key(c)} {variant}: unwritten output"
            err = ((got - expect.double()).abs() / expect.double().abs().clamp(min=1)).max()
            assert err < 2**-7, f"{family.key(c)} T={tokens} {variant}: error {err}"


def test_dispatch_then_combine_is_order_independent(bundle):
    """Two dispatches (atomics may order rows differently) combine to bitwise equal outputs."""
    import torch

    for values in _points(bundle, "moe_dispatch"):
        d = get_family("moe_dispatch").make_config(**values)
        if d.dtype == "float8_e4m3fn" or not any(
            p["top_k"] == d.top_k and p["hidden"] == d.hidden and p["dtype"] == d.dtype
            for p in _points(bundle, "moe_combine")
        ):
            continue
        combine = bundle.kernel("moe_combine", top_k=d.top_k, hidden=d.hidden, dtype=d.dtype)
        outs = []
        for variant in ("decode", "prefill", "prefill"):
            dev, _ = _dispatch_case(bundle, values, 1000, "random", variant)
            y, pos = dev[2], dev[4]
            w = torch.rand(1000, d.top_k, generator=torch.Generator().manual_seed(5)).cuda()
            out = torch.empty(1000, d.hidden, dtype=y.dtype, device="cuda")
            combine(y, pos, w, out)
            outs.append(out)
        torch.cuda.synchronize()
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])


def test_decode_dispatch_replays_in_a_cuda_graph(bundle):
    """The grid barrier's word resets itself: 200 graph replays stay correct."""
    import torch

    values = _points(bundle, "moe_dispatch")[0]
    family = get_family("moe_dispatch")
    c = family.make_config(**values)
    handle = bundle.kernel("moe_dispatch", **values)
    dev, _ = _dispatch_case(bundle, values, 64, "random", "decode")  # warm-up: workspace exists
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        handle(*dev, variant="decode")  # workspace for the capture stream
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        handle(*dev, variant="decode")
    offsets_before = dev[-2].clone()
    for _ in range(200):
        dev[-1].fill_(-7)
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(dev[-2], offsets_before)
    assert (dev[-1] != -7).all(), "positions not rewritten by the replays"
    del c
