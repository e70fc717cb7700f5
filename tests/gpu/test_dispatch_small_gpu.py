"""moe_dispatch's "small" variant (redundant per-block routing, no grid barrier) on the GPU.

Every moe_dispatch point of the bundle, forced to "small" at every token count it takes, with
random, skewed, sparse and out-of-range routing. Its rows inside an expert come in (token, k)
order in every block (each warp ranks a share, then the shares are combined), so the outputs
must equal the float64 reference exactly: positions, expert_offsets, each copied row, padding
zeroed and rows past the end untouched. Also: the plan picks it for small counts, launches are
bitwise repeatable, and a CUDA graph of back-to-back dispatches (PDL between them) stays
correct over replays.
"""

from __future__ import annotations

import pytest

from rose_aot import open_bundle
from rose_aot.kernels import get_family
from rose_aot.kernels.moe_dispatch.tuning import SMALL_MAX_PAIRS

pytestmark = pytest.mark.gpu

ROUTINGS = ("random", "skewed", "sparse", "out_of_range")
FAMILY = "moe_dispatch"


@pytest.fixture(scope="module")
def bundle(shipped_bundle_path):
    return open_bundle(shipped_bundle_path)


def _points(bundle):
    import torch

    arch = bundle.arch_for_device(torch.cuda.current_device())
    return [p["config"] for p in bundle.index["points"] if p["arch"] == arch and p["family"] == FAMILY]


