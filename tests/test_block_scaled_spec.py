"""CPU tests of block_scaled_quant (MXFP8, MXFP4, NVFP4): config and arguments, the reference
against exact rational arithmetic, the 128x4 swizzle against a reshape/permute formulation,
and compiles (the sm_90a e2m1 PTX runs in tests/test_quant_arithmetic_cpu.py) for sm_90a and sm_100a."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import pytest

from rose_aot.archs import get_arch
from rose_aot.errors import ConfigError
from rose_aot.kernels import get_family
from rose_aot.kernels.spec import Dim

torch = pytest.importorskip("torch")

SEED = 20261130
FAM = get_family("block_scaled_quant")
NV = get_family("nvfp4_quant")
E2M1 = [Fraction(v) for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)]


def _family(fmt: str):
    return NV if fmt == "nvfp4" else FAM


def _config(**values):
    """Config of block_scaled_quant, or of nvfp4_quant for format="nvfp4"."""
    if values.get("format") == "nvfp4":
        values = {k: v for k, v in values.items() if k != "format"}
        return NV.make_config(**values)
    return FAM.make_config(**values)


def test_config_and_arguments():
    c = _config(hidden=4096)
    assert (c.format, c.scale_layout) == ("mxfp8", "swizzled_128x4")
    with pytest.raises(ConfigError):
        FAM.make_config(hidden=4096, format="nvfp4")  # its own family (a global scale argument)
    assert NV.make_config(hidden=4096).format == "nvfp4"
    assert "format" not in NV.key(NV.make_config(hidden=4096))
    with pytest.raises(ConfigError):
        _config(hidden=4096 + 16)  # not a multiple of 32 for MX
    _config(hidden=4096 + 16, format="nvfp4")  # 16-element blocks
    x, q, s = FAM.args(_config(hidden=2880, format="mxfp4"), get_arch("sm_90a"))
    assert q.dtype == "float4_e2m1fn_x2" and q.shape == (Dim("tokens"), 1440)
    assert s.dtype == "float8_e8m0fnu" and s.layout == "swizzled_128x4"
    assert s.shape[1] == 92 and s.shape[0].divisibility == 128  # 90 groups padded to 92
    x, g, q, s = NV.args(_config(hidden=4096, format="nvfp4", scale_layout="row_major"),
                         get_arch("sm_100a"))
    assert g.shape == (1,) and g.dtype == "float32"
    assert s.dtype == "float8_e4m3fn" and s.shape == (Dim("tokens"), 256)
    for arch, vec in (("sm_90a", 8), ("sm_100a", 16)):
        for fmt, block in (("mxfp8", 32), ("mxfp4", 32), ("nvfp4", 16)):
            for v in _family(fmt).variants(_config(hidden=4096, format=fmt), get_arch(arch)):
                # the FP4 prefill shapes take 16 elements per unit (two 16-byte loads on
                # sm_90a): NVFP4's whole block, half of MXFP4's; every other shape one access
                unit = 16 if v.name == "prefill" and fmt != "mxfp8" else vec
                assert v.constants["vec"] == unit
                assert v.constants["group_lanes"] == block // unit
                assert v.constants["native_e2m1"] == (arch == "sm_100a")


# ----------------------------------------------------------------------------- exact model
def _e2m1_exact(q: Fraction, negative: bool) -> int:
    a = min(abs(q), Fraction(6))
    best = min(range(8), key=lambda c: (abs(E2M1[c] - a), c & 1))
    return best | (8 if negative else 0)


def _e4m3_values():
    out = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        v = Fraction(m, 8) * Fraction(2) ** -6 if e == 0 else (1 + Fraction(m, 8)) * Fraction(2) ** (e - 7)
        out.append((v, code))
    return out


E4M3 = _e4m3_values()


def _e4m3_exact(q: Fraction) -> tuple[int, Fraction]:
    a = abs(q)
    v, code = min(E4M3, key=lambda vc: (abs(vc[0] - a), vc[1] & 1))
    return (code | (0x80 if q < 0 else 0)), (v if q >= 0 else -v)


def _fp32(x) -> Fraction:
    import numpy as np

    return Fraction(float(np.float32(float(x))))


def _expected_block(vals, fmt, g=None):
    """(data codes, scale byte) of one block by exact arithmetic."""
    amax = max(Fraction(abs(v)) for v in vals)
    if fmt in ("mxfp8", "mxfp4"):
        top = Fraction(448) if fmt == "mxfp8" else Fraction(6)
        m = max(amax, Fraction(2) ** -126)
        e = -200
        while Fraction(2) ** e < m / top:
            e += 1
        e = max(-127, min(127, e))
        scaled = [Fraction(v) / Fraction(2) ** e for v in vals]
        if fmt == "mxfp8":
            codes = [_e4m3_exact(_fp32(s))[0] if s != 0 else (0x80 if math.copysign(1, v) < 0 else 0)
                     for s, v in zip(scaled, vals)]
        else:
            codes = [_e2m1_exact(s, math.copysign(1, v) < 0) for s, v in zip(scaled, vals)]
        return codes, e + 127
    g = Fraction(g)
    s = _fp32(_fp32(amax * g) / 6)
    byte, sb = _e4m3_exact(min(s, Fraction(448)))
    # the block's factor fp32(g / scale) (finite here), then one fp32 product per element
    factor = _fp32(g / sb) if sb != 0 else Fraction(0)
    codes = [_e2m1_exact(_fp32(Fraction(v) * factor), math.copysign(1, v) < 0) for v in vals]
    return codes, byte


def _unpack(data: torch.Tensor, fmt: str) -> list[list[int]]:
    d = data.view(torch.uint8)
    if fmt == "mxfp8":
        return d.tolist()
    lo, hi = d & 0xF, d >> 4
    return torch.stack([lo, hi], dim=-1).reshape(d.shape[0], -1).tolist()


def _run_reference(fmt, rows, layout="row_major", g=None):
    x = torch.tensor(rows, dtype=torch.float64).bfloat16()
    t, h = x.shape
    c = _config(hidden=h, format=fmt, scale_layout=layout)
    data = torch.zeros(t, h if fmt == "mxfp8" else h // 2, dtype=torch.uint8)
    groups = h // (16 if fmt == "nvfp4" else 32)
    if layout == "row_major":
        scales = torch.full((t, groups), 0xEE, dtype=torch.uint8)
    else:
        scales = torch.full((-(-t // 128) * 128, -(-groups // 4) * 4), 0xEE, dtype=torch.uint8)
    sdt = torch.float8_e4m3fn if fmt == "nvfp4" else torch.float8_e8m0fnu
    qdt = torch.float8_e4m3fn if fmt == "mxfp8" else torch.float4_e2m1fn_x2
    args = [x]
    if fmt == "nvfp4":
        args.append(torch.tensor([g], dtype=torch.float32))
    args += [data.view(qdt), scales.view(sdt)]
    _family(fmt).reference(c, *args)
    return x, data, scales


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_plans_switch_from_decode_to_prefill_with_the_batch(arch):
    # every format: decode for a decode step, prefill from 8192 tokens (measured faster there on
    # the H200, NVFP4 too since its shorter e2m1 path: act_and_mul/tuning.py)
    a = get_arch(arch)
    for fmt in ("nvfp4", "mxfp8", "mxfp4"):
        fam, c = _family(fmt), _config(hidden=7168, format=fmt)
        variants = {v.name: v for v in fam.variants(c, a)}
        assert fam.plan(c, variants, {"tokens": 0}, a.sm_count) == ()
        chosen = []
        for tokens in (1, 7, 128, 1024, 8192, 32768):
            for force in fam.plan_choices:
                (launch,) = fam.plan(c, variants, {"tokens": tokens}, a.sm_count, force)
                assert launch.variant == force
            (launch,) = fam.plan(c, variants, {"tokens": tokens}, a.sm_count)
            rows = variants[launch.variant].constants["rows_per_block"]
            assert launch.grid[0] * rows >= tokens > (launch.grid[0] - 1) * rows
            # the decode shape: `mid` is its form with late-triggered PDL (7168 x 128 on sm_100a)
            chosen.append({"mid": "decode"}.get(launch.variant, launch.variant))
        assert chosen[:3] == ["decode"] * 3 and chosen[-2:] == ["prefill"] * 2, (fmt, chosen)
        assert chosen == sorted(chosen)


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
def test_reference_matches_exact_arithmetic(fmt):
    gen = torch.Generator().manual_seed(SEED)
    block = 16 if fmt == "nvfp4" else 32
    rows = (torch.randn(5, 4 * block, generator=gen) * torch.logspace(-4, 4, 4 * block)).tolist()
    rows[1][:block] = [0.0] * block  # all-zero block
    rows[2][:block] = [-2.5] * block  # all-equal block
    rows[3][:6] = [6.0, 0.75, 1.25, -1.75, 2.5, 5.0]  # e2m1 ties when the scale is 1
    rows[4][:block] = [1e-39] * block  # bf16 subnormals
    g = 448.0 * 6.0 / 37.0
    x, data, scales = _run_reference(fmt, rows, g=g)
    codes = _unpack(data, fmt)
    for t in range(5):
        xs = [float(v) for v in x[t]]
        for b in range(4):
            want_codes, want_byte = _expected_block(xs[b * block:(b + 1) * block], fmt, g)
            assert scales[t, b].item() == want_byte, (t, b)
            got = codes[t][b * block:(b + 1) * block]
            assert got == want_codes, (t, b, got, want_codes)


def test_reference_spelled_out_cases():
    # MXFP4, amax 6: scale 2^0 (byte 127); ties 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0,
    # 2.5 -> 2.0, 5 -> 4.0; codes 7, 2, 2, 8|4, 4, 6
    row = [6.0, 0.75, 1.25, -1.75, 2.5, 5.0] + [0.0] * 26
    _, data, scales = _run_reference("mxfp4", [row])
    assert scales[0, 0].item() == 127
    assert _unpack(data, "mxfp4")[0][:6] == [7, 2, 2, 12, 4, 6]
    assert data[0, 0].item() == 0x27  # element 0 in the low nibble
    # MXFP8, amax 449 -> bf16 448? use 480: scale 2 (byte 128), 480 / 2 = 240
    _, data, scales = _run_reference("mxfp8", [[480.0] + [1.0] * 31])
    assert scales[0, 0].item() == 128 and data[0, 0].item() == 0x77  # 240 = 1.875 * 2^7
    # all-zero MX block: the smallest scale, byte 0 after the clamp to 2^-127
    _, _, scales = _run_reference("mxfp8", [[0.0] * 32])
    assert scales[0, 0].item() == 0


def test_swizzled_layout_matches_reshape_permute():
    gen = torch.Generator().manual_seed(SEED)
    t, h = 130, 6 * 32  # 6 groups -> 8 padded; 130 rows -> 256 padded
    x = torch.randn(t, h, generator=gen).tolist()
    _, _, linear = _run_reference("mxfp8", x, layout="row_major")
    _, _, swizzled = _run_reference("mxfp8", x, layout="swizzled_128x4")
    padded = torch.zeros(256, 8, dtype=torch.uint8)
    padded[:t, :6] = linear
    mask = torch.zeros(256, 8, dtype=torch.bool)
    mask[:t, :6] = True
    # the layout of CUTLASS's block-scaled GEMMs: [M/128, 4, 32, K/4, 4] -> [M/128, K/4, 32, 4, 4]
    def swizzle(m):
        return m.reshape(2, 4, 32, 2, 4).permute(0, 3, 2, 1, 4).reshape(-1)

    want = swizzle(padded)
    written = swizzle(mask)
    flat = swizzled.reshape(-1)
    assert torch.equal(flat[written], want[written])
    assert (flat[~written] == 0xEE).all()  # padding not written


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("values", [
    dict(hidden=4096, format="mxfp8"),
    dict(hidden=2880, format="mxfp4"),
    dict(hidden=2880, format="nvfp4", scale_layout="row_major"),
], ids=["mxfp8", "mxfp4", "nvfp4"])
def test_compiles_with_expected_ptx(values, arch):
    pytest.importorskip("cutlass")
    from rose_aot.builder.compile import compile_point

    c = _config(**values)
    fam = _family(values.get("format", "mxfp8"))
    point = compile_point(fam.name, c, get_arch(arch))
    for name, (ptx, _) in point.artifacts.items():
        v = {x.name: x for x in fam.variants(c, get_arch(arch))}[name]
        assert f".reqntid {v.block[0]}, 1, 1" in ptx
        # decode and mid launch with programmatic dependent launch (wait before any read)
        assert ("griddepcontrol.wait" in ptx) == (name in ("decode", "mid")) == (v.pdl > 0)
        assert ("ld.global.v8.b32" if arch == "sm_100a" else "ld.global.v4.b32") in ptx
        native = "cvt.rn.satfinite.e2m1x2.f32" in ptx
        assert native == (arch == "sm_100a" and c.format != "mxfp8")
        # no word packed from one 16-bit register twice (ptxas mis-packed such a word of e4m3
        # codes: tests/test_dispatch_fp8_spec.py)
        assert not re.search(r"\{%rs(\d+), %rs\1\}", ptx)
        if c.format == "mxfp8":
            assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
        elif arch == "sm_90a":
            # MXFP4 from bf16: the scaled bf16 pairs (MX_E2M1_WORD_PTX); NVFP4's quotients
            # are fp32, rounded to odd at bf16 first (E2M1_WORD_PTX); both round bf16 pairs,
            # the upper codes by Veltkamp's splitting, and pack 8 codes to a word
            packed = c.format == "mxfp4" and c.dtype == "bfloat16"
            assert "min.bf16x2 c, a, k;" in ptx and "fma.rn.bf16x2 t, lo, k, t;" in ptx
            assert "fma.rn.bf16x2 v, hi, k, d;" in ptx and "mad.lo.u32 w01, " in ptx
            assert ("fma.rn.bf16x2 a, " in ptx) == packed
            assert ("min.u16x2 d, d, k;" in ptx) == (not packed)
        if c.format == "nvfp4":
            # the scale's sixth and reciprocal without a division's slow-path call
            assert "cvt.rn.satfinite.e4m3x2.f32 h, z, q;" in ptx and "rcp.approx.ftz.f32" in ptx
            assert "div.rn.f32" not in ptx and "rcp.rn.f32" not in ptx
        lanes = v.constants["group_lanes"]
        assert ptx.count("shfl.sync.bfly.b32") == (lanes.bit_length() - 1) * v.constants["vecs_per_thread"]
