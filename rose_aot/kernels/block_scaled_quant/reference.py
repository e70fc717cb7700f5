"""Float64/float32 torch reference of the block-scaled formats (MXFP8, MXFP4, NVFP4). No cutlass.

Mirrors the definitions in family.py with torch ops whose rounding is exact or IEEE
round-to-nearest (float32 multiply and divide), and its own e2m1 rounding (torch has the packed
dtype but no conversion to it).
"""

from __future__ import annotations

__all__ = ["E2M1_VALUES", "e2m1_codes", "pack_e2m1", "mx_exponents", "swizzle_offsets", "reference"]

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # code 0..7; bit 3 is the sign
_MAX = {"mxfp8": 448.0, "mxfp4": 6.0, "nvfp4": 6.0}
BLOCK = {"mxfp8": 32, "mxfp4": 32, "nvfp4": 16}


def e2m1_codes(v):
    """4-bit codes of float tensor v: round to nearest, ties to the even code, saturating at 6;
    the sign bit is kept for zeros and values rounding to zero."""
    import torch

    table = torch.tensor(E2M1_VALUES, dtype=torch.float64, device=v.device)
    a = v.double().abs().clamp(max=6.0)
    lo = torch.bucketize(a, table, right=True) - 1  # table[lo] <= a
    hi = (lo + 1).clamp(max=7)
    below, above = a - table[lo], table[hi] - a
    tie = torch.where(lo % 2 == 0, lo, hi)  # the even code
    mag = torch.where(below < above, lo, torch.where(above < below, hi, tie))
    sign = torch.signbit(v).long() * 8
    return (mag + sign).to(torch.uint8)


def pack_e2m1(codes):
    """[..., 2n] codes -> [..., n] bytes, element 2i in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch_uint8())


def torch_uint8():
    import torch

    return torch.uint8


def mx_exponents(amax, max_value: float):
    """e = ceil(log2(max(amax, 2^-126) / max_value)) clamped to [-127, 127], exactly: with
    M = fM 2^eM and max_value = fV 2^eV (frexp), e = eM - eV + (fM > fV)."""
    import torch

    m = amax.double().clamp(min=2.0**-126)
    fm, em = torch.frexp(m)
    fv, ev = torch.frexp(torch.tensor(max_value, dtype=torch.float64, device=amax.device))
    e = em - ev + (fm > fv).to(em.dtype)
    return e.clamp(-127, 127)


def swizzle_offsets(rows_padded: int, groups_padded: int, device="cpu"):
    """Offset of scale (m, k) in the 128x4 swizzled layout, as a [rows_padded, groups_padded]
    int64 tensor: (m/128)*K4*512 + (k/4)*512 + (m%32)*16 + ((m%128)/32)*4 + k%4."""
    import torch

    m = torch.arange(rows_padded, device=device).unsqueeze(1)
    k = torch.arange(groups_padded, device=device).unsqueeze(0)
    k4 = groups_padded // 4
    return (m // 128) * k4 * 512 + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4


def _absmax(blocks):
    import torch

    return torch.where(torch.isnan(blocks), torch.zeros_like(blocks), blocks.abs()).amax(dim=-1)


def quantize(config, x, global_scale=None):
    """(data bytes [T, H or H/2] uint8, scale bytes [T, G] uint8) of x [T, H]."""
    import torch

    t, h = x.shape
    block = BLOCK[config.format]
    blocks = x.double().reshape(t, h // block, block)
    amax = _absmax(blocks)
    if config.format in ("mxfp8", "mxfp4"):
        e = mx_exponents(amax, _MAX[config.format])
        scale_bytes = (e + 127).to(torch.uint8)
        q = blocks * torch.ldexp(torch.ones_like(amax), -e).unsqueeze(-1)  # exact
    else:
        g = global_scale.float().reshape(())
        s = (amax.float() * g) / 6.0  # float32 multiply, then float32 divide
        sb = s.clamp(max=448.0).to(torch.float8_e4m3fn)
        scale_bytes = sb.view(torch.uint8)
        sbf = sb.float().unsqueeze(-1)
        # the block's factor, a float32 divide (0 for a zero scale), then a float32 multiply
        # per element (x * 0 keeps x's sign)
        factor = torch.where(sbf == 0, torch.zeros_like(sbf), g / sbf)
        q = (blocks.float() * factor).double()
    if config.format == "mxfp8":
        data = q.float().clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
        data = data.reshape(t, h)
    else:
        data = pack_e2m1(e2m1_codes(q.reshape(t, h)))
    return data, scale_bytes


def reference(config, *tensors) -> None:
    """Writes q and scales (and leaves the inputs) like the kernel: scales in the config's
    layout; the swizzled layout's padding entries are not written."""
    if config.format == "nvfp4":
        x, global_scale, q, scales = tensors
    else:
        x, q, scales = tensors
        global_scale = None
    data, sbytes = quantize(config, x, global_scale)
    q.view(torch_uint8()).copy_(data)
    if config.scale_layout == "row_major":
        scales.view(torch_uint8()).copy_(sbytes)
        return
    t, g = sbytes.shape
    rows_padded, groups_padded = scales.shape
    offsets = swizzle_offsets(rows_padded, groups_padded, scales.device)[:t, :g]
    flat = scales.view(torch_uint8()).reshape(-1)
    flat[offsets.reshape(-1)] = sbytes.reshape(-1)