def _capacity(handle):
    """Pairs "small" takes at most (its record's max_pairs) and the pairs each warp of its
    blocks ranks."""
    import torch

    v = handle.record(torch.cuda.current_device()).variant("small")
    return v.constants["max_pairs"], -(-v.constants["max_pairs"] // v.threads) * 32


def _token_counts(top_k, max_pairs, per_warp):
    """Tiny counts, the last count ranked by warp 0 alone and one more (warps past 0 rank
    too), and the capacity."""
    most = max_pairs // top_k
    one_warp = per_warp // top_k
    return sorted({1, 2, 3, min(16, most), min(one_warp, most), min(one_warp + 1, most),
                   max(1, most - 1), most})


def _routing(kind, tokens, c, gen):
    import torch

    if kind == "skewed":
        return (torch.arange(c.top_k, dtype=torch.int32) + c.expert_start).repeat(tokens, 1)
    if kind == "sparse":
        picks = torch.randint(0, 2, (tokens, c.top_k), generator=gen, dtype=torch.int32)
        return picks + c.expert_start
    ids = torch.argsort(torch.rand(tokens, c.num_experts, generator=gen), dim=1)[:, : c.top_k]
    ids = ids.to(torch.int32)
    if kind == "out_of_range":
        ids[::3, 0] = -1
        ids[1::5, -1] = c.num_experts + 5
    return ids


def _case(values, tokens, routing, seed):
    """(config, host tensors in argument order with outputs poisoned, reference outputs)."""
    import torch

    family = get_family(FAMILY)
    c = family.make_config(**values)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, c.hidden, generator=gen).to(getattr(torch, c.dtype))
    ids = _routing(routing, tokens, c, gen)
    rows = family.max_rows(c, tokens) + 5
    host = [x, ids]
    if c.scale_group:
        host.append(torch.rand(tokens, c.hidden // c.scale_group, generator=gen) + 0.5)
    host.append(torch.full((rows, c.hidden), float("nan")).to(x.dtype))
    if c.scale_group:
        host.append(torch.full((rows, c.hidden // c.scale_group), float("nan")))
    host += [torch.full((family.local(c) + 1,), -7, dtype=torch.int32),
             torch.full((tokens, c.top_k), -7, dtype=torch.int32)]
    expect = [t.clone() for t in host]
    family.reference(c, *expect)
    return c, host, expect


def _assert_bitwise(where, names, got, expect):
    """Byte equality (the NaN poison where nothing may be written compares equal to itself);
    the message names the first differing elements."""
    for name, g, e in zip(names, got, expect):
        g = g.cpu()
        if g.shape != e.shape or g.dtype != e.dtype:
            raise AssertionError(f"{where}: {name} is {g.dtype}{list(g.shape)}, want {e.dtype}{list(e.shape)}")
        width = g.element_size()
        a = g.contiguous().view(-1).view(torch_uint(width))
        b = e.contiguous().view(-1).view(torch_uint(width))
        bad = (a != b).nonzero().view(-1)
        if bad.numel():
            first = [divmod(int(i), g.shape[-1]) if g.dim() == 2 else int(i) for i in bad[:4]]
            raise AssertionError(
                f"{where}: {name} differs from the reference at {bad.numel()} elements, first "
                f"(row, col) {first}: got {[g.view(-1)[int(i)].double().item() for i in bad[:4]]}, want "
                f"{[e.view(-1)[int(i)].double().item() for i in bad[:4]]}"
            )


def torch_uint(width):
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32}[width]


@pytest.mark.parametrize("routing", ROUTINGS)
def test_small_equals_the_reference_exactly(bundle, routing):
    """Forced at every count it takes: rows in (token, k) order like the reference, so every
    output compares bitwise (the ranks of warps 1.. included)."""
    import torch

    points = _points(bundle)
    assert points, "the bundle has no moe_dispatch point"
    for i, values in enumerate(points):
        handle = bundle.kernel(FAMILY, **values)
        names = [a.name for a in handle.record(torch.cuda.current_device()).args]
        for tokens in _token_counts(values["top_k"], *_capacity(handle)):
            c, host, expect = _case(values, tokens, routing, seed=1000 * i + tokens)
            dev = [t.cuda() for t in host]
            (launch,) = handle.plan(*dev, variant="small")
            assert launch.variant == "small"
            handle(*dev, variant="small")
            torch.cuda.synchronize()
            _assert_bitwise(f"{handle.key} T={tokens} {routing}", names, dev, expect)


def test_the_plan_picks_small_and_launches_repeat_bitwise(bundle):
    import torch

    for values in _points(bundle):
        handle = bundle.kernel(FAMILY, **values)
        names = [a.name for a in handle.record(torch.cuda.current_device()).args]
        tokens = SMALL_MAX_PAIRS // values["top_k"]
        _, host, expect = _case(values, tokens, "random", seed=7)
        for _ in range(2):
            dev = [t.cuda() for t in host]
            assert [x.variant for x in handle.plan(*dev)] == ["small"]
            handle(*dev)
            torch.cuda.synchronize()
            _assert_bitwise(f"{handle.key} T={tokens} plan", names, dev, expect)


def test_small_back_to_back_in_a_cuda_graph(bundle):
    """Three dispatches of different routings captured in one graph (PDL lets each start
    during its predecessor; the prologue waits before any read), replayed 100 times with the
    routing changed between replays: each replay's outputs equal the reference."""
    import torch

    values = next(p for p in _points(bundle) if not p.get("scale_group"))
    handle = bundle.kernel(FAMILY, **values)
    names = [a.name for a in handle.record(torch.cuda.current_device()).args]
    cases = [_case(values, t, r, seed=t) for t, r in ((1, "random"), (4, "skewed"), (3, "out_of_range"))]
    devs = [[t.cuda() for t in host] for _, host, _ in cases]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for dev in devs:
            handle(*dev)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for dev in devs:
            handle(*dev)
    gen = torch.Generator().manual_seed(3)
    for replay in range(100):
        expects = []
        for (cfg, host, _), dev in zip(cases, devs):
            ids = _routing("random", host[0].shape[0], cfg, gen)
            host = [h.clone() for h in host]
            host[1] = ids
            expect = [h.clone() for h in host]
            get_family(FAMILY).reference(cfg, *expect)
            for d, h in zip(dev, host):
                d.copy_(h.cuda())
            expects.append(expect)
        graph.replay()
        torch.cuda.synchronize()
        for dev, expect in zip(devs, expects):
            _assert_bitwise(f"{handle.key} replay {replay}", names, dev, expect)
