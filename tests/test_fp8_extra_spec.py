"""Dynamic per-token (fp8_token_quant) and per-tensor (fp8_tensor_quant) FP8 quantization on
the CPU: config validation, arguments and workspace, launch plans per SM count (the cooperative
grid limit included), the float64 references on edge cases, the GPU suite's comparison, and
real compiles for sm_90a and sm_100a with PTX facts."""

from __future__ import annotations

import os
import re
import sys

import pytest

from rose_aot.archs import get_arch
from rose_aot.errors import ConfigError
from rose_aot.kernels import get_family
from rose_aot.kernels.fp8_token_quant.family import row_split

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(__file__))
from fp8_extra_cases import compare, make_case, poison  # noqa: E402

ARCHS = ("sm_90a", "sm_100a")
TOKEN, TENSOR = "fp8_token_quant", "fp8_tensor_quant"


def _point(family, **values):
    fam = get_family(family)
    return fam, fam.make_config(**values)


def _variants(fam, c, arch):
    return {v.name: v for v in fam.variants(c, arch)}


# ----------------------------------------------------------------------------- configs
@pytest.mark.parametrize("family", [TOKEN, TENSOR])
@pytest.mark.parametrize("values,field", [
    (dict(hidden=4100), "hidden"),  # not a multiple of the 16-byte vector
    (dict(hidden=0), "hidden"),
    (dict(hidden=131072), "hidden"),
    (dict(hidden=4096, eps=0.0), "eps"),
    (dict(hidden=4096, eps=2.0), "eps"),
    (dict(hidden=4096, dtype="float32"), "dtype"),
])
def test_invalid_configs_name_the_field(family, values, field):
    with pytest.raises(ConfigError) as info:
        get_family(family).make_config(**values)
    assert info.value.field == field


def test_token_quant_hidden_limit_is_where_a_row_still_fits_one_block():
    fam = get_family(TOKEN)
    fam.make_config(hidden=32768)
    with pytest.raises(ConfigError):
        fam.make_config(hidden=32768 + 8)


# ----------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("arch", ARCHS)
def test_arguments_and_workspace(arch):
    a = get_arch(arch)
    fam, c = _point(TOKEN, hidden=4096)
    x, q, s = fam.args(c, a)
    assert (x.name, q.name, s.name) == ("x", "q", "scales")
    assert q.dtype == "float8_e4m3fn" and s.dtype == "float32"
    assert s.shape[1:] == (1,) and s.stride == (1, 1)
    assert fam.workspace(c, a) == ()
    fam, c = _point(TENSOR, hidden=4096)
    x, q, s = fam.args(c, a)
    assert s.shape == (1,) and s.dtype == "float32" and s.role == "output"
    (w,) = fam.workspace(c, a)
    # 8 words, then one slot per block of the cooperative launch
    assert (w.dtype, w.shape, w.role) == ("int32", (8 + 1024,), "workspace")
    assert fam.variants(c, a)[2].constants["decode_max_blocks"] == 1024
    for v in fam.variants(c, a):
        assert v.params == ("x", "q", "scale", "words")
    vec = 16 if arch == "sm_100a" else 8
    assert x.stride[0].divisibility == vec


# ----------------------------------------------------------------------------- row split
@pytest.mark.parametrize("vectors", [4, 32, 96, 128, 360, 448, 512, 896, 1024, 2048, 4096])
def test_row_split_covers_the_row_in_one_block(vectors):
    for args in ((1024, 4, None, 0), (512, 8, 4, 256)):
        s = row_split(vectors, *args)
        assert s.col_blocks == 1 and s.row_threads % 32 == 0
        assert s.row_threads <= args[0] and s.threads <= 1024
        assert s.row_threads * s.vecs_per_thread >= vectors
        # no thread idles entirely: the last thread has a vector at i = 0
        assert s.row_threads - 32 < vectors
        assert s.exact == (s.row_threads * s.vecs_per_thread == vectors)
        if vectors % 32 == 0 and vectors // 32 <= args[0] * args[1] // 32:
            assert s.exact or vectors > args[0], (vectors, s)
    assert row_split(512, 1024, 4, None, 0).vecs_per_thread == 1  # decode: widest
    assert row_split(512, 512, 8, 4, 256).vecs_per_thread == 4  # prefill: ~4 per thread
    with pytest.raises(ValueError):
        row_split(4097, 1024, 4, None, 0)


