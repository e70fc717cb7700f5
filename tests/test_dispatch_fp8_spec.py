"""moe_dispatch_fp8_quant on the CPU: configs, arguments and scale layouts, variants, the
reference (moe_dispatch's, then fp8_group_quant's), real compiles, and model derivation."""

from __future__ import annotations

import re

import pytest
import torch

from rose_aot.archs import ARCHS
from rose_aot.builder.compile import compile_point
from rose_aot.errors import ConfigError
from rose_aot.kernels import get_family
from rose_aot.kernels.fp8_group_quant.reference import quantize_groups
from rose_aot.kernels.moe_dispatch.tuning import (
    SMALL_MAX_PAIRS,
    SMALL_QUANT_VECS_PER_LANE,
    SMALL_WIDE_MAX_PAIRS,
)

FUSED = get_family("moe_dispatch_fp8_quant")
DISPATCH = get_family("moe_dispatch")


def fused(**overrides):
    return FUSED.make_config(**{"num_experts": 128, "top_k": 8, "hidden": 2048, **overrides})


# --- configs ------------------------------------------------------------------------------------
def test_defaults_and_one_key_for_the_implicit_expert_range():
    c = fused()
    assert (c.group, c.dtype, c.scale_layout, c.ue8m0, c.eps) == (128, "bfloat16", "row_major",
                                                                  False, 1e-10)
    assert c == fused(local_experts=128) and FUSED.key(c) == FUSED.key(fused(local_experts=128))
    assert FUSED.key(c).startswith("moe_dispatch_fp8_quant(")
    assert FUSED.key(c) != FUSED.key(fused(ue8m0=True)) != FUSED.key(fused(group=64))


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"group": 96}, "group"),
        ({"hidden": 2000}, "hidden"),  # not a multiple of the group
        ({"hidden": 32768}, "hidden"),  # above moe_dispatch's limit
        ({"dtype": "float8_e4m3fn"}, "dtype"),
        ({"dtype": "float32"}, "dtype"),
        ({"eps": 0.0}, "eps"),
        ({"eps": 2.0}, "eps"),
        ({"scale_layout": "swizzled_128x4"}, "scale_layout"),
        ({"expert_start": 120, "local_experts": 16}, "local_experts"),
        ({"top_k": 0}, "top_k"),
    ],
)
def test_bad_configs_name_the_field(overrides, field):
    with pytest.raises(ConfigError) as info:
        fused(**overrides)
    assert info.value.field == field


# --- arguments, variants, plan --------------------------------------------------------------
@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("layout", ["row_major", "col_major_tma"])
def test_arguments_are_e4m3_rows_and_fp32_scales_in_the_layout(arch, layout):
    c = fused(scale_layout=layout)
    a = ARCHS[arch]
    args = FUSED.args(c, a)
    assert [x.name for x in args] == [
        "x", "topk_ids", "out", "out_scales", "expert_offsets", "positions"
    ]
    by = {x.name: x for x in args}
    assert by["out"].dtype == "float8_e4m3fn" and by["out"].shape[1] == 2048
    s = by["out_scales"]
    assert s.dtype == "float32" and s.layout == layout and s.shape[1] == 2048 // 128
    assert s.shape[0].name == by["out"].shape[0].name == "rows"
    if layout == "row_major":
        assert s.stride == (16, 1)
    else:  # buf [groups, rows padded to 4] passed as buf.t()[:rows]
        assert s.stride[0] == 1 and s.stride[1].divisibility == 4 and s.align == 16
    workspace = [w.name for w in FUSED.workspace(c, a)]
    for v in FUSED.variants(c, a):
        assert v.params == (*(x.name for x in args), *workspace)
        vec = v.constants["vec"]
        assert v.constants["group_lanes"] == 128 // vec
        assert by["out"].align == vec  # a vector of vec codes per store


