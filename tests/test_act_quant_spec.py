"""CPU tests of the activation and FP8 quantization families (issue 11): configs, arguments,
variants and plans per arch, float64 references against independent computations (exact
rational arithmetic for the quantization), and real compiles for sm_90a and sm_100a whose PTX
is checked for the instructions the design promises."""

from __future__ import annotations

import dataclasses
import math
import re
from fractions import Fraction

import pytest

from rose_aot.archs import get_arch
from rose_aot.errors import ConfigError
from rose_aot.kernels import get_family
from rose_aot.kernels.chunked_rows import MAX_GRID_Y, chunk_grid, chunk_split
from rose_aot.kernels.spec import Dim

torch = pytest.importorskip("torch")

SEED = 20261130
ARCHS = ("sm_90a", "sm_100a")
QUANT = ("fp8_group_quant", "act_and_mul_fp8_quant")


# ----------------------------------------------------------------------------- configs
def test_act_and_mul_config_defaults_and_validation():
    fam = get_family("act_and_mul")
    c = fam.make_config(d=4096, dtype="float16")
    assert (c.activation, c.out_dtype) == ("silu", "float16")  # out_dtype follows dtype
    for bad in (dict(d=4100), dict(d=0), dict(d=65536), dict(d=4096, activation="relu"),
                dict(d=4096, dtype="float32")):
        with pytest.raises(ConfigError):
            fam.make_config(**bad)


@pytest.mark.parametrize("family", QUANT)
def test_quant_config_validation(family):
    fam = get_family(family)
    width = "hidden" if family == "fp8_group_quant" else "d"
    c = fam.make_config(**{width: 7168})
    assert (c.group, c.scale_layout, c.ue8m0, c.eps) == (128, "row_major", False, 1e-10)
    fam.make_config(**{width: 2880, "group": 64})  # 2880 = 45 * 64, not a multiple of 128
    for bad in ({width: 2880}, {width: 7168, "group": 32}, {width: 7168, "eps": 0.0},
                {width: 7168, "eps": 1e-30}, {width: 7168, "scale_layout": "swizzled_128x4"}):
        with pytest.raises(ConfigError):
            fam.make_config(**bad)


# ----------------------------------------------------------------------------- work split
@pytest.mark.parametrize("vectors", [8, 40, 64, 128, 180, 256, 360, 448, 896, 1792, 3584])
@pytest.mark.parametrize("threads,vecs", [(128, 1), (256, 4)])
def test_chunk_split_covers_the_row_once(vectors, threads, vecs):
    s = chunk_split(vectors, threads, vecs)
    assert s.row_threads % 32 == 0 and s.threads <= threads and s.vecs_per_thread <= vecs
    covered = sorted(
        cb * s.chunk_vectors + t + i * s.row_threads
        for cb in range(s.col_blocks)
        for t in range(s.row_threads)
        for i in range(s.vecs_per_thread)
    )
    inside = [v for v in covered if v < vectors]
    assert inside == list(range(vectors))  # every vector exactly once
    assert s.exact == (len(covered) == vectors)
    assert s.rows_per_block == 1 or s.col_blocks == 1


def _coords_of(grid, col_blocks, chunks_in_x):
    """Every (row block, chunk) of a launch of `grid`, in the order the blocks start (x
    fastest), decoded as device_utils.chunk_coords decodes a block index."""
    gx, gy, gz = grid
    blocks = [(x, y, z) for z in range(gz) for y in range(gy) for x in range(gx)]
    if not chunks_in_x or col_blocks == 1:
        return [(x, y) for x, y, z in blocks]
    return [(z * MAX_GRID_Y + y, x) for x, y, z in blocks]


@pytest.mark.parametrize("row_blocks", [1, 2, 7, 4096, MAX_GRID_Y - 1, MAX_GRID_Y, MAX_GRID_Y + 1,
                                        3 * MAX_GRID_Y + 5])
@pytest.mark.parametrize("col_blocks", [1, 2, 7, 14])
def test_chunk_grid_in_address_order_covers_each_chunk_once(row_blocks, col_blocks):
    """With chunks_in_x, the chunks of one row start one after another and the rows follow
    in order (grid y, then z past CUDA's 65535 limit on y and z); the last z slab may run past
    the rows (the kernels skip rows >= tokens), but each chunk below `row_blocks` appears
    once. Without it, the rows are in x and the chunks in y, as before."""
    want = [(r, x) for r in range(row_blocks) for x in range(col_blocks)]
    grid = chunk_grid(row_blocks, col_blocks, chunks_in_x=True)
    assert grid[0] <= 2**31 - 1 and grid[1] <= MAX_GRID_Y and grid[2] <= MAX_GRID_Y
    covered = _coords_of(grid, col_blocks, True)
    assert [c for c in covered if c[0] < row_blocks] == want
    assert len(covered) - len(want) < MAX_GRID_Y * col_blocks  # one partial z slab at most
    if col_blocks > 1:
        assert grid[0] == col_blocks
    rows_in_x = chunk_grid(row_blocks, col_blocks, chunks_in_x=False)
    assert rows_in_x == (row_blocks, col_blocks, 1)
    assert sorted(_coords_of(rows_in_x, col_blocks, False)) == want


def test_chunk_split_prefers_exact_splits():
    # 448 vectors (7168 bf16 at 32-byte accesses): 224 threads x 2, not 128 x 4 with a tail
    assert chunk_split(448, 256, 4) == chunk_split(448, 256, 4).__class__(224, 2, 1, 1, True)


