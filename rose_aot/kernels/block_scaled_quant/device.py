"""CuTeDSL device code of block_scaled_quant (see family.py for the formats and layouts)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint8, Uint32, const_expr

from ...archs import Arch
from ..act_and_mul.device import load_chunk, store_chunk
from ..fp8_group_quant.device import butterfly_max
from ..device_utils import pdl_prologue, pure_asm, quotient, quotient_factors
from ..spec import Variant

__all__ = ["host_function", "E2M1_PAIR_PTX", "MX_E2M1_BF16X2_PTX", "ABSMAX_BF16X2_STEP_PTX",
           "BF16X2_LARGER_LANE_PTX"]

# max representable value = 1.f * 2**K: mantissa field of 1.f and K, per data format
_MX = {"mxfp8": (8, 0x600000), "mxfp4": (2, 0x400000)}
def _e2m1_pair_ptx() -> str:
    """PTX of the sm_90a `e2m1_pair`: $0 = e2m1($1) | e2m1($2) << 4, codes from integer
    arithmetic on the fp32 bits (about 12 instructions each; a compare per rounding threshold
    took 14 more and left the FP4 kernels compute-bound on the H200):
    - |a| < 1: the code is round-half-even(2|a|) (0, 0.5, 1.0 are codes 0, 1, 2), read off the
      bits of fma(|a|, 2, 2^23), whose one rounding lands on that integer;
    - |a| >= 1: codes 2..7 are 1.0, 1.5, 2, 3, 4, 6 in order: the fp32 bits rounded to one
      mantissa bit, ties to even (add 2^21 - 1 plus the kept bit, shift by 22), minus 252,
      capped at 7 (saturation; +inf too).
    The sign is bit 31 of the input, so -0 and negatives rounding to 0 keep it."""
    lines = ["{", ".reg .f32 af, t;", ".reg .pred p;", ".reg .b32 b, c, h, n, s, r;",
             "mov.b32 r, 0;"]
    for shift, src in ((0, "$1"), (4, "$2")):
        lines += [
            f"mov.b32 b, {src};", "and.b32 b, b, 0x7FFFFFFF;", "mov.b32 af, b;",
            "fma.rn.f32 t, af, 0f40000000, 0f4B000000;", "mov.b32 s, t;",
            "sub.u32 s, s, 0x4B000000;",
            "bfe.u32 h, b, 22, 1;", "add.u32 n, b, 0x1FFFFF;", "add.u32 n, n, h;",
            "shr.u32 n, n, 22;", "sub.u32 n, n, 252;", "min.u32 n, n, 7;",
            "setp.lt.u32 p, b, 0x3F800000;", "selp.b32 c, s, n, p;",
            f"mov.b32 s, {src};", "shr.u32 s, s, 28;", "and.b32 s, s, 8;",
            "or.b32 c, c, s;", f"shl.b32 c, c, {shift};", "or.b32 r, r, c;",
        ]
    return "\n".join([*lines, "mov.b32 $0, r;", "}"])


E2M1_PAIR_PTX = _e2m1_pair_ptx()


def _mx_e2m1_bf16x2_ptx() -> str:
    """PTX of `mx_e2m1_bf16x2`: $0 = byte of e2m1(x.lo * s) | e2m1(x.hi * s) << 4 for a word
    $1 of two bf16 and $2 = bf16x2 (s, s), s a power of two (MXFP4 on sm_90a, bf16 input).

    Both elements at once in 16-bit lanes (about 9 instructions per element against 20 for
    the fp32 path; the FP4 kernels were compute-bound on the H200). Exact: x * s is a bf16
    number (a power-of-two multiple of one; tiny products may flush, to a signed zero, which
    is their code anyway), and the code follows from its bits as in E2M1_PAIR_PTX:
    - c = min(|x s|, 6); codes below 1 from fma(min(c, 1), 2, 128), whose one bf16 rounding
      lands on the integer round-half-even(2 min(c, 1)) (128 + k is 0x4300 + k);
    - codes from 1 up from max(c, 1): its bits rounded to one mantissa bit (add 2^5 - 1 plus
      the kept bit, shift by 6) are 254 + (code - 2);
    - the code is the sum of both parts minus 0x4300 + 254 per lane (no lane borrows), the
      sign bit 15 of each lane of x becomes bit 3 of its nibble."""
    # packed-type operands are registers (PTX takes no bf16x2 immediates)
    return "\n".join([
        "{", ".reg .b32 a, c, lo, hi, t, h, n, s, k;",
        "mov.b32 k, 0x80008000;", "fma.rn.bf16x2 a, $1, $2, k;",  # x * s + -0: exact, keeps -0
        "and.b32 a, a, 0x7FFF7FFF;",
        "mov.b32 k, 0x40C040C0;", "min.bf16x2 c, a, k;",  # 6.0
        "mov.b32 k, 0x3F803F80;", "min.bf16x2 lo, c, k;", "max.bf16x2 hi, c, k;",  # 1.0
        "mov.b32 k, 0x40004000;", "mov.b32 t, 0x43004300;",
        "fma.rn.bf16x2 t, lo, k, t;",  # 2 lo + 128
        "shr.b32 h, hi, 6;", "and.b32 h, h, 0x00010001;",
        "add.u32 n, hi, 0x001F001F;", "add.u32 n, n, h;",
        "shr.b32 n, n, 6;", "and.b32 n, n, 0x01FF01FF;",
        "add.u32 t, t, n;", "sub.u32 t, t, 0x43FE43FE;",
        "shr.b32 s, $1, 12;", "and.b32 s, s, 0x00080008;", "or.b32 t, t, s;",
        "shr.b32 s, t, 12;", "or.b32 t, t, s;", "and.b32 $0, t, 0xFF;",
        "}",
    ])


MX_E2M1_BF16X2_PTX = _mx_e2m1_bf16x2_ptx()
# $0 = lane-wise max of $1 and |$2| for bf16x2 words (max.bf16x2 returns the non-NaN operand)
ABSMAX_BF16X2_STEP_PTX = "{\n.reg .b32 w;\nand.b32 w, $2, 0x7FFF7FFF;\nmax.bf16x2 $0, $1, w;\n}"
# $0 = the larger lane of the bf16x2 word $1 (both lanes >= 0), as fp32
BF16X2_LARGER_LANE_PTX = ("{\n.reg .b32 a, b;\nshl.b32 a, $1, 16;\nand.b32 b, $1, 0xFFFF0000;\n"
                          "max.f32 $0, a, b;\n}")


def mx_scale_byte(amax: Float32, k: int, fmax: int) -> Uint32:
    """E8M0 byte of 2**ceil(log2(max(amax, 2^-126) / (1.fmax * 2**k))), clamped to [0, 254]:
    exponent field E of M minus k, plus one when M's mantissa field exceeds fmax."""
    text = (
        "{\n.reg .b32 b, e, f;\n.reg .pred p;\n"
        "mov.b32 b, $1;\nmax.u32 b, b, 0x00800000;\n"
        "shr.u32 e, b, 23;\nand.b32 f, b, 0x7FFFFF;\n"
        f"setp.gt.u32 p, f, {fmax};\nsub.s32 e, e, {k};\n@p add.s32 e, e, 1;\n"
        "max.s32 e, e, 0;\nmin.s32 e, e, 254;\nmov.b32 $0, e;\n}"
    )
    return Uint32(pure_asm(Uint32.mlir_type, [amax], text, "=r,f"))


