"""fp8_group_quant: per-token-group FP8 (e4m3) quantization.

x [tokens, hidden] (bf16/fp16, rows may be strided) -> q [tokens, hidden] float8_e4m3fn and
fp32 scales, one per group of ``group`` consecutive elements of a row:

    absmax = max |x| over the group (NaN elements ignored)
    scale  = fp32(max(absmax, fp32(eps)) / 448)        ue8m0: 2 ** ceil(log2(max(absmax, eps) / 448))
    q      = e4m3(fp32(x / scale))   fp32 division rounded to nearest, then rounded to nearest
                                     even e4m3, saturated to +-448

which is what torch's ``(x.double() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)`` gives
bit for bit: torch converts a float64 to e4m3 through fp32, and rounding the exact quotient to
fp64 and then to fp32 equals rounding it to fp32 once. (It is not always the correctly rounded
e4m3 of the exact quotient: a quotient just off an e4m3 midpoint can round to the midpoint in
fp32 first; fp32 kernels that divide and then convert behave the same way.)

Scale layouts (``scale_layout``), element (token t, group g):
- ``row_major``: scales [tokens, hidden/group] contiguous, at t * (hidden/group) + g.
- ``col_major_tma``: the column-major, TMA-aligned layout DeepGEMM-style FP8 GEMMs read: a buffer
  [hidden/group, tokens_padded] with tokens_padded = tokens rounded up to a multiple of 4 (16
  bytes), element at g * tokens_padded + t. The kernel argument is its transposed view
  ``buf.t()[:tokens]`` (shape [tokens, hidden/group], strides (1, tokens_padded)); the padding
  entries t >= tokens are not written.

Non-finite inputs (documented policy, same in the reference): NaN elements do not count in the
absmax and quantize to NaN (0x7F or 0xFF: compare NaN codes as NaN); an infinite element makes its
group's scale +inf, its code NaN and every finite code of the group +-0. With ue8m0 the scale of a
finite group is a power of two (exact in fp32 and in E8M0).
``eps`` is rounded to fp32 (as the kernel uses it) and must lie in [1e-20, 1], so that every
scale, and the UE8M0 rounding read off its bits, stays in the normal fp32 range.

Work split: chunked_rows.py (as act_and_mul); a group is ``group / vec`` consecutive lanes of a
warp, and its absmax is a butterfly max over only those lanes (log2 of that many shuffle rounds).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...archs import Arch
from ...errors import ConfigError
from ..act_and_mul.tuning import (
    DECODE_MAX_VECS,
    DECODE_THREADS,
    FP8_GROUP_DECODE_WARPS_PER_SM,
    NARROW_PREFILL_MAX_VECS,
    NARROW_PREFILL_THREADS,
    NARROW_ROW_VECTORS,
    PREFILL_MAX_VECS,
    PREFILL_THREADS,
)
from ..base import KernelFamily, choice
from ..chunked_rows import chunk_split, chunked_plan, decode_variants
from ..rowwise import access_bytes, vector_width
from ..spec import DTYPES, Dim, Launch, TensorArg, Variant

__all__ = ["Fp8GroupQuantConfig", "Fp8GroupQuant", "SCALE_LAYOUTS", "FP8_MAX", "quant_args",
           "quant_variants", "validate_quant"]

SCALE_LAYOUTS = ("row_major", "col_major_tma")
FP8_MAX = 448.0
MIN_EPS = 1e-20
MAX_HIDDEN = 32768
_DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True)
class Fp8GroupQuantConfig:
    hidden: int
    group: int = choice(64, 128, default=128, doc="elements per scale")
    dtype: str = choice(*_DTYPES, default="bfloat16", doc="input dtype")
    scale_layout: str = choice(*SCALE_LAYOUTS, default="row_major", doc="layout of the scales")
    ue8m0: bool = False  # scales rounded up to a power of two
    eps: float = 1e-10  # lower bound of the absmax (all-zero groups)


def validate_quant(family: str, c, width_field: str, width: int) -> None:
    if not 0 < width <= MAX_HIDDEN or width % c.group:
        raise ConfigError(
            family, width_field,
            f"{width} is not supported; use a multiple of group={c.group} up to {MAX_HIDDEN}",
        )
    if not MIN_EPS <= c.eps <= 1.0:
        raise ConfigError(family, "eps", f"must be in [{MIN_EPS}, 1] (got {c.eps})")


def quant_args(c, arch: Arch, width: int, x_width: int) -> tuple[TensorArg, ...]:
    """x [tokens, x_width], q [tokens, width] e4m3, scales [tokens, width/group] fp32."""
    tokens = Dim("tokens")
    vec = vector_width(c.dtype, access_bytes(arch, width * DTYPES[c.dtype].bits // 8))
    groups = width // c.group
    x_stride = Dim("x_row_stride", width=64, divisibility=vec)
    q_stride = Dim("q_row_stride", width=64, divisibility=vec)
    if c.scale_layout == "row_major":
        scales = TensorArg("scales", "float32", (tokens, groups), (groups, 1), 4, role="output",
                           layout="row_major")
    else:
        padded = Dim("scales_tokens_padded", width=64, divisibility=4)
        scales = TensorArg("scales", "float32", (tokens, groups), (1, padded), 16, role="output",
                           layout="col_major_tma")
    return (
        TensorArg("x", c.dtype, (tokens, x_width), (x_stride, 1), vec * DTYPES[c.dtype].bits // 8,
                  role="input"),
        TensorArg("q", "float8_e4m3fn", (tokens, width), (q_stride, 1), vec, role="output"),
        scales,
    )


def quant_variants(c, arch: Arch, width: int, params: tuple[str, ...], *,
                   narrow_prefill: bool = False, decode_only: bool = False) -> tuple[Variant, ...]:
    """decode, prefill and mid (chunked_rows.decode_variants); with `narrow_prefill`, a row of
    at most NARROW_ROW_VECTORS vectors takes the narrow prefill shape (fp8_group_quant:
    measured, act_and_mul/tuning.py). With `decode_only` (a family that plans the decode shape
    at every size): decode, mid and bulk, the decode shape without its PDL instructions
    (chunked_rows.bulk_variant), and no prefill shape, which its plan would never pick."""
    vec = vector_width(c.dtype, access_bytes(arch, width * DTYPES[c.dtype].bits // 8))
    prefill = (PREFILL_THREADS, PREFILL_MAX_VECS)
    if narrow_prefill and width // vec <= NARROW_ROW_VECTORS:
        prefill = (NARROW_PREFILL_THREADS, NARROW_PREFILL_MAX_VECS)
    shapes = [("decode", DECODE_THREADS, DECODE_MAX_VECS)]
    if not decode_only:
        shapes.append(("prefill", *prefill))
    out = []
    for name, threads, vecs in shapes:
        split = chunk_split(width // vec, threads, vecs)
        constants = {**split.constants(), "vec": vec, "group_lanes": c.group // vec}
        out.append(Variant(name, (split.threads, 1, 1), params=params, constants=constants))
    decode, *others = decode_variants(out[0], bulk=decode_only)
    return (decode, *out[1:], *others)


class Fp8GroupQuant(KernelFamily):
    name = "fp8_group_quant"
    Config = Fp8GroupQuantConfig
    plan_choices = ("decode", "mid", "prefill")
    device_module = "rose_aot.kernels.fp8_group_quant.device"
    shape_fields = ("hidden",)

    def validate(self, c: Fp8GroupQuantConfig) -> None:
        validate_quant(self.name, c, "hidden", c.hidden)

    def args(self, c: Fp8GroupQuantConfig, arch: Arch) -> tuple[TensorArg, ...]:
        return quant_args(c, arch, c.hidden, c.hidden)

    def variants(self, c: Fp8GroupQuantConfig, arch: Arch) -> tuple[Variant, ...]:
        return quant_variants(c, arch, c.hidden, tuple(a.name for a in self.args(c, arch)),
                              narrow_prefill=True)

    def plan(self, c, variants, sizes, sm_count, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        chosen = chunked_plan(variants, sizes["tokens"], sm_count,
                              FP8_GROUP_DECODE_WARPS_PER_SM, force)
        return () if chosen is None else (chosen,)
