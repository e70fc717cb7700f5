"""Inputs, poisoning and comparisons of the activation / FP8 quantization GPU suite.

Plain torch on any device, so the CPU suite can check the checks themselves
(tests/test_act_quant_spec.py runs them with the reference standing in for the kernel).

Tolerances (one table, with the reason):
- act_and_mul: |got - ref| <= 1 ulp of the output dtype at |ref| (the kernel rounds once from
  fp32; fp32 error of exp/erfc and the products is far below half an ulp of bf16/fp16).
- fp8_group_quant: bit-exact codes and scales (the definition is exact in fp32); NaN codes
  compare as NaN (0x7F and 0xFF are both NaN).
- block_scaled_quant, nvfp4_quant: bit-exact data bytes and scale bytes, over the whole scale buffer (the
  swizzled layout's padding must keep its poison). Inputs finite (the formats' policy).
- act_and_mul_fp8_quant: y = act(gate) * up is fp32 in the kernel and float64 in the reference,
  so a group's absmax differs by a few fp32 ulps: scales within 2^-18 relative (UE8M0: equal, or
  a factor 2 when the absmax sits on a power-of-two boundary, in at most 0.1% of groups); in
  groups whose scales are equal up to that, codes within one e4m3 step of the reference and at
  most 0.1% of them different.
"""

from __future__ import annotations

__all__ = ["make_case", "poison", "compare", "nvfp4_factor_rows", "nvfp4_quotient_codes",
           "E4M3_NAN"]

E4M3_NAN = 0x7F
BLOCK_SCALED = ("block_scaled_quant", "nvfp4_quant")
_MANT_BITS = {"bfloat16": 7, "float16": 10}
_MIN_EXP = {"bfloat16": -126, "float16": -14}  # exponent of the smallest normal


