"""MoE dispatch and combine from a CPU-built bundle against float64 references, on the GPU.

Every moe_dispatch point of the bundle, every launch variant forced at every size, with random,
skewed (all tokens to the same experts), sparse (most experts empty) and out-of-range routing.
Rows inside an expert may come in any order, so outputs are checked through `positions`.
Every moe_combine point, every variant forced and the plan's choice, bitwise equal to each other.

Inputs are drawn and checked on the GPU, once per case for all its variants; the combine
reference runs there too. The dispatch reference builds its routing on the CPU, so it gets the
routing only (one-column stand-ins for the rows, whose copies are checked against x directly).
"""

from __future__ import annotations

import pytest

from rose_aot import open_bundle
from rose_aot.archs import get_arch
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
    """topk_ids [tokens, top_k] int32 on the device of `gen`."""
    import torch

    device = gen.device
    if kind == "skewed":  # every token picks experts 0..k-1 (of this rank): all load on k experts
        base = torch.arange(c.top_k, dtype=torch.int32, device=device) + c.expert_start
        return base.repeat(tokens, 1)
    if kind == "sparse":  # only two experts in use
        picks = torch.randint(0, 2, (tokens, c.top_k), generator=gen, dtype=torch.int32,
                              device=device)
        return picks + c.expert_start
    scores = torch.rand(tokens, c.num_experts, generator=gen, device=device)
    ids = torch.argsort(scores, dim=1)[:, : c.top_k].to(torch.int32)
    if kind == "out_of_range":
        ids[::3, 0] = -1
        ids[1::5, -1] = c.num_experts + 5
    return ids


def _dispatch_inputs(c, tokens, routing):
    """(x, topk_ids, x_scales or None) on the GPU, from a seed fixed per case."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(tokens * 31 + len(routing))
    x = torch.randn(tokens, c.hidden, generator=gen, device="cuda").to(getattr(torch, c.dtype))
    ids = _routing(routing, tokens, c, gen)
    scales = None
    if c.scale_group:
        groups = c.hidden // c.scale_group
        scales = torch.rand(tokens, groups, generator=gen, device="cuda") + 0.5
    return x, ids, scales


def _dispatch_expected(family, c, tokens, x, ids):
    """The reference's expert offsets and positions (on the GPU). The reference runs on the CPU
    with one-column stand-ins for x, out and the scales: only its routing is compared."""
    import torch

    rows = family.max_rows(c, tokens) + 5
    stand_ins = [torch.zeros(tokens, 1, dtype=x.dtype), ids.cpu()]
    if c.scale_group:
        stand_ins.append(torch.zeros(tokens, 1))
    stand_ins.append(torch.zeros(rows, 1, dtype=x.dtype))
    if c.scale_group:
        stand_ins.append(torch.zeros(rows, 1))
    offsets = torch.full((family.local(c) + 1,), -7, dtype=torch.int32)
    positions = torch.full((tokens, c.top_k), -7, dtype=torch.int32)
    family.reference(c, *stand_ins, offsets, positions)
    return offsets.cuda(), positions.cuda()


def _dispatch_run(bundle, values, c, tokens, routing, variant, inputs, expected):
    """One launch on fresh poisoned outputs, checked; returns (arguments, outputs by name)."""
    import torch

    family = get_family("moe_dispatch")
    x, ids, scales = inputs
    ref_offsets, ref_pos = expected
    rows = family.max_rows(c, tokens) + 5
    dev = [x, ids] + ([scales] if scales is not None else [])
    dev.append(torch.full((rows, c.hidden), float("nan"), device="cuda").to(x.dtype))
    if scales is not None:
        dev.append(torch.full((rows, scales.shape[1]), float("nan"), device="cuda"))
    dev += [torch.full((family.local(c) + 1,), -7, dtype=torch.int32, device="cuda"),
            torch.full((tokens, c.top_k), -7, dtype=torch.int32, device="cuda")]
    handle = bundle.kernel("moe_dispatch", **values)
    handle(*dev, variant=variant)
    torch.cuda.synchronize()
    where = f"{family.key(c)} T={tokens} {routing} {variant}"
    # The argument order the handle took them in: its record for this device's arch.
    names = [a.name for a in handle.record(torch.cuda.current_device()).args]
    assert len(names) == len(dev), where
    g = dict(zip(names, dev))
    assert torch.equal(g["expert_offsets"], ref_offsets), where
    pos = g["positions"]
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
    t_idx = torch.arange(tokens, device="cuda").unsqueeze(1).expand_as(pos)[valid]
    assert torch.equal(g["out"][rows_used].view(torch.uint8), x[t_idx].view(torch.uint8)), where
    used = torch.zeros(rows, dtype=torch.bool, device="cuda")
    used[rows_used] = True
    total = int(offsets[-1])
    pad = ~used[:total]
    assert (g["out"][:total][pad].float() == 0).all(), f"{where}: padding not zeroed"
    assert g["out"][total:].float().isnan().all(), f"{where}: wrote past the used rows"
    if c.scale_group:
        assert torch.equal(g["out_scales"][rows_used], scales[t_idx]), f"{where}: scales"
        assert (g["out_scales"][:total][pad] == 0).all(), f"{where}: scale padding"
    return dev, g


def _dispatch_case(bundle, values, tokens, routing, variant):
    family = get_family("moe_dispatch")
    c = family.make_config(**values)
    inputs = _dispatch_inputs(c, tokens, routing)
    expected = _dispatch_expected(family, c, tokens, inputs[0], inputs[1])
    return _dispatch_run(bundle, values, c, tokens, routing, variant, inputs, expected)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("routing", ROUTINGS)
def test_dispatch_every_point(bundle, tokens, routing):
    family = get_family("moe_dispatch")
    points = _points(bundle, "moe_dispatch")
    assert points, "the bundle has no moe_dispatch point"
    for values in points:
        c = family.make_config(**values)
        inputs = _dispatch_inputs(c, tokens, routing)
        expected = _dispatch_expected(family, c, tokens, inputs[0], inputs[1])
        for variant in family.plan_choices:
            _dispatch_run(bundle, values, c, tokens, routing, variant, inputs, expected)


def _combine_inputs(c, tokens):
    """(y, positions, weights) on the GPU: distinct rows, a copy on another rank (-1) every
    fourth token, a position past the last row every fifth."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(tokens + c.top_k)
    rows = tokens * c.top_k + 3
    y = torch.randn(rows, c.hidden, generator=gen, device="cuda").to(getattr(torch, c.dtype))
    pos = torch.randperm(rows, generator=gen, device="cuda")[: tokens * c.top_k]
    pos = pos.view(tokens, c.top_k).to(torch.int32)
    pos[::4, 0] = -1
    pos[1::5, -1] = rows + 7
    w = torch.rand(tokens, c.top_k, generator=gen, device="cuda")
    return y, pos, w


