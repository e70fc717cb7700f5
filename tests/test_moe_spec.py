"""MoE dispatch/combine on the CPU: configs, launch plans, references, and real compiles."""

from __future__ import annotations

import re

import pytest
import torch

from rose_aot.archs import ARCHS
from rose_aot.builder.compile import compile_point
from rose_aot.errors import ArgumentError, ConfigError
from rose_aot.kernels import get_family
from rose_aot.kernels.moe_dispatch.tuning import (
    DECODE_MAX_PAIRS_PER_SM,
    SMALL_BLOCK_THREADS,
    SMALL_MAX_PAIRS,
)

DISPATCH = get_family("moe_dispatch")
COMBINE = get_family("moe_combine")


def _variants(family, config, arch):
    return {v.name: v for v in family.variants(config, arch)}


def _plan(family, config, arch, sizes, force=None):
    """The plan on a device with the arch's SM count, from the arch's variants."""
    return family.plan(config, _variants(family, config, arch), sizes, arch.sm_count, force)


def qwen3_moe(**overrides):
    return DISPATCH.make_config(**{"num_experts": 128, "top_k": 8, "hidden": 2048, **overrides})


# --- configs ------------------------------------------------------------------------------------
def test_local_experts_default_is_made_explicit_for_one_key():
    assert qwen3_moe() == qwen3_moe(local_experts=128)
    assert DISPATCH.key(qwen3_moe()) == DISPATCH.key(qwen3_moe(local_experts=128))
    assert qwen3_moe(expert_start=96).local_experts == 32


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"expert_start": 120, "local_experts": 16}, "local_experts"),
        ({"expert_start": 128}, "expert_start"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 129}, "top_k"),
        ({"hidden": 2049}, "hidden"),
        ({"dtype": "float8_e4m3fn", "scale_group": 100}, "scale_group"),
        ({"scale_group": 128}, "scale_group"),
        ({"expert_alignment": 100}, "expert_alignment"),
        ({"dtype": "float32"}, "dtype"),
    ],
)
def test_bad_dispatch_configs_name_the_field(overrides, field):
    with pytest.raises(ConfigError) as info:
        qwen3_moe(**overrides)
    assert info.value.field == field


def test_float8_gets_a_scale_group_and_scale_tensors():
    c = qwen3_moe(dtype="float8_e4m3fn")
    assert c.scale_group == 128
    for arch in ARCHS.values():
        args = DISPATCH.args(c, arch)
        names = [a.name for a in args]
        assert names == [
            "x", "topk_ids", "x_scales", "out", "out_scales", "expert_offsets", "positions"
        ]
        scales = args[2]
        assert scales.shape[1] == 2048 // 128 and scales.dtype == "float32"
        assert [a.role for a in args] == [
            "input", "input", "input", "output", "output", "output", "output"
        ]
        # The workspace follows the call arguments in every variant's parameters.
        workspace = [a.name for a in DISPATCH.workspace(c, arch)]
        assert all(a.role == "workspace" for a in DISPATCH.workspace(c, arch))
        for v in DISPATCH.variants(c, arch):
            assert v.params == (*names, *workspace)