def make_case(family_name: str, config, tokens: int, seed: int, device: str = "cuda"):
    """(args for the kernel on `device`, expected outputs on the CPU, views to compare).

    The float64 reference runs on `device` too (same torch ops; on the GPU it keeps 20011-token
    references fast), and its outputs come back to the CPU.

    The input is a strided view (rows padded by 64 elements) of a wider buffer; group
    magnitudes span 1e-3..1e3 for the quantization families; outputs are poisoned (NaN for
    floats, the NaN code 0x7F for e4m3), col_major_tma scales are the transposed view of a
    poisoned [groups, tokens padded to 4] buffer."""
    import torch

    # Inputs are drawn on `device` (a CPU draw of 20011 x 28736 values takes seconds per point).
    gen = torch.Generator(device=device).manual_seed(seed)
    dt = getattr(torch, config.dtype)
    if family_name in BLOCK_SCALED:
        return _block_scaled_case(family_name, config, tokens, gen, dt, device)
    if family_name == "act_and_mul":
        width, x_width = config.d, 2 * config.d
    elif family_name == "fp8_group_quant":
        width, x_width = config.hidden, config.hidden
    else:
        width, x_width = config.d, 2 * config.d
    x = torch.randn(tokens, x_width + 64, generator=gen, device=device)
    if family_name != "act_and_mul":
        group = config.group
        mags = torch.logspace(-3, 3, 7, device=device)[
            torch.randint(0, 7, (tokens, x_width // group), generator=gen, device=device)]
        x[:, :x_width] *= mags.repeat_interleave(group, dim=1)
        if tokens >= 3:  # an all-zero group and an all-equal group
            x[1, :group] = 0.0
            x[2, :group] = -1.5
    x = x.to(dt)
    x_dev = x.to(device)[:, :x_width]
    x_ref = x[:, :x_width].contiguous().to(device)  # the float64 reference runs where the data is
    if family_name == "act_and_mul":
        out_dt = getattr(torch, config.out_dtype)
        out = torch.full((tokens, width), float("nan"), dtype=out_dt, device=device)
        from rose_aot.kernels.act_and_mul.reference import act_and_mul64

        want = {"out": act_and_mul64(x_ref, config.d, config.activation)}  # unrounded
        return (x_dev, out), want, {"out": out}
    groups = width // config.group
    q = torch.full((tokens, width), E4M3_NAN, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    if config.scale_layout == "row_major":
        scales = torch.full((tokens, groups), float("nan"), device=device)
        padding = None
    else:
        padded = -(-tokens // 4) * 4
        buf = torch.full((groups, padded), float("nan"), device=device)
        scales = buf.t()[:tokens]
        padding = buf[:, tokens:]
    want_q = torch.empty(tokens, width, dtype=torch.float8_e4m3fn, device=device)
    want_s = torch.empty(tokens, groups, device=device)
    get_family_reference(family_name)(config, x_ref, want_q, want_s)
    views = {"q": q, "scales": scales, "padding": padding}
    return (x_dev, q, scales), {"q": want_q, "scales": want_s}, views


def _block_scaled_case(family_name, config, tokens, gen, dt, device):
    import torch

    fmt, h = config.format, config.hidden
    block = 16 if fmt == "nvfp4" else 32
    groups = h // block
    x = torch.randn(tokens, h + 64, generator=gen, device=device)
    mags = torch.logspace(-3, 3, 7, device=device)[
        torch.randint(0, 7, (tokens, groups), generator=gen, device=device)]
    x[:, :h] *= mags.repeat_interleave(block, dim=1)
    if tokens >= 3:
        x[1, :block] = 0.0
        x[2, :block] = -1.5
    x = x.to(dt)
    x_ref = x[:, :h].contiguous().to(device)
    x_dev = x.to(device)[:, :h]
    qdt = torch.float8_e4m3fn if fmt == "mxfp8" else torch.float4_e2m1fn_x2
    sdt = torch.float8_e4m3fn if fmt == "nvfp4" else torch.float8_e8m0fnu
    q = torch.full((tokens, h if fmt == "mxfp8" else h // 2), 0xFF, dtype=torch.uint8, device=device)
    if config.scale_layout == "row_major":
        s = torch.full((tokens, groups), 0xEE, dtype=torch.uint8, device=device)
    else:
        s = torch.full((-(-tokens // 128) * 128, -(-groups // 4) * 4), 0xEE, dtype=torch.uint8,
                       device=device)
    want_q, want_s = q.clone().to(device), s.clone().to(device)
    inputs = [x_ref]
    dev_inputs = [x_dev]
    if fmt == "nvfp4":
        amax = x_ref.float().abs().amax().clamp(min=1e-12)
        g = (448.0 * 6.0 / amax).reshape(1).float()
        inputs.append(g)
        dev_inputs.append(g)
    get_family_reference(family_name)(config, *inputs, want_q.view(qdt), want_s.view(sdt))
    q_dev, s_dev = q.to(device).view(qdt), s.to(device).view(sdt)
    want = {"q": want_q, "scales": want_s}
    return (*dev_inputs, q_dev, s_dev), want, {"q": q_dev, "scales": s_dev}


def nvfp4_factor_rows(hidden: int, dtype: str):
    """Rows of x [tokens, hidden] (CPU, `dtype`) for nvfp4_quant with the global scale g = 1,
    made of 16-element blocks (amax, x, 0, ...) where x * fp32(1 / scale) (NVFP4's definition:
    one factor per block) and fp32(x / scale) (a quotient per element) round to different e2m1
    codes: x / scale sits within an ulp of an e2m1 midpoint. amax = 6 scale sets the scale;
    x = the bf16/fp16 values nearest midpoint * scale, and their neighbours. The rest of the last
    row is zeros."""
    import torch

    from rose_aot.kernels.block_scaled_quant.reference import e2m1_codes

    dt = getattr(torch, dtype)
    scales = torch.arange(0x08, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    s = scales.repeat_interleave(len(mids))
    m = mids.repeat(len(scales))
    amax = (6.0 * s).to(dt).float()
    blocks = []
    for step in (-2, -1, 0, 1, 2):
        x = (m * s).to(dt)
        x = (x.view(torch.int16) + step).view(dt).float()
        scale = (amax / 6.0).clamp(max=448.0).to(torch.float8_e4m3fn).float()
        new = e2m1_codes(x * (1.0 / scale))
        old = e2m1_codes(x / scale)
        keep = (scale == s) & (x.abs() <= amax) & x.isfinite() & (new != old)
        blocks.append(torch.stack([amax[keep], x[keep]], dim=1))
    pairs = torch.cat(blocks)
    per_row = hidden // 16
    rows = -(-len(pairs) // per_row)
    out = torch.zeros(rows * per_row, 16)
    out[: len(pairs), :2] = pairs
    return out.reshape(rows, hidden).to(dt)


def nvfp4_quotient_codes(x, g: float = 1.0):
    """[tokens, hidden] e2m1 codes (uint8, unpacked) of x under a quotient per element,
    fp32(fp32(x * g) / scale), the definition NVFP4 had before its per-block factor: what a
    test compares with to show that its rows tell the two apart."""
    import torch

    from rose_aot.kernels.block_scaled_quant.reference import e2m1_codes

    t, h = x.shape
    xf = x.float().reshape(t, h // 16, 16)
    g32 = torch.tensor(g, dtype=torch.float32)
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = ((amax * g32) / 6.0).clamp(max=448.0).to(torch.float8_e4m3fn).float()
    q = torch.where(scale == 0, xf * 0.0, (xf * g32) / scale)
    return e2m1_codes(q.reshape(t, h).double())


def poison(family_name: str, views: dict) -> None:
    """Re-poison the outputs of a case (to launch it again, e.g. with another variant)."""
    import torch

    if family_name == "act_and_mul":
        views["out"].fill_(float("nan"))
    elif family_name in BLOCK_SCALED:
        views["q"].view(torch.uint8).fill_(0xFF)
        views["scales"].view(torch.uint8).fill_(0xEE)
    else:
        views["q"].view(torch.uint8).fill_(E4M3_NAN)
        views["scales"].fill_(float("nan"))


def get_family_reference(family_name: str):
    from rose_aot.kernels import get_family

    return get_family(family_name).reference


def _first_bad(mask) -> list[int]:
    return mask.nonzero()[0].tolist()


def compare(family_name: str, config, want: dict, views: dict, label: str) -> None:
    """Raise AssertionError naming the first bad index when the outputs miss the tolerances.
    The comparison runs where `want` lives (the GPU for the test suite's cases)."""
    import torch

    dev = next(v for v in want.values() if v is not None).device

    if family_name == "act_and_mul":
        got = views["out"].to(dev).double()
        exact = want["out"]
        nan = torch.isnan(got)
        assert not nan.any(), f"{label}: NaN in out (unwritten element?) at {_first_bad(nan)}"
        low = _MIN_EXP[config.out_dtype]
        _, e = torch.frexp(exact.abs().clamp(min=2.0**low))  # subnormals: the smallest spacing
        ulp = torch.ldexp(torch.ones_like(exact), e - 1 - _MANT_BITS[config.out_dtype])
        bad = (got - exact).abs() > ulp
        if bad.any():
            i = tuple(_first_bad(bad))
            raise AssertionError(
                f"{label}: {int(bad.sum())} elements off by more than 1 ulp; first {list(i)}: "
                f"got {got[i].item()!r} want {exact[i].item()!r}"
            )
        return
    if family_name in BLOCK_SCALED:
        for name in ("q", "scales"):
            got = views[name].to(dev).view(torch.uint8)
            bad = got != want[name]
            if bad.any():
                i = tuple(_first_bad(bad))
                raise AssertionError(
                    f"{label}: {int(bad.sum())} {name} bytes differ; first {list(i)}: got "
                    f"{got[i].item():#04x} want {want[name][i].item():#04x}"
                )
        return
    q = views["q"].to(dev).view(torch.uint8)
    s = views["scales"].to(dev)
    wq = want["q"].view(torch.uint8)
    ws = want["scales"]
    assert not torch.isnan(s).any(), f"{label}: NaN scale (unwritten?) at {_first_bad(torch.isnan(s))}"
    if views.get("padding") is not None:
        assert torch.isnan(views["padding"]).all(), f"{label}: the scale padding was written"
    q_nan = (q & 0x7F) == 0x7F
    w_nan = (wq & 0x7F) == 0x7F
    if family_name == "fp8_group_quant":
        s_bad = ~((s == ws) | (torch.isinf(s) & torch.isinf(ws)))
        assert not s_bad.any(), (
            f"{label}: scales differ at {_first_bad(s_bad)}: got {s[tuple(_first_bad(s_bad))].item()!r} "
            f"want {ws[tuple(_first_bad(s_bad))].item()!r}"
        )
        bad = (q != wq) & ~(q_nan & w_nan)
        assert not bad.any(), (
            f"{label}: {int(bad.sum())} codes differ; first {_first_bad(bad)}: got "
            f"{q[tuple(_first_bad(bad))].item():#04x} want {wq[tuple(_first_bad(bad))].item():#04x}"
        )
        return
    # fused: fp32 activation in the kernel, float64 in the reference
    ratio = s.double() / ws.double()
    if config.ue8m0:
        same = s == ws
        off = ~same
        factor2 = (ratio == 2.0) | (ratio == 0.5)
        assert not (off & ~factor2).any(), (
            f"{label}: ue8m0 scales off by more than a factor 2 at {_first_bad(off & ~factor2)}"
        )
        assert off.sum().item() <= max(1, s.numel() // 1000), f"{label}: {int(off.sum())} ue8m0 scales differ"
    else:
        same = (ratio - 1).abs() <= 2.0**-18
        assert same.all(), (
            f"{label}: scales off by {(ratio - 1).abs().max().item():.3g} relative; first "
            f"{_first_bad(~same)}"
        )
    assert not q_nan.any(), f"{label}: NaN code (unwritten?) at {_first_bad(q_nan)}"
    got_v = views["q"].to(dev).float().double()
    want_v = want["q"].float().double()
    mask = same.repeat_interleave(config.group, dim=1)
    # e4m3 spacing at the reference value: 2^(e-3) in the normal range, 2^-9 below 2^-6
    _, e = torch.frexp(want_v.abs().clamp(min=2.0**-6))
    step = torch.ldexp(torch.ones_like(want_v), e - 1 - 3)
    far = ((got_v - want_v).abs() > step) & mask
    assert not far.any(), f"{label}: codes more than one e4m3 step off at {_first_bad(far)}"
    diff = ((got_v != want_v) & mask).sum().item()
    assert diff <= max(1, mask.sum().item() // 1000), f"{label}: {diff} codes differ (> 0.1%)"