# ----------------------------------------------------------------------------- plans
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("hidden", [1024, 2880, 4096, 16384, 32768])
def test_token_plan_covers_every_row_once(arch, hidden):
    a = get_arch(arch)
    fam, c = _point(TOKEN, hidden=hidden)
    vs = _variants(fam, c, a)
    for sm in (16, 132, 148):
        for tokens in (0, 1, 2, 7, 33, 129, 1000, 20011):
            for force in (None, "decode", "prefill"):
                launches = fam.plan(c, vs, {"tokens": tokens}, sm, force)
                if tokens == 0:
                    assert launches == ()
                    continue
                (launch,) = launches
                if force:
                    assert launch.variant == force
                rows = vs[launch.variant].constants["rows_per_block"]
                gx, gy, gz = launch.grid
                assert (gy, gz) == (1, 1)
                assert gx * rows >= tokens > (gx - 1) * rows


def test_token_plan_switch_moves_with_the_sm_count():
    fam, c = _point(TOKEN, hidden=4096)
    a = get_arch("sm_90a")
    vs = _variants(fam, c, a)

    def switch(sm):
        return next(t for t in range(1, 1 << 16) if fam.plan(c, vs, {"tokens": t}, sm)[0].variant == "prefill")

    assert switch(66) < switch(132) < switch(264)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("hidden", [2880, 4096, 65536])
