"""CuTeDSL device code of all_reduce (see family.py for the protocol and the launch plan)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from ...archs import Arch
from ..device_utils import (
    SharedMemory,
    butterfly_sum,
    cutlass_dtype,
    load_acquire_sys,
    store_release_sys,
    trap,
)
from ..spec import Variant
from .family import AllReduceConfig

__all__ = ["host_function"]


def host_function(config: AllReduceConfig, variant: Variant, arch: Arch):
    """The `@cute.jit` launcher of one variant: arguments in kernel order, grid, stream."""
    k = variant.constants
    W = config.world_size
    vec = k["vec"]
    flag_ranks = k["flag_ranks"]
    flag_blocks = k["flag_blocks"]
    dtype = cutlass_dtype(config.dtype)
    block = list(variant.block)
    threads = variant.threads
    smem_bytes = variant.smem

    def vectors(iterator, count):
        """A [vec, count] view of 16-byte vectors starting at `iterator` (16-byte aligned)."""
        return cute.make_tensor(iterator, cute.make_layout((vec, count), stride=(1, vec)))

    def peer_vectors(mPtrs, p, count):
        ptr = cute.make_ptr(dtype, mPtrs[0, p], cute.AddressSpace.gmem, assumed_align=16)
        return vectors(ptr, count)

    @cute.jit
    def check_rank(rank: Int32):
        # A rank outside [0, world_size) would index the pointer table out of bounds.
        if rank < 0 or rank >= W:
            trap()

    @cute.jit
    def cross_rank_barrier(mPtrs: cute.Tensor, rank: Int32, phase: cutlass.Constexpr, epoch: Int32):
        """Block b of every rank meets block b of every other rank (flag slot per phase, source
        rank and block). Thread p < world_size talks to rank p: publishes this block's epoch in
        rank p's flags (release, system scope), then waits until rank p's epoch for this block
        has reached ours in our own flags (acquire, system scope). A peer may already be one
        call ahead (it left this barrier and started the next call), hence >= (wrap-safe)."""
        cute.arch.sync_threads()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if tidx < W:
            if tidx != rank:
                slot_out = ((phase * flag_ranks + rank) * flag_blocks + bidx) * 4
                store_release_sys(mPtrs[1, tidx] + Int64(slot_out), epoch)
                slot_in = ((phase * flag_ranks + tidx) * flag_blocks + bidx) * 4
                address = mPtrs[1, rank] + Int64(slot_in)
                seen = load_acquire_sys(address)
                while seen - epoch < 0:
                    seen = load_acquire_sys(address)
        cute.arch.sync_threads()

    @cute.jit
    def finish(mState: cute.Tensor, epoch: Int32):
        """Record this call's epoch for the next one: every block in its own counter (it read
        it at its start, before the cross-rank barrier), block 0 also in the counters of the
        blocks this call did not launch, so every counter holds the call count whatever the
        grids of the calls. Plain stores; the next launch on the stream sees them."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        blocks, _, _ = cute.arch.grid_dim()
        if tidx == 0:
            mState[bidx] = epoch
        if bidx == 0:
            for i in cutlass.range(blocks + tidx, flag_blocks, threads):
                mState[i] = epoch

    @cute.jit
    def sum_ranks(rP: cute.Tensor):
        """fp32 sum over the rank mode (last) in the fixed order 0..W-1."""
        acc = rP[None, 0].load().to(Float32)
        for p in cutlass.range_constexpr(1, W):
            acc = acc + rP[None, p].load().to(Float32)
        return acc

    # --- plain all-reduce: one_shot ------------------------------------------------------------
    @cute.kernel
    def one_shot_kernel(mX: cute.Tensor, mO: cute.Tensor, mBuf: cute.Tensor, mPtrs: cute.Tensor,
                        mState: cute.Tensor, rank: Int32):
        # mX, mO: [n]; mBuf: [capacity]; mPtrs: int64 [2, W]; mState: int32 [MAX_BLOCKS]
        check_rank(rank)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        blocks, _, _ = cute.arch.grid_dim()
        n_vec = mX.shape[0] // vec
        cap_vec = mBuf.shape[0] // vec
        epoch = mState[bidx] + 1
        base = (epoch & 1) * (cap_vec // 2)  # this call's half of every rank's data region
        gX = vectors(mX.iterator, n_vec)
        gO = vectors(mO.iterator, n_vec)
        gB = vectors(mBuf.iterator, cap_vec)
        rV = cute.make_rmem_tensor((vec,), dtype)
        first = bidx * threads + tidx
        step = blocks * threads
        for j in cutlass.range(first, n_vec, step):
            cute.autovec_copy(gX[None, j], rV)
            cute.autovec_copy(rV, gB[None, base + j])
        cross_rank_barrier(mPtrs, rank, 0, epoch)
        peers = [peer_vectors(mPtrs, p, cap_vec) for p in range(W)]
        rP = cute.make_rmem_tensor((vec, W), dtype)
        for j in cutlass.range(first, n_vec, step):
            for p in cutlass.range_constexpr(W):  # every load in flight before the sum
                cute.autovec_copy(peers[p][None, base + j], rP[None, p])
            rV.store(sum_ranks(rP).to(dtype))
            cute.autovec_copy(rV, gO[None, j])
        finish(mState, epoch)

    # --- plain all-reduce: two_shot ------------------------------------------------------------
    @cute.kernel
    def two_shot_kernel(mX: cute.Tensor, mO: cute.Tensor, mBuf: cute.Tensor, mPtrs: cute.Tensor,
                        mState: cute.Tensor, rank: Int32):
        # Block b owns tiles b, b + grid, ...; a tile is W slices of `threads` vectors, slice s
        # reduced by rank s (reduce-scatter), then copied by every other rank (all-gather).
        check_rank(rank)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        blocks, _, _ = cute.arch.grid_dim()
        tile = threads * W
        n_vec = mX.shape[0] // vec
        n_tiles = (n_vec + tile - 1) // tile
        cap_vec = mBuf.shape[0] // vec
        epoch = mState[bidx] + 1
        base = (epoch & 1) * (cap_vec // 2)
        gX = vectors(mX.iterator, n_vec)
        gO = vectors(mO.iterator, n_vec)
        gB = vectors(mBuf.iterator, cap_vec)
        rV = cute.make_rmem_tensor((vec,), dtype)
        for t in cutlass.range(bidx, n_tiles, blocks):
            for s in cutlass.range_constexpr(W):
                j = t * tile + s * threads + tidx
                if j < n_vec:
                    cute.autovec_copy(gX[None, j], rV)
                    cute.autovec_copy(rV, gB[None, base + j])
        cross_rank_barrier(mPtrs, rank, 0, epoch)
        peers = [peer_vectors(mPtrs, p, cap_vec) for p in range(W)]
        rP = cute.make_rmem_tensor((vec, W), dtype)
        for t in cutlass.range(bidx, n_tiles, blocks):
            j = t * tile + rank * threads + tidx
            if j < n_vec:
                for p in cutlass.range_constexpr(W):
                    cute.autovec_copy(peers[p][None, base + j], rP[None, p])
                rV.store(sum_ranks(rP).to(dtype))
                # Our slice of the staging half now holds the sum (no peer reads our input
                # there: rank s reads only slice s).
                cute.autovec_copy(rV, gB[None, base + j])
                cute.autovec_copy(rV, gO[None, j])
        cross_rank_barrier(mPtrs, rank, 1, epoch)
        for t in cutlass.range(bidx, n_tiles, blocks):
            for s in cutlass.range_constexpr(W):
                if s != rank:
                    j = t * tile + s * threads + tidx
                    if j < n_vec:
                        cute.autovec_copy(peers[s][None, base + j], rV)
                        cute.autovec_copy(rV, gO[None, j])
        finish(mState, epoch)

    # --- fused: all-reduce + residual add + RMSNorm (one-shot) ---------------------------------
    hidden = config.hidden
    row_vec = hidden // vec if hidden else 1
    warps = k.get("warps_per_row", 1)
    per_thread = k.get("vecs_per_thread", 1)
    exact = row_vec == threads * per_thread
    eps = config.eps
    offset = config.weight_offset
    inv_hidden = 1.0 / hidden if hidden else 0.0

    @cute.kernel
    def fused_kernel(mX: cute.Tensor, mRes: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor,
                     mBuf: cute.Tensor, mPtrs: cute.Tensor, mState: cute.Tensor, rank: Int32):
        # mX, mRes, mO: [tokens, hidden]; mW: [hidden]. Block b owns rows b, b + grid, ...
        check_rank(rank)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        blocks, _, _ = cute.arch.grid_dim()
        tokens = mX.shape[0]
        cap_vec = mBuf.shape[0] // vec
        epoch = mState[bidx] + 1
        base = (epoch & 1) * (cap_vec // 2)
        total = tokens * row_vec
        gX = vectors(mX.iterator, total)
        gR = vectors(mRes.iterator, total)
        gO = vectors(mO.iterator, total)
        gW = vectors(mW.iterator, row_vec)
        gB = vectors(mBuf.iterator, cap_vec)
        rV = cute.make_rmem_tensor((vec,), dtype)
        for row in cutlass.range(bidx, tokens, blocks):
            for i in cutlass.range_constexpr(per_thread):
                idx = tidx + i * threads
                if const_expr(exact):
                    cute.autovec_copy(gX[None, row * row_vec + idx], rV)
                    cute.autovec_copy(rV, gB[None, base + row * row_vec + idx])
                else:
                    if idx < row_vec:
                        cute.autovec_copy(gX[None, row * row_vec + idx], rV)
                        cute.autovec_copy(rV, gB[None, base + row * row_vec + idx])
        # The weight does not depend on the peers: load it while they catch up.
        tWrW = cute.make_rmem_tensor((vec, per_thread), mW.element_type)
        tWrW.fill(0)
        for i in cutlass.range_constexpr(per_thread):
            idx = tidx + i * threads
            if const_expr(exact):
                cute.autovec_copy(gW[None, idx], tWrW[None, i])
            else:
                if idx < row_vec:
                    cute.autovec_copy(gW[None, idx], tWrW[None, i])
        w = tWrW.load().to(Float32) + offset
        cross_rank_barrier(mPtrs, rank, 0, epoch)
        peers = [peer_vectors(mPtrs, p, cap_vec) for p in range(W)]
        smem = SharedMemory(smem_bytes, "all_reduce residual_rms_norm")
        sSum = None
        if const_expr(warps > 1):
            sSum = smem.tensor(Float32, (warps,))
        rP = cute.make_rmem_tensor((vec, per_thread, W), dtype)
        tRrR = cute.make_rmem_tensor((vec, per_thread), dtype)
        tOrO = cute.make_rmem_tensor((vec, per_thread), dtype)
        for row in cutlass.range(bidx, tokens, blocks):
            rP.fill(0)
            tRrR.fill(0)
            for i in cutlass.range_constexpr(per_thread):
                idx = tidx + i * threads
                if const_expr(exact):
                    for p in cutlass.range_constexpr(W):
                        cute.autovec_copy(peers[p][None, base + row * row_vec + idx],
                                          rP[None, i, p])
                    cute.autovec_copy(gR[None, row * row_vec + idx], tRrR[None, i])
                else:
                    if idx < row_vec:
                        for p in cutlass.range_constexpr(W):
                            cute.autovec_copy(peers[p][None, base + row * row_vec + idx],
                                              rP[None, i, p])
                        cute.autovec_copy(gR[None, row * row_vec + idx], tRrR[None, i])
            acc = rP[None, None, 0].load().to(Float32)
            for p in cutlass.range_constexpr(1, W):
                acc = acc + rP[None, None, p].load().to(Float32)
            # Round the sum to the dtype, then add the residual and round again: the same
            # values the unfused all-reduce + fused-residual RMSNorm produce.
            summed = acc.to(dtype).to(Float32)
            tRrR.store((summed + tRrR.load().to(Float32)).to(dtype))
            for i in cutlass.range_constexpr(per_thread):
                idx = tidx + i * threads
                if const_expr(exact):
                    cute.autovec_copy(tRrR[None, i], gR[None, row * row_vec + idx])
                else:
                    if idx < row_vec:
                        cute.autovec_copy(tRrR[None, i], gR[None, row * row_vec + idx])
            x = tRrR.load().to(Float32)
            ss = butterfly_sum((x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), 0), 32)
            if const_expr(warps > 1):
                if tidx % 32 == 0:
                    sSum[tidx // 32] = ss
                cute.arch.sync_threads()
                ss = Float32(0.0)
                for wi in cutlass.range_constexpr(warps):
                    ss = ss + sSum[wi]
                cute.arch.sync_threads()  # before the next row overwrites the partial sums
            rstd = cute.math.rsqrt(ss * inv_hidden + eps, fastmath=False)
            tOrO.store((x * rstd * w).to(dtype))
            for i in cutlass.range_constexpr(per_thread):
                idx = tidx + i * threads
                if const_expr(exact):
                    cute.autovec_copy(tOrO[None, i], gO[None, row * row_vec + idx])
                else:
                    if idx < row_vec:
                        cute.autovec_copy(tOrO[None, i], gO[None, row * row_vec + idx])
        finish(mState, epoch)

    # --- fused: MoE combine + all-reduce (one-shot) ---------------------------------------------
    top_k = config.top_k

    @cute.kernel
    def combine_kernel(mY: cute.Tensor, mPos: cute.Tensor, mWts: cute.Tensor, mO: cute.Tensor,
                       mBuf: cute.Tensor, mPtrs: cute.Tensor, mState: cute.Tensor, rank: Int32):
        # mY: [rows, hidden] this rank's expert outputs; mPos, mWts: [tokens, top_k];
        # mO: [tokens, hidden]. Block b owns tokens b, b + grid, ...
        check_rank(rank)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        blocks, _, _ = cute.arch.grid_dim()
        tokens = mO.shape[0]
        n_rows = mY.shape[0]
        cap_vec = mBuf.shape[0] // vec
        epoch = mState[bidx] + 1
        base = (epoch & 1) * (cap_vec // 2)
        gY = vectors(mY.iterator, n_rows * row_vec)
        gO = vectors(mO.iterator, tokens * row_vec)
        gB = vectors(mBuf.iterator, cap_vec)
        # This rank's partial combine, moe_combine's rule: every k's loads in flight, then the
        # fp32 sum in the order k = 0..top_k-1, rounded to the dtype; staged for the peers.
        tYrY = cute.make_rmem_tensor((vec, per_thread, top_k), dtype)
        weights = cute.make_rmem_tensor(top_k, Float32)
        tPrP = cute.make_rmem_tensor((vec, per_thread), dtype)
        for row in cutlass.range(bidx, tokens, blocks):
            tYrY.fill(0)
            weights.fill(0.0)
            for kk in cutlass.range_constexpr(top_k):
                p = mPos[row, kk]
                if p >= 0 and p < n_rows:
                    weights[kk] = mWts[row, kk]
                    for i in cutlass.range_constexpr(per_thread):
                        idx = tidx + i * threads
                        if const_expr(exact):
                            cute.autovec_copy(gY[None, p * row_vec + idx], tYrY[None, i, kk])
                        else:
                            if idx < row_vec:
                                cute.autovec_copy(gY[None, p * row_vec + idx], tYrY[None, i, kk])
            acc = tYrY[None, None, 0].load().to(Float32) * weights[0]
            for kk in cutlass.range_constexpr(1, top_k):
                acc = acc + tYrY[None, None, kk].load().to(Float32) * weights[kk]
            tPrP.store(acc.to(dtype))
            for i in cutlass.range_constexpr(per_thread):
                idx = tidx + i * threads
                if const_expr(exact):
                    cute.autovec_copy(tPrP[None, i], gB[None, base + row * row_vec + idx])
                else:
                    if idx < row_vec:
                        cute.autovec_copy(tPrP[None, i], gB[None, base + row * row_vec + idx])
        cross_rank_barrier(mPtrs, rank, 0, epoch)
        peers = [peer_vectors(mPtrs, p, cap_vec) for p in range(W)]
        rP = cute.make_rmem_tensor((vec, per_thread, W), dtype)
        for row in cutlass.range(bidx, tokens, blocks):
            rP.fill(0)
            for i in cutlass.range_constexpr(per_thread):
                idx = tidx + i * threads
                if const_expr(exact):
                    for p in cutlass.range_constexpr(W):
                        cute.autovec_copy(peers[p][None, base + row * row_vec + idx],
                                          rP[None, i, p])
                else:
                    if idx < row_vec:
                        for p in cutlass.range_constexpr(W):
                            cute.autovec_copy(peers[p][None, base + row * row_vec + idx],
                                              rP[None, i, p])
            acc = rP[None, None, 0].load().to(Float32)
            for p in cutlass.range_constexpr(1, W):
                acc = acc + rP[None, None, p].load().to(Float32)
            tPrP.store(acc.to(dtype))
            for i in cutlass.range_constexpr(per_thread):
                idx = tidx + i * threads
                if const_expr(exact):
                    cute.autovec_copy(tPrP[None, i], gO[None, row * row_vec + idx])
                else:
                    if idx < row_vec:
                        cute.autovec_copy(tPrP[None, i], gO[None, row * row_vec + idx])
        finish(mState, epoch)

    if config.fusion == "moe_combine":

        @cute.jit
        def launch_combine(mY: cute.Tensor, mPos: cute.Tensor, mWts: cute.Tensor, mO: cute.Tensor,
                           mBuf: cute.Tensor, mPtrs: cute.Tensor, mState: cute.Tensor,
                           rank: Int32, grid_x: Int32, grid_y: Int32, grid_z: Int32,
                           stream: cuda.CUstream):
            combine_kernel(mY, mPos, mWts, mO, mBuf, mPtrs, mState, rank).launch(
                grid=[grid_x, grid_y, grid_z], block=block, stream=stream, cooperative=True
            )

        return launch_combine

    if config.fusion == "residual_rms_norm":

        @cute.jit
        def launch_fused(mX: cute.Tensor, mRes: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor,
                         mBuf: cute.Tensor, mPtrs: cute.Tensor, mState: cute.Tensor, rank: Int32,
                         grid_x: Int32, grid_y: Int32, grid_z: Int32, stream: cuda.CUstream):
            fused_kernel(mX, mRes, mW, mO, mBuf, mPtrs, mState, rank).launch(
                grid=[grid_x, grid_y, grid_z], block=block, smem=smem_bytes, stream=stream,
                cooperative=True,
            )

        return launch_fused

    kernel = one_shot_kernel if variant.name == "one_shot" else two_shot_kernel

    @cute.jit
    def launch(mX: cute.Tensor, mO: cute.Tensor, mBuf: cute.Tensor, mPtrs: cute.Tensor,
               mState: cute.Tensor, rank: Int32, grid_x: Int32, grid_y: Int32, grid_z: Int32,
               stream: cuda.CUstream):
        kernel(mX, mO, mBuf, mPtrs, mState, rank).launch(
            grid=[grid_x, grid_y, grid_z], block=block, stream=stream, cooperative=True
        )

    return launch
