"""CuTeDSL device code of block_scaled_quant (see family.py for the formats and layouts)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint8, Uint32, const_expr

from ...archs import Arch
from ..act_and_mul.device import load_chunk, store_chunk
from ..fp8_group_quant.device import butterfly_max
from ..device_utils import chunk_coords, pdl_epilogue, pdl_prologue, pure_asm, quotient
from ..spec import Variant

__all__ = ["host_function", "E2M1_WORD_PTX", "MX_E2M1_WORD_PTX", "ABSMAX_BF16X2_STEP_PTX",
           "BF16X2_LARGER_LANE_PTX", "SIXTH", "NVFP4_SCALE_BYTE_PTX", "E4M3_BYTE_VALUE_PTX",
           "E4M3_RECIPROCAL_PTX"]

# max representable value = 1.f * 2**K: mantissa field of 1.f and K, per data format
_MX = {"mxfp8": (8, 0x600000), "mxfp4": (2, 0x400000)}
def _e2m1_bf16x2_lanes(a: str, out: str) -> list[str]:
    """PTX lines: register `out` = the unsigned e2m1 codes of the two bf16 lanes of register
    `a` (|x|, both lanes >= 0, NaN-free after the first min), in bits 0-2 and 16-18. Both lanes
    at once in 16-bit lanes:
    - c = min(a, 6); codes below 1 from fma(min(c, 1), 2, 128), whose one bf16 rounding lands
      on the integer round-half-even(2 min(c, 1)) (128 + k is 0x4300 + k);
    - codes from 1 up from h = max(c, 1) rounded to one mantissa bit by Veltkamp's splitting in
      bf16 arithmetic: v = 65 h, r = v - (v - h), each rounded to nearest even, is h rounded to
      nearest even at 2 significant bits (the CPU suite runs this text on every bf16 value);
      r's bits shifted right by 6 are 254 + (code - 2) per lane (its 6 lowest bits are zero, so
      nothing crosses from the upper lane);
    - the code is the sum of both parts minus 0x4300 + 254 per lane (no lane borrows).
    The splitting runs on the FMA pipe: the FP4 kernels are bound by the ALU pipe on the H200
    (benchmarks/results/ncu-*-prefill-c2d61cf-7168x8192-h200.csv), and the integer rounding it
    replaces took 6 ALU instructions per pair. Temporaries: c, lo, hi, t, v, d, k."""
    # packed-type operands are registers (PTX takes no bf16x2 immediates)
    return [
        "mov.b32 k, 0x40C040C0;", f"min.bf16x2 c, {a}, k;",  # 6.0
        "mov.b32 k, 0x3F803F80;", "min.bf16x2 lo, c, k;", "max.bf16x2 hi, c, k;",  # 1.0
        "mov.b32 k, 0x40004000;", "mov.b32 t, 0x43004300;",
        "fma.rn.bf16x2 t, lo, k, t;",  # 2 lo + 128
        "mov.b32 k, 0x42824282;", "mov.b32 d, 0x80008000;",  # 65.0, -0.0
        "fma.rn.bf16x2 v, hi, k, d;",  # v = 65 h
        "mov.b32 k, 0xBF80BF80;",  # -1.0
        "fma.rn.bf16x2 d, hi, k, v;",  # v - h
        "fma.rn.bf16x2 d, d, k, v;",  # v - (v - h): h at 2 significant bits
        "shr.b32 d, d, 6;",
        "add.u32 t, t, d;", f"sub.u32 {out}, t, 0x43FE43FE;",
    ]


def _e2m1_word(codes: list[str], signs: list[str]) -> list[str]:
    """PTX lines: $0 = 4 bytes of e2m1 codes, byte j = the codes of pair j (register codes[j],
    from _e2m1_bf16x2_lanes; low lane in the low nibble), each lane's sign from bit 15 of that
    lane of signs[j]. Two pairs at a time: their codes in one word (one multiply-add, FMA
    pipe), their 4 sign bits gathered by one byte permute, both lanes folded into 2 bytes (in
    MXFP4's prefill SASS, 41 ALU instructions fewer per 32 elements than a byte per pair)."""
    lines = []
    for j, out in ((0, "w01"), (2, "w23")):
        lines += [
            f"mad.lo.u32 {out}, {codes[j + 1]}, 256, {codes[j]};",  # codes at bits 0/8/16/24
            # sign bytes (x_j lo, x_j+1 lo, x_j hi, x_j+1 hi): signs at bits 7/15/23/31
            f"prmt.b32 s, {signs[j]}, {signs[j + 1]}, 0x7351;",
            "shr.b32 s, s, 4;", "and.b32 s, s, 0x08080808;", f"or.b32 {out}, {out}, s;",
            f"shr.b32 s, {out}, 12;", f"or.b32 {out}, {out}, s;",  # upper lanes to bits 4-7, 12-15
        ]
    return lines + ["prmt.b32 $0, w01, w23, 0x5410;"]


def _round_to_odd_bf16x2(lo: str, hi: str, out: str) -> list[str]:
    """PTX lines: `out` = the fp32 registers lo, hi rounded to odd at bf16 precision, in one
    word (lo in the low lane): the upper halves of their bits (bf16 truncations, signs kept)
    with the lowest bit set where the dropped lower half was not zero. Rounding to odd at 8
    bits and then to nearest at e2m1's 2 gives the same result as one rounding to nearest
    (8 >= 2 + 2; Boldo and Melquiond): a value just above a rounding midpoint stays above it,
    an exact midpoint stays exact. Temporaries: d, k."""
    return [
        f"prmt.b32 {out}, {lo}, {hi}, 0x7632;",  # (hi's upper half, lo's upper half)
        f"prmt.b32 d, {lo}, {hi}, 0x5410;",  # the dropped lower halves
        "mov.b32 k, 0x00010001;", "min.u16x2 d, d, k;",  # 1 where a lower half is not 0
        f"or.b32 {out}, {out}, d;",
    ]


_TEMPS = ".reg .b32 a, c, lo, hi, t, v, d, k, s;"


def _e2m1_word_ptx() -> str:
    """PTX of the sm_90a `e2m1_word`: $0 = 4 bytes, byte j = e2m1($2j+1) | e2m1($2j+2) << 4 for
    fp32 $1 .. $8: each pair rounded to odd at bf16 precision (_round_to_odd_bf16x2), then the
    codes of the bf16 pair (_e2m1_bf16x2_lanes), packed by _e2m1_word. Saturating at 6 (+-inf
    too; NaN gives 6, sign kept); -0 and negatives that round to 0 keep their sign."""
    lines = ["{", _TEMPS, ".reg .b32 w0, w1, w2, w3, q0, q1, q2, q3, w01, w23;"]
    for j in range(4):
        lines += _round_to_odd_bf16x2(f"${2 * j + 1}", f"${2 * j + 2}", f"w{j}")
        lines += [f"abs.bf16x2 a, w{j};", *_e2m1_bf16x2_lanes("a", f"q{j}")]
    lines += _e2m1_word([f"q{j}" for j in range(4)], [f"w{j}" for j in range(4)])
    return "\n".join(lines + ["}"])


E2M1_WORD_PTX = _e2m1_word_ptx()


def _mx_e2m1_word_ptx() -> str:
    """PTX of `mx_e2m1_word`: $0 = 4 bytes, byte j = e2m1(x.lo * s) | e2m1(x.hi * s) << 4 for
    the word x = $(j+1) of two bf16, $5 = bf16x2 (s, s), s a power of two (MXFP4 on sm_90a,
    bf16 input). Exact: x * s is a bf16 number (a power-of-two multiple of one; tiny products
    may flush, to a signed zero, which is their code anyway); the codes follow from its bits
    (_e2m1_bf16x2_lanes), the sign of each lane from x, packed by _e2m1_word."""
    lines = ["{", _TEMPS, ".reg .b32 q0, q1, q2, q3, w01, w23;"]
    for j in range(4):
        lines += ["mov.b32 k, 0x80008000;", f"fma.rn.bf16x2 a, ${j + 1}, $5, k;",
                  "abs.bf16x2 a, a;", *_e2m1_bf16x2_lanes("a", f"q{j}")]
    lines += _e2m1_word([f"q{j}" for j in range(4)], [f"${j + 1}" for j in range(4)])
    return "\n".join(lines + ["}"])


MX_E2M1_WORD_PTX = _mx_e2m1_word_ptx()
# fp32(1 / 6) rounded to nearest (0x3E2AAAAB): NVFP4's scale is quotient(m, 6, SIXTH), m the
# block's fp32(absmax * g), exact like a division but without its slow-path branch
SIXTH = 1.0 / 6.0
# $0 = byte of e4m3($2) for $2 = quotient($1, 6, SIXTH): satfinite, so NaN stays NaN and large
# values give 448, as the division did; $1 = +inf gives +inf (its quotient would be NaN).
NVFP4_SCALE_BYTE_PTX = "\n".join([
    "{", ".reg .f32 q, z;", ".reg .b16 h;", ".reg .pred p;",
    "setp.eq.f32 p, $1, 0f7F800000;", "selp.f32 q, 0f7F800000, $2, p;",
    "mov.f32 z, 0f00000000;", "cvt.rn.satfinite.e4m3x2.f32 h, z, q;", "cvt.u32.u16 $0, h;", "}",
])
# $0 = the fp32 value of the e4m3 byte $1 (exact: e4m3 -> f16 -> f32)
E4M3_BYTE_VALUE_PTX = "\n".join([
    "{", ".reg .b16 h, l, u;", ".reg .b32 w;", "cvt.u16.u32 h, $1;",
    "cvt.rn.f16x2.e4m3x2 w, h;", "mov.b32 {l, u}, w;", "cvt.f32.f16 $0, l;", "}",
])
# $0 = fp32(1 / $1) rounded to nearest for an e4m3 value $1 > 0 (2^-9 .. 448), and 0 for 0: the
# fast path of div.rn's reciprocal (MUFU.RCP, within 1 ulp, then one Newton step), without its
# range check and slow-path call, which only denormals, huge values and inf/NaN need; the CPU
# suite checks the step for every e4m3 value and every start within 1 ulp
# (tests/test_quant_arithmetic_cpu.py).
E4M3_RECIPROCAL_PTX = "\n".join([
    "{", ".reg .f32 r, e, n;", ".reg .pred p;",
    "rcp.approx.ftz.f32 r, $1;", "neg.f32 n, $1;", "fma.rn.f32 e, n, r, 0f3F800000;",
    "fma.rn.f32 r, r, e, r;", "setp.eq.f32 p, $1, 0f00000000;", "selp.f32 $0, 0f00000000, r, p;",
    "}",
])
# $0 = lane-wise max of $1 and |$2| for bf16x2 words (max.bf16x2 returns the non-NaN operand)
ABSMAX_BF16X2_STEP_PTX = "{\n.reg .b32 w;\nabs.bf16x2 w, $2;\nmax.bf16x2 $0, $1, w;\n}"
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


def e2m1_native_pair(lo: Float32, hi: Float32) -> Uint32:
    """sm_100a: byte holding e2m1(lo) in bits 0-3 and e2m1(hi) in bits 4-7 (nearest even,
    saturating); the first source operand of the conversion goes to the upper nibble."""
    text = "{\n.reg .b8 t;\ncvt.rn.satfinite.e2m1x2.f32 t, $2, $1;\ncvt.u32.u8 $0, t;\n}"
    return Uint32(pure_asm(Uint32.mlir_type, [lo, hi], text, "=r,f,f"))


def e2m1_word(values: list) -> Uint32:
    """sm_90a: 4 bytes of e2m1 codes of 8 fp32 values, byte j = e2m1(values[2j]) |
    e2m1(values[2j + 1]) << 4 (E2M1_WORD_PTX)."""
    return Uint32(pure_asm(Uint32.mlir_type, values, E2M1_WORD_PTX, "=r" + ",f" * 8))


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
    # MXFP4 from bf16 on sm_90a: two elements per instruction in bf16x2 (MX_E2M1_WORD_PTX)
    packed = fmt == "mxfp4" and not native and config.dtype == "bfloat16"
    # sm_90a, bf16 input: each group's absmax in bf16x2 pairs (exact: the largest |x| is a bf16
    # value either way), one max per two elements (ABSMAX_BF16X2_STEP_PTX)
    packed_absmax = not native and config.dtype == "bfloat16"
    k_tiles = groups_padded // 4
    block = list(variant.block)
    smem_bytes = variant.smem
    pdl = variant.pdl
    late = bool(kc.get("pdl_late", 0))  # the `mid` variant (chunked_rows.decode_variants)

    @cute.jit
    def body(mX: cute.Tensor, mG, mQ: cute.Tensor, mS: cute.Tensor):
        # mX: [tokens, hidden]; mG: [1] fp32 (nvfp4); mQ: [tokens, hidden or hidden/2] bytes;
        # mS: scales, [tokens, groups] or swizzled [rows_padded, groups_padded]
        tidx, _, _ = cute.arch.thread_idx()
        row_block, col = chunk_coords(kc["col_blocks"], kc["chunks_in_x"])
        row = row_block * rows + tidx // row_threads
        first = col * chunk + tidx % row_threads
        valid = row < mX.shape[0]

        gX = cute.zipped_divide(mX[row, None], (vec,))
        tXrX = cute.make_rmem_tensor((vec, per_thread), mX.element_type)
        tXrX.fill(0)
        load_chunk(gX, tXrX, first, row_threads, per_thread, vectors, exact, valid)
        tYrY = cute.make_rmem_tensor((vec, per_thread), Float32)
        tW = cute.recast_tensor(tXrX, Uint32)  # (vec / 2, per_thread) bf16x2 words
        if const_expr(fmt == "nvfp4" and packed_absmax):
            # bf16 to fp32 by one instruction per element, the upper lane by a mask: the
            # generic conversion takes a byte permute and a shift for it (573 -> 557 SASS
            # instructions per 32 elements at 7168 wide; NVFP4 0.9-3.5% faster from 8192
            # tokens on the H200, benchmarks/results/fp4-conversion-experiment-h200.md).
            # MXFP8 keeps the generic conversion: the same change made it 1-4% slower at
            # hidden 2048-4096.
            for i in cutlass.range_constexpr(per_thread):
                for j in cutlass.range_constexpr(vec // 2):
                    tYrY[2 * j, i] = Float32(pure_asm(Float32.mlir_type, [tW[j, i]],
                                                      "shl.b32 $0, $1, 16;", "=f,r"))
                    tYrY[2 * j + 1, i] = Float32(pure_asm(Float32.mlir_type, [tW[j, i]],
                                                          "and.b32 $0, $1, 0xFFFF0000;", "=f,r"))
        elif const_expr(not packed):
            tYrY.store(tXrX.load().to(Float32))
        tQrQ = cute.make_rmem_tensor((data_vec, per_thread), Uint8 if fp4 else mQ.element_type)
        if const_expr(fp4 and not native):
            # sm_90a writes the FP4 codes a word (8 values) at a time
            if const_expr(data_vec % 4):
                raise ValueError(f"block_scaled_quant: {vec} values per access are not whole "
                                 "32-bit words of FP4 codes")
            tQw = cute.recast_tensor(tQrQ, Uint32)  # (data_vec / 4, per_thread)
        g = Float32(1.0)
        if const_expr(fmt == "nvfp4"):
            g = mG[0]
        # scales are stored as bytes (NVFP4's e4m3 byte comes from inline PTX)
        mSb = cute.make_tensor(cute.recast_ptr(mS.iterator, dtype=Uint8), mS.layout)
        if const_expr(swizzled):
            # the scales as one flat array and this row's part of the swizzled offset, once
            # per thread (a 2-D index costs a division by groups_padded per store)
            sFlat = cute.make_tensor(mSb.iterator, cute.make_layout(mS.shape[0] * groups_padded))
            # vector i of the thread is group k0 + i * row_threads / lanes, a multiple of 4
            # groups further: its offset is the first one's plus i x a constant
            if const_expr((row_threads // lanes) % 4):
                raise ValueError(f"block_scaled_quant: {row_threads} threads of {lanes} lanes "
                                 "per group do not step whole 4-group tiles")
            k0 = first // lanes
            offset0 = ((row // 128) * k_tiles * 512 + (row % 32) * 16 + ((row % 128) // 32) * 4
                       + (k0 // 4) * 512 + k0 % 4)
            offset_step = (row_threads // lanes // 4) * 512

        tScale = cute.make_rmem_tensor((per_thread,), Uint8)
        for i in cutlass.range_constexpr(per_thread):
            amax = Float32(0.0)
            if const_expr(packed_absmax):
                pair_max = Uint32(0)
                for j in cutlass.range_constexpr(vec // 2):
                    pair_max = Uint32(pure_asm(Uint32.mlir_type, [pair_max, tW[j, i]],
                                               ABSMAX_BF16X2_STEP_PTX, "=r,r,r"))
                amax = Float32(pure_asm(Float32.mlir_type, [pair_max], BF16X2_LARGER_LANE_PTX,
                                        "=f,r"))
            else:
                for j in cutlass.range_constexpr(vec):
                    amax = cute.arch.fmax(amax, cute.math.absf(tYrY[j, i]))
            amax = butterfly_max(amax, lanes)
            if const_expr(fmt == "nvfp4"):
                m = amax * g
                sixth = quotient(m, Float32(6.0), Float32(SIXTH))
                byte = Uint32(pure_asm(Uint32.mlir_type, [m, sixth], NVFP4_SCALE_BYTE_PTX,
                                       "=r,f,f"))
                value = Float32(pure_asm(Float32.mlir_type, [byte], E4M3_BYTE_VALUE_PTX,
                                         "=f,r"))
                # The block's factor fp32(g / scale), exact (device_utils.quotient; divisor
                # and reciprocal (0, 0) for a zero scale give 0, and every x a zero of its
                # sign); then ONE fp32 multiply per element, where a quotient per element,
                # fp32(x * g) / scale, took four fp32 operations (557 -> 467 SASS instructions
                # per 32 elements at 7168 wide; nvfp4-factor-experiment-h200.md).
                recip = Float32(pure_asm(Float32.mlir_type, [value], E4M3_RECIPROCAL_PTX,
                                         "=f,f"))
                factor = quotient(g, value, recip)
                for j in cutlass.range_constexpr(vec):
                    tYrY[j, i] = tYrY[j, i] * factor
                tScale[i] = Uint8(byte)
            else:
                byte = mx_scale_byte(amax, *_MX[fmt])
                inv = inverse_of_scale_byte(byte)
                if const_expr(packed):
                    inv2 = Uint32(pure_asm(Uint32.mlir_type, [inv], "cvt.rn.bf16x2.f32 $0, $1, $1;",
                                           "=r,f"))
                    for w in cutlass.range_constexpr(data_vec // 4):
                        tQw[w, i] = Uint32(pure_asm(
                            Uint32.mlir_type, [*(tW[4 * w + j, i] for j in range(4)), inv2],
                            MX_E2M1_WORD_PTX, "=r,r,r,r,r,r"))
                else:
                    for j in cutlass.range_constexpr(vec):
                        tYrY[j, i] = tYrY[j, i] * inv
                tScale[i] = Uint8(byte)

        if const_expr(fp4 and not packed):
            for i in cutlass.range_constexpr(per_thread):
                if const_expr(native):
                    for j in cutlass.range_constexpr(data_vec):
                        tQrQ[j, i] = Uint8(e2m1_native_pair(tYrY[2 * j, i], tYrY[2 * j + 1, i]))
                else:
                    for w in cutlass.range_constexpr(data_vec // 4):
                        tQw[w, i] = e2m1_word([tYrY[8 * w + j, i] for j in range(8)])
        elif const_expr(not fp4):
            tQrQ.store(tYrY.load().to(mQ.element_type))
        gQ = cute.zipped_divide(mQ[row, None], (data_vec,))
        store_chunk(tQrQ, gQ, first, row_threads, per_thread, vectors, exact, valid)
        # the scales last: a store branch between the vectors kept the compiler from issuing
        # every vector's load first (the prefill shape has 4 per thread)
        for i in cutlass.range_constexpr(per_thread):
            idx = first + i * row_threads
            if valid and idx < vectors and (tidx % lanes) == 0:
                if const_expr(swizzled):
                    if row < mS.shape[0]:
                        sFlat[offset0 + i * offset_step] = tScale[i]
                else:
                    mSb[row, idx // lanes] = tScale[i]

    @cute.kernel
    def block_scaled_quant_kernel(mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor):
        pdl_prologue(pdl, late)
        body(mX, None, mQ, mS)
        pdl_epilogue(pdl, late)

    @cute.kernel
    def nvfp4_quant_kernel(mX: cute.Tensor, mG: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor):
        pdl_prologue(pdl, late)
        body(mX, mG, mQ, mS)
        pdl_epilogue(pdl, late)

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
