"""CuTeDSL device code of rms_norm (see rms_norm.py for the algorithm and launch plan)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from ...archs import Arch
from ..device_utils import (
    SharedMemory,
    butterfly_sum,
    cutlass_dtype,
    load_vector_hinted,
    pdl_epilogue,
    pdl_prologue,
)
from ..spec import Variant
from .family import RmsNormConfig

__all__ = ["host_function"]


def host_function(config: RmsNormConfig, variant: Variant, arch: Arch):
    """The `@cute.jit` launcher of one variant: tensors in kernel order, grid, stream."""
    warps = variant.constants["warps_per_row"]
    rows = variant.constants["rows_per_block"]
    per_thread = variant.constants["vecs_per_thread"]
    vec = variant.constants["vec"]
    vectors = config.hidden // vec
    row_threads = 32 * warps
    exact = vectors == row_threads * per_thread  # every thread's vectors are in the row
    eps = config.eps
    offset = config.weight_offset
    inv_hidden = 1.0 / config.hidden
    dtype = cutlass_dtype(config.dtype)
    access_bits = vec * dtype.width  # the family's access width (vec counts input elements)
    reload_x = bool(variant.constants["reload_x"])
    cache_hints = bool(variant.constants["cache_hints"])
    weight_first = bool(variant.constants["weight_first"])
    scale_before_sum = bool(variant.constants["scale_before_sum"])
    if scale_before_sum and reload_x:
        raise ValueError(f"rms_norm {variant.name}: scale_before_sum needs x kept in registers")
    block = list(variant.block)
    smem_bytes = variant.smem
    pdl = variant.pdl
    late = bool(variant.constants.get("pdl_late", 0))  # decode_late, and decode of wide rows
    # At least min_blocks blocks per SM (nvvm.minctasm caps ptxas's registers). The carveout is
    # passed because without one the DSL asks the GPU of the compiling machine for its shared
    # memory size; -1 is the driver's default, and the loader sets no carveout.
    min_blocks = variant.constants["min_blocks"]
    bounds = dict(min_blocks_per_mp=min_blocks, preferred_smem_carveout=-1) if min_blocks else {}

    @cute.jit
    def load_vector(src: cute.Tensor, dst: cute.Tensor, last_use: cutlass.Constexpr):
        if const_expr(cache_hints):
            load_vector_hinted(src, dst, access_bits, last_use)
        else:
            cute.autovec_copy(src, dst)

    @cute.jit
    def load_row(
        mRow: cute.Tensor, rDst: cute.Tensor, t: Int32, valid, last_use: cutlass.Constexpr
    ):
        gRow = cute.zipped_divide(mRow, (vec,))  # ((vec), (vectors))
        for i in cutlass.range_constexpr(per_thread):
            idx = t + i * row_threads
            if const_expr(exact):
                if valid:
                    load_vector(gRow[(None, idx)], rDst[None, i], last_use)
            else:
                if valid and idx < vectors:
                    load_vector(gRow[(None, idx)], rDst[None, i], last_use)

    @cute.jit
    def store_row(rSrc: cute.Tensor, mRow: cute.Tensor, t: Int32, valid):
        gRow = cute.zipped_divide(mRow, (vec,))
        for i in cutlass.range_constexpr(per_thread):
            idx = t + i * row_threads
            if const_expr(exact):
                if valid:
                    cute.autovec_copy(rSrc[None, i], gRow[(None, idx)])
            else:
                if valid and idx < vectors:
                    cute.autovec_copy(rSrc[None, i], gRow[(None, idx)])

    @cute.jit
    def body(mX: cute.Tensor, mRes, mW: cute.Tensor, mO: cute.Tensor):
        # mX, mRes, mO: [tokens, hidden] (row stride dynamic); mW: [hidden]
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        row_local = tidx // row_threads
        t = tidx % row_threads
        row = bidx * rows + row_local
        valid = row < mX.shape[0]

        if const_expr(weight_first):
            # Issued with x's loads so that the two latencies overlap. Loaded after x, ptxas
            # places the weight's load once x has arrived (it reuses x's registers), and its
            # latency follows x's (tuning.py: WEIGHT_FIRST). Rows past the end skip it, as x.
            tWrW = cute.make_rmem_tensor((vec, per_thread), mW.element_type)
            tWrW.fill(0)
            load_row(mW, tWrW, t, valid, False)
        tXrX = cute.make_rmem_tensor((vec, per_thread), dtype)
        tXrX.fill(0)
        load_row(mX[row, None], tXrX, t, valid, False)
        x = tXrX.load().to(Float32)
        if const_expr(mRes is not None):
            tRrR = cute.make_rmem_tensor((vec, per_thread), dtype)
            tRrR.fill(0)
            load_row(mRes[row, None], tRrR, t, valid, False)
            # Normalize the residual sum as stored (rounded to dtype), like the unfused layers.
            tRrR.store((x + tRrR.load().to(Float32)).to(dtype))
            store_row(tRrR, mRes[row, None], t, valid)
            x = tRrR.load().to(Float32)
        if const_expr(not weight_first):
            # Where it was (after x and the residual's store): a move changes ptxas's schedule
            # of these variants, measured slower for them (tuning.py: WEIGHT_FIRST).
            tWrW = cute.make_rmem_tensor((vec, per_thread), mW.element_type)
            tWrW.fill(0)
            load_row(mW, tWrW, t, True, False)
        if const_expr(scale_before_sum):
            # x * w while the row's sum is exchanged; y = (x * w) * rstd below.
            x_w = x * (tWrW.load().to(Float32) + offset)

        ss = butterfly_sum((x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), 0), 32)
        if const_expr(warps > 1):
            smem = SharedMemory(smem_bytes, f"rms_norm {variant.name}")
            sSum = smem.tensor(Float32, (warps, rows))
            warp = t // 32
            if t % 32 == 0:
                sSum[warp, row_local] = ss
            cute.arch.sync_threads()
            ss = Float32(0.0)
            for w in cutlass.range_constexpr(warps):
                ss = ss + sSum[w, row_local]
        rstd = cute.math.rsqrt(ss * inv_hidden + eps, fastmath=False)
        if const_expr(reload_x and mRes is None):
            # Read x again (from L1, as torch.compile's kernel does) instead of keeping it in
            # registers across the block's sum: 32 registers instead of 40, and the second
            # read demotes x's lines in the caches (evict_first). Hidden 8192 x 32768 on the
            # H200: 261.4 µs with x kept, 257.0 read twice, 250.5 read twice with the hints.
            load_row(mX[row, None], tXrX, t, valid, True)
            x = tXrX.load().to(Float32)
        if const_expr(scale_before_sum):
            y = x_w * rstd
        else:
            y = x * rstd * (tWrW.load().to(Float32) + offset)
        tOrO = cute.make_rmem_tensor((vec, per_thread), mO.element_type)
        tOrO.store(y.to(mO.element_type))
        store_row(tOrO, mO[row, None], t, valid)

    @cute.kernel
    def rms_norm_kernel(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor):
        pdl_prologue(pdl, late)
        body(mX, None, mW, mO)
        pdl_epilogue(pdl, late)

    @cute.kernel
    def rms_norm_residual_kernel(
        mX: cute.Tensor, mRes: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor
    ):
        pdl_prologue(pdl, late)
        body(mX, mRes, mW, mO)
        pdl_epilogue(pdl, late)

    if config.fused_residual:

        @cute.jit
        def launch_fused(
            mX: cute.Tensor,
            mRes: cute.Tensor,
            mW: cute.Tensor,
            mO: cute.Tensor,
            grid_x: Int32,
            grid_y: Int32,
            grid_z: Int32,
            stream: cuda.CUstream,
        ):
            rms_norm_residual_kernel(mX, mRes, mW, mO).launch(
                grid=[grid_x, grid_y, grid_z], block=block, smem=smem_bytes, stream=stream,
                **bounds,
            )

        return launch_fused

    @cute.jit
    def launch(
        mX: cute.Tensor,
        mW: cute.Tensor,
        mO: cute.Tensor,
        grid_x: Int32,
        grid_y: Int32,
        grid_z: Int32,
        stream: cuda.CUstream,
    ):
        rms_norm_kernel(mX, mW, mO).launch(
            grid=[grid_x, grid_y, grid_z], block=block, smem=smem_bytes, stream=stream,
            **bounds,
        )

    return launch