# --- launch plans -------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_small_counts_are_one_plain_launch_without_a_barrier(arch):
    a = ARCHS[arch]
    c = qwen3_moe()
    variants = _variants(DISPATCH, c, a)
    small = variants["small"]
    assert not small.cooperative and small.pdl > 0
    assert small.constants["max_pairs"] == SMALL_MAX_PAIRS
    assert "small_wide" not in variants  # moe_dispatch_fp8_quant's only
    for tokens in (1, 7, SMALL_MAX_PAIRS // c.top_k):
        sizes = {"tokens": tokens, "rows": DISPATCH.max_rows(c, tokens)}
        (launch,) = _plan(DISPATCH, c, a, sizes)
        assert launch.variant == "small"
        # one warp per slice of 32 x vecs_per_lane vectors of each copy, capped per SM
        units = -(-(c.hidden // small.constants["vec"]) // (32 * small.constants["vecs_per_lane"]))
        want = -(-tokens * c.top_k * units // (small.threads // 32))
        assert launch.grid == (min(want, a.sm_count * small.constants["blocks_per_sm"]), 1, 1)


def test_one_token_spreads_its_rows_over_blocks_within_the_pdl_limit():
    """One token, top-8, hidden 7168 bf16 on sm_90a: 8 rows of 896 16-byte vectors, 7 units of
    128 vectors each, 56 warps: 14 blocks of 128 threads, PDL on (1792 threads)."""
    c = qwen3_moe(hidden=7168)
    a = ARCHS["sm_90a"]
    (launch,) = _plan(DISPATCH, c, a, {"tokens": 1, "rows": DISPATCH.max_rows(c, 1)})
    small = _variants(DISPATCH, c, a)["small"]
    assert launch.grid == (14, 1, 1)
    assert launch.grid[0] * small.threads <= small.pdl


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_decode_is_one_cooperative_launch_within_the_sm_count(arch):
    a = ARCHS[arch]
    c = qwen3_moe()
    limit_tokens = a.sm_count * DECODE_MAX_PAIRS_PER_SM // c.top_k
    variants = _variants(DISPATCH, c, a)
    for tokens in (1, 7, SMALL_MAX_PAIRS // c.top_k + 1, limit_tokens):
        sizes = {"tokens": tokens, "rows": DISPATCH.max_rows(c, tokens)}
        force = "decode" if tokens * c.top_k <= SMALL_MAX_PAIRS else None
        (launch,) = _plan(DISPATCH, c, a, sizes, force)
        assert launch.variant == "decode" and variants["decode"].cooperative
        assert 1 <= launch.grid[0] <= a.sm_count
    sizes = {"tokens": limit_tokens + 1, "rows": DISPATCH.max_rows(c, limit_tokens + 1)}
    route, copy = _plan(DISPATCH, c, a, sizes)
    assert (route.variant, variants[route.variant].cooperative) == ("prefill_route", True)
    assert route.grid[0] <= a.sm_count
    assert (copy.variant, variants[copy.variant].cooperative) == ("prefill_copy", False)
    warps = variants["prefill_copy"].block[0] // 32
    assert copy.grid[0] * warps >= (limit_tokens + 1) * c.top_k + DISPATCH.local(c)


def test_forcing_small_beyond_its_capacity_gets_the_sizes_own_plan():
    c = qwen3_moe()
    a = ARCHS["sm_90a"]
    for tokens in (SMALL_MAX_PAIRS // c.top_k + 1, 100, 1000):
        sizes = {"tokens": tokens, "rows": DISPATCH.max_rows(c, tokens)}
        assert _plan(DISPATCH, c, a, sizes, "small") == _plan(DISPATCH, c, a, sizes)
    one = {"tokens": 1, "rows": DISPATCH.max_rows(c, 1)}
    assert [x.variant for x in _plan(DISPATCH, c, a, one, "prefill")] == [
        "prefill_route", "prefill_copy"
    ]


def test_small_shared_memory_covers_every_expert_and_pair():
    from rose_aot.kernels.moe_dispatch.family import small_shared_bytes

    for experts in (1, 16, 128, 1024):
        c = DISPATCH.make_config(num_experts=experts, top_k=1, hidden=512)
        small = _variants(DISPATCH, c, ARCHS["sm_90a"])["small"]
        warps = SMALL_BLOCK_THREADS // 32
        assert small.threads == SMALL_BLOCK_THREADS
        assert small.smem == small_shared_bytes(experts, warps, SMALL_MAX_PAIRS)
        # counts, offsets, padding prefix; the counts of ranking warps 1..; each pair's expert
        # and rank
        assert small.smem >= 4 * ((3 + warps - 1) * (experts + 1) + 2 * SMALL_MAX_PAIRS)


def test_the_switch_moves_with_the_target_sm_count():
    c = qwen3_moe()
    tokens = 140  # 1120 pairs: above 8 x 132, below 8 x 148
    sizes = {"tokens": tokens, "rows": DISPATCH.max_rows(c, tokens)}
    assert len(_plan(DISPATCH, c, ARCHS["sm_90a"], sizes)) == 2
    assert [x.variant for x in _plan(DISPATCH, c, ARCHS["sm_100a"], sizes)] == ["decode"]
    # The SM count is the device's, passed to the plan: the same records plan differently on
    # a smaller sm_90a part (an H20 has 78 SMs).
    variants = _variants(DISPATCH, c, ARCHS["sm_90a"])
    assert len(DISPATCH.plan(c, variants, sizes, 148)) == 1
    mid = {"tokens": 90, "rows": DISPATCH.max_rows(c, 90)}  # 720 pairs: above 8 x 78
    assert SMALL_MAX_PAIRS < 720
    assert [x.variant for x in DISPATCH.plan(c, variants, mid, 132)] == ["decode"]
    assert len(DISPATCH.plan(c, variants, mid, 78)) == 2


def test_forcing_a_variant_and_rejecting_unknown_names():
    c = qwen3_moe()
    sizes = {"tokens": 4, "rows": DISPATCH.max_rows(c, 4)}
    assert [x.variant for x in _plan(DISPATCH, c, ARCHS["sm_90a"], sizes, "prefill")] == [
        "prefill_route",
        "prefill_copy",
    ]
    with pytest.raises(ConfigError, match="unknown variant 'fast'"):
        _plan(DISPATCH, c, ARCHS["sm_90a"], sizes, "fast")


def test_too_small_an_output_is_refused_with_the_numbers():
    c = qwen3_moe(expert_alignment=128)
    need = DISPATCH.max_rows(c, 10)
    assert need == 10 * 8 + 128 * 127
    with pytest.raises(ArgumentError, match=f"out has {need - 1} rows .* need up to {need}"):
        _plan(DISPATCH, c, ARCHS["sm_90a"], {"tokens": 10, "rows": need - 1})
    assert _plan(DISPATCH, c, ARCHS["sm_90a"], {"tokens": 0, "rows": 0}) == ()


# --- references (the semantics the GPU suite holds the kernels to) -------------------------------
def _dispatch_reference(c, ids, hidden=16):
    tokens = ids.shape[0]
    x = torch.arange(tokens * hidden, dtype=torch.float32).view(tokens, hidden).bfloat16()
    rows = DISPATCH.max_rows(c, tokens)
    out = torch.full((rows, hidden), float("nan")).bfloat16()
    offsets = torch.empty(DISPATCH.local(c) + 1, dtype=torch.int32)
    positions = torch.empty(tokens, c.top_k, dtype=torch.int32)
    DISPATCH.reference(c, x, ids, out, offsets, positions)
    return x, out, offsets, positions


def test_reference_skips_out_of_range_and_other_ranks_experts_and_pads_with_zeros():
    c = DISPATCH.make_config(
        num_experts=8, top_k=2, hidden=16, expert_start=4, local_experts=4, expert_alignment=16
    )
    ids = torch.tensor([[4, 5], [0, 7], [-1, 4], [9, 6]], dtype=torch.int32)
    x, out, offsets, positions = _dispatch_reference(c, ids)
    assert positions.tolist() == [[0, 16], [-1, 48], [-1, 1], [-1, 32]]
    assert offsets.tolist() == [0, 16, 32, 48, 64]  # experts 4..7, each padded to 16 rows
    assert torch.equal(out[0], x[0]) and torch.equal(out[1], x[2]) and torch.equal(out[48], x[1])
    assert (out[2:16].float() == 0).all() and (out[17:32].float() == 0).all()
    assert out[64:].float().isnan().all()  # never written past the used rows


def test_combine_reference_is_the_weighted_sum_in_order_and_ignores_missing_copies():
    c = COMBINE.make_config(top_k=2, hidden=8)
    y = torch.arange(24, dtype=torch.float32).view(3, 8).bfloat16()
    positions = torch.tensor([[2, 0], [-1, 1], [7, 1]], dtype=torch.int32)  # 7: out of range
    weights = torch.tensor([[0.5, 0.25], [1.0, 2.0], [3.0, 1.0]])
    out = torch.empty(3, 8, dtype=torch.float64)
    COMBINE.reference(c, y, positions, weights, out)
    expect0 = 0.5 * y[2].double() + 0.25 * y[0].double()
    assert torch.equal(out[0], expect0)
    assert torch.equal(out[1], 2.0 * y[1].double())
    assert torch.equal(out[2], y[1].double())


# --- real compiles --------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["sm_90a", "sm_100a"])
def dispatch_ptx(request):
    c = qwen3_moe()
    point = compile_point("moe_dispatch", c, request.param)
    assert [v.name for v in point.record.variants] == [
        "small", "decode", "prefill_route", "prefill_copy"
    ]
    return {"arch": request.param, **{n: ptx for n, (ptx, _cubin) in point.artifacts.items()}}


def test_decode_kernel_has_the_grid_barrier_and_shared_counters(dispatch_ptx):
    ptx = dispatch_ptx["decode"]
    assert re.search(r"atom\.global\.release(\.gpu)?\.add", ptx), "barrier arrival"
    assert "ld.acquire.gpu.global.b32" in ptx, "barrier wait"
    assert re.search(r"atom\.shared(\.cta)?\.add", ptx), "shared-memory counters"
    assert "shfl.sync.up" in ptx, "prefix sum over experts"


def test_small_kernel_has_no_barrier_no_atomics_and_ranks_with_warp_matches(dispatch_ptx):
    """No grid barrier and no atomics (the rank of a pair inside its expert must be the same
    in every block): match.any + popc, a PDL prologue, shared counters updated by one lane;
    the warps' ranks combined after block barriers (four: before and after the ranking, and
    two in the combination)."""
    ptx = dispatch_ptx["small"]
    assert not re.search(r"\b(atom|red)\.", ptx)
    assert "ld.acquire" not in ptx
    assert "match.any.sync.b32" in ptx and "popc.b32" in ptx
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    assert ptx.count("bar.sync") >= 4


@pytest.mark.parametrize("variant", ["small", "decode", "prefill_route", "prefill_copy"])
def test_dispatch_kernels_use_no_local_memory_and_the_arch_widest_row_copies(dispatch_ptx, variant):
    """Rows of 2048 bf16 (4096 bytes) are copied 128 bits at a time on sm_90a and 256 bits
    (v8.b32) on sm_100a."""
    ptx = dispatch_ptx[variant]
    assert not re.search(r"\.local|ld\.local|st\.local", ptx)
    if variant != "prefill_route":
        width = "v8" if dispatch_ptx["arch"] == "sm_100a" else "v4"
        assert f"ld.global.{width}.b32" in ptx and f"st.global.{width}.b32" in ptx
        if width == "v4":
            assert "ld.global.v8" not in ptx and "st.global.v8" not in ptx


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_combine_compiles_with_the_arch_widest_loads(arch):
    """128-bit row accesses on sm_90a; 256-bit (v8.b32) on sm_100a, where a bf16 row of 7168
    (14336 bytes) is a whole number of 32-byte vectors."""
    point = compile_point("moe_combine", COMBINE.make_config(top_k=8, hidden=7168), arch)
    # split_block too: 131 tokens of its 7 (sm_100a: 4) blocks pass split_block_late's 65536
    names = ["decode", "prefill", "split", "split_wide", "split_block", "split_block_late"]
    assert [v.name for v in point.record.variants] == names
    assert list(point.artifacts) == names
    width = "v8" if arch == "sm_100a" else "v4"
    for v in point.record.variants:
        ptx = point.artifacts[v.name][0]
        assert v.constants["vec"] == (16 if arch == "sm_100a" else 8)
        assert f"ld.global.{width}.b32" in ptx and f"st.global.{width}.b32" in ptx, (arch, v.name)
        if arch == "sm_90a":
            assert "ld.global.v8" not in ptx and "st.global.v8" not in ptx
        else:  # every row access is 256-bit: no 128-bit row load or store is left
            assert "ld.global.v4.b32" not in ptx and "st.global.v4.b32" not in ptx, v.name
        assert not re.search(r"\.local", ptx)


# --- moe_combine split variant (issue 10 item 4) ----------------------------------------------------
@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("top_k, hidden", [(8, 7168), (2, 2048), (4, 6144), (1, 1000), (8, 16384)])
def test_combine_split_covers_each_row_with_one_warp_blocks(arch, top_k, hidden):
    a = ARCHS[arch]
    c = COMBINE.make_config(top_k=top_k, hidden=hidden)
    v = _variants(COMBINE, c, a)
    split, decode, prefill = v["split"], v["decode"], v["prefill"]
    s = split.constants
    assert split.block == (32, 1, 1) and s["rows_per_block"] == 1 and s["vecs_per_thread"] == 1
    chunk_elems = 32 * s["vec"]
    assert s["chunks"] == -(-hidden // chunk_elems)  # every vector of the row, no block idle
    assert (s["chunks"] - 1) * chunk_elems < hidden <= s["chunks"] * chunk_elems
    assert split.pdl == decode.pdl > 0 and prefill.pdl == 0
    assert decode.constants["chunks"] == prefill.constants["chunks"] == 1
    assert split.params == decode.params == prefill.params
    wide = v["split_wide"]
    w = wide.constants
    # 8 row loads in flight per thread whatever top_k (tuning.SPLIT_WIDE_LOADS)
    vecs = {1: 8, 2: 4, 4: 2, 8: 1}[top_k]
    assert wide.block == (32, 1, 1) and w["rows_per_block"] == 1 and w["vecs_per_thread"] == vecs
    assert w["chunks"] == -(-hidden // (vecs * chunk_elems)) and wide.pdl == split.pdl
    assert wide.params == split.params
    # split_block_late: 4-warp blocks, PDL to SPLIT_BLOCK_PDL_MAX_THREADS with the next kernel
    # launched after its stores; split_block, the same launch without it, only where 4-warp
    # blocks of the split range (to SMs - 1 tokens) pass that limit, but at top-4
    # (SPLIT_BLOCK_LATE_BEYOND_TOP_K), whose launches beyond it split_block_late takes too
    late = v["split_block_late"]
    b = late.constants
    assert late.block == (128, 1, 1) and b["rows_per_block"] == 1 and b["vecs_per_thread"] == 1
    assert b["chunks"] == -(-hidden // (4 * chunk_elems)) and b["pdl_late"] == 1
    assert late.pdl == 65536 > split.pdl and late.params == split.params
    largest = (a.sm_count - 1) * b["chunks"] * 128
    assert b["late_beyond_top_k"] == 4
    assert ("split_block" in v) == (largest > 65536 and top_k != 4), largest
    if "split_block" in v:
        block = v["split_block"]
        assert (block.block, block.params, block.pdl) == (late.block, late.params, split.pdl)
        assert late.constants == {**block.constants, "pdl_late": 1, "late_beyond_top_k": 4}
    assert not any("pdl_late" in x.constants for x in v.values() if x is not late)


def test_combine_plan_splits_rows_below_one_token_per_sm():
    a = ARCHS["sm_90a"]  # 132 SMs
    c = COMBINE.make_config(top_k=8, hidden=7168)
    chunks = _variants(COMBINE, c, a)["split"].constants["chunks"]
    assert chunks == 28  # 7168 bf16 = 896 vectors of 16 bytes, 32 per block
    # split while the grid has at most 8 blocks per SM (1056 here: 37 tokens of 28 blocks)
    for tokens in (1, 2, 16, 37):
        (launch,) = _plan(COMBINE, c, a, {"tokens": tokens})
        assert (launch.variant, launch.grid) == ("split", (tokens * chunks, 1, 1)), tokens
    # beyond it 4-warp blocks, 7 per token (896 vectors, 128 per block): split_block_late up to
    # 65536 threads (73 tokens of 896), split_block beyond
    for tokens in (38, 64, 73, 74, 131):
        (launch,) = _plan(COMBINE, c, a, {"tokens": tokens})
        name = "split_block_late" if tokens * 7 * 128 <= 65536 else "split_block"
        assert (launch.variant, launch.grid) == (name, (tokens * 7, 1, 1)), tokens
    (launch,) = _plan(COMBINE, c, a, {"tokens": 132})
    assert (launch.variant, launch.grid) == ("decode", (132, 1, 1))
    (launch,) = _plan(COMBINE, c, a, {"tokens": 8192})
    assert launch.variant == "prefill"
    assert _plan(COMBINE, c, a, {"tokens": 0}) == ()
    assert _plan(COMBINE, c, a, {"tokens": 0}, "split") == ()


def test_combine_split_rule_moves_with_the_sm_count_and_caps_the_grid():
    c = COMBINE.make_config(top_k=8, hidden=7168)
    variants = _variants(COMBINE, c, ARCHS["sm_90a"])
    assert COMBINE.plan(c, variants, {"tokens": 37}, 132)[0].variant == "split"  # 1036 blocks
    # H20: > 624 blocks; 33152 threads, within split_block_late's PDL limit
    assert COMBINE.plan(c, variants, {"tokens": 37}, 78)[0].variant == "split_block_late"
    # hidden 16384 bf16: 64 one-warp blocks per token; at most 8 blocks per SM (tuning.py)
    wide = COMBINE.make_config(top_k=8, hidden=16384)
    wv = _variants(COMBINE, wide, ARCHS["sm_90a"])
    assert wv["split"].constants["chunks"] == 64
    assert COMBINE.plan(wide, wv, {"tokens": 16}, 132)[0].variant == "split"  # 1024 blocks
    assert COMBINE.plan(wide, wv, {"tokens": 17}, 132)[0].variant == "split_block_late"
    assert COMBINE.plan(wide, wv, {"tokens": 33}, 132)[0].variant == "split_block"  # 67584
    assert COMBINE.plan(wide, wv, {"tokens": 132}, 132)[0].variant == "decode"


def test_combine_plan_takes_the_variant_the_sweep_measured_fastest():
    """tuning.py: below one token per SM, top-2 and top-4 from 16 tokens take split_wide while its
    launch gets programmatic dependent launch (at most 2048 threads), split_block beyond; below
    16 tokens split (split_wide where split's grid is over its block limit); top-8 split, and
    split_block where split's grid is over its limit; from one token per SM on, decode/prefill.
    split_block's launches of at most 65536 threads are split_block_late's (PDL, late trigger);
    points whose split launches never pass that compile no split_block."""
    a = ARCHS["sm_90a"]  # 132 SMs

    def chosen(top_k, hidden, tokens, sm_count=a.sm_count):
        c = COMBINE.make_config(top_k=top_k, hidden=hidden)
        variants = _variants(COMBINE, c, a)
        (launch,) = COMBINE.plan(c, variants, {"tokens": tokens}, sm_count)
        chunks = variants[launch.variant].constants["chunks"]
        assert launch.grid[0] == (tokens * chunks if "split" in launch.variant else launch.grid[0])
        return launch.variant

    # top-2, hidden 2048: split_wide's 2 one-warp blocks per token reach 2048 threads at 32;
    # split_block's 2 four-warp blocks reach 33536 threads at 131 tokens: split_block_late only
    assert [chosen(2, 2048, t) for t in (1, 15, 16, 32, 33, 64, 131, 132)] == [
        "split", "split", "split_wide", "split_wide", "split_block_late", "split_block_late",
        "split_block_late", "decode"]
    # hidden 7168: 7 blocks per token, already 3584 threads at 16 tokens, 65536 at 73
    assert [chosen(2, 7168, t) for t in (15, 16, 64, 73, 74, 128)] == [
        "split", "split_block_late", "split_block_late", "split_block_late", "split_block",
        "split_block"]
    # top-4 (2 vectors per thread in split_wide), hidden 2048: 4 blocks per token
    assert [chosen(4, 2048, t) for t in (15, 16, 17, 128)] == [
        "split", "split_wide", "split_block_late", "split_block_late"]
    # top-4 beyond 65536 threads too (tuning.py: SPLIT_BLOCK_LATE_BEYOND_TOP_K)
    assert [chosen(4, 7168, t) for t in (1, 15, 16, 64, 131, 132)] == [
        "split", "split", "split_block_late", "split_block_late", "split_block_late", "decode"]
    # below 16 tokens: split unless its grid passes the block limit (hidden 16384 bf16: 64 blocks
    # per token; 78 SMs, an H20, allow 624: 9 tokens), then split_wide
    assert [chosen(4, 16384, t, 78) for t in (9, 10, 15)] == ["split", "split_wide", "split_wide"]
    # top-8: split while its grid is within the limit (hidden 7168: 28 blocks per token, 1056
    # blocks: 37 tokens), split_block beyond, decode from one token per SM
    assert [chosen(8, 7168, t) for t in (16, 37, 38, 64, 131, 132)] == [
        "split", "split", "split_block_late", "split_block_late", "split_block", "decode"]
    assert [chosen(8, 2048, t) for t in (128, 131)] == ["split", "split"]  # 8 blocks per token
    wide = _variants(COMBINE, COMBINE.make_config(top_k=2, hidden=7168), a)["split_wide"]
    assert wide.constants["chunks"] == 7  # 896 vectors, 128 per one-warp block


@pytest.mark.parametrize("top_k", [2, 8])
def test_combine_records_without_split_block_late_plan_split_block_as_built(top_k):
    """A bundle built before split_block_late (its records hold split_block, with the trigger
    at the top) launches split_block wherever the plan takes that shape, forced
    split_block_late included, never a variant it lacks."""
    c = COMBINE.make_config(top_k=top_k, hidden=7168)
    a = ARCHS["sm_90a"]
    built_before = {n: v for n, v in _variants(COMBINE, c, a).items() if n != "split_block_late"}
    for tokens in (38, 64, 73, 74, 131):
        (launch,) = COMBINE.plan(c, built_before, {"tokens": tokens}, a.sm_count)
        assert (launch.variant, launch.grid) == ("split_block", (tokens * 7, 1, 1)), tokens
        (launch,) = COMBINE.plan(c, built_before, {"tokens": tokens}, a.sm_count,
                                 "split_block_late")
        assert launch.variant == "split_block"


@pytest.mark.parametrize("hidden", [1024, 7168])
@pytest.mark.parametrize("force", COMBINE.plan_choices)
def test_combine_every_variant_can_be_forced_at_any_size(force, hidden):
    """Forced, each variant launches itself; split_block where the point has none (hidden
    1024: its split launches never pass split_block_late's PDL limit) launches
    split_block_late, the variant that takes its launches there."""
    c = COMBINE.make_config(top_k=2, hidden=hidden)
    a = ARCHS["sm_90a"]
    variants = _variants(COMBINE, c, a)
    assert ("split_block" in variants) == (hidden == 7168)
    for tokens in (1, 3, 1000, 20011):
        (launch,) = _plan(COMBINE, c, a, {"tokens": tokens}, force)
        assert launch.variant == (force if force in variants else "split_block_late")
        v = variants[launch.variant].constants
        blocks_per_token = v["chunks"]
        tokens_per_block = v["rows_per_block"]
        assert launch.grid == (-(-tokens // tokens_per_block) * blocks_per_token, 1, 1)
    assert {"split", "split_wide", "split_block", "split_block_late"} <= set(COMBINE.plan_choices)
    with pytest.raises(ConfigError, match="unknown variant 'fast'"):
        _plan(COMBINE, c, a, {"tokens": 1}, "fast")


@pytest.fixture(scope="module")
def combine_ptx():
    point = compile_point("moe_combine", COMBINE.make_config(top_k=8, hidden=7168), "sm_90a")
    return {name: ptx for name, (ptx, _cubin) in point.artifacts.items()}


@pytest.mark.parametrize("variant", ["decode", "prefill", "split", "split_wide", "split_block",
                                     "split_block_late"])
def test_combine_reads_every_position_and_weight_before_any_row(combine_ptx, variant):
    """Positions and weights are straight-line scalar loads issued together; every row load
    comes after them, so no row load waits behind a branch on a later position. In
    split_block_late the weights are read after the row loads are issued (device.py: else
    ptxas placed their select, which waits for them, ahead of the row loads)."""
    ptx = combine_ptx[variant]
    body = ptx[ptx.index("griddepcontrol.wait") if variant != "prefill" else 0:]
    scalar = [m.start() for m in re.finditer(r"ld\.global\.b32", body)]
    rows = [m.start() for m in re.finditer(r"ld\.global\.v4\.b32", body)]
    assert len(scalar) == 2 * 8 and rows
    if variant == "split_block_late":  # the positions, the rows, then the weights
        assert max(scalar[:8]) < min(rows) and max(rows) < min(scalar[8:])
        return
    assert max(scalar) < min(rows)
    assert not re.search(r"\bbra\b", body[min(scalar):max(scalar)]), "a branch between the reads"


def test_combine_variants_do_the_same_arithmetic_per_element(combine_ptx):
    """Bitwise-equal results across variants: each output element is one fp32 multiply then
    top_k - 1 fused multiply-adds in the order k = 0..7, in every variant (the same body)."""
    for name, ptx in combine_ptx.items():
        muls = len(re.findall(r"\bmul(\.rn)?\.f32", ptx))
        fmas = len(re.findall(r"\bfma\.rn\.f32", ptx))
        adds = len(re.findall(r"\badd(\.rn)?\.f32", ptx))
        assert muls > 0 and fmas == 7 * muls and adds == 0, (name, muls, fmas, adds)
