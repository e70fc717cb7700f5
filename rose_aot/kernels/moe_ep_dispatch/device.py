"""CuTeDSL device code of moe_ep_dispatch (protocol and phases: family.py, protocol.py)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from ...archs import Arch
from ..device_utils import (
    SharedMemory,
    block_exclusive_sum,
    cutlass_dtype,
    grid_barrier,
    store_release_sys,
)
from ..spec import Variant
from .ep_device import check_rank, copy_row, finish, ld_i32, row_view, st_i32, wait_flag
from .family import MoeEpDispatchConfig
from .protocol import BARRIER_WORD, COUNT_FLAGS, MAX_RANKS, RECV_TOTALS, local_padded, region_layout

__all__ = ["host_function"]


def host_function(config: MoeEpDispatchConfig, variant: Variant, arch: Arch):
    k = variant.constants
    W = config.world_size
    E = config.num_experts
    L = k["local_experts"]
    Lp = local_padded(L)
    K = config.top_k
    H = config.hidden
    vec = k["vec"]
    V = H // vec
    G = k["groups"]
    eb = k["elem_bytes"]
    align = config.expert_alignment
    threads = variant.threads
    warps = threads // 32
    smem = variant.smem
    dtype = cutlass_dtype(config.dtype)
    per_e = -(-E // threads)  # consecutive entries of [E] each thread scans
    per_l = -(-L // threads)
    pad_items = L if align > 1 else 0  # a warp per expert zeroes its padding rows

    @cute.jit
    def scan_flat(sIn: cute.Tensor, sOut: cute.Tensor, sWarp: cute.Tensor):
        """sOut[e] = sum of sIn[0:e] over the E entries, sOut[E] = the total."""
        tidx, _, _ = cute.arch.thread_idx()
        mine = Int32(0)
        for j in cutlass.range_constexpr(per_e):
            e = tidx * per_e + j
            if e < E:
                mine = mine + sIn[e]
        start, total = block_exclusive_sum(mine, sWarp, threads)
        for j in cutlass.range_constexpr(per_e):
            e = tidx * per_e + j
            if e < E:
                sOut[e] = start
                start = start + sIn[e]
        if tidx == 0:
            sOut[E] = total
        cute.arch.sync_threads()

    @cute.jit
    def body(mX, mIds, mXs, mOut, mOutS, mOffsets, mSend, mRecvPos, mPtrs, mState, mCounters,
             rank: Int32):
        # mX: [tokens, H]; mIds, mSend: [tokens, K]; mOut: [rows, H]; mOffsets: [L + 1];
        # mRecvPos: [W * cap]; mPtrs: int64 [W]; mState: int32 [STATE_WORDS];
        # mCounters: int32 [2 * E] (per parity: this rank's copies per global expert)
        check_rank(rank, W)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        blocks, _, _ = cute.arch.grid_dim()
        warp = tidx // 32
        lane = tidx % 32
        tokens = mIds.shape[0]
        pairs = tokens * K
        cap = mRecvPos.shape[0] // W
        cap64 = Int64(cap)
        epoch = mState[bidx] + 1
        par = epoch & 1
        lay = region_layout(W, cap64, H, L, eb, G)
        mine = mPtrs[rank]

        alloc = SharedMemory(smem, "moe_ep_dispatch")
        sCnt = alloc.tensor(Int32, E)  # copies per expert: this block's, then this rank's
        sBase = alloc.tensor(Int32, E)  # this block's first copy inside each expert
        sStart = alloc.tensor(Int32, E)  # each expert's first slot in its destination
        sRc = alloc.tensor(Int32, E)  # received counts [sender][local expert]
        sDelta = alloc.tensor(Int32, E)  # out row - slot, per [sender][local expert]
        sP = alloc.tensor(Int32, E + 1)  # prefix of sStart's input, then of sRc
        sOff = alloc.tensor(Int32, L + 1)  # expert offsets of out
        sWarp = alloc.tensor(Int32, warps)

        # --- 1. route: count copies per expert (block, then rank) ---------------------------
        for e in cutlass.range(tidx, E, threads):
            sCnt[e] = Int32(0)
        cute.arch.sync_threads()
        for i in cutlass.range(bidx * threads + tidx, pairs, blocks * threads):
            t = i // K
            kk = i - t * K
            ident = mIds[t, kk]
            local = Int32(-1)
            if ident >= 0 and ident < E:
                local = cute.arch.atomic_add(sCnt.iterator + ident, Int32(1), scope="cta")
            mSend[t, kk] = local
        cute.arch.sync_threads()
        for e in cutlass.range(tidx, E, threads):
            base = Int32(0)
            if sCnt[e] > 0:
                base = cute.arch.atomic_add(mCounters.iterator + (par * E + e), sCnt[e], scope="gpu")
            sBase[e] = base
        if bidx == 0:
            # The other parity's counters serve the next step: clear them now (nobody reads
            # them during this step).
            for e in cutlass.range(tidx, E, threads):
                mCounters[(1 - par) * E + e] = Int32(0)
        grid_barrier(mState.iterator + BARRIER_WORD)

        # --- 2. this rank's totals; slots grouped by expert inside each destination ----------
        for e in cutlass.range(tidx, E, threads):
            sCnt[e] = cute.arch.atomic_add(mCounters.iterator + (par * E + e), Int32(0), scope="gpu")
        cute.arch.sync_threads()
        scan_flat(sCnt, sP, sWarp)
        for e in cutlass.range(tidx, E, threads):
            sStart[e] = sP[e] - sP[(e // L) * L]
        cute.arch.sync_threads()
        if bidx == 0:
            for e in cutlass.range(tidx, E, threads):
                d = e // L
                j = e - d * L
                st_i32(mPtrs[d] + lay["counts"] + Int64(((par * W + rank) * Lp + j) * 4), sCnt[e])
            # Every writer's own system-scope fence as well as the block barrier, before one
            # thread per destination releases the flag (once per launch: cheap insurance).
            cute.arch.fence_acq_rel_sys()
            cute.arch.sync_threads()
            if tidx < W:
                store_release_sys(
                    mPtrs[tidx] + Int64((COUNT_FLAGS + par * MAX_RANKS + rank) * 4), epoch
                )

        # --- 3. send: final slots, then a warp per copy into the destination's region -------
        for i in cutlass.range(bidx * threads + tidx, pairs, blocks * threads):
            t = i // K
            kk = i - t * K
            local = mSend[t, kk]
            if local >= 0:
                e = mIds[t, kk]
                mSend[t, kk] = (e // L) * cap + sStart[e] + sBase[e] + local
        cute.arch.sync_threads()
        for first in cutlass.range(bidx * threads, pairs, blocks * threads):
            for q in cutlass.range(warp, threads, warps):
                i = first + q
                if i < pairs:
                    t = i // K
                    kk = i - t * K
                    v = mSend[t, kk]
                    if v >= 0:
                        d = v // cap
                        slot = v - d * cap
                        index = Int64(par * W + rank) * cap64 + Int64(slot)
                        peer = mPtrs[d]
                        gSrc = row_view(dtype, mX.iterator.toint() + Int64(t) * (H * eb), vec, V)
                        gDst = row_view(dtype, peer + lay["recv_rows"] + index * (H * eb), vec, V)
                        copy_row(gSrc, gDst, lane, dtype, vec, V)
                        if const_expr(G > 0):
                            sc = cute.make_tensor(
                                cute.make_ptr(Float32, peer + lay["recv_scales"] + index * (G * 4),
                                              cute.AddressSpace.gmem, assumed_align=4),
                                cute.make_layout(G),
                            )
                            for g in cutlass.range(lane, G, 32):
                                sc[g] = mXs[t, g]
                        if lane == 0:
                            st_i32(peer + lay["meta"] + index * 4, mIds[t, kk] - d * L)
                        cute.arch.sync_warp()
                        if lane == 0:
                            store_release_sys(peer + lay["send_flags"] + index * 4, epoch)

        # --- 4. receive: every sender's counts, the expert layout, then the rows ------------
        if tidx < W:
            wait_flag(mine + Int64((COUNT_FLAGS + par * MAX_RANKS + tidx) * 4), epoch)
        cute.arch.sync_threads()
        for e in cutlass.range(tidx, E, threads):
            s = e // L
            j = e - s * L
            sRc[e] = ld_i32(mine + lay["counts"] + Int64(((par * W + s) * Lp + j) * 4))
        cute.arch.sync_threads()
        scan_flat(sRc, sP, sWarp)
        mine_rows = Int32(0)
        for jj in cutlass.range_constexpr(per_l):
            j = tidx * per_l + jj
            if j < L:
                total = Int32(0)
                for s in cutlass.range_constexpr(W):
                    total = total + sRc[s * L + j]
                mine_rows = mine_rows + (total + (align - 1)) // align * align
        start, all_rows = block_exclusive_sum(mine_rows, sWarp, threads)
        for jj in cutlass.range_constexpr(per_l):
            j = tidx * per_l + jj
            if j < L:
                total = Int32(0)
                for s in cutlass.range_constexpr(W):
                    total = total + sRc[s * L + j]
                sOff[j] = start
                if bidx == 0:
                    mOffsets[j] = start
                start = start + (total + (align - 1)) // align * align
        if tidx == 0:
            sOff[L] = all_rows
            if bidx == 0:
                mOffsets[L] = all_rows
        cute.arch.sync_threads()
        for e in cutlass.range(tidx, E, threads):
            s = e // L
            j = e - s * L
            below = Int32(0)
            for s2 in cutlass.range_constexpr(W):
                if s2 < s:
                    below = below + sRc[s2 * L + j]
            sDelta[e] = sOff[j] + below - (sP[e] - sP[s * L])
        cute.arch.sync_threads()
        received = sP[E]
        if bidx == 0 and tidx < W:
            mState[RECV_TOTALS + tidx] = sP[(tidx + 1) * L] - sP[tidx * L]
        for g in cutlass.range(bidx * warps + warp, received + pad_items, blocks * warps):
            if g < received:
                s = Int32(0)
                for s2 in cutlass.range_constexpr(1, W):
                    if g >= sP[s2 * L]:
                        s = Int32(s2)
                slot = g - sP[s * L]
                index = Int64(par * W + s) * cap64 + Int64(slot)
                wait_flag(mine + lay["send_flags"] + index * 4, epoch)
                j = ld_i32(mine + lay["meta"] + index * 4)
                row = sDelta[s * L + j] + slot
                gSrc = row_view(dtype, mine + lay["recv_rows"] + index * (H * eb), vec, V)
                gDst = row_view(dtype, mOut.iterator.toint() + Int64(row) * (H * eb), vec, V)
                copy_row(gSrc, gDst, lane, dtype, vec, V)
                if const_expr(G > 0):
                    sc = cute.make_tensor(
                        cute.make_ptr(Float32, mine + lay["recv_scales"] + index * (G * 4),
                                      cute.AddressSpace.gmem, assumed_align=4),
                        cute.make_layout(G),
                    )
                    for gg in cutlass.range(lane, G, 32):
                        mOutS[row, gg] = sc[gg]
                if lane == 0:
                    mRecvPos[s * cap + slot] = row
            else:
                j = g - received
                total = Int32(0)
                for s in cutlass.range_constexpr(W):
                    total = total + sRc[s * L + j]
                rZ = cute.make_rmem_tensor((vec,), dtype)
                rZ.fill(0)
                for row in cutlass.range(sOff[j] + total, sOff[j + 1]):
                    gO = row_view(dtype, mOut.iterator.toint() + Int64(row) * (H * eb), vec, V)
                    for jv in cutlass.range(lane, V, 32):
                        cute.autovec_copy(rZ, gO[None, jv])
                    if const_expr(G > 0):
                        for gg in cutlass.range(lane, G, 32):
                            mOutS[row, gg] = Float32(0.0)
        finish(mState, epoch, threads)

    @cute.kernel
    def scaled_kernel(mX: cute.Tensor, mIds: cute.Tensor, mXs: cute.Tensor, mOut: cute.Tensor,
                      mOutS: cute.Tensor, mOffsets: cute.Tensor, mSend: cute.Tensor,
                      mRecvPos: cute.Tensor, mPtrs: cute.Tensor, mState: cute.Tensor,
                      mCounters: cute.Tensor, rank: Int32):
        body(mX, mIds, mXs, mOut, mOutS, mOffsets, mSend, mRecvPos, mPtrs, mState, mCounters,
             rank)

    @cute.kernel
    def plain_kernel(mX: cute.Tensor, mIds: cute.Tensor, mOut: cute.Tensor, mOffsets: cute.Tensor,
                     mSend: cute.Tensor, mRecvPos: cute.Tensor, mPtrs: cute.Tensor,
                     mState: cute.Tensor, mCounters: cute.Tensor, rank: Int32):
        body(mX, mIds, None, mOut, None, mOffsets, mSend, mRecvPos, mPtrs, mState, mCounters,
             rank)

    block = list(variant.block)

    if G:

        @cute.jit
        def launch_scaled(mX: cute.Tensor, mIds: cute.Tensor, mXs: cute.Tensor, mOut: cute.Tensor,
                          mOutS: cute.Tensor, mOffsets: cute.Tensor, mSend: cute.Tensor,
                          mRecvPos: cute.Tensor, mPtrs: cute.Tensor, mState: cute.Tensor,
                          mCounters: cute.Tensor, rank: Int32, grid_x: Int32, grid_y: Int32,
                          grid_z: Int32, stream: cuda.CUstream):
            scaled_kernel(mX, mIds, mXs, mOut, mOutS, mOffsets, mSend, mRecvPos, mPtrs, mState,
                          mCounters, rank).launch(
                grid=[grid_x, grid_y, grid_z], block=block, smem=smem, stream=stream,
                cooperative=True,
            )

        return launch_scaled

    @cute.jit
    def launch(mX: cute.Tensor, mIds: cute.Tensor, mOut: cute.Tensor, mOffsets: cute.Tensor,
               mSend: cute.Tensor, mRecvPos: cute.Tensor, mPtrs: cute.Tensor, mState: cute.Tensor,
               mCounters: cute.Tensor, rank: Int32, grid_x: Int32, grid_y: Int32, grid_z: Int32,
               stream: cuda.CUstream):
        plain_kernel(mX, mIds, mOut, mOffsets, mSend, mRecvPos, mPtrs, mState, mCounters,
                     rank).launch(
            grid=[grid_x, grid_y, grid_z], block=block, smem=smem, stream=stream,
            cooperative=True,
        )

    return launch