# ----------------------------------------------------------------------------- args, variants, plan
def _point(family, **values):
    fam = get_family(family)
    return fam, fam.make_config(**values)


@pytest.mark.parametrize("arch", ARCHS)
def test_act_and_mul_args_and_variants(arch):
    fam, c = _point("act_and_mul", d=7168)
    a = get_arch(arch)
    x, out = fam.args(c, a)
    vec = 8 if arch == "sm_90a" else 16  # 128-bit accesses on Hopper, 256-bit on Blackwell
    assert x.shape == (Dim("tokens"), 14336) and out.shape == (Dim("tokens"), 7168)
    assert x.stride[0].divisibility == vec and x.stride[1] == 1 and x.align == 2 * vec
    assert (x.role, out.role) == ("input", "output")
    # one shape, its three PDL forms; no prefill shape (its plan would never pick it)
    decode, mid, bulk = fam.variants(c, a)
    assert bulk == dataclasses.replace(decode, name="bulk", pdl=0) and decode.pdl > 0
    late = {**decode.constants, "pdl_late": 1}
    assert mid == dataclasses.replace(decode, name="mid", pdl=mid.pdl, constants=late)
    assert mid.pdl > decode.pdl
    k = decode.constants
    assert k["vec"] == vec and decode.block == (k["row_threads"] * k["rows_per_block"], 1, 1)
    assert decode.params == ("x", "out")
    assert decode.constants["vecs_per_thread"] == 1
    assert decode.constants["col_blocks"] > 1  # one token spread over several SMs


def test_fp8_group_quant_prefills_narrow_rows_in_one_row_blocks_of_two_vectors_per_thread():
    """Rows of at most 256 vectors (hidden 2048 in bf16 on Hopper) take the measured narrow
    prefill shape (act_and_mul/tuning.py): 128 threads, 2 vectors each, one row per block;
    wider rows keep 4 vectors per thread in blocks of up to 256; the fused family, which plans
    the decode shape at every size, has no prefill shape."""
    a = get_arch("sm_90a")
    shapes = {}
    for family, field in (("fp8_group_quant", "hidden"), ("act_and_mul_fp8_quant", "d")):
        for width in (1024, 2048, 2112, 4096, 7168):
            fam, c = _point(family, **{field: width, "group": 64 if width == 2112 else 128})
            prefill = {v.name: v for v in fam.variants(c, a)}.get("prefill")
            if prefill is not None:
                k = prefill.constants
                shapes[family, width] = (prefill.block[0], k["vecs_per_thread"],
                                         k["rows_per_block"])
    assert shapes["fp8_group_quant", 2048] == (128, 2, 1)
    assert shapes["fp8_group_quant", 1024] == (128, 2, 2)  # 64-thread rows, two per block
    wide = chunk_split(264, 256, 4)  # 264 vectors: not narrow, the usual prefill split
    assert shapes["fp8_group_quant", 2112] == (wide.threads, wide.vecs_per_thread,
                                               wide.rows_per_block) != (128, 2, 1)
    assert shapes["fp8_group_quant", 4096] == (256, 4, 2)
    assert shapes["fp8_group_quant", 7168] == (224, 4, 1)
    assert not any(family == "act_and_mul_fp8_quant" for family, _ in shapes)


def test_act_and_mul_narrows_the_access_when_the_row_does_not_allow_256_bits():
    fam, c = _point("act_and_mul", d=2056)  # 2056 * 2 bytes is a multiple of 16, not of 32
    assert fam.variants(c, get_arch("sm_100a"))[0].constants["vec"] == 8


@pytest.mark.parametrize("layout", ["row_major", "col_major_tma"])
def test_quant_scale_arguments(layout):
    fam, c = _point("fp8_group_quant", hidden=4096, group=128, scale_layout=layout)
    x, q, s = fam.args(c, get_arch("sm_90a"))
    assert q.dtype == "float8_e4m3fn" and q.shape == (Dim("tokens"), 4096)
    assert s.dtype == "float32" and s.shape == (Dim("tokens"), 32) and s.layout == layout
    if layout == "row_major":
        assert s.stride == (32, 1)
    else:  # [groups, tokens padded to 4] seen transposed: stride of a group = padded tokens
        assert s.stride[0] == 1 and isinstance(s.stride[1], Dim)
        assert s.stride[1].divisibility == 4


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("group", [64, 128])
def test_quant_group_lanes(arch, group):
    fam, c = _point("fp8_group_quant", hidden=7168, group=group)
    for v in fam.variants(c, get_arch(arch)):
        k = v.constants
        assert k["group_lanes"] * k["vec"] == group
        assert k["row_threads"] % k["group_lanes"] == 0  # a group never straddles threads rows


@pytest.mark.parametrize("family,width", [("act_and_mul", "d"), ("fp8_group_quant", "hidden"),
                                          ("act_and_mul_fp8_quant", "d")])
