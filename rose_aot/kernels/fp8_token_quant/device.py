"""CuTeDSL device code of fp8_token_quant (see family.py for the math and the split)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from ...archs import Arch
from ..act_and_mul.device import load_chunk, store_chunk
from ..device_utils import SharedMemory, pdl_epilogue, pdl_prologue, quotient, quotient_factors
from ..fp8_group_quant.device import butterfly_max
from ..spec import Variant
from .family import FP8_MAX

__all__ = ["host_function", "segment_max"]


@cute.jit
def segment_max(value: Float32, sWarp: cute.Tensor, seg_threads: cutlass.Constexpr) -> Float32:
    """Max over aligned segments of `seg_threads` consecutive threads (a multiple of 32);
    every thread gets its segment's max. sWarp: shared fp32 scratch, one entry per warp of the
    block. Contains one block barrier; NaN-quiet like butterfly_max."""
    tidx, _, _ = cute.arch.thread_idx()
    value = butterfly_max(value, 32)
    if tidx % 32 == 0:
        sWarp[tidx // 32] = value
    cute.arch.sync_threads()
    first = tidx // seg_threads * (seg_threads // 32)
    out = sWarp[first]
    for w in cutlass.range_constexpr(1, seg_threads // 32):
        out = cute.arch.fmax(out, sWarp[first + w])
    return out


def host_function(config, variant: Variant, arch: Arch):
    """Launcher: x [tokens, hidden], q [tokens, hidden], scales [tokens, 1], grid, stream."""
    k = variant.constants
    vec = k["vec"]
    row_threads = k["row_threads"]
    per_thread = k["vecs_per_thread"]
    rows = k["rows_per_block"]
    exact = k["exact"]
    vectors = config.hidden // vec
    eps = float(config.eps)
    block = list(variant.block)
    warps = variant.threads // 32
    smem_bytes = variant.smem
    pdl = variant.pdl
    late = bool(k.get("pdl_late", 0))  # the `mid` variant (chunked_rows.decode_variants)

    @cute.kernel
    def fp8_token_quant_kernel(mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor):
        # mX: [tokens, hidden]; mQ: [tokens, hidden] e4m3; mS: [tokens, 1] fp32
        pdl_prologue(pdl, late)
        alloc = SharedMemory(smem_bytes, f"fp8_token_quant {variant.name}")
        sWarp = alloc.tensor(Float32, warps, byte_alignment=4)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        row = bidx * rows + tidx // row_threads
        first = tidx % row_threads
        valid = row < mX.shape[0]

        gX = cute.zipped_divide(mX[row, None], (vec,))
        tXrX = cute.make_rmem_tensor((vec, per_thread), mX.element_type)
        tXrX.fill(0)  # predicated-off vectors count as 0 in the absmax
        load_chunk(gX, tXrX, first, row_threads, per_thread, vectors, exact, valid)
        tYrY = cute.make_rmem_tensor((vec, per_thread), Float32)
        tYrY.store(tXrX.load().to(Float32))

        amax = Float32(0.0)
        for i in cutlass.range_constexpr(per_thread):
            for j in cutlass.range_constexpr(vec):
                amax = cute.arch.fmax(amax, cute.math.absf(tYrY[j, i]))
        amax = segment_max(amax, sWarp, row_threads)
        scale = cute.arch.fmax(amax, Float32(eps)) / Float32(FP8_MAX)
        divisor, recip = quotient_factors(scale)
        for i in cutlass.range_constexpr(per_thread):
            for j in cutlass.range_constexpr(vec):
                tYrY[j, i] = quotient(tYrY[j, i], divisor, recip)
        if valid and first == 0:
            mS[row, 0] = scale

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
        fp8_token_quant_kernel(mX, mQ, mS).launch(
            grid=[grid_x, grid_y, grid_z], block=block, smem=smem_bytes, stream=stream
        )

    return launch
