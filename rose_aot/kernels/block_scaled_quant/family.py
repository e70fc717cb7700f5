"""block_scaled_quant: the MX block-scaled formats of Blackwell's GEMMs, MXFP8 and MXFP4 (NVFP4,
whose arguments add a global scale, is the nvfp4_quant family on the same code).

x [tokens, hidden] (bf16/fp16, rows may be strided) -> data + one scale per block of a row:

- ``mxfp8``: e4m3 data, an E8M0 (power-of-two) scale per 32 elements;
- ``mxfp4``: e2m1 data packed two per byte (element 2i in the low nibble), E8M0 per 32;
- ``nvfp4`` (the nvfp4_quant family, same code): e2m1 data packed, an e4m3 scale per 16, times
  a fp32 global scale g read from a one-element tensor (the caller's choice, e.g. 448 * 6 / amax of the tensor).

Definitions (absmax ignores NaN; inputs are expected finite):
  MX:    e = ceil(log2(max(absmax, 2^-126) / M)) clamped to [-127, 127] with M = 448 (e4m3) or
         6 (e2m1): the scale rounded UP to a power of two, so no element saturates (NVIDIA's
         recipe; OCP's spec rounds down and saturates); scale byte = e + 127;
         data = round(x * 2^-e) (exact product, one rounding).
  NVFP4: s = fp32(fp32(absmax * g) / 6); scale = e4m3(s) (nearest even, saturating);
         data = e2m1(fp32(x * fp32(g / scale))), and +-0 where the scale is 0.
  e4m3 and e2m1 roundings are to nearest, ties to even, saturating (e2m1 at +-6).
The sm_100a build converts to e2m1 with the native cvt.rn.satfinite.e2m1x2.f32; the sm_90a build
rounds each fp32 pair to odd at bf16 precision and codes the pair in bf16x2 arithmetic
(Veltkamp's splitting) and a few integer instructions, 8 codes to a word (device.py
E2M1_WORD_PTX), same results. NVFP4's factor fp32(g / scale) is device_utils.quotient (the
scale's reciprocal and a correction step, once per block; exact for 2^-100 <= g <= 2^100), then
one fp32 multiply per element.

Scale layouts (``scale_layout``):
- ``swizzled_128x4`` (CUTLASS / cuBLAS block-scaled GEMMs): a [rows_padded, groups_padded]
  tensor, rows_padded = tokens rounded up to 128 (any multiple of 128 that is >= tokens),
  groups_padded = hidden/block rounded up to 4 (static); scale (m, k) sits at flat offset
  (m/128)*(groups_padded/4)*512 + (k/4)*512 + (m%32)*16 + ((m%128)/32)*4 + k%4. Padding entries
  are not written: allocate the tensor zeroed once (the GEMM reads them for the padded rows).
- ``row_major``: [tokens, hidden/block], contiguous.
Scales are float8_e8m0fnu (MX) or float8_e4m3fn (NVFP4) tensors; packed data float4_e2m1fn_x2.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...archs import Arch
from ...errors import ConfigError
from ..act_and_mul.tuning import (
    DECODE_MAX_VECS,
    DECODE_THREADS,
    MX_DECODE_WARPS_PER_SM,
    PREFILL_MAX_VECS,
    PREFILL_THREADS,
)
from ..base import KernelFamily, choice
from ..chunked_rows import chunk_split, chunked_plan, decode_variants
from ..rowwise import access_bytes, vector_width
from ..spec import DTYPES, Dim, Launch, TensorArg, Variant

__all__ = ["BlockScaledQuantConfig", "BlockScaledQuant", "FORMATS", "BLOCK"]

FORMATS = ("mxfp8", "mxfp4")  # nvfp4: the nvfp4_quant family
BLOCK = {"mxfp8": 32, "mxfp4": 32, "nvfp4": 16}
MAX_HIDDEN = 32768
# elements per unit of work of the FP4 prefill shapes (see variants)
FP4_PREFILL_UNIT = 16


@dataclass(frozen=True)
class BlockScaledQuantConfig:
    hidden: int
    format: str = choice(*FORMATS, default="mxfp8", doc="data / scale format")
    dtype: str = choice("bfloat16", "float16", default="bfloat16", doc="input dtype")
    scale_layout: str = choice("swizzled_128x4", "row_major", default="swizzled_128x4",
                               doc="layout of the scales")


def _groups_padded(c) -> int:
    groups = c.hidden // BLOCK[c.format]
    return -(-groups // 4) * 4


class BlockScaledQuant(KernelFamily):
    name = "block_scaled_quant"
    Config = BlockScaledQuantConfig
    plan_choices = ("decode", "mid", "prefill")
    device_module = "rose_aot.kernels.block_scaled_quant.device"
    shape_fields = ("hidden",)

    def validate(self, c: BlockScaledQuantConfig) -> None:
        block = BLOCK[c.format]
        if not 0 < c.hidden <= MAX_HIDDEN or c.hidden % block:
            raise ConfigError(self.name, "hidden",
                              f"{c.hidden} is not supported for {c.format}; use a multiple of "
                              f"{block} up to {MAX_HIDDEN}")

    def vec(self, c, arch: Arch) -> int:
        return vector_width(c.dtype, access_bytes(arch, c.hidden * DTYPES[c.dtype].bits // 8))

    def args(self, c: BlockScaledQuantConfig, arch: Arch) -> tuple[TensorArg, ...]:
        tokens = Dim("tokens")
        vec = self.vec(c, arch)
        fp4 = c.format != "mxfp8"
        data_dtype = "float4_e2m1fn_x2" if fp4 else "float8_e4m3fn"
        data_cols = c.hidden // 2 if fp4 else c.hidden
        data_vec = vec // 2 if fp4 else vec  # bytes of data per input vector
        scale_dtype = "float8_e4m3fn" if c.format == "nvfp4" else "float8_e8m0fnu"
        groups = c.hidden // BLOCK[c.format]
        x = TensorArg("x", c.dtype, (tokens, c.hidden),
                      (Dim("x_row_stride", width=64, divisibility=vec), 1),
                      vec * DTYPES[c.dtype].bits // 8, role="input")
        q = TensorArg("q", data_dtype, (tokens, data_cols),
                      (Dim("q_row_stride", width=64, divisibility=data_vec), 1), data_vec,
                      role="output")
        if c.scale_layout == "row_major":
            scales = TensorArg("scales", scale_dtype, (tokens, groups), (groups, 1), 1,
                               role="output", layout="row_major")
        else:
            gp = _groups_padded(c)
            rows = Dim("scale_rows_padded", divisibility=128)
            scales = TensorArg("scales", scale_dtype, (rows, gp), (gp, 1), 16, role="output",
                               layout="swizzled_128x4")
        if c.format == "nvfp4":
            g = TensorArg("global_scale", "float32", (1,), (1,), 4, role="input")
            return (x, g, q, scales)
        return (x, q, scales)

    def variants(self, c: BlockScaledQuantConfig, arch: Arch) -> tuple[Variant, ...]:
        params = tuple(a.name for a in self.args(c, arch))
        vec = self.vec(c, arch)
        out = []
        for name, threads, vecs in (
            ("decode", DECODE_THREADS, DECODE_MAX_VECS),
            ("prefill", PREFILL_THREADS, PREFILL_MAX_VECS),
        ):
            # A thread's unit of work: one access (`vec` elements), or in the FP4 prefill
            # shapes 16 elements (two 16-byte loads on sm_90a; one access on sm_100a already):
            # NVFP4's whole block, which needs no shuffle and is scaled once instead of on
            # both lanes, and half of MXFP4's, one shuffle instead of two (act_and_mul/
            # tuning.py: 2-5% and 4-13% faster; MXFP8 was slower with either unit)
            fp4 = c.format in ("nvfp4", "mxfp4")
            unit = max(vec, FP4_PREFILL_UNIT) if name == "prefill" and fp4 else vec
            split = chunk_split(c.hidden // unit, threads, max(1, vecs * vec // unit))
            if name == "prefill" and fp4 and split.rows_per_block > 1:
                # FP4 prefill blocks hold one row (64 threads at 2048 wide, 128 at 4096): with
                # several, each thread's row and its swizzled scale offset are per-thread
                # arithmetic (NVFP4 4096: 498 -> 467 SASS instructions per 32 elements, MXFP4
                # 375 -> 354; fp4-one-row-experiment-h200.md)
                split = chunk_split(c.hidden // unit, split.row_threads, max(1, vecs * vec // unit))
            constants = {**split.constants(), "vec": unit, "group_lanes": BLOCK[c.format] // unit,
                         "groups_padded": _groups_padded(c),
                         "native_e2m1": arch.capability[0] >= 10}
            out.append(Variant(name, (split.threads, 1, 1), params=params, constants=constants))
        decode, mid = decode_variants(out[0], bulk=False)
        return (decode, out[1], mid)

    def plan(self, c, variants, sizes, sm_count, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        chosen = chunked_plan(variants, sizes["tokens"], sm_count,
                              MX_DECODE_WARPS_PER_SM[c.format], force)
        return () if chosen is None else (chosen,)