@pytest.mark.parametrize("tokens", TOKENS)
def test_combine_every_point_every_variant_bitwise_equal(bundle, tokens):
    """Each variant forced and the plan's choice: outputs fully written, within half an ulp
    of bf16 of the unrounded float64 reference, bitwise repeatable and bitwise equal across
    variants (one body, one summation order)."""
    import torch

    family = get_family("moe_combine")
    points = _points(bundle, "moe_combine")
    assert points, "the bundle has no moe_combine point"
    device = torch.cuda.current_device()
    for values in points:
        c = family.make_config(**values)
        y, pos, w = _combine_inputs(c, tokens)
        # unrounded float64 reference: the kernel rounds once to bf16 (half an ulp)
        expect = torch.empty(tokens, c.hidden, dtype=torch.float64, device="cuda")
        family.reference(c, y, pos, w, expect)
        out = torch.empty(tokens, c.hidden, dtype=y.dtype, device="cuda")
        handle = bundle.kernel("moe_combine", **values)
        variants = [v.name for v in handle.record(device).variants]
        # what the build compiles for this arch (split_block only where a split launch
        # exceeds its late twin's PDL limit: family.variants)
        arch = get_arch(bundle.arch_for_device(device))
        assert variants == [v.name for v in family.variants(c, arch)], variants
        baseline = None
        for variant in [None, *variants]:
            where = f"{family.key(c)} T={tokens} {variant or 'auto'}"
            out.fill_(float("nan"))
            handle(y, pos, w, out, variant=variant)
            first = out.clone()
            out.fill_(float("nan"))
            handle(y, pos, w, out, variant=variant)
            torch.cuda.synchronize()
            assert torch.equal(first, out), f"{where}: not bitwise repeatable"
            got = first.double()
            assert not got.isnan().any(), f"{where}: unwritten output"
            err = ((got - expect).abs() / expect.abs().clamp(min=1)).max()
            assert err < 2**-7, f"{where}: error {err}"
            if baseline is None:
                baseline = first
            else:
                bad = (first.view(torch.int16) != baseline.view(torch.int16)).nonzero()
                assert bad.numel() == 0, (
                    f"{where}: differs from the plan's choice; first bad index {bad[0].tolist()}"
                )


