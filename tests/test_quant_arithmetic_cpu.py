"""The inline PTX of the quantization kernels, run on the CPU by a small interpreter of the
instructions it uses: the exact text the kernels are compiled with (DIVISOR_PTX, QUOTIENT_PTX,
E2M1_WORD_PTX, ...), against float64 division and the e2m1 reference rounding.

fp32 arithmetic is emulated exactly: a product of two fp32 values is exact in float64, and a sum
is rounded to odd at 53 bits (TwoSum) before the one rounding to fp32, which equals rounding the
exact sum to fp32 once (53 >= 24 + 2)."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("cutlass")  # the PTX lives in the device modules

f32, f64, u32 = np.float32, np.float64, np.uint32


def _rn32_sum(a, b):
    s = a + b
    bp = s - a
    err = (a - (s - bp)) + (b - bp)
    odd = (err != 0) & ((s.view(np.int64) & 1) == 0) & np.isfinite(s)
    s = np.where(odd, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(f32)


def _round_to_odd_f32(s, err):
    """fp32 of s + err (s = the float64 sum rounded to odd, err its exact error) rounded to
    odd at 24 bits: enough for a later round to nearest at bf16's 8."""
    r = s.astype(f32)
    inexact = (r.astype(f64) != s) | (err != 0)
    even = (r.view(u32) & 1) == 0
    toward = np.where(s + err > r.astype(f64), np.inf, -np.inf).astype(f32)
    return np.where(inexact & even & np.isfinite(r), np.nextafter(r, toward), r).astype(f32)


def _bf16_round(a, b):
    """bf16 bits (uint32, low 16) of a + b rounded to nearest even, a and b float64."""
    s = a + b
    bp = s - a
    err = (a - (s - bp)) + (b - bp)
    bits = _round_to_odd_f32(s, err).view(u32).astype(np.uint64)
    out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(u32)
    nan = np.isnan(s)
    return np.where(nan, u32(0x7FC0), out & u32(0xFFFF))


def _lanes(w):
    """The two bf16 lanes of uint32 words as float64 (lo, hi)."""
    lo = ((w & u32(0xFFFF)) << u32(16)).view(f32).astype(f64)
    hi = (w & u32(0xFFFF0000)).view(f32).astype(f64)
    return lo, hi


def _pack(lo_bits, hi_bits):
    return (lo_bits & u32(0xFFFF)) | (hi_bits << u32(16))


def _bits(v):
    return np.asarray(v, dtype=f32).view(u32)


def _float(bits):
    return np.asarray(bits, dtype=u32).view(f32)


def _e4m3_bits(bits):
    """float8_e4m3fn bytes of fp32 bits, rounded to nearest even, saturating (satfinite)."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(_float(bits)))
    nan = torch.isnan(t)
    t = t.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8).numpy().astype(u32)
    return np.where(nan.numpy(), u32(0x7F), t)


def _e4m3_to_f16_bits(byte):
    """fp16 bits of the e4m3 byte's value (exact)."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(byte & u32(0xFF), dtype=np.uint8))
    return t.view(torch.float8_e4m3fn).half().view(torch.int16).numpy().astype(np.uint16).astype(u32)


