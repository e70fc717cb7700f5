"""moe_dispatch_fp8_quant from a CPU-built bundle on the GPU, bitwise against the float64
reference (moe_dispatch's reference, then fp8_group_quant's) through positions.

Every point of the bundle, each launch variant forced (small where it applies, decode, prefill)
and the plan's own choice, at edge token counts with random, skewed, sparse and out-of-range
routing; codes and scales bit for bit, padding rows quantized zero rows, nothing written past
the used rows (nor into the padding of a column-major scale buffer). Also: bitwise equal to
moe_dispatch followed by fp8_group_quant from the same bundle where it has both points, and
CUDA-graph replays.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dispatch_fp8_cases import FAMILY, ROUTINGS, check, make_case, to_device  # noqa: E402

from rose_aot import open_bundle  # noqa: E402
from rose_aot.kernels import get_family  # noqa: E402
from rose_aot.kernels.moe_dispatch.tuning import SMALL_WIDE_MAX_PAIRS  # noqa: E402

pytestmark = pytest.mark.gpu

TOKENS = (1, 3, 17, 64, 128, 1000, 4099)


@pytest.fixture(scope="module")
def bundle(shipped_bundle_path):
    return open_bundle(shipped_bundle_path)


def _points(bundle, family=FAMILY):
    import torch

    arch = bundle.arch_for_device(torch.cuda.current_device())
    return [p["config"] for p in bundle.index["points"] if p["arch"] == arch and p["family"] == family]


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("routing", ROUTINGS)
def test_every_point_every_variant_bitwise(bundle, tokens, routing):
    import torch

    points = _points(bundle)
    assert points, f"the bundle has no {FAMILY} point (tests/manifests/moe-fp8-quant-cases.toml)"
    for i, values in enumerate(points):
        if tokens > 1000 and values["hidden"] > 2048:
            continue  # the float64 reference of 32k rows x 7168 is slow on the CPU
        c = get_family(FAMILY).make_config(**values)
        handle = bundle.kernel(FAMILY, **values)
        host, expect = make_case(c, tokens, routing, seed=97 * i + tokens,
                                 strided_x=tokens % 2 == 1)
        record = handle.record(torch.cuda.current_device())
        for variant in (None, "small", "small_wide", "decode", "prefill"):
            if variant in ("small", "small_wide") and (
                    tokens * c.top_k > record.variant(variant).constants["max_pairs"]):
                continue  # beyond its capacity a small variant is the plan's own choice
            dev = to_device(host)
            launches = handle.plan(*dev, variant=variant)
            handle(*dev, variant=variant)
            torch.cuda.synchronize()
            ran = "+".join(x.variant for x in launches)
            where = f"{handle.key} T={tokens} {routing} forced={variant} ran={ran}"
            check(c, host, dev, expect, where, exact_rows=ran in ("small", "small_wide"))


def test_equals_dispatch_then_group_quant_from_the_bundle(bundle):
    """Where the bundle has the unfused pair (moe_dispatch of the same routing and
    fp8_group_quant of the same hidden/group/layout/ue8m0/eps), the fused kernel writes the
    same codes and scales as running both, bit for bit."""
    import torch

    dispatch_points = _points(bundle, "moe_dispatch")
    quant_points = _points(bundle, "fp8_group_quant")
    pairs = 0
    for values in _points(bundle):
        c = get_family(FAMILY).make_config(**values)
        d = next((p for p in dispatch_points if all(
            p.get(k, v) == v for k, v in (("num_experts", c.num_experts), ("top_k", c.top_k),
                                           ("hidden", c.hidden), ("dtype", c.dtype),
                                           ("expert_alignment", c.expert_alignment),
                                           ("expert_start", c.expert_start),
                                           ("local_experts", c.local_experts)))), None)
        q = next((p for p in quant_points if all(
            p.get(k) == v for k, v in (("hidden", c.hidden), ("group", c.group), ("dtype", c.dtype),
                                        ("scale_layout", c.scale_layout), ("ue8m0", c.ue8m0),
                                        ("eps", c.eps)))), None)
        if d is None or q is None:
            continue
        pairs += 1
        for tokens in (1, 64, 1000):
            host, _ = make_case(c, tokens, "random", seed=tokens)
            fused = to_device(host)
            bundle.kernel(FAMILY, **values)(*fused)
            # unfused: dispatch bf16 rows, then quantize every used row
            x, ids = fused[0], fused[1]
            rows = host[2].shape[0]
            routed = torch.zeros(rows, c.hidden, dtype=x.dtype, device="cuda")
            offsets = torch.empty_like(fused[4])
            positions = torch.empty_like(fused[5])
            bundle.kernel("moe_dispatch", **d)(x, ids, routed, offsets, positions)
            torch.cuda.synchronize()
            total = int(offsets[-1])
            codes = torch.empty(total, c.hidden, dtype=torch.float8_e4m3fn, device="cuda")
            groups = c.hidden // c.group
            if c.scale_layout == "row_major":
                scales = torch.empty(total, groups, device="cuda")
            else:
                scales = torch.empty(groups, -(-total // 4) * 4, device="cuda").t()[:total]
            if total:
                bundle.kernel("fp8_group_quant", **q)(routed[:total], codes, scales)
            torch.cuda.synchronize()
            where = f"{bundle.kernel(FAMILY, **values).key} T={tokens}"
            assert torch.equal(offsets, fused[4]), where
            valid = positions >= 0
            mine, theirs = fused[5][valid].long(), positions[valid].long()
            assert torch.equal(fused[2][mine].view(torch.uint8), codes[theirs].view(torch.uint8)), where
            assert torch.equal(fused[3][mine].view(torch.int32), scales[theirs].contiguous().view(torch.int32)), where
    if not pairs:
        pytest.skip("the bundle has no moe_dispatch + fp8_group_quant pair matching a fused point")


def test_fused_dispatch_replays_in_a_cuda_graph(bundle):
    import torch

    values = _points(bundle)[0]
    c = get_family(FAMILY).make_config(**values)
    handle = bundle.kernel(FAMILY, **values)
    # small, small_wide (up to SMALL_WIDE_MAX_PAIRS), and decode or prefill
    for tokens in (1, SMALL_WIDE_MAX_PAIRS // c.top_k, 3 * SMALL_WIDE_MAX_PAIRS // c.top_k):
        host, expect = make_case(c, tokens, "random", seed=5)
        dev = to_device(host)
        handle(*dev)  # warm-up: the workspace exists before the capture
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            handle(*dev)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            handle(*dev)
        poisoned = to_device(host)
        for replay in range(50):
            for d, p in zip(dev[2:], poisoned[2:]):
                d.copy_(p)
            graph.replay()
            torch.cuda.synchronize()
            check(c, host, dev, expect, f"{handle.key} T={tokens} replay {replay}")
