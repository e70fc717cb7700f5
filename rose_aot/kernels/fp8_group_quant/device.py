"""CuTeDSL device code of the FP8 group quantization families (fp8_group_quant, and
act_and_mul_fp8_quant through ``build(..., activation=...)``). See family.py for the math."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm

from ...archs import Arch
from ..act_and_mul.device import activate, load_chunk, store_chunk
from ..device_utils import chunk_coords, pdl_epilogue, pdl_prologue, quotient, quotient_factors
from ..spec import Variant
from .family import FP8_MAX

__all__ = ["host_function", "build", "butterfly_max", "group_scale", "ue8m0_scale"]


@cute.jit
def butterfly_max(value: Float32, lanes: cutlass.Constexpr) -> Float32:
    """Max over aligned groups of `lanes` consecutive lanes (a power of two <= 32); every lane
    of a group gets the group's max. NaN-quiet (max.f32 returns the other operand)."""
    offset = lanes // 2
    for _ in cutlass.range_constexpr(lanes.bit_length() - 1):
        value = cute.arch.fmax(value, cute.arch.shuffle_sync_bfly(value, offset=offset))
        offset = offset // 2
    return value


def ue8m0_scale(m: Float32) -> Float32:
    """2 ** ceil(log2(m / 448)) for a normal positive fp32 m, exactly, from its bits:
    m = 1.f * 2**e, and m / 448 = (1.f / 1.75) * 2**(e-8), so the power is e - 8 when
    1.f <= 1.75 (mantissa field <= 0x600000) and e - 7 otherwise. +inf stays +inf."""
    return Float32(
        llvm.inline_asm(
            Float32.mlir_type,
            [m.ir_value()],
            "{\n"
            ".reg .b32 b, e, f;\n"
            ".reg .pred p, inf;\n"
            "mov.b32 b, $1;\n"
            "shr.u32 e, b, 23;\n"
            "and.b32 f, b, 0x7FFFFF;\n"
            "setp.eq.u32 inf, e, 255;\n"
            "setp.gt.u32 p, f, 0x600000;\n"
            "sub.u32 e, e, 8;\n"
            "@p add.u32 e, e, 1;\n"
            "shl.b32 e, e, 23;\n"
            "@inf mov.b32 e, b;\n"
            "mov.b32 $0, e;\n"
            "}",
            "=f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@cute.jit
def group_scale(amax: Float32, lanes: cutlass.Constexpr, eps: cutlass.Constexpr,
                ue8m0: cutlass.Constexpr) -> Float32:
    """The scale of a group from one lane's absmax (the group is `lanes` consecutive lanes, so
    the whole warp calls it): max(group absmax, eps) / 448, or its UE8M0 rounding up."""
    amax = butterfly_max(amax, lanes)
    m = cute.arch.fmax(amax, Float32(eps))
    if const_expr(ue8m0):
        scale = ue8m0_scale(m)
    else:
        scale = m / Float32(FP8_MAX)
    return scale


def build(config, variant: Variant, arch: Arch, width: int, activation: str | None):
    """Launcher of one variant: x [tokens, (2*)width], q [tokens, width], scales, grid, stream."""
    k = variant.constants
    vec = k["vec"]
    row_threads = k["row_threads"]
    per_thread = k["vecs_per_thread"]
    rows = k["rows_per_block"]
    exact = k["exact"]
    lanes = k["group_lanes"]
    chunk = row_threads * per_thread
    vectors = width // vec
    eps = float(config.eps)
    ue8m0 = bool(config.ue8m0)
    block = list(variant.block)
    smem_bytes = variant.smem
    pdl = variant.pdl
    late = bool(k.get("pdl_late", 0))  # the `mid` variant (chunked_rows.decode_variants)

    @cute.kernel
    def fp8_group_quant_kernel(mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor):
        # mX: [tokens, width] (or [tokens, 2*width] gate|up with an activation); mQ: [tokens,
        # width] e4m3; mS: [tokens, width/group] fp32 in the config's scale layout
        pdl_prologue(pdl, late)
        tidx, _, _ = cute.arch.thread_idx()
        row_block, col = chunk_coords(k["col_blocks"], k["chunks_in_x"])
        row = row_block * rows + tidx // row_threads
        first = col * chunk + tidx % row_threads
        valid = row < mX.shape[0]

        gX = cute.zipped_divide(mX[row, None], (vec,))
        tXrX = cute.make_rmem_tensor((vec, per_thread), mX.element_type)
        tXrX.fill(0)
        load_chunk(gX, tXrX, first, row_threads, per_thread, vectors, exact, valid)
        tYrY = cute.make_rmem_tensor((vec, per_thread), Float32)
        if const_expr(activation is None):
            tYrY.store(tXrX.load().to(Float32))
        else:
            tBrB = cute.make_rmem_tensor((vec, per_thread), mX.element_type)
            tBrB.fill(0)
            load_chunk(gX, tBrB, first + vectors, row_threads, per_thread, 2 * vectors, exact,
                       valid)
            a = tXrX.load().to(Float32)
            tYrY.store(activate(a, activation) * tBrB.load().to(Float32))

        for i in cutlass.range_constexpr(per_thread):
            amax = Float32(0.0)
            for j in cutlass.range_constexpr(vec):
                amax = cute.arch.fmax(amax, cute.math.absf(tYrY[j, i]))
            scale = group_scale(amax, lanes, eps, ue8m0)
            divisor, recip = quotient_factors(scale)
            for j in cutlass.range_constexpr(vec):
                tYrY[j, i] = quotient(tYrY[j, i], divisor, recip)
            idx = first + i * row_threads
            if valid and idx < vectors and (tidx % lanes) == 0:
                mS[row, idx // lanes] = scale

        tQrQ = cute.make_rmem_tensor((vec, per_thread), mQ.element_type)
        tQrQ.store(tYrY.load().to(mQ.element_type))
        gQ = cute.zipped_divide(mQ[row, None], (vec,))
        store_chunk(tQrQ, gQ, first, row_threads, per_thread, vectors, exact, valid)
        pdl_epilogue(pdl, late)

    @cute.jit
    def launch(
        mX: cute.Tensor,
        mQ: cute.Tensor,
        mS: cute.Tensor,
        grid_x: Int32,
        grid_y: Int32,
        grid_z: Int32,
        stream: cuda.CUstream,
    ):
        fp8_group_quant_kernel(mX, mQ, mS).launch(
            grid=[grid_x, grid_y, grid_z], block=block, smem=smem_bytes, stream=stream
        )

    return launch


def host_function(config, variant: Variant, arch: Arch):
    return build(config, variant, arch, config.hidden, None)