def test_plans_are_moe_dispatchs_but_small_units_are_token_slices():
    c, d = fused(), DISPATCH.make_config(num_experts=128, top_k=8, hidden=2048)
    a = ARCHS["sm_90a"]
    fv = {v.name: v for v in FUSED.variants(c, a)}
    dv = {v.name: v for v in DISPATCH.variants(d, a)}
    # the plain dispatch's variants, and small_wide: small with room for more pairs
    assert list(dv) == ["small", "decode", "prefill_route", "prefill_copy"]
    assert list(fv) == ["small", "small_wide", "decode", "prefill_route", "prefill_copy"]
    assert "token_units" not in dv["small"].constants
    for name in ("small", "small_wide"):
        small = fv[name].constants
        assert small["token_units"] and small["vecs_per_lane"] == SMALL_QUANT_VECS_PER_LANE
    assert fv["small"].constants["max_pairs"] == dv["small"].constants["max_pairs"] == SMALL_MAX_PAIRS
    assert fv["small_wide"].constants["max_pairs"] == SMALL_WIDE_MAX_PAIRS > SMALL_MAX_PAIRS
    units_per_row = -(-2048 // small["vec"] // (32 * SMALL_QUANT_VECS_PER_LANE))
    for tokens in (1, 7, 32, 33, 64, 65, 100, 128, 129, 132, 1024, 65536):
        pairs = tokens * c.top_k
        sizes = {"tokens": tokens, "rows": FUSED.max_rows(c, tokens)}
        for force in (None, *FUSED.plan_choices):
            ours = FUSED.plan(c, fv, sizes, 132, force)
            if pairs <= SMALL_WIDE_MAX_PAIRS and (
                    force == "small_wide" or (pairs > SMALL_MAX_PAIRS and force in (None, "small"))):
                assert [x.variant for x in ours] == ["small_wide"], (tokens, force)
            else:  # moe_dispatch's plan (small_wide forced beyond its capacity: the plan's own)
                theirs = DISPATCH.plan(d, dv, sizes, 132, None if force == "small_wide" else force)
                assert [x.variant for x in ours] == [x.variant for x in theirs], (tokens, force)
                if ours[0].variant != "small":
                    assert ours == theirs
                    continue
            # a warp per slice of a token (not of each of its top_k copies), capped per SM
            warps = tokens * units_per_row
            assert ours[0].grid == (min(-(-warps // 4), 132 * small["blocks_per_sm"]), 1, 1)


def test_one_token_is_a_warp_per_slice_of_its_row_not_of_each_copy():
    """One token, hidden 7168 bf16 on sm_90a: 896 16-byte vectors; with one vector per lane 28
    slices, each quantized once and stored to the token's 8 rows: 7 blocks of 4 warps (the
    plain dispatch: 8 copies x 7 slices of 4 vectors per lane, 14 blocks)."""
    c = fused(hidden=7168)
    a = ARCHS["sm_90a"]
    fv = {v.name: v for v in FUSED.variants(c, a)}
    (launch,) = FUSED.plan(c, fv, {"tokens": 1, "rows": FUSED.max_rows(c, 1)}, 132)
    slices = -(-896 // (32 * SMALL_QUANT_VECS_PER_LANE))
    assert launch.variant == "small" and launch.grid == (-(-slices // 4), 1, 1)
    assert launch.grid[0] * fv["small"].threads <= fv["small"].pdl  # PDL stays on


# --- reference --------------------------------------------------------------------------------
def _run_reference(c, ids, x):
    tokens = ids.shape[0]
    rows = FUSED.max_rows(c, tokens)
    out = torch.full((rows, c.hidden), float("nan")).to(torch.float8_e4m3fn)
    groups = c.hidden // c.group
    if c.scale_layout == "row_major":
        scales = torch.full((rows, groups), float("nan"))
        buf = scales
    else:
        padded = -(-rows // 4) * 4
        buf = torch.full((groups, padded), float("nan"))
        scales = buf.t()[:rows]
    offsets = torch.empty(FUSED.local(c) + 1, dtype=torch.int32)
    positions = torch.empty(tokens, c.top_k, dtype=torch.int32)
    FUSED.reference(c, x, ids, out, scales, offsets, positions)
    return out, scales, buf, offsets, positions


@pytest.mark.parametrize("layout", ["row_major", "col_major_tma"])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_reference_is_dispatch_then_group_quant(layout, ue8m0):
    c = FUSED.make_config(num_experts=8, top_k=2, hidden=256, group=64, expert_start=4,
                          local_experts=4, expert_alignment=16, scale_layout=layout, ue8m0=ue8m0)
    ids = torch.tensor([[4, 5], [0, 7], [-1, 4], [9, 6]], dtype=torch.int32)
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 256, generator=gen) * torch.logspace(-3, 3, 256)).bfloat16()
    x[3, :64] = 0  # an all-zero group
    out, scales, buf, offsets, positions = _run_reference(c, ids, x)
    assert positions.tolist() == [[0, 16], [-1, 48], [-1, 1], [-1, 32]]
    assert offsets.tolist() == [0, 16, 32, 48, 64]
    q, s = quantize_groups(x.double(), 64, c.eps, ue8m0)
    for t, k in ((0, 0), (0, 1), (1, 1), (2, 1), (3, 1)):
        row = int(positions[t, k])
        assert torch.equal(out[row].view(torch.uint8), q[t].view(torch.uint8))
        assert torch.equal(scales[row], s[t])
    # padding rows: quantized zero rows (codes 0, the all-zero group's scale)
    zq, zs = quantize_groups(torch.zeros(1, 256, dtype=torch.float64), 64, c.eps, ue8m0)
    assert (zq.view(torch.uint8) == 0).all()
    for row in list(range(2, 16)) + list(range(17, 32)) + list(range(33, 48)) + list(range(49, 64)):
        assert (out[row].view(torch.uint8) == 0).all() and torch.equal(scales[row], zs[0])
    # rows past the used ones are never written
    assert out[64:].float().isnan().all() and scales[64:].isnan().all()
    if layout == "col_major_tma":
        assert buf[:, 64:].isnan().all()


def test_reference_quantizes_each_copy_like_fp8_group_quant_of_the_token():
    from rose_aot.kernels.fp8_group_quant.reference import reference as quant_reference

    quant = get_family("fp8_group_quant").make_config(hidden=512, group=128, ue8m0=True)
    c = FUSED.make_config(num_experts=16, top_k=4, hidden=512, group=128, ue8m0=True)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 512, generator=gen).bfloat16()
    ids = torch.argsort(torch.rand(5, 16, generator=gen), dim=1)[:, :4].int()
    out, scales, _, _, positions = _run_reference(c, ids, x)
    q = torch.empty(5, 512, dtype=torch.float8_e4m3fn)
    s = torch.empty(5, 4)
    quant_reference(quant, x, q, s)
    for t in range(5):
        for k in range(4):
            row = int(positions[t, k])
            assert torch.equal(out[row].view(torch.uint8), q[t].view(torch.uint8))
            assert torch.equal(scales[row], s[t])


# --- real compiles ----------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["sm_90a", "sm_100a"])
def fused_ptx(request):
    point = compile_point("moe_dispatch_fp8_quant", fused(), request.param)
    return {"arch": request.param, **{n: ptx for n, (ptx, _c) in point.artifacts.items()}}


@pytest.mark.parametrize("variant", ["small", "small_wide", "decode", "prefill_copy"])
def test_copies_quantize_with_fp8_group_quants_instructions(fused_ptx, variant):
    """fp8_group_quant's arithmetic (bit-exact results need the same instructions): the scale's
    IEEE division, the quotient (a reciprocal per group, fma per element) and the saturating
    e4m3 conversion; group maxima by butterfly shuffles; e4m3 stored a vector at a time; no
    local memory."""
    ptx = fused_ptx[variant]
    assert "div.rn.f32" in ptx and "div.approx" not in ptx and "div.full" not in ptx
    assert "rcp.rn.f32" in ptx and "fma.rn.f32" in ptx
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert "shfl.sync.bfly.b32" in ptx
    assert not re.search(r"\.local|ld\.local|st\.local", ptx)
    # bf16 rows are loaded at the arch's widest; the e4m3 codes of one vector stored at once
    width = "v8" if fused_ptx["arch"] == "sm_100a" else "v4"
    assert f"ld.global.{width}.b32" in ptx
    store = r"st\.global\.v4\.b32" if fused_ptx["arch"] == "sm_100a" else r"st\.global\.(v2\.b32|v4\.b16)"
    assert re.search(store, ptx)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_padding_rows_store_zero_bytes_and_no_word_packs_one_half_twice(arch):
    """With expert_alignment > 1 every variant writes padding rows: their codes are stored as
    literal zero words, never converted. A 32-bit word built from the same 16-bit register
    twice, {%rsN, %rsN}, after an e4m3x2 conversion of a compile-time zero, was packed by ptxas
    with a stale register's upper half (nonzero padding codes on the H200, 2026-11-30)."""
    point = compile_point("moe_dispatch_fp8_quant", fused(expert_alignment=64), arch)
    for name, (ptx, _) in point.artifacts.items():
        if name == "prefill_route":
            continue
        assert re.search(r"st\.global\.v\d\.b\d+\s+\[[^\]]+\], \{0(, 0)+\}", ptx), name
        twice = [m.group(0) for m in re.finditer(r"\{%rs(\d+), %rs\1\}", ptx)]
        assert not twice, (name, twice[:3])


@pytest.mark.parametrize("variant", ["small", "small_wide"])
def test_small_fused_kernels_have_no_atomics_or_barrier(fused_ptx, variant):
    ptx = fused_ptx[variant]
    assert not re.search(r"\b(atom|red)\.", ptx) and "ld.acquire" not in ptx
    assert "match.any.sync.b32" in ptx


def test_ue8m0_scales_and_col_major_layout_compile():
    point = compile_point(
        "moe_dispatch_fp8_quant",
        FUSED.make_config(num_experts=32, top_k=1, hidden=1024, group=64, dtype="float16",
                          scale_layout="col_major_tma", ue8m0=True, expert_alignment=64),
        "sm_90a",
    )
    assert [v.name for v in point.record.variants] == [
        "small", "small_wide", "decode", "prefill_route", "prefill_copy"
    ]
    for name, (ptx, _) in point.artifacts.items():
        if name != "prefill_route":  # fp8_group_quant's UE8M0 rounding, read off the bits
            assert "setp.gt.u32 p, f, 0x600000;" in ptx, name


# --- derivation from model configs --------------------------------------------------------------
def test_fp8_block_checkpoints_derive_the_fused_point():
    from fixtures_build import REPO

    from rose_aot.manifest.from_config import manifest_from_config

    derived = manifest_from_config(REPO / "tests/data/hf_configs/deepseek-v3",
                                   archs=("sm_90a", "sm_100a")).manifest()
    keys = sorted(p.key for p in derived.points if p.family == "moe_dispatch_fp8_quant")
    assert keys == [
        "moe_dispatch_fp8_quant(num_experts=256,top_k=8,hidden=7168,group=128,dtype=bfloat16,"
        f"scale_layout=col_major_tma,ue8m0={u},eps=1e-10,expert_alignment=1,expert_start=0,"
        "local_experts=256)"
        for u in ("false", "true")
    ]
    tp = manifest_from_config(REPO / "tests/data/hf_configs/deepseek-v3", tp=8,
                              archs=("sm_90a",)).manifest()
    ranks = [p.config for p in tp.points if p.family == "moe_dispatch_fp8_quant"]
    assert [(c.expert_start, c.local_experts, c.ue8m0) for c in ranks] == [
        (32 * r, 32, False) for r in range(8)
    ]
    # a bf16 MoE checkpoint gets none
    qwen = manifest_from_config(REPO / "tests/data/hf_configs/qwen3-30b-a3b").manifest()
    assert not [p for p in qwen.points if p.family == "moe_dispatch_fp8_quant"]
