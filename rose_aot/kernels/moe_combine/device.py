"""CuTeDSL device code of moe_combine (see moe_combine.py)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from ...archs import Arch
from ..device_utils import cutlass_dtype, pdl_prologue
from ..spec import Variant
from .family import MoeCombineConfig

__all__ = ["host_function"]


def host_function(config: MoeCombineConfig, variant: Variant, arch: Arch):
    warps = variant.constants["warps_per_row"]
    rows = variant.constants["rows_per_block"]
    per_thread = variant.constants["vecs_per_thread"]
    K = config.top_k
    vec = variant.constants["vec"]
    vectors = config.hidden // vec
    row_threads = 32 * warps
    exact = vectors == row_threads * per_thread
    dtype = cutlass_dtype(config.dtype)
    block = list(variant.block)
    pdl = variant.pdl

    @cute.kernel
    def combine_kernel(mY: cute.Tensor, mPos: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor):
        # mY: [rows, hidden]; mPos, mW: [tokens, top_k]; mO: [tokens, hidden]
        pdl_prologue(pdl)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        t = bidx * rows + tidx // row_threads
        lane = tidx % row_threads
        valid = t < mO.shape[0]
        n_rows = mY.shape[0]
        # Every k's loads are issued before any accumulation (independent requests in flight);
        # then the sum runs in fp32 in the fixed order k = 0..top_k-1.
        tYrY = cute.make_rmem_tensor((vec, per_thread, K), dtype)
        tYrY.fill(0)
        weights = cute.make_rmem_tensor(K, Float32)
        weights.fill(0.0)
        for k in cutlass.range_constexpr(K):
            p = Int32(-1)
            if valid:
                p = mPos[t, k]
            if p >= 0 and p < n_rows:
                weights[k] = mW[t, k]
                gY = cute.zipped_divide(mY[p, None], (vec,))
                for i in cutlass.range_constexpr(per_thread):
                    j = lane + i * row_threads
                    if const_expr(exact):
                        cute.autovec_copy(gY[(None, j)], tYrY[None, i, k])
                    else:
                        if j < vectors:
                            cute.autovec_copy(gY[(None, j)], tYrY[None, i, k])
        acc = tYrY[None, None, 0].load().to(Float32) * weights[0]
        for k in cutlass.range_constexpr(1, K):
            acc = acc + tYrY[None, None, k].load().to(Float32) * weights[k]
        tOrO = cute.make_rmem_tensor((vec, per_thread), dtype)
        tOrO.store(acc.to(dtype))
        if valid:
            gO = cute.zipped_divide(mO[t, None], (vec,))
            for i in cutlass.range_constexpr(per_thread):
                j = lane + i * row_threads
                if const_expr(exact):
                    cute.autovec_copy(tOrO[None, i], gO[(None, j)])
                else:
                    if j < vectors:
                        cute.autovec_copy(tOrO[None, i], gO[(None, j)])

    @cute.jit
    def launch(mY: cute.Tensor, mPos: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor,
               grid_x: Int32, grid_y: Int32, grid_z: Int32, stream: cuda.CUstream):
        combine_kernel(mY, mPos, mW, mO).launch(
            grid=[grid_x, grid_y, grid_z], block=block, stream=stream
        )

    return launch