def run_ptx(text: str, *inputs, rcp_ulps: int = 0):
    """Run one inline-PTX block on numpy uint32 arrays ($1, $2, ... = inputs); returns $0.

    rcp.approx.ftz.f32 gives the correctly rounded reciprocal moved by `rcp_ulps` ulps (the
    hardware's MUFU.RCP is within 1 ulp: callers try -1, 0 and 1)."""
    regs = {f"${i + 1}": np.asarray(v, dtype=u32) for i, v in enumerate(inputs)}
    n = len(regs["$1"])

    def val(tok):
        if tok in regs:
            return regs[tok]
        if tok.startswith("0f"):
            return np.full(n, int(tok[2:], 16), dtype=u32)
        return np.full(n, int(tok, 0) & 0xFFFFFFFF, dtype=u32)

    for line in text.splitlines():
        line = line.strip().rstrip(";")
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op == "mov.b32" and rest.startswith("{"):  # unpack: mov.b32 {lo, hi}, word
            halves, word = rest[1:].split("}")
            lo, hi = [t.strip() for t in halves.split(",")]
            w = val(word.strip(" ,"))
            regs[lo], regs[hi] = w & u32(0xFFFF), w >> u32(16)
            continue
        d, *src = [t.strip() for t in rest.split(",")]
        a = [val(t) for t in src]
        with np.errstate(all="ignore"):
            if op in ("mov.b32", "mov.f32"):
                r = a[0]
            elif op in ("cvt.u32.u16", "cvt.u16.u32"):
                r = a[0] & u32(0xFFFF)
            elif op == "cvt.rn.satfinite.e4m3x2.f32":  # first source to the upper byte
                r = (_e4m3_bits(a[0]) << u32(8)) | _e4m3_bits(a[1])
            elif op == "cvt.rn.f16x2.e4m3x2":  # lower byte to the lower half
                r = _e4m3_to_f16_bits(a[0]) | (_e4m3_to_f16_bits(a[0] >> u32(8)) << u32(16))
            elif op == "cvt.f32.f16":
                h = (a[0] & u32(0xFFFF)).astype(np.uint16).view(np.float16)
                r = _bits(h.astype(f32))
            elif op == "rcp.approx.ftz.f32":
                x = _float(a[0]).astype(f64)
                with np.errstate(divide="ignore"):
                    r = _bits((1.0 / x).astype(f32)).astype(np.int64) + rcp_ulps
                r = r.astype(u32)
            elif op == "and.b32":
                r = a[0] & a[1]
            elif op == "or.b32":
                r = a[0] | a[1]
            elif op == "shl.b32":
                r = a[0] << a[1]
            elif op in ("shr.u32", "shr.b32"):
                r = a[0] >> a[1]
            elif op == "add.u32":
                r = a[0] + a[1]
            elif op == "sub.u32":
                r = a[0] - a[1]
            elif op == "mad.lo.u32":
                r = a[0] * a[1] + a[2]
            elif op == "abs.bf16x2":  # the magnitude of each lane (NaN stays NaN)
                r = a[0] & u32(0x7FFF7FFF)
            elif op == "min.u32":
                r = np.minimum(a[0], a[1])
            elif op == "prmt.b32":  # bytes of (a[1], a[0]) picked by the selector's nibbles
                both = a[0].astype(np.uint64) | (a[1].astype(np.uint64) << np.uint64(32))
                r = np.zeros(n, dtype=np.uint64)
                for i in range(4):
                    pick = (a[2].astype(np.uint64) >> np.uint64(4 * i)) & np.uint64(7)
                    byte = (both >> (pick * np.uint64(8))) & np.uint64(0xFF)
                    r |= byte << np.uint64(8 * i)
                r = r.astype(u32)
            elif op == "min.u16x2":
                r = (np.minimum(a[0] & u32(0xFFFF), a[1] & u32(0xFFFF))
                     | (np.minimum(a[0] >> u32(16), a[1] >> u32(16)) << u32(16)))
            elif op == "bfe.u32":
                r = (a[0] >> a[1]) & ((u32(1) << a[2]) - u32(1))
            elif op == "neg.f32":
                r = a[0] ^ u32(0x80000000)
            elif op == "mul.rn.f32":
                r = _bits((_float(a[0]).astype(f64) * _float(a[1]).astype(f64)).astype(f32))
            elif op == "fma.rn.f32":
                p = _float(a[0]).astype(f64) * _float(a[1]).astype(f64)
                r = _bits(_rn32_sum(p, _float(a[2]).astype(f64)))
            elif op == "max.f32":
                r = _bits(np.fmax(_float(a[0]), _float(a[1])))
            elif op in ("min.bf16x2", "max.bf16x2"):
                pick = np.fmin if op == "min.bf16x2" else np.fmax
                (x0, x1), (y0, y1) = _lanes(a[0]), _lanes(a[1])
                r = _pack(_bits(pick(x0, y0).astype(f32)) >> 16, _bits(pick(x1, y1).astype(f32)) >> 16)
            elif op == "fma.rn.bf16x2":
                (x0, x1), (y0, y1), (z0, z1) = _lanes(a[0]), _lanes(a[1]), _lanes(a[2])
                r = _pack(_bf16_round(x0 * y0, z0), _bf16_round(x1 * y1, z1))
            elif op in ("setp.lt.u32", "setp.eq.f32"):
                r = a[0] < a[1] if op == "setp.lt.u32" else _float(a[0]) == _float(a[1])
            elif op in ("selp.b32", "selp.f32"):
                r = np.where(a[2].astype(bool), a[0], a[1]).astype(u32)
            else:
                raise AssertionError(f"the interpreter does not know {op!r}: extend it")
        regs[d] = r.astype(u32)
    return regs["$0"]


