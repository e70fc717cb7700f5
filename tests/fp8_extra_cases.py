"""Inputs, poisoning and bit-exact comparison of the per-token / per-tensor FP8 GPU suite.

Plain torch on any device: tests/test_fp8_extra_spec.py runs these checks with the reference
standing in for the kernel (so a check that cannot fail would show there), and
tests/gpu/test_fp8_extra_gpu.py runs them against the kernels.
Tolerance: none. Codes and scales are bit-exact (the definition is exact in fp32); NaN codes
compare as NaN (0x7F and 0xFF are both NaN in e4m3fn); an unwritten (poisoned) element fails.
"""

from __future__ import annotations

__all__ = ["make_case", "poison", "compare", "E4M3_NAN"]

E4M3_NAN = 0x7F


def make_case(family_name: str, config, tokens: int, seed: int, device: str = "cuda"):
    """(args on `device`, expected outputs on the CPU, output views to compare).

    x is a strided view (rows padded by 64 elements) with row magnitudes spanning 1e-3..1e3
    (per-tensor: one token holds the absmax, the rest spans down to 1e-6 times it, so many
    codes are subnormal e4m3); the first tokens hold an all-zero and an all-equal row where
    the count allows. Outputs are poisoned."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    h = config.hidden
    x = torch.randn(tokens, h + 64, generator=gen)
    if family_name == "fp8_token_quant":
        mags = torch.logspace(-3, 3, 7)[torch.randint(0, 7, (tokens, 1), generator=gen)]
    else:
        mags = torch.logspace(-6, 0, 7)[torch.randint(0, 7, (tokens, 1), generator=gen)]
    x *= mags
    if tokens >= 3:
        x[1, :h] = 0.0
        x[2, :h] = -1.5
    x = x.to(getattr(torch, config.dtype))
    x_dev = x.to(device)[:, :h]
    q = torch.empty(tokens, h, dtype=torch.float8_e4m3fn, device=device)
    if family_name == "fp8_token_quant":
        scales = torch.empty(tokens, 1, device=device)
    else:
        scales = torch.empty(1, device=device)
    # the float64 reference runs where the data is (fast for 20011 wide tokens on a GPU)
    want_q = torch.empty(tokens, h, dtype=torch.float8_e4m3fn, device=device)
    want_s = torch.empty_like(scales)
    from rose_aot.kernels import get_family

    get_family(family_name).reference(config, x[:, :h].contiguous().to(device), want_q, want_s)
    views = {"q": q, "scales": scales}
    poison(views)
    return (x_dev, q, scales), {"q": want_q.cpu(), "scales": want_s.cpu()}, views


def poison(views: dict) -> None:
    import torch

    views["q"].view(torch.uint8).fill_(E4M3_NAN)
    views["scales"].fill_(float("nan"))


def _first_bad(mask) -> list[int]:
    import torch

    return [int(i) for i in torch.nonzero(mask)[0]] if bool(mask.any()) else []


def compare(want: dict, views: dict, label: str) -> None:
    """Bit-exact codes and scales; NaN codes equal only to NaN codes, NaN scales never pass
    unless the reference scale is NaN too."""
    import torch

    got_s = views["scales"].cpu()
    want_s = want["scales"]
    bad = ~((got_s == want_s) | (torch.isnan(got_s) & torch.isnan(want_s)))
    if bad.any():
        i = _first_bad(bad)
        raise AssertionError(f"{label}: scale at {i}: got {got_s[tuple(i)].item()!r}, "
                             f"want {want_s[tuple(i)].item()!r} ({int(bad.sum())} differ)")
    got_q = views["q"].cpu().view(torch.uint8)
    want_q = want["q"].view(torch.uint8)
    nan_got = (got_q & 0x7F) == 0x7F
    nan_want = (want_q & 0x7F) == 0x7F
    bad = torch.where(nan_want, ~nan_got, got_q != want_q)
    if bad.any():
        i = _first_bad(bad)
        raise AssertionError(f"{label}: code at {i}: got 0x{int(got_q[tuple(i)]):02x}, "
                             f"want 0x{int(want_q[tuple(i)]):02x} ({int(bad.sum())} differ)")