def test_combine_chain_with_programmatic_dependent_launch(bundle):
    """Two combines back to back, the second reading the first's output. At one token the
    split and decode launches carry the PDL attribute, so the second starts before the first
    ends and must wait for its writes (griddepcontrol.wait): poisoned before each chain, the
    intermediate would turn the result into NaN if it were read early."""
    import torch

    family = get_family("moe_combine")
    device = torch.cuda.current_device()
    for values in _points(bundle, "moe_combine"):
        c = family.make_config(**values)
        handle = bundle.kernel("moe_combine", **values)
        record = handle.record(device)
        y, pos, w = _combine_inputs(c, 1)
        mid = torch.empty(1, c.hidden, dtype=y.dtype, device="cuda")
        pos2 = torch.zeros(1, c.top_k, dtype=torch.int32, device="cuda")  # k copies of mid[0]
        w2 = torch.rand(1, c.top_k, generator=torch.Generator().manual_seed(3)).cuda()
        out = torch.empty_like(mid)
        for variant in ("split", "split_wide", "decode"):
            (launch,) = handle.plan(y, pos, w, mid, variant=variant)
            v = record.variant(variant)
            grid = launch.grid[0] * launch.grid[1] * launch.grid[2]
            assert 0 < grid * v.threads <= v.pdl, f"{variant}: no PDL at one token"
            mid.fill_(float("nan"))
            handle(y, pos, w, mid, variant=variant)
            torch.cuda.synchronize()
            handle(mid, pos2, w2, out, variant=variant)
            torch.cuda.synchronize()
            expect = out.clone()
            assert not expect.isnan().any()
            for _ in range(20):
                mid.fill_(float("nan"))
                out.fill_(float("nan"))
                handle(y, pos, w, mid, variant=variant)
                handle(mid, pos2, w2, out, variant=variant)
            torch.cuda.synchronize()
            assert torch.equal(out, expect), f"{family.key(c)} {variant}: PDL chain differs"


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


def test_a_forced_launch_checks_its_points_forced_plans_first(bundle, tmp_path):
    """A record that only a forced plan misreads (top-8 moe_combine without split_wide's
    `chunks`, which its plan reads only when split_wide is forced) serves the plan's own
    launches, as before; the point's first forced launch, or forced plan, raises the
    BundleError the loader's record check raises (check_forced_plans), instead of the plan's
    KeyError."""
    import json

    import torch

    from rose_aot.bundle import BundleReader, write_bundle
    from rose_aot.errors import BundleError

    reader = BundleReader.open(bundle.path)
    index = json.loads(json.dumps(reader.index))
    tops = [p for p in index["points"]
            if p["family"] == "moe_combine" and p["config"]["top_k"] == 8]
    assert tops, "the bundle has no top-8 moe_combine point"
    for point in tops:
        wide = next(v for v in point["variants"] if v["name"] == "split_wide")
        del wide["constants"]["chunks"]
    path = tmp_path / "forced-misread.rosebundle"
    write_bundle(path, index, {name: reader.blob(name) for name in reader.blob_names()})

    values = tops[0]["config"]
    c = get_family("moe_combine").make_config(**values)
    y, pos, w = _combine_inputs(c, 3)
    want = torch.empty(3, c.hidden, dtype=y.dtype, device="cuda")
    bundle.kernel("moe_combine", **values)(y, pos, w, want)
    handle = open_bundle(path).kernel("moe_combine", **values)
    out = torch.full_like(want, float("nan"))
    handle(y, pos, w, out)  # the plan's own launch
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    for forced in ("split_wide", "split"):  # any forced launch of the point: its plans first
        with pytest.raises(BundleError, match="'chunks'.*rebuild"):
            handle(y, pos, w, out, variant=forced)
        with pytest.raises(BundleError, match="'chunks'"):
            handle.plan(y, pos, w, out, variant=forced)