def _kernel_quotient(x, scale):
    """What the kernels compute for fp32(x / scale): quotient_factors then quotient."""
    from rose_aot.kernels.device_utils import DIVISOR_PTX, QUOTIENT_PTX

    with np.errstate(all="ignore"):
        recip = (f32(1.0) / scale).astype(f32)  # div.rn.f32
    divisor = run_ptx(DIVISOR_PTX, _bits(scale))
    return _float(run_ptx(QUOTIENT_PTX, _bits(x), divisor, _bits(recip)))


def _e4m3(v):
    import torch

    t = torch.from_numpy(np.ascontiguousarray(v, dtype=f32)).clamp(-448.0, 448.0)
    return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def _assert_same_e4m3(x, scale):
    """The kernel's quotient and fp32(float64 x / scale) give the same e4m3 byte, and the same
    fp32 bits wherever the residual cannot underflow (|x| >= 2^-100)."""
    got = _kernel_quotient(x, scale)
    with np.errstate(all="ignore"):
        want = (x.astype(f64) / scale.astype(f64)).astype(f32)
    g8, w8 = _e4m3(got), _e4m3(want)
    both_nan = ((g8 & 0x7F) == 0x7F) & ((w8 & 0x7F) == 0x7F)
    bad = (g8 != w8) & ~both_nan
    assert not bad.any(), (
        f"{int(bad.sum())} e4m3 codes differ; first x={x[bad][0]!r} scale={scale[bad][0]!r}: "
        f"got {got[bad][0]!r} want {want[bad][0]!r}")
    big = (np.abs(x) >= 2.0**-100) & np.isfinite(want)
    off = big & (_bits(got) != _bits(want))
    assert not off.any(), (
        f"{int(off.sum())} quotients not correctly rounded; first x={x[off][0]!r} "
        f"scale={scale[off][0]!r}: got {got[off][0]!r} want {want[off][0]!r}")


def _every_finite(dtype):
    raw = np.arange(65536, dtype=np.uint32)
    if dtype == "bfloat16":
        v = (raw << 16).view(f32)
    else:
        v = raw.astype(np.uint16).view(np.float16).astype(f32)
    return v[np.isfinite(v)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_quotient_is_exact_for_every_input_value(dtype):
    """Every finite bf16/fp16 x against scales at every third power of two the kernels can have
    (max(absmax, eps) / 448 with eps >= 1e-20, up to fp32's largest absmax), only where x could
    be in the scale's group (|x| <= 448 * scale)."""
    rng = np.random.default_rng(0)
    xs = _every_finite(dtype)
    for e in range(-76, 120, 3):
        for scale in (rng.uniform(1, 2, 2) * 2.0**e).astype(f32):
            x = xs[np.abs(xs.astype(f64)) <= 448.0 * float(scale)]
            _assert_same_e4m3(x, np.full(x.shape, scale, dtype=f32))


def test_quotient_is_exact_near_every_e4m3_midpoint():
    """Full-precision fp32 x (the fused activation's products) placed within a few fp32 ulps of
    e4m3 midpoints, where one ulp of error would flip the code."""
    import torch

    rng = np.random.default_rng(1)
    codes = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    mids = ((codes[:-1].astype(f64) + codes[1:]) / 2)
    n = 400_000
    scale = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-70, 100, n)).astype(f32)
    q = mids[rng.integers(0, len(mids), n)].astype(f32)
    q = _float(_bits(q) + rng.integers(-3, 4, n).astype(u32))
    x = (q.astype(f64) * scale).astype(f32) * np.where(rng.random(n) < 0.5, f32(-1), f32(1))
    _assert_same_e4m3(x, scale)


