"""CuTeDSL device code of moe_combine (see family.py). One kernel body for every variant: a
block covers `rows_per_block` tokens, or one chunk of one token's row when the variant splits
rows (`chunks` > 1), so decode, prefill and split compute each element the same way."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from ...archs import Arch
from ..device_utils import cutlass_dtype, pdl_epilogue, pdl_prologue
from ..spec import Variant
from .family import MoeCombineConfig

__all__ = ["host_function"]


def host_function(config: MoeCombineConfig, variant: Variant, arch: Arch):
    warps = variant.constants["warps_per_row"]
    rows = variant.constants["rows_per_block"]
    per_thread = variant.constants["vecs_per_thread"]
    chunks = variant.constants["chunks"]
    K = config.top_k
    vec = variant.constants["vec"]
    vectors = config.hidden // vec
    row_threads = 32 * warps
    chunk_vectors = row_threads * per_thread  # vectors of a row one block covers
    if chunks > 1 and rows != 1:
        raise ValueError(f"moe_combine {variant.name}: a split row needs one token per block")
    exact = vectors == chunks * chunk_vectors
    dtype = cutlass_dtype(config.dtype)
    block = list(variant.block)
    pdl = variant.pdl
    late = bool(variant.constants.get("pdl_late", 0))  # split_block_late (tuning.py)

    @cute.kernel
    def combine_kernel(mY: cute.Tensor, mPos: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor):
        # mY: [rows, hidden]; mPos, mW: [tokens, top_k]; mO: [tokens, hidden]
        pdl_prologue(pdl, late)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if const_expr(chunks == 1):
            t = bidx * rows + tidx // row_threads
            first = tidx % row_threads
        else:
            t = bidx // chunks
            first = (bidx % chunks) * chunk_vectors + tidx
        tokens = mO.shape[0]
        valid = t < tokens
        n_rows = mY.shape[0]
        # Every position and weight is read first, unconditionally (a block past the last token
        # reads the last token's and writes nothing), so the reads are straight-line code, all
        # in flight together; then every k's row loads are issued before any accumulation, and
        # the sum runs in fp32 in the fixed order k = 0..top_k-1.
        t_in = cutlass.min(t, tokens - 1)
        tPos = cute.make_rmem_tensor(K, Int32)
        weights = cute.make_rmem_tensor(K, Float32)
        for k in cutlass.range_constexpr(K):
            tPos[k] = mPos[t_in, k]
            if const_expr(not late):
                weights[k] = mW[t_in, k]
        tYrY = cute.make_rmem_tensor((vec, per_thread, K), dtype)
        tYrY.fill(0)
        for k in cutlass.range_constexpr(K):
            p = tPos[k]
            ok = p >= 0 and p < n_rows
            if const_expr(not late):
                weights[k] = cutlass.select_(ok, weights[k], Float32(0.0))  # a missing copy adds +0
            if ok:
                gY = cute.zipped_divide(mY[p, None], (vec,))
                for i in cutlass.range_constexpr(per_thread):
                    j = first + i * row_threads
                    if const_expr(exact):
                        cute.autovec_copy(gY[(None, j)], tYrY[None, i, k])
                    else:
                        if j < vectors:
                            cute.autovec_copy(gY[(None, j)], tYrY[None, i, k])
        if const_expr(late):
            # The weights read after the rows' loads are issued: read with the positions, as the
            # other variants do, ptxas placed their select (which waits for them) ahead of the
            # row loads in this variant's schedule (split_block's cubin with the late trigger:
            # benchmarks/results/norm-late-pdl-experiment-h200.md).
            for k in cutlass.range_constexpr(K):
                p = tPos[k]
                ok = p >= 0 and p < n_rows
                weights[k] = cutlass.select_(ok, mW[t_in, k], Float32(0.0))
        acc = tYrY[None, None, 0].load().to(Float32) * weights[0]
        for k in cutlass.range_constexpr(1, K):
            acc = acc + tYrY[None, None, k].load().to(Float32) * weights[k]
        tOrO = cute.make_rmem_tensor((vec, per_thread), dtype)
        tOrO.store(acc.to(dtype))
        if valid:
            gO = cute.zipped_divide(mO[t, None], (vec,))
            for i in cutlass.range_constexpr(per_thread):
                j = first + i * row_threads
                if const_expr(exact):
                    cute.autovec_copy(tOrO[None, i], gO[(None, j)])
                else:
                    if j < vectors:
                        cute.autovec_copy(tOrO[None, i], gO[(None, j)])
        pdl_epilogue(pdl, late)

    @cute.jit
    def launch(mY: cute.Tensor, mPos: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor,
               grid_x: Int32, grid_y: Int32, grid_z: Int32, stream: cuda.CUstream):
        combine_kernel(mY, mPos, mW, mO).launch(
            grid=[grid_x, grid_y, grid_z], block=block, stream=stream
        )

    return launch