def test_tensor_plan_one_block_then_one_cooperative_launch_then_two_kernels(arch, hidden):
    a = get_arch(arch)
    fam, c = _point(TENSOR, hidden=hidden)
    vs = _variants(fam, c, a)
    d = vs["decode"]
    assert d.cooperative and not vs["prefill_absmax"].cooperative
    assert not vs["prefill_quant"].cooperative
    units_per_token = hidden // d.constants["vec"]
    small_capacity = vs["single_small"].threads * vs["single_small"].constants["single_max_vecs"]
    single_capacity = vs["single"].threads * vs["single"].constants["single_max_vecs"]
    wide_capacity = vs["single_wide"].threads * vs["single_wide"].constants["single_max_vecs"]
    small_edge = small_capacity // units_per_token
    single_edge = single_capacity // units_per_token
    wide_edge = wide_capacity // units_per_token
    decode_edge = d.constants["decode_max_elements"] // hidden
    assert d.constants["decode_max_elements"] == 1 << 24
    for sm in (1, 16, 132, 148, 1024):
        capacity = sm * d.constants["blocks_per_sm"] * d.threads * d.constants["decode_max_vecs"]
        edge = capacity // units_per_token
        for tokens in sorted({1, 7, 128, 4096, 20011, 1 << 20, max(1, edge), edge + 1,
                              max(1, small_edge), small_edge + 1,
                              max(1, single_edge), single_edge + 1,
                              max(1, wide_edge), wide_edge + 1, decode_edge,
                              decode_edge + 1}):
            for force in (None, "single_small", "single", "single_wide", "decode", "prefill"):
                launches = fam.plan(c, vs, {"tokens": tokens}, sm, force)
                units = tokens * units_per_token
                # the smallest one-block variant that holds the tensor, or the forced one
                if force is None:
                    single = ("single_small" if units <= small_capacity else
                              "single" if units <= single_capacity else
                              "single_wide" if units <= wide_capacity else None)
                else:
                    single = force if force.startswith("single") else None
                # the one cooperative launch up to 2**24 elements (measured faster there)
                decode = force == "decode" or (force is None and not single and
                                               tokens * hidden <= 1 << 24)
                if single:
                    # the whole tensor in one (non-cooperative) block, whatever the SM count
                    assert [(l.variant, l.grid) for l in launches] == [(single, (1, 1, 1))]
                    assert not vs[single].cooperative
                elif decode:
                    (launch,) = launches
                    assert launch.variant == "decode"
                    # cooperative grid limit: blocks_per_sm blocks per SM at most (what the
                    # build checked fits), never more blocks than there are vectors for or
                    # workspace slots (1024, at 1024 SMs)
                    per_sm = d.constants["blocks_per_sm"]
                    assert 1 <= launch.grid[0] <= sm * per_sm and launch.grid[1:] == (1, 1)
                    assert launch.grid[0] == min(sm * per_sm, -(-units // d.threads), 1024)
                else:
                    assert [l.variant for l in launches] == ["prefill_absmax", "prefill_quant"]
                    for launch in launches:
                        assert 1 <= launch.grid[0] <= sm * d.constants["prefill_blocks_per_sm"]
                        assert launch.grid[0] <= -(-units // d.threads)
    # up to 2 vectors per thread of the 256-thread block (4096 elements at 8 per vector), then
    # of the 1024-thread block (16384), then 64 bytes per thread of it (32768 elements): one
    # block; the cooperative launch above that
    assert (small_capacity, single_capacity) == (512, 2048)
    assert wide_capacity * d.constants["vec"] == 32768
    one = ("single_small" if units_per_token <= small_capacity else
           "single" if units_per_token <= single_capacity else
           "single_wide" if units_per_token <= wide_capacity else "decode")
    assert fam.plan(c, vs, {"tokens": 1}, 132)[0].variant == one
    assert [l.variant for l in fam.plan(c, vs, {"tokens": 64}, 132)] == ["decode"]
    assert [l.variant for l in fam.plan(c, vs, {"tokens": decode_edge + 1}, 132)] == [
        "prefill_absmax", "prefill_quant"]
    with pytest.raises(ConfigError):
        fam.plan(c, vs, {"tokens": 1}, 132, "prefill_quant")


# ----------------------------------------------------------------------------- references
def _ref(family, x, **values):
    fam, c = _point(family, hidden=x.shape[1], **values)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
    s = torch.empty(x.shape[0], 1) if family == TOKEN else torch.empty(1)
    fam.reference(c, x, q, s)
    return q, s


def _codes(q):
    return q.view(torch.uint8)


@pytest.mark.parametrize("family", [TOKEN, TENSOR])
def test_reference_zeros_take_the_eps_scale(family):
    q, s = _ref(family, torch.zeros(3, 64, dtype=torch.bfloat16), eps=1e-4)
    assert (s == torch.tensor(1e-4, dtype=torch.float32) / 448).all()
    assert (_codes(q) == 0).all()


@pytest.mark.parametrize("family", [TOKEN, TENSOR])
def test_reference_all_equal_rows_hit_448(family):
    x = torch.full((1, 64), -3.0, dtype=torch.bfloat16)
    q, s = _ref(family, x)
    assert float(s.flatten()[0]) == float(torch.tensor(3.0 / 448, dtype=torch.float32))
    assert (_codes(q) == 0xFE).all()  # -448


@pytest.mark.parametrize("family", [TOKEN, TENSOR])
def test_reference_ties_round_to_even(family):
    # absmax 448: scale exactly 1, so the codes are the e4m3 rounding of x itself
    x = torch.tensor([[448.0, 1.0625, 1.1875, -1.0625, 3 * 2.0**-10, 2.0**-10, 2.0**-11, 0.0]],
                     dtype=torch.bfloat16)
    q, s = _ref(family, x)
    assert float(s.flatten()[0]) == 1.0
    got = q.float()[0].tolist()
    assert got == [448.0, 1.0, 1.25, -1.0, 2.0**-8, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("family", [TOKEN, TENSOR])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reference_subnormal_inputs(family, dtype):
    dt = getattr(torch, dtype)
    tiny = torch.finfo(dt).tiny  # smallest normal; the values below are subnormal inputs
    x = (torch.arange(0, 64, dtype=torch.float64) * tiny / 64).to(dt).reshape(1, 64)
    assert (x.double().abs() < tiny).all() and (x[0, 1:] != 0).all()
    q, s = _ref(family, x, dtype=dtype, eps=1e-20)
    amax = float(x.double().abs().max())
    if amax > 1e-20:  # fp16 subnormals (~6e-8..6e-5) set the scale: the largest maps to 448
        assert float(s.flatten()[0]) == float(torch.tensor(amax / 448, dtype=torch.float32))
        assert q.float()[0, -1] == 448.0 and (q.float()[0].diff() >= 0).all()
        assert (q.float()[0, 1:] > 0).all()
    else:  # bf16 subnormals (< 1.2e-38) are below any allowed eps: eps sets the scale
        assert float(s.flatten()[0]) == float(torch.tensor(float(torch.tensor(1e-20, dtype=torch.float32)) / 448, dtype=torch.float32))
        assert (_codes(q) == 0).all()


def test_reference_token_scales_are_per_row_and_tensor_scale_is_global():
    x = torch.randn(7, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    x[4] *= 100
    qt, st = _ref(TOKEN, x)
    qg, sg = _ref(TENSOR, x)
    assert st.shape == (7, 1) and sg.shape == (1,)
    rows = x.double().abs().amax(dim=1)
    assert torch.equal(st[:, 0], (rows / 448).float())
    assert float(sg[0]) == float(torch.tensor(float(rows.max()) / 448, dtype=torch.float32))
    assert torch.equal(_codes(qt[4]), _codes(qg[4]))  # the row holding the global absmax
    assert not torch.equal(_codes(qt), _codes(qg))
    # one token: per-tensor is per-token
    q1, s1 = _ref(TOKEN, x[:1])
    q2, s2 = _ref(TENSOR, x[:1])
    assert torch.equal(_codes(q1), _codes(q2)) and float(s1[0, 0]) == float(s2[0])


def test_reference_matches_fp8_group_quant_with_one_group_per_row():
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    fam, c = _point("fp8_group_quant", hidden=128, group=128)
    q = torch.empty(5, 128, dtype=torch.float8_e4m3fn)
    s = torch.empty(5, 1)
    fam.reference(c, x, q, s)
    qt, st = _ref(TOKEN, x)
    assert torch.equal(_codes(q), _codes(qt)) and torch.equal(s, st)


def test_reference_inf_and_nan_policy():
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    x[0, 3] = float("nan")
    x[1, 5] = float("inf")
    qt, st = _ref(TOKEN, x)
    assert torch.isfinite(st[0, 0]) and torch.isinf(st[1, 0])
    assert torch.isnan(qt.float()[0, 3]) and torch.isnan(qt.float()[1, 5])
    assert (qt.float()[1].nan_to_num(0.0) == 0).all()
    qg, sg = _ref(TENSOR, x)
    assert torch.isinf(sg[0]) and (qg.float().nan_to_num(0.0) == 0).all()


# ----------------------------------------------------------------------------- GPU checks
@pytest.mark.parametrize("family", [TOKEN, TENSOR])
@pytest.mark.parametrize("tokens", [1, 3, 7])
def test_gpu_suite_checks_pass_on_the_reference_and_catch_errors(family, tokens):
    fam, c = _point(family, hidden=256)
    (x, q, s), want, views = make_case(family, c, tokens, seed=tokens, device="cpu")
    with pytest.raises(AssertionError, match="scale"):
        compare(want, views, "poisoned")  # nothing written yet
    fam.reference(c, x.contiguous(), q, s)
    compare(want, views, "reference")
    q.view(torch.uint8)[tokens - 1, 17] ^= 1
    with pytest.raises(AssertionError, match=r"code at \[%d, 17\]" % (tokens - 1)):
        compare(want, views, "one bit")
    poison(views)
    fam.reference(c, x.contiguous(), q, s)
    s.view(-1)[0] = torch.nextafter(s.view(-1)[0], torch.tensor(1.0))
    with pytest.raises(AssertionError, match="scale"):
        compare(want, views, "one ulp")
    if tokens >= 3:
        assert (x[1] == 0).all() and (x[2] == -1.5).all()
    assert x.stride(0) == c.hidden + 64


# ----------------------------------------------------------------------------- compiles
COMPILE_CASES = [
    (TOKEN, dict(hidden=4096)),
    (TOKEN, dict(hidden=2880, dtype="float16")),  # predicated tail
    (TOKEN, dict(hidden=1024)),  # several rows per prefill block
    (TENSOR, dict(hidden=4096)),
    (TENSOR, dict(hidden=2880, dtype="float16")),
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("family,values", COMPILE_CASES,
                         ids=[f"{f}-{v['hidden']}" for f, v in COMPILE_CASES])
def test_compiles_with_expected_ptx(family, values, arch):
    pytest.importorskip("cutlass")
    from rose_aot.builder.compile import compile_point

    fam, c = _point(family, **values)
    a = get_arch(arch)
    point = compile_point(family, c, a)
    vs = _variants(fam, c, a)
    assert set(point.artifacts) == set(vs)
    for name, (ptx, cubin) in point.artifacts.items():
        v = vs[name]
        assert cubin[:4] == b"\x7fELF"
        assert f".reqntid {v.block[0]}, 1, 1" in ptx
        wide = "ld.global.v8.b32" if v.constants["vec"] * 2 == 32 else "ld.global.v4.b32"
        assert wide in ptx, f"{name}: no {wide}"
        assert "ld.global.b16" not in ptx and "ld.global.u16" not in ptx
        assert "div.approx" not in ptx and "div.full" not in ptx
        quantizes = name != "prefill_absmax"
        assert ("cvt.rn.satfinite.e4m3x2.f32" in ptx) == quantizes
        if quantizes:  # device_utils.quotient: a reciprocal per scale, fma per element
            assert "rcp.rn.f32" in ptx and "fma.rn.f32" in ptx
            divisions = ptx.count("div.rn.f32") + ptx.count("rcp.rn.f32")
            # single and decode: the in-register path and the loop
            paths = 2 if name in ("single", "single_small", "single_wide", "decode") else 1
            assert divisions <= 2 * paths, f"{name}: {divisions} divisions, one per element?"
            # no word packed from one 16-bit register twice (ptxas mis-packed such a word of e4m3
            # codes: tests/test_dispatch_fp8_spec.py)
            assert not re.search(r"\{%rs(\d+), %rs\1\}", ptx)
        if family == TOKEN:
            assert ("griddepcontrol.wait" in ptx) == (name in ("decode", "mid")) == (v.pdl > 0)
            assert ptx.count("shfl.sync.bfly.b32") == 5  # one warp butterfly per row
            assert "bar.sync" in ptx and "atom." not in ptx
        elif name in ("single", "single_small", "single_wide"):
            # one block, the scale in registers: no atomics, no grid barrier, one block
            # barrier; programmatic dependent launch like the other one-wave decode kernels
            assert "atom." not in ptx and "bar.sync" in ptx
            assert "griddepcontrol.wait" in ptx and v.pdl > 0 and not v.cooperative
        elif name == "decode":
            # one rendezvous: the leader stores the block's max in its slot, arrives with
            # release and spins with acquire loads (the last arrival flips the phase, acq_rel);
            # then acquire loads of every slot. No other atomic, nothing reset, no fence: the
            # data never leaves its thread's registers, so no thread but the leader orders
            # anything (the seed's form, a fence per thread and five serial atomics, took 5 µs
            # at one token). Two paths: resident and forced-larger.
            assert v.cooperative and v.constants["blocks_per_sm"] >= 2
            assert ptx.count("atom.global.release.add.u32") == 2
            assert ptx.count("atom.global.acq_rel.add.u32") == 2
            assert ptx.count("atom.") == 4 and ptx.count("ld.acquire.gpu.global.b32") == 6
            assert "fence" not in ptx and "membar" not in ptx
            assert "griddepcontrol" not in ptx
        else:
            reduces = name != "prefill_quant"
            assert ("atom.global.max.s32" in ptx) == reduces  # max on the float bits
            assert ("atom.global.acq_rel.add.u32" in ptx) == reduces  # last block counts in
            assert ("atom.global.acq_rel.exch.b32" in ptx) == reduces  # and zeroes the word
            assert "atom.global.release.add.u32" not in ptx and not v.cooperative
            assert "griddepcontrol" not in ptx


def test_resident_blocks_follows_the_occupancy_rules():
    from rose_aot.builder.compile import resident_blocks

    assert resident_blocks(512, 50, 1092) == 2  # 50 -> 56 registers a thread, 28672 a block
    assert resident_blocks(512, 64, 0) == 2 and resident_blocks(512, 65, 0) == 1
    assert resident_blocks(256, 32, 0) == 8 and resident_blocks(1024, 32, 0) == 2
    assert resident_blocks(128, 16, 100 * 1024) == 2  # shared memory bounds it


def test_build_refuses_a_cooperative_plan_of_more_blocks_per_sm_than_fit(monkeypatch):
    """The cooperative decode launch puts blocks_per_sm blocks on every SM; a kernel whose
    registers allow fewer would fail every launch at serving, so the build refuses it."""
    pytest.importorskip("cutlass")
    from rose_aot.builder.compile import compile_point
    from rose_aot.kernels.fp8_tensor_quant import family as tensor_family

    fam, c = _point(TENSOR, hidden=4096)
    monkeypatch.setattr(tensor_family, "DECODE_BLOCKS_PER_SM", 3)
    with pytest.raises(RuntimeError, match=r"2 block\(s\) of 512 threads fit an SM, but its "
                                           r"cooperative plan launches 3 per SM"):
        compile_point(TENSOR, c, get_arch("sm_90a"))