def test_quotient_signs_zeros_and_the_infinite_scale():
    """x / +inf: finite x -> +-0 with x's sign, +-inf -> NaN; +-0 / scale keeps the sign."""
    x = np.array([1.5, -1.5, 0.0, -0.0, np.inf, -np.inf, 3e38, -1e-40], dtype=f32)
    got = _kernel_quotient(x, np.full(x.shape, np.inf, dtype=f32))
    assert _bits(got[:4]).tolist() == [0, 0x80000000, 0, 0x80000000]
    assert np.isnan(got[4:6]).all() and _bits(got[6:]).tolist() == [0, 0x80000000]
    z = np.array([0.0, -0.0], dtype=f32)
    assert _bits(_kernel_quotient(z, np.array([3.0, 3.0], dtype=f32))).tolist() == [0, 0x80000000]


def _nibbles(words):
    """The 8 codes of each uint32 word, lowest nibble first, as one flat array."""
    return np.stack([(words >> u32(4 * k)) & u32(0xF) for k in range(8)], axis=1).ravel()


def test_e2m1_word_matches_the_reference_rounding():
    """Every rounding threshold and its neighbours, saturation, +-inf, signed zeros, subnormals,
    a sweep of the fp32 bit patterns and 2M random values: the sm_90a PTX gives the reference's
    codes, value 2j + k of a word in bit 8j + 4k."""
    import torch

    from rose_aot.kernels.block_scaled_quant.device import E2M1_WORD_PTX
    from rose_aot.kernels.block_scaled_quant.reference import e2m1_codes

    rng = np.random.default_rng(2)
    marks = np.array([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8,
                      1e-40, 100, 3e38], dtype=f32)
    near = (_bits(marks)[:, None] + np.arange(-64, 65).astype(u32)[None, :]).ravel()
    sweep = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(u32)
    v = np.concatenate([_float(near), -_float(near), _float(sweep),
                        rng.uniform(-8, 8, 2_000_000).astype(f32),
                        np.array([np.inf, -np.inf, 0.0, -0.0], dtype=f32)])
    v = v[~np.isnan(v)]
    v = v[: len(v) // 8 * 8]
    want = e2m1_codes(torch.from_numpy(v)).numpy().astype(u32)
    got = _nibbles(run_ptx(E2M1_WORD_PTX, *[_bits(v[k::8]) for k in range(8)]))
    bad = got != want
    assert not bad.any(), (
        f"{int(bad.sum())} codes differ; first {v[bad][0]!r}: got {got[bad][0]} want {want[bad][0]}")


def _bf16_values():
    raw = np.arange(65536, dtype=u32)
    v = (raw << u32(16)).view(f32)
    return raw[np.isfinite(v)]


def test_packed_mxfp4_codes_match_the_reference_for_every_bf16_value():
    """MX_E2M1_WORD_PTX: every finite bf16 x in every one of a word's 8 positions (the other
    positions shuffled values), times every power-of-two MX scale that puts some x in e2m1's
    range, gives the reference's codes e2m1(x * s) (exact product), value 2j + k of the words
    in bit 8j + 4k."""
    import torch

    from rose_aot.kernels.block_scaled_quant.device import MX_E2M1_WORD_PTX
    from rose_aot.kernels.block_scaled_quant.reference import e2m1_codes

    rng = np.random.default_rng(3)
    every = _bf16_values()
    # lane k of the 8 holds `every` in order (rolled by k), so each value visits each lane
    lanes = [np.roll(every, 997 * k) if k % 2 == 0 else rng.permutation(every) for k in range(8)]
    words = [lanes[2 * j] | (lanes[2 * j + 1] << u32(16)) for j in range(4)]
    values = np.stack([_lanes(w)[h] for w in words for h in (0, 1)], axis=1)  # [n, 8] float64
    for e in list(range(-130, 131, 7)) + [-1, 0, 1, 2, 3]:
        if not -126 <= e <= 127:
            continue
        s = np.float64(2.0) ** e
        s_bits = u32(_bits(np.float32(s)) >> 16)
        got = _nibbles(run_ptx(MX_E2M1_WORD_PTX, *words,
                               np.full(words[0].shape, s_bits | (s_bits << 16), u32)))
        xs = values.ravel()
        want = e2m1_codes(torch.from_numpy(xs * s)).numpy().astype(u32)
        bad = got != want
        assert not bad.any(), (
            f"scale 2^{e}: {int(bad.sum())} codes differ; first x={xs[bad][0]!r}: "
            f"got {got[bad][0]} want {want[bad][0]}")


def test_packed_absmax_is_the_largest_magnitude():
    from rose_aot.kernels.block_scaled_quant.device import (ABSMAX_BF16X2_STEP_PTX,
                                                             BF16X2_LARGER_LANE_PTX)

    rng = np.random.default_rng(4)
    vals = _bf16_values()
    words = rng.choice(vals, (4, 200_000)) | (rng.choice(vals, (4, 200_000)) << u32(16))
    m = np.zeros(words.shape[1], dtype=u32)
    for w in words:
        m = run_ptx(ABSMAX_BF16X2_STEP_PTX, m, w)
    got = _float(run_ptx(BF16X2_LARGER_LANE_PTX, m))
    lanes = np.concatenate([np.stack(_lanes(w)) for w in words])
    assert np.array_equal(got.astype(f64), np.abs(lanes).max(axis=0))


def test_nvfp4_scale_byte_is_e4m3_of_the_correctly_rounded_sixth():
    """quotient(m, 6, SIXTH) then NVFP4_SCALE_BYTE_PTX, as the kernel computes NVFP4's scale
    byte: e4m3(fp32(m / 6)) for m = fp32(absmax * g): random magnitudes over
    fp32's range, fp32 neighbours of 6 x every e4m3 value and midpoint (where a quotient off by
    one ulp flips the byte), zeros, subnormals, saturation and +inf (-> 448, as the division
    would give)."""
    import torch

    from rose_aot.kernels.block_scaled_quant.device import NVFP4_SCALE_BYTE_PTX, SIXTH
    from rose_aot.kernels.device_utils import QUOTIENT_PTX

    assert _bits(np.float32(SIXTH)).tolist() == 0x3E2AAAAB  # fp32(1/6), rounded to nearest

    rng = np.random.default_rng(5)
    codes = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    marks = np.concatenate([codes, (codes[:-1].astype(f64) + codes[1:]) / 2]) * 6.0
    near = (_bits(marks.astype(f32))[:, None] + np.arange(-40, 41).astype(u32)[None, :]).ravel()
    m = np.concatenate([
        _float(near), (rng.uniform(1, 2, 500_000) * 2.0 ** rng.integers(-149, 128, 500_000)),
        np.array([0.0, 1e-45, 1e-39, 2688.0, 2700.0, 3.4e38, np.inf])]).astype(f32)
    m = np.abs(m[np.isfinite(m) | np.isinf(m)])
    with np.errstate(all="ignore"):
        want = _e4m3_bits(_bits((m.astype(f64) / 6.0).astype(f32)))
    n = len(m)
    sixth = run_ptx(QUOTIENT_PTX, _bits(m), np.full(n, _bits(np.float32(6.0)), u32),
                    np.full(n, _bits(np.float32(SIXTH)), u32))
    got = run_ptx(NVFP4_SCALE_BYTE_PTX, _bits(m), sixth)
    bad = got != want
    assert not bad.any(), (f"{int(bad.sum())} bytes differ; first m={m[bad][0]!r}: "
                           f"got {got[bad][0]:#x} want {want[bad][0]:#x}")
    assert got[m == np.inf].tolist() == [0x7E]  # 448


def test_e4m3_byte_value_and_reciprocal():
    """E4M3_BYTE_VALUE_PTX gives every finite non-negative e4m3 byte's value exactly, and
    E4M3_RECIPROCAL_PTX its correctly rounded reciprocal from any MUFU.RCP start within 1 ulp
    (0 for 0): the Newton step's exactness, proved for every scale NVFP4 can have."""
    import torch

    from rose_aot.kernels.block_scaled_quant.device import (E4M3_BYTE_VALUE_PTX,
                                                             E4M3_RECIPROCAL_PTX)

    byte = np.arange(0, 0x7F, dtype=u32)
    want = torch.from_numpy(byte.astype(np.uint8)).view(torch.float8_e4m3fn).float().numpy()
    value = run_ptx(E4M3_BYTE_VALUE_PTX, byte)
    assert np.array_equal(_float(value), want)
    with np.errstate(divide="ignore"):
        exact = np.where(want == 0, f32(0), (1.0 / want.astype(f64)).astype(f32))
    for ulps in (-1, 0, 1):
        got = _float(run_ptx(E4M3_RECIPROCAL_PTX, value, rcp_ulps=ulps))
        assert np.array_equal(_bits(got), _bits(exact)), ulps


def test_nvfp4_factor_is_the_correctly_rounded_quotient_of_the_global_scale():
    """NVFP4's per-block factor as the kernel forms it (E4M3_BYTE_VALUE_PTX, E4M3_RECIPROCAL_PTX
    from any MUFU.RCP start within 1 ulp, QUOTIENT_PTX) is fp32(g / scale) for every e4m3 scale
    and global scales g across the documented range 2^-100 .. 2^100 (full 24-bit mantissas,
    the range's ends and powers of two), and 0 for a zero scale."""
    import torch

    from rose_aot.kernels.block_scaled_quant.device import (E4M3_BYTE_VALUE_PTX,
                                                             E4M3_RECIPROCAL_PTX)
    from rose_aot.kernels.device_utils import QUOTIENT_PTX

    rng = np.random.default_rng(2)
    gs = np.concatenate([
        (rng.uniform(1, 2, 3000) * 2.0 ** rng.integers(-100, 100, 3000)).astype(f32),
        np.array([2.0**-100, 2.0**100, 1.0, 448.0 * 6.0, np.nextafter(f32(2.0**100), f32(0))],
                 dtype=f32),
    ])
    byte = np.arange(0, 0x7F, dtype=u32)
    scale = torch.from_numpy(byte.astype(np.uint8)).view(torch.float8_e4m3fn).float().numpy()
    b, g = (a.ravel() for a in np.meshgrid(byte, gs))
    s, _ = (a.ravel() for a in np.meshgrid(scale, gs))
    value = run_ptx(E4M3_BYTE_VALUE_PTX, b)
    with np.errstate(divide="ignore"):
        want = np.where(s == 0, f32(0), (g.astype(f64) / s.astype(f64)).astype(f32))
    for ulps in (-1, 0, 1):
        recip = run_ptx(E4M3_RECIPROCAL_PTX, value, rcp_ulps=ulps)
        got = _float(run_ptx(QUOTIENT_PTX, _bits(g), value, recip))
        bad = _bits(got) != _bits(want)
        assert not bad.any(), (f"{int(bad.sum())} factors differ (rcp {ulps:+d} ulp); first "
                               f"g={g[bad][0]!r} scale={s[bad][0]!r}: got {got[bad][0]!r} "
                               f"want {want[bad][0]!r}")


def test_the_interpreter_knows_every_instruction_of_the_ptx():
    """A new instruction in the kernels' PTX must be taught to run_ptx (else it raises)."""
    from rose_aot.kernels.block_scaled_quant import device
    from rose_aot.kernels.device_utils import DIVISOR_PTX, QUOTIENT_PTX

    for text in (DIVISOR_PTX, QUOTIENT_PTX, device.E2M1_WORD_PTX, device.MX_E2M1_WORD_PTX,
                 device.ABSMAX_BF16X2_STEP_PTX, device.BF16X2_LARGER_LANE_PTX,
                 device.NVFP4_SCALE_BYTE_PTX, device.E4M3_BYTE_VALUE_PTX,
                 device.E4M3_RECIPROCAL_PTX):
        inputs = max(int(i) for i in re.findall(r"\$(\d+)", text))
        run_ptx(text, *[np.ones(2, dtype=u32)] * inputs)