@pytest.mark.parametrize("arch", ARCHS)
def test_plan_grids_cover_every_token(family, width, arch):
    fam, c = _point(family, **{width: 7168})
    a = get_arch(arch)
    variants = {v.name: v for v in fam.variants(c, a)}
    assert fam.plan(c, variants, {"tokens": 0}, a.sm_count) == ()
    chosen = []
    for tokens in (1, 7, 16, 128, 1024, 4096, 20011, 32768):
        for force in (None, *fam.plan_choices):
            (launch,) = fam.plan(c, variants, {"tokens": tokens}, a.sm_count, force)
            v = variants[launch.variant]
            assert force is None or launch.variant == force
            k = v.constants
            assert launch.grid == chunk_grid(-(-tokens // k["rows_per_block"]), k["col_blocks"],
                                             k["chunks_in_x"])
            # act_and_mul streams in address order (measured faster); the quantizers keep the
            # rows in x, where their column-major scales were measured faster (chunk_grid)
            assert k["chunks_in_x"] == (family == "act_and_mul")
            if k["col_blocks"] > 1 and family == "act_and_mul":
                assert launch.grid[:2] == (k["col_blocks"], tokens)
            else:
                assert launch.grid == (-(-tokens // k["rows_per_block"]), k["col_blocks"], 1)
            if force is None:
                chosen.append(launch.variant)
    if family in ("act_and_mul", "act_and_mul_fp8_quant"):
        # the decode shape, measured faster at every width and token count on the H200
        # (act_and_mul/tuning.py): with early PDL, then late PDL (mid), then without (bulk)
        order = ["decode", "mid", "bulk"]
        assert chosen == sorted(chosen, key=order.index) and set(chosen) == set(order)
    else:
        assert chosen[0] == "decode" and "mid" in chosen and chosen[-1] == "prefill"
        # the switch to prefill happens once and moves with the SM count of the device
        n = chosen.index("prefill")
        assert set(chosen[:n]) <= {"decode", "mid"} and set(chosen[n:]) == {"prefill"}
    with pytest.raises(ConfigError):
        fam.plan(c, variants, {"tokens": 5}, a.sm_count, "bogus")


# (family, config, tokens, the planned variant): the decode-shaped launches of the chunked-row
# families keep programmatic dependent launch, triggered at the top of the kernel to 8192
# threads (`decode`) and after its stores to 65536 (`mid`; measured: act_and_mul/tuning.py), one
# vector of 8 elements per thread on sm_90a; beyond, act_and_mul and the fused family take
# `bulk`, the quantizers `decode` without the attribute until their prefill switch.
DECODE_PDL_CASES = [
    ("act_and_mul", {"d": 2048}, 32, "decode"),  # 8192 threads
    ("act_and_mul", {"d": 2048}, 33, "mid"),  # 8448
    ("act_and_mul", {"d": 7168}, 16, "mid"),  # 14336: was bulk, 1.37 -> 1.10 µs
    ("act_and_mul", {"d": 2048}, 256, "mid"),  # 65536
    ("act_and_mul", {"d": 2048}, 257, "bulk"),  # 65792
    ("act_and_mul", {"d": 7168}, 128, "bulk"),  # 114688: level with the late trigger
    ("act_and_mul_fp8_quant", {"d": 2048}, 16, "decode"),  # 4096
    ("act_and_mul_fp8_quant", {"d": 7168}, 64, "mid"),  # 57344
    ("act_and_mul_fp8_quant", {"d": 7168}, 256, "bulk"),  # 229376
    ("fp8_group_quant", {"hidden": 4096}, 16, "decode"),  # 8192
    ("fp8_group_quant", {"hidden": 4096}, 128, "mid"),  # 65536
    ("fp8_group_quant", {"hidden": 4096}, 129, "decode"),  # 66048: no attribute
    ("block_scaled_quant", {"hidden": 2048, "format": "mxfp8"}, 256, "mid"),  # 65536
    ("nvfp4_quant", {"hidden": 7168}, 16, "mid"),  # 14336
    ("nvfp4_quant", {"hidden": 2048}, 1024, "decode"),  # 262144: no attribute
    ("fp8_token_quant", {"hidden": 7168}, 64, "mid"),  # 57344
    ("fp8_token_quant", {"hidden": 2048}, 16, "decode"),  # 4096
]


@pytest.mark.parametrize("family,values,tokens,variant", DECODE_PDL_CASES)
def test_decode_shaped_launches_keep_pdl_in_two_stages(family, values, tokens, variant):
    """`decode` launches with programmatic dependent launch to 8192 threads, `mid` to 65536
    (the loader sets the attribute on a launch of at most the variant's `pdl` threads); the
    larger decode-shaped launches go without it."""
    a = get_arch("sm_90a")
    fam, c = _point(family, **values)
    variants = {v.name: v for v in fam.variants(c, a)}
    assert (variants["decode"].pdl, variants["mid"].pdl) == (8192, 65536)
    assert variants["mid"].constants["pdl_late"] == 1
    assert "pdl_late" not in variants["decode"].constants
    assert all(v.pdl == 0 for v in variants.values() if v.name not in ("decode", "mid"))
    assert "mid" in fam.plan_choices
    (launch,) = fam.plan(c, variants, {"tokens": tokens}, a.sm_count)
    threads = launch.grid[0] * launch.grid[1] * launch.grid[2] * variants[launch.variant].threads
    assert launch.variant == variant
    with_pdl = 0 < threads <= variants[launch.variant].pdl  # runtime._resolve
    assert with_pdl == (threads <= 65536)
    assert fam.plan(c, variants, {"tokens": tokens}, a.sm_count, "mid")[0].variant == "mid"


@pytest.mark.parametrize("family,width", [("act_and_mul", "d"), ("act_and_mul_fp8_quant", "d")])
def test_decode_shape_launches_beyond_the_pdl_limit_are_bulk(family, width):
    """The decode shape without its PDL instructions once the launch has more threads than the
    decode variant's PDL limit (the loader would launch it without PDL anyway); measured 1-26%
    faster at 1024 tokens (act_and_mul/tuning.py). fp8_group_quant has no bulk variant."""
    fam, c = _point(family, **{width: 2048})
    a = get_arch("sm_90a")
    variants = {v.name: v for v in fam.variants(c, a)}
    decode = variants["decode"]
    mid = variants["mid"]
    for tokens in range(1, 300):
        (launch,) = fam.plan(c, variants, {"tokens": tokens}, a.sm_count)
        threads = launch.grid[0] * launch.grid[1] * decode.threads
        want = "decode" if threads <= decode.pdl else "mid" if threads <= mid.pdl else "bulk"
        assert launch.variant == want, tokens
    assert fam.plan(c, variants, {"tokens": 1}, a.sm_count, "bulk")[0].variant == "bulk"
    assert fam.plan(c, variants, {"tokens": 4096}, a.sm_count, "decode")[0].variant == "decode"
    fp8, cq = _point("fp8_group_quant", hidden=2048)
    assert "bulk" not in {v.name for v in fp8.variants(cq, a)} and "bulk" not in fp8.plan_choices


def test_plan_switch_point_grows_with_sm_count():
    # fp8_group_quant keeps the decode/prefill switch (act_and_mul plans decode at every size)
    fam, c = _point("fp8_group_quant", hidden=4096)
    variants = {v.name: v for v in fam.variants(c, get_arch("sm_90a"))}

    def switch(sm):
        t = 1
        while fam.plan(c, variants, {"tokens": t}, sm)[0].variant != "prefill":
            t += 1
            assert t < 1 << 20, "no switch to prefill"
        return t

    assert switch(78) < switch(132) < switch(160)


# The H200 sweep of both shapes forced (act_and_mul/tuning.py,
# benchmarks/results/act_quant-*-switch-sweep-h200.md): (family, config, tokens, the faster shape).
MEASURED_SWITCH = [
    ("fp8_group_quant", {"hidden": 2048}, 512, "decode"),  # 1.92 vs 2.48 µs
    ("fp8_group_quant", {"hidden": 2048}, 1024, "prefill"),  # 2.93 vs 3.16
    ("fp8_group_quant", {"hidden": 4096}, 256, "decode"),  # 1.92 vs 2.47
    ("fp8_group_quant", {"hidden": 4096}, 512, "prefill"),  # 2.91 vs 3.15
    ("fp8_group_quant", {"hidden": 7168}, 128, "decode"),  # 1.83 vs 2.28
    ("fp8_group_quant", {"hidden": 7168}, 512, "prefill"),  # 3.57 vs 4.99
    ("block_scaled_quant", {"hidden": 7168, "format": "mxfp8"}, 128, "decode"),  # 2.00 vs 2.26
    ("block_scaled_quant", {"hidden": 2048, "format": "mxfp8"}, 1024, "prefill"),  # 3.00 vs 3.13
    # MXFP4 and NVFP4 re-swept after the FP4 change (act_quant-block_scaled_quant-switch-sweep-fp4)
    ("block_scaled_quant", {"hidden": 2048, "format": "mxfp4"}, 512, "decode"),  # 2.14 vs 2.38
    ("block_scaled_quant", {"hidden": 2048, "format": "mxfp4"}, 1024, "prefill"),  # 2.86 vs 3.15
    ("block_scaled_quant", {"hidden": 4096, "format": "mxfp4"}, 256, "decode"),  # 2.16 vs 2.49
    ("block_scaled_quant", {"hidden": 4096, "format": "mxfp4"}, 512, "prefill"),  # 2.94 vs 3.14
    ("block_scaled_quant", {"hidden": 7168, "format": "mxfp4"}, 256, "decode"),  # 2.82 vs 2.88
    ("block_scaled_quant", {"hidden": 7168, "format": "mxfp4"}, 512, "prefill"),  # 3.73 vs 4.97
    ("nvfp4_quant", {"hidden": 4096}, 512, "decode"),  # 3.39 vs 3.47
    ("nvfp4_quant", {"hidden": 7168}, 256, "decode"),  # 3.22 vs 3.45
    ("nvfp4_quant", {"hidden": 7168}, 512, "prefill"),  # 4.68 vs 5.00
    ("nvfp4_quant", {"hidden": 2048}, 2048, "prefill"),  # 5.01 vs 5.62
    ("fp8_token_quant", {"hidden": 2048}, 256, "decode"),  # 1.75 vs 1.87
    ("fp8_token_quant", {"hidden": 7168}, 128, "prefill"),  # 2.00 vs 2.25
]


@pytest.mark.parametrize("family, values, tokens, faster", MEASURED_SWITCH)
def test_plan_takes_the_shape_measured_faster_on_the_h200(family, values, tokens, faster):
    fam, c = _point(family, **values)
    a = get_arch("sm_90a")
    variants = {v.name: v for v in fam.variants(c, a)}
    (launch,) = fam.plan(c, variants, {"tokens": tokens}, a.sm_count)
    # the decode shape: `mid` is its form with late-triggered PDL (chunked_rows.decode_variants)
    assert {"mid": "decode"}.get(launch.variant, launch.variant) == faster


# ----------------------------------------------------------------------------- references: activations
def _sigmoid(k: float) -> float:
    if k >= 0:
        return 1.0 / (1.0 + math.exp(-k))
    e = math.exp(k)
    return e / (1.0 + e)


def _act_math(a: float, activation: str) -> float:
    """The activations with Python's math module, in cancellation-free forms."""
    if activation == "silu":
        return a * _sigmoid(a)
    if activation == "gelu":
        return 0.5 * a * math.erfc(-a / math.sqrt(2.0))
    u = math.sqrt(2.0 / math.pi) * (a + 0.044715 * a**3)
    return a * _sigmoid(2.0 * u)


@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_act_and_mul_reference(activation, dtype):
    fam, c = _point("act_and_mul", d=64, activation=activation, dtype=dtype)
    gen = torch.Generator().manual_seed(SEED)
    tdt = getattr(torch, dtype)
    x = (3 * torch.randn(5, 128, generator=gen)).to(tdt)
    out = torch.full((5, 64), float("nan"), dtype=tdt)
    fam.reference(c, x, out)
    for t in range(5):
        for j in range(64):
            want = _act_math(float(x[t, j]), activation) * float(x[t, 64 + j])
            assert float(out[t, j]) == float(torch.tensor(want, dtype=torch.float64).to(tdt))
    # torch's own float64 definitions agree where they do not cancel (|a| <= 5)
    x64 = x.double()
    a = x64[:, :64]
    ref = {"silu": torch.nn.functional.silu(a),
           "gelu": torch.nn.functional.gelu(a),
           "gelu_tanh": torch.nn.functional.gelu(a, approximate="tanh")}[activation]
    keep = a.abs() <= 5
    assert torch.equal(out[keep], (ref * x64[:, 64:]).to(tdt)[keep])


def test_activation_reference_has_no_cancellation_for_large_negative_inputs():
    from rose_aot.kernels.act_and_mul.reference import activation64

    a = torch.tensor([-9.0, -12.0, -15.0], dtype=torch.float64)
    for activation in ("gelu", "gelu_tanh", "silu"):
        got = activation64(a, activation)
        want = torch.tensor([_act_math(float(v), activation) for v in a], dtype=torch.float64)
        assert (got < 0).all() and torch.allclose(got, want, rtol=1e-12, atol=0)
    # the textbook gelu_tanh form rounds 1 + tanh(u) to 0 here
    assert torch.nn.functional.gelu(a, approximate="tanh")[0] == 0


# ----------------------------------------------------------------------------- references: FP8
E4M3_MAX = 448.0


def _e4m3_values() -> list[Fraction]:
    """Every finite non-negative e4m3fn value, from the format definition (bias 7, no inf,
    0x7F is NaN), with its code."""
    out = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        v = Fraction(m, 8) * Fraction(2) ** -6 if e == 0 else (1 + Fraction(m, 8)) * Fraction(2) ** (e - 7)
        out.append((v, code))
    return out


E4M3 = _e4m3_values()


def _e4m3_code(q: Fraction) -> int:
    """Round to nearest, ties to the even code, saturating at 448; sign in bit 7."""
    sign = 0x80 if q < 0 else 0
    a = abs(q)
    best = min(E4M3, key=lambda vc: (abs(vc[0] - a), vc[1] & 1))
    return sign | best[1]


def _fp32(x: Fraction | float) -> Fraction:
    import numpy as np

    return Fraction(float(np.float32(float(x))))  # float(Fraction) is correctly rounded


def _expected_group(values: list[float], eps: float, ue8m0: bool):
    """(codes, scale) of one group by exact rational arithmetic, per fp8_group_quant's doc."""
    m = max([Fraction(abs(v)) for v in values] + [_fp32(eps)])
    if ue8m0:
        p = 0
        while Fraction(2) ** p < m / 448:
            p += 1
        while Fraction(2) ** (p - 1) >= m / 448:
            p -= 1
        scale = Fraction(2) ** p
    else:
        scale = _fp32(m / 448)
    codes = [_e4m3_code(_fp32(Fraction(v) / scale)) if v != 0 else (0x80 if math.copysign(1, v) < 0 else 0)
             for v in values]
    return codes, scale


def _quant(family_name, rows, group=64, ue8m0=False, eps=1e-10, layout="row_major", dtype="bfloat16"):
    tdt = getattr(torch, dtype)
    x = torch.tensor(rows, dtype=torch.float64).to(tdt)
    tokens, hidden = x.shape
    fam, c = _point(family_name, hidden=hidden, group=group, ue8m0=ue8m0, eps=eps,
                    scale_layout=layout, dtype=dtype)
    q = torch.empty(tokens, hidden, dtype=torch.float8_e4m3fn)
    padded = -(-tokens // 4) * 4
    if layout == "row_major":
        s = torch.full((tokens, hidden // group), float("nan"))
    else:
        buf = torch.full((hidden // group, padded), float("nan"))
        s = buf.t()[:tokens]
    fam.reference(c, x, q, s)
    return x, q.view(torch.uint8), s


def _check_exact(x, q, s, group, eps=1e-10, ue8m0=False):
    tokens, hidden = x.shape
    for t in range(tokens):
        for g in range(hidden // group):
            vals = [float(v) for v in x[t, g * group:(g + 1) * group]]
            codes, scale = _expected_group(vals, eps, ue8m0)
            assert Fraction(float(s[t, g])) == scale, (t, g)
            got = q[t, g * group:(g + 1) * group].tolist()
            bad = [i for i, (a, b) in enumerate(zip(got, codes)) if a != b]
            assert not bad, f"t={t} g={g} first bad {bad[0]}: {got[bad[0]]:#x} vs {codes[bad[0]]:#x} (x={vals[bad[0]]})"


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("tokens", [1, 3, 7])
def test_fp8_reference_random_rows_bit_exact(ue8m0, tokens):
    gen = torch.Generator().manual_seed(SEED + tokens)
    rows = (torch.randn(tokens, 192, generator=gen) * torch.logspace(-3, 3, 192)).tolist()
    x, q, s = _quant("fp8_group_quant", rows, group=64, ue8m0=ue8m0)
    _check_exact(x, q, s, 64, ue8m0=ue8m0)


def test_fp8_reference_edge_groups():
    g = 64
    row_ties = [448.0] + [17.0, 19.0, -17.0, 2.0**-10, 3 * 2.0**-10, -(2.0**-10), 0.0] * 10
    row_zero = [0.0] * g
    row_neg_zero = [-0.0] * g
    row_equal = [-3.25] * g
    row_denormal = [1e-39, -2e-39, 5e-40] + [0.0] * (g - 3)  # bf16 subnormals, absmax < eps
    row_small = [1e-12 * (i - 32) for i in range(g)]  # absmax < eps: scale = eps / 448
    rows = [row_ties[:g], row_zero, row_neg_zero, row_equal, row_denormal, row_small, row_ties[1:g + 1]]
    x, q, s = _quant("fp8_group_quant", [r + r for r in rows], group=g)
    _check_exact(x, q, s, g)
    # spelled out: scale 1, so ties round to even codes: 17 -> 16, 19 -> 20, 2^-10 -> 0
    assert float(s[0, 0]) == 1.0
    assert q[0, :9].tolist() == [0x7E, 0x58, 0x5A, 0xD8, 0x00, 0x02, 0x80, 0x00, 0x58]
    assert q[3].tolist() == [0xFE] * 2 * g  # all equal: every code is -448
    assert float(s[1, 0]) == float(torch.tensor(1e-10 / 448, dtype=torch.float32))
    assert q[1].tolist() == [0] * 2 * g and q[2].tolist() == [0x80] * 2 * g
    assert q[4].tolist() == [0x00, 0x80, 0x00] + [0] * (g - 3) + [0x00, 0x80, 0x00] + [0] * (g - 3)


def test_fp8_reference_rounds_the_fp32_quotient_like_torch():
    """absmax 3, x = 2.25: x * 448 / 3 = 336 is an e4m3 midpoint (320 | 352); the fp32 scale
    3/448 is inexact, so the exact quotient is just off 336, but it rounds to 336.0 in fp32 and
    then to the even code 320: the documented (torch-compatible) result."""
    x, q, s = _quant("fp8_group_quant", [[3.0, 2.25] + [0.0] * 62], group=64)
    exact = Fraction(2.25) / Fraction(float(s[0, 0]))
    assert exact != 336 and _fp32(exact) == 336
    assert q[0, 1].item() == 0x7A  # 320 = 1.25 * 2^8: exponent field 15, mantissa 2
    x64 = x.double()
    torch_codes = (x64 / s.double()[:, :1]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(q, torch_codes)


def test_fp8_reference_non_finite_policy():
    g = 64
    nan_row = [float("nan"), 2.0, -4.0] + [1.0] * (g - 3)
    inf_row = [float("inf"), 2.0, -4.0] + [1.0] * (g - 3)
    x, q, s = _quant("fp8_group_quant", [nan_row, inf_row], group=g)
    assert float(s[0, 0]) == float(torch.tensor(4.0 / 448, dtype=torch.float32))  # NaN ignored
    assert q[0, 0].item() & 0x7F == 0x7F and q[0, 2].item() == 0xFE
    assert math.isinf(float(s[1, 0]))
    assert q[1, 0].item() & 0x7F == 0x7F and q[1, 1].item() == 0x00 and q[1, 2].item() == 0x80
    for ue8m0 in (False, True):
        _, _, s2 = _quant("fp8_group_quant", [inf_row], group=g, ue8m0=ue8m0)
        assert math.isinf(float(s2[0, 0]))


def test_fp8_reference_col_major_tma_layout_and_padding():
    gen = torch.Generator().manual_seed(SEED)
    rows = torch.randn(5, 256, generator=gen).tolist()
    x, q_row, s_row = _quant("fp8_group_quant", rows, group=128)
    _, q_col, s_col = _quant("fp8_group_quant", rows, group=128, layout="col_major_tma")
    assert torch.equal(q_row, q_col) and torch.equal(s_row, s_col)
    assert s_col.stride() == (1, 8)  # tokens padded 5 -> 8
    buf = s_col.as_strided((2, 8), (8, 1))
    assert torch.isnan(buf[:, 5:]).all()  # padding is not written


@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
def test_fused_reference_is_quant_of_unrounded_activation(activation):
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(3, 256, generator=gen).bfloat16()
    fam, c = _point("act_and_mul_fp8_quant", d=128, activation=activation, group=64)
    q = torch.empty(3, 128, dtype=torch.float8_e4m3fn)
    s = torch.empty(3, 2)
    fam.reference(c, x, q, s)
    y = torch.tensor([[_act_math(float(x[t, j]), activation) * float(x[t, 128 + j])
                       for j in range(128)] for t in range(3)], dtype=torch.float64)
    for t in range(3):
        for gi in range(2):
            vals = y[t, gi * 64:(gi + 1) * 64]
            amax = _fp32(max(abs(float(v)) for v in vals))
            assert Fraction(float(s[t, gi])) == _fp32(max(amax, _fp32(1e-10)) / 448)
            deq = q[t, gi * 64:(gi + 1) * 64].float().double() * float(s[t, gi])
            # within half an e4m3 step (relative 2^-4) of the value, or of the smallest step
            err = (deq - vals).abs()
            assert (err <= vals.abs() * 2.0**-4 + float(s[t, gi]) * 2.0**-10).all()


# ----------------------------------------------------------------------------- compiles
COMPILE_CASES = [
    ("act_and_mul", dict(d=4096, activation="silu")),
    ("act_and_mul", dict(d=2880, activation="gelu", dtype="float16")),  # predicated tail
    ("act_and_mul", dict(d=7168, activation="gelu_tanh")),
    ("fp8_group_quant", dict(hidden=7168, group=128)),
    ("fp8_group_quant", dict(hidden=2880, group=64, scale_layout="col_major_tma", ue8m0=True)),
    ("act_and_mul_fp8_quant", dict(d=14336, activation="silu", scale_layout="col_major_tma")),
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("family,values", COMPILE_CASES, ids=[f"{f}-{i}" for i, (f, _) in enumerate(COMPILE_CASES)])
def test_compiles_with_expected_ptx(family, values, arch):
    pytest.importorskip("cutlass")
    from rose_aot.builder.compile import compile_point

    fam, c = _point(family, **values)
    a = get_arch(arch)
    point = compile_point(family, c, a)
    variants = {v.name: v for v in fam.variants(c, a)}
    assert set(point.artifacts) == set(variants) >= {"decode", "mid"}
    for name, (ptx, cubin) in point.artifacts.items():
        v = variants[name]
        assert cubin[:4] == b"\x7fELF"
        assert ".visible .entry" in ptx
        assert f".reqntid {v.block[0]}, 1, 1" in ptx
        # decode and mid launch with programmatic dependent launch (wait before any read)
        assert ("griddepcontrol.wait" in ptx) == (name in ("decode", "mid")) == (v.pdl > 0)
        wide = "ld.global.v8.b32" if v.constants["vec"] * 2 == 32 else "ld.global.v4.b32"
        assert wide in ptx, f"{name}: no {wide}"
        assert "ld.global.b16" not in ptx and "ld.global.u16" not in ptx  # no scalar loads
        if family == "act_and_mul":
            st = "st.global.v8.b32" if v.constants["vec"] * 2 == 32 else "st.global.v4.b32"
            assert st in ptx
            if values["activation"] == "gelu":
                assert "ex2.approx" in ptx  # libdevice erfc, not a constant-folded stub
        else:
            assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
            assert "div.approx" not in ptx and "div.full" not in ptx
            lanes = v.constants["group_lanes"]
            shuffles = ptx.count("shfl.sync.bfly.b32")
            assert shuffles == (lanes.bit_length() - 1) * v.constants["vecs_per_thread"]
            assert ("0x600000" in ptx) == c.ue8m0  # the exact power-of-two scale
            # device_utils.quotient: a correctly rounded reciprocal per group (and the scale's
            # own division), three fp32 operations per element, never a division per element
            divisions = ptx.count("div.rn.f32") + ptx.count("rcp.rn.f32")
            assert 0 < divisions <= 2 * v.constants["vecs_per_thread"]
            assert "fma.rn.f32" in ptx
            # no word packed from one 16-bit register twice (ptxas mis-packed such a word of e4m3
            # codes: tests/test_dispatch_fp8_spec.py)
            assert not re.search(r"\{%rs(\d+), %rs\1\}", ptx)


PDL_FAMILIES = [
    ("act_and_mul", dict(d=7168)),
    ("act_and_mul_fp8_quant", dict(d=2048, scale_layout="col_major_tma")),
    ("fp8_group_quant", dict(hidden=4096)),
    ("block_scaled_quant", dict(hidden=2048, format="mxfp4")),
    ("nvfp4_quant", dict(hidden=2048)),
    ("fp8_token_quant", dict(hidden=7168)),
]


@pytest.mark.parametrize("family,values", PDL_FAMILIES, ids=[f for f, _ in PDL_FAMILIES])
def test_decode_shapes_trigger_their_dependents_early_or_after_their_stores(family, values):
    """In the PTX: `decode` lets the next kernel launch, then waits, before its first global
    load; `mid` waits there and lets the next kernel launch after its last global store; the
    other variants (prefill, bulk) carry no griddepcontrol instruction."""
    pytest.importorskip("cutlass")
    from rose_aot.builder.compile import compile_point

    fam, c = _point(family, **values)
    a = get_arch("sm_90a")
    point = compile_point(family, c, a)
    assert {"decode", "mid"} <= set(point.artifacts)
    for name, (ptx, _) in point.artifacts.items():
        lines = ptx.splitlines()

        def at(text):
            return [i for i, line in enumerate(lines) if text in line]

        triggers = at("griddepcontrol.launch_dependents")
        (wait,) = at("griddepcontrol.wait") or [None]
        if name not in ("decode", "mid"):
            assert not triggers and wait is None, name
            continue
        (trigger,) = triggers
        first_load, last_store = min(at("ld.global")), max(at("st.global"))
        assert wait < first_load, name
        if name == "decode":
            assert trigger < wait
        else:
            assert last_store < trigger


# ----------------------------------------------------------------------------- the GPU suite's checks
def _gpu_cases():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent / "gpu" / "act_quant_cases.py"
    spec = importlib.util.spec_from_file_location("act_quant_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_stand_in(family_name, c, want, views):
    """What a correct kernel writes: the reference, in the poisoned views."""
    if family_name == "act_and_mul":
        views["out"].copy_(want["out"].to(views["out"].dtype))
    elif family_name in ("block_scaled_quant", "nvfp4_quant"):
        views["q"].view(torch.uint8).copy_(want["q"])
        views["scales"].view(torch.uint8).copy_(want["scales"])
    else:
        views["q"].copy_(want["q"])
        views["scales"].copy_(want["scales"])


@pytest.mark.parametrize("family,values", [
    ("act_and_mul", dict(d=256, activation="gelu")),
    ("act_and_mul", dict(d=256, activation="silu", dtype="float16")),
    ("fp8_group_quant", dict(hidden=256, group=64, scale_layout="col_major_tma")),
    ("fp8_group_quant", dict(hidden=256, group=128, ue8m0=True)),
    ("act_and_mul_fp8_quant", dict(d=256, activation="silu", group=128, scale_layout="col_major_tma")),
    ("act_and_mul_fp8_quant", dict(d=256, activation="gelu_tanh", group=64, ue8m0=True)),
    ("block_scaled_quant", dict(hidden=256, format="mxfp8")),
    ("block_scaled_quant", dict(hidden=256, format="mxfp4", scale_layout="row_major")),
    ("nvfp4_quant", dict(hidden=256)),
])
def test_gpu_suite_checks_pass_on_the_reference_and_catch_errors(family, values):
    cases = _gpu_cases()
    fam, c = _point(family, **values)
    tokens = 7
    args, want, views = cases.make_case(family, c, tokens, seed=3, device="cpu")
    # a kernel that writes nothing fails (outputs are poisoned)
    with pytest.raises(AssertionError):
        cases.compare(family, c, want, views, "unwritten")
    _run_stand_in(family, c, want, views)
    cases.compare(family, c, want, views, "reference")
    cases.poison(family, views)  # poisoning again makes the same outputs fail
    with pytest.raises(AssertionError):
        cases.compare(family, c, want, views, "re-poisoned")
    _run_stand_in(family, c, want, views)
    if family == "act_and_mul":
        out = views["out"]
        v = out[3, 5].item()
        out[3, 5] = v + 3 * abs(v) * 2.0**-7 + 1e-3  # well past one ulp
        with pytest.raises(AssertionError, match="1 ulp"):
            cases.compare(family, c, want, views, "perturbed")
        return
    if family in ("block_scaled_quant", "nvfp4_quant"):
        q = views["q"].view(torch.uint8)
        q[4, 9] ^= 0x11
        with pytest.raises(AssertionError, match="q bytes"):
            cases.compare(family, c, want, views, "perturbed data")
        q[4, 9] ^= 0x11
        s = views["scales"].view(torch.uint8)
        s[-1, -1] ^= 0x01  # a padding entry (swizzled) or the last scale (row-major)
        with pytest.raises(AssertionError, match="scales bytes"):
            cases.compare(family, c, want, views, "perturbed scales")
        return
    q = views["q"].view(torch.uint8)
    code = q[4, 9].item()
    q[4, 9] = code ^ 0x04  # four e4m3 steps away (or another binade)
    with pytest.raises(AssertionError):
        cases.compare(family, c, want, views, "perturbed code")
    q[4, 9] = code
    cases.compare(family, c, want, views, "restored")
    views["scales"][2, 1] *= 1.5
    with pytest.raises(AssertionError, match="scale"):
        cases.compare(family, c, want, views, "perturbed scale")
    if views["padding"] is not None:
        views["scales"][2, 1] = want["scales"][2, 1]
        views["padding"].zero_()
        with pytest.raises(AssertionError, match="padding"):
            cases.compare(family, c, want, views, "padding written")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_nvfp4_reference_multiplies_by_the_blocks_factor(dtype):
    """NVFP4's data are e2m1(fp32(x * fp32(g / scale))): on the GPU suite's rows that tell it
    from a quotient per element (fp32(fp32(x * g) / scale), the definition before), the
    reference gives the factor's codes, and they differ from the quotient's."""
    from rose_aot.kernels.block_scaled_quant.reference import e2m1_codes

    cases = _gpu_cases()
    fam, c = _point("nvfp4_quant", hidden=256, dtype=dtype, scale_layout="row_major")
    x = cases.nvfp4_factor_rows(c.hidden, dtype)
    t = x.shape[0]
    q = torch.zeros(t, c.hidden // 2, dtype=torch.uint8)
    s = torch.zeros(t, c.hidden // 16, dtype=torch.uint8)
    fam.reference(c, x, torch.tensor([1.0]), q.view(torch.float4_e2m1fn_x2),
                  s.view(torch.float8_e4m3fn))
    codes = torch.stack([q & 0xF, q >> 4], dim=-1).reshape(t, c.hidden)
    scale = s.view(torch.float8_e4m3fn).float().repeat_interleave(16, dim=1)
    factor = torch.where(scale == 0, torch.zeros_like(scale), 1.0 / scale)  # g = 1
    assert torch.equal(codes, e2m1_codes((x.float() * factor).double()))
    differ = codes != cases.nvfp4_quotient_codes(x)
    assert differ.sum() >= 40, int(differ.sum())  # one element per block built to differ