def inverse_of_scale_byte(byte: Uint32) -> Float32:
    """2**(127 - byte) as fp32 (exponent field 254 - byte; byte <= 247 for finite inputs)."""
    text = "{\n.reg .b32 t;\nsub.u32 t, 254, $1;\nshl.b32 t, t, 23;\nmov.b32 $0, t;\n}"
    return Float32(pure_asm(Float32.mlir_type, [byte], text, "=f,r"))


def zero_to_inf(value: Float32) -> Float32:
    text = "{\n.reg .pred p;\nsetp.eq.f32 p, $1, 0f00000000;\nselp.f32 $0, 0f7F800000, $1, p;\n}"
    return Float32(pure_asm(Float32.mlir_type, [value], text, "=f,f"))


def e2m1_pair(lo: Float32, hi: Float32, native: bool) -> Uint32:
    """Byte holding e2m1(lo) in bits 0-3 and e2m1(hi) in bits 4-7 (nearest even, saturating)."""
    if native:  # sm_100a: the first source operand goes to the upper nibble
        text = "{\n.reg .b8 t;\ncvt.rn.satfinite.e2m1x2.f32 t, $2, $1;\ncvt.u32.u8 $0, t;\n}"
        return Uint32(pure_asm(Uint32.mlir_type, [lo, hi], text, "=r,f,f"))
    return Uint32(pure_asm(Uint32.mlir_type, [lo, hi], E2M1_PAIR_PTX, "=r,f,f"))


