"""CuTeDSL device code of moe_ep_combine (protocol: family.py, moe_ep_dispatch/protocol.py)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from ...archs import Arch
from ..device_utils import cutlass_dtype, store_release_sys
from ..moe_ep_dispatch.ep_device import check_rank, copy_row, row_view, wait_flag
from ..moe_ep_dispatch.protocol import (
    DONE_FLAGS,
    MAX_RANKS,
    RECV_TOTALS,
    RETURN_ELEM_BYTES,
    shared_layout,
)
from ..spec import Variant
from .family import MoeEpCombineConfig

__all__ = ["host_function"]


def host_function(config: MoeEpCombineConfig, variant: Variant, arch: Arch):
    W = config.world_size
    K = config.top_k
    H = config.hidden
    vec = variant.constants["vec"]
    V = H // vec
    eb = RETURN_ELEM_BYTES
    threads = variant.threads
    warps = threads // 32
    dtype = cutlass_dtype(config.dtype)
    block = list(variant.block)

    @cute.kernel
    def combine_kernel(mY: cute.Tensor, mSend: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor,
                       mRecvPos: cute.Tensor, mPtrs: cute.Tensor, mState: cute.Tensor,
                       rank: Int32):
        # mY: [rows, H] this rank's expert outputs (rows of the dispatch's out);
        # mSend, mW: [tokens, K]; mO: [tokens, H]; mRecvPos: [W * cap]; mPtrs: int64 [W]
        check_rank(rank, W)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        blocks, _, _ = cute.arch.grid_dim()
        warp = tidx // 32
        lane = tidx % 32
        tokens = mO.shape[0]
        cap = mRecvPos.shape[0] // W
        cap64 = Int64(cap)
        epoch = mState[bidx]  # the dispatch of this step raised it
        par = epoch & 1
        lay = shared_layout(W, cap64, H)
        mine = mPtrs[rank]

        # --- 1. progress flag, then every received row back to its sender ------------------
        if bidx == 0 and tidx < W:
            store_release_sys(mPtrs[tidx] + Int64((DONE_FLAGS + par * MAX_RANKS + rank) * 4), epoch)
        rTot = cute.make_rmem_tensor(W, Int32)
        received = Int32(0)
        for s in cutlass.range_constexpr(W):
            rTot[s] = mState[RECV_TOTALS + s]
            received = received + rTot[s]
        for g in cutlass.range(bidx * warps + warp, received, blocks * warps):
            s = Int32(0)
            first = Int32(0)
            below = Int32(0)
            for s2 in cutlass.range_constexpr(W):
                if g >= below:
                    s = Int32(s2)
                    first = below
                below = below + rTot[s2]
            slot = g - first
            row = mRecvPos[s * cap + slot]
            index = Int64(par * W + rank) * cap64 + Int64(slot)
            peer = mPtrs[s]
            gSrc = row_view(dtype, mY.iterator.toint() + Int64(row) * (H * eb), vec, V)
            gDst = row_view(dtype, peer + lay["return_rows"] + index * (H * eb), vec, V)
            copy_row(gSrc, gDst, lane, dtype, vec, V)
            cute.arch.sync_warp()
            if lane == 0:
                store_release_sys(peer + lay["return_flags"] + index * 4, epoch)

        # --- 2. this rank's tokens: wait for each copy, weighted sum in k order ---------------
        rAddr = cute.make_rmem_tensor(K, Int64)
        rWt = cute.make_rmem_tensor(K, Float32)
        rOk = cute.make_rmem_tensor(K, Int32)
        rY = cute.make_rmem_tensor((vec, K), dtype)
        rO = cute.make_rmem_tensor((vec,), dtype)
        for t in cutlass.range(bidx, tokens, blocks):
            for kk in cutlass.range_constexpr(K):
                v = mSend[t, kk]
                rOk[kk] = Int32(0)
                rWt[kk] = Float32(0.0)
                rAddr[kk] = Int64(0)
                if v >= 0:
                    d = v // cap
                    index = Int64(par * W + d) * cap64 + Int64(v - d * cap)
                    wait_flag(mine + lay["return_flags"] + index * 4, epoch)
                    rOk[kk] = Int32(1)
                    rWt[kk] = mW[t, kk]
                    rAddr[kk] = mine + lay["return_rows"] + index * (H * eb)
            gO = row_view(dtype, mO.iterator.toint() + Int64(t) * (H * eb), vec, V)
            for j in cutlass.range(tidx, V, threads):
                rY.fill(0)
                for kk in cutlass.range_constexpr(K):
                    if rOk[kk] != 0:
                        gR = row_view(dtype, rAddr[kk], vec, V)
                        cute.autovec_copy(gR[None, j], rY[None, kk])
                acc = rY[None, 0].load().to(Float32) * rWt[0]
                for kk in cutlass.range_constexpr(1, K):
                    acc = acc + rY[None, kk].load().to(Float32) * rWt[kk]
                rO.store(acc.to(dtype))
                cute.autovec_copy(rO, gO[None, j])

        # --- 3. no peer may start the step after next before this one has entered this step --
        if tidx < W:
            wait_flag(mine + Int64((DONE_FLAGS + par * MAX_RANKS + tidx) * 4), epoch)

    @cute.jit
    def launch(mY: cute.Tensor, mSend: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor,
               mRecvPos: cute.Tensor, mPtrs: cute.Tensor, mState: cute.Tensor, rank: Int32,
               grid_x: Int32, grid_y: Int32, grid_z: Int32, stream: cuda.CUstream):
        combine_kernel(mY, mSend, mW, mO, mRecvPos, mPtrs, mState, rank).launch(
            grid=[grid_x, grid_y, grid_z], block=block, stream=stream, cooperative=True
        )

    return launch