def host_function(config, variant: Variant, arch: Arch):
    """Launcher of one variant: x, [global_scale,] q, scales, grid, stream."""
    kc = variant.constants
    vec = kc["vec"]
    row_threads = kc["row_threads"]
    per_thread = kc["vecs_per_thread"]
    rows = kc["rows_per_block"]
    exact = kc["exact"]
    lanes = kc["group_lanes"]
    groups_padded = kc["groups_padded"]
    native = kc["native_e2m1"]
    chunk = row_threads * per_thread
    vectors = config.hidden // vec
    fmt = config.format
    fp4 = fmt != "mxfp8"
    swizzled = config.scale_layout == "swizzled_128x4"
    data_vec = vec // 2 if fp4 else vec
    # MXFP4 from bf16 on sm_90a: two elements per instruction in bf16x2 (MX_E2M1_BF16X2_PTX)
    packed = fmt == "mxfp4" and not native and config.dtype == "bfloat16"
    k_tiles = groups_padded // 4
    block = list(variant.block)
    smem_bytes = variant.smem
    pdl = variant.pdl

    @cute.jit
    def body(mX: cute.Tensor, mG, mQ: cute.Tensor, mS: cute.Tensor):
        # mX: [tokens, hidden]; mG: [1] fp32 (nvfp4); mQ: [tokens, hidden or hidden/2] bytes;
        # mS: scales, [tokens, groups] or swizzled [rows_padded, groups_padded]
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        row = bidx * rows + tidx // row_threads
        first = bidy * chunk + tidx % row_threads
        valid = row < mX.shape[0]

        gX = cute.zipped_divide(mX[row, None], (vec,))
        tXrX = cute.make_rmem_tensor((vec, per_thread), mX.element_type)
        tXrX.fill(0)
        load_chunk(gX, tXrX, first, row_threads, per_thread, vectors, exact, valid)
        tYrY = cute.make_rmem_tensor((vec, per_thread), Float32)
        if const_expr(not packed):
            tYrY.store(tXrX.load().to(Float32))
        tW = cute.recast_tensor(tXrX, Uint32)  # (vec / 2, per_thread) bf16x2 words
        tQrQ = cute.make_rmem_tensor((data_vec, per_thread), Uint8 if fp4 else mQ.element_type)
        g = Float32(1.0)
        if const_expr(fmt == "nvfp4"):
            g = mG[0]

        for i in cutlass.range_constexpr(per_thread):
            amax = Float32(0.0)
            if const_expr(packed):
                m = Uint32(0)
                for j in cutlass.range_constexpr(vec // 2):
                    m = Uint32(pure_asm(Uint32.mlir_type, [m, tW[j, i]], ABSMAX_BF16X2_STEP_PTX,
                                        "=r,r,r"))
                amax = Float32(pure_asm(Float32.mlir_type, [m], BF16X2_LARGER_LANE_PTX, "=f,r"))
            else:
                for j in cutlass.range_constexpr(vec):
                    amax = cute.arch.fmax(amax, cute.math.absf(tYrY[j, i]))
            amax = butterfly_max(amax, lanes)
            if const_expr(fmt == "nvfp4"):
                tSrS = cute.make_rmem_tensor((2,), Float32)
                tSrS[0] = (amax * g) / Float32(6.0)
                tSrS[1] = Float32(0.0)
                tSrQ = cute.make_rmem_tensor((2,), mS.element_type)
                tSrQ.store(tSrS.load().to(mS.element_type))
                tSrS.store(tSrQ.load().to(Float32))
                divisor, recip = quotient_factors(zero_to_inf(tSrS[0]))
                for j in cutlass.range_constexpr(vec):
                    tYrY[j, i] = quotient(tYrY[j, i] * g, divisor, recip)
                scale_value = tSrQ[0]
            else:
                byte = mx_scale_byte(amax, *_MX[fmt])
                inv = inverse_of_scale_byte(byte)
                if const_expr(packed):
                    inv2 = Uint32(pure_asm(Uint32.mlir_type, [inv], "cvt.rn.bf16x2.f32 $0, $1, $1;",
                                           "=r,f"))
                    for j in cutlass.range_constexpr(data_vec):
                        tQrQ[j, i] = Uint8(pure_asm(Uint32.mlir_type, [tW[j, i], inv2],
                                                    MX_E2M1_BF16X2_PTX, "=r,r,r"))
                else:
                    for j in cutlass.range_constexpr(vec):
                        tYrY[j, i] = tYrY[j, i] * inv
                scale_value = Uint8(byte)
            idx = first + i * row_threads
            k = idx // lanes
            if valid and idx < vectors and (tidx % lanes) == 0:
                if const_expr(swizzled):
                    off = ((row // 128) * k_tiles * 512 + (k // 4) * 512 + (row % 32) * 16
                           + ((row % 128) // 32) * 4 + k % 4)
                    if row < mS.shape[0]:
                        mS[off // groups_padded, off % groups_padded] = scale_value
                else:
                    mS[row, k] = scale_value

        if const_expr(fp4 and not packed):
            for i in cutlass.range_constexpr(per_thread):
                for j in cutlass.range_constexpr(data_vec):
                    tQrQ[j, i] = Uint8(e2m1_pair(tYrY[2 * j, i], tYrY[2 * j + 1, i], native))
        elif const_expr(not fp4):
            tQrQ.store(tYrY.load().to(mQ.element_type))
        gQ = cute.zipped_divide(mQ[row, None], (data_vec,))
        store_chunk(tQrQ, gQ, first, row_threads, per_thread, vectors, exact, valid)

    @cute.kernel
    def block_scaled_quant_kernel(mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor):
        pdl_prologue(pdl)
        body(mX, None, mQ, mS)

    @cute.kernel
    def nvfp4_quant_kernel(mX: cute.Tensor, mG: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor):
        pdl_prologue(pdl)
        body(mX, mG, mQ, mS)

    if fmt == "nvfp4":

        @cute.jit
        def launch_nvfp4(mX: cute.Tensor, mG: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor,
                         grid_x: Int32, grid_y: Int32, grid_z: Int32, stream: cuda.CUstream):
            nvfp4_quant_kernel(mX, mG, mQ, mS).launch(
                grid=[grid_x, grid_y, grid_z], block=block, smem=smem_bytes, stream=stream
            )

        return launch_nvfp4

    @cute.jit
    def launch(mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor,
               grid_x: Int32, grid_y: Int32, grid_z: Int32, stream: cuda.CUstream):
        block_scaled_quant_kernel(mX, mQ, mS).launch(
            grid=[grid_x, grid_y, grid_z], block=block, smem=smem_bytes, stream=stream
        )

    return launch
