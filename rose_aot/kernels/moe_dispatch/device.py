"""CuTeDSL device code of moe_dispatch (see moe_dispatch.py for semantics and launch plans)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr

from ...archs import Arch
from ..device_utils import (
    SharedMemory,
    block_exclusive_sum,
    cutlass_dtype,
    grid_barrier,
    pdl_prologue,
)
from ..spec import Variant
from .family import MoeDispatchConfig

__all__ = ["host_function"]

# 128-bit vectors a lane loads before it stores them (a row copy's loads in flight per lane;
# 16 x 16 B = 64 registers).
COPY_CHUNK = 16


def host_function(config: MoeDispatchConfig, variant: Variant, arch: Arch):
    phase = variant.constants["phase"]
    E = config.local_experts
    K = config.top_k
    H = config.hidden
    vec = variant.constants["vec"]
    V = H // vec
    G = H // config.scale_group if config.scale_group else 0
    align = config.expert_alignment
    e0 = config.expert_start
    n_experts = config.num_experts
    threads = variant.threads
    warps = threads // 32
    per_thread = -(-E // threads)  # experts each thread scans
    dtype = cutlass_dtype(config.dtype)
    smem = variant.smem
    reg_pairs = variant.constants.get("register_pairs", 0)
    pdl = variant.pdl

    @cute.jit
    def count_pairs(mIds, mPos, sCount, first, step):
        """Shared-memory counters per expert; each valid pair's slot goes to positions."""
        pairs = mIds.shape[0] * K
        for i in cutlass.range(first, pairs, step):
            t = i // K
            k = i % K
            ident = mIds[t, k]
            e = ident - e0
            if ident >= 0 and ident < n_experts and e >= 0 and e < E:
                mPos[t, k] = cute.arch.atomic_add(sCount.iterator + e, Int32(1), scope="cta")
            else:
                mPos[t, k] = Int32(-1)

    @cute.jit
    def scan_experts(sCount, sOffset, sWarp, mOffsets, mPadStart, write_out):
        """sOffset[e] = start row of expert e (segments padded to `align`)."""
        tidx, _, _ = cute.arch.thread_idx()
        mine = Int32(0)
        for j in cutlass.range_constexpr(per_thread):
            e = tidx * per_thread + j
            if e < E:
                mine = mine + (sCount[e] + (align - 1)) // align * align
        start, total = block_exclusive_sum(mine, sWarp, threads)
        for j in cutlass.range_constexpr(per_thread):
            e = tidx * per_thread + j
            if e < E:
                sOffset[e] = start
                if write_out:
                    mOffsets[e] = start
                    mPadStart[e] = start + sCount[e]
                start = start + (sCount[e] + (align - 1)) // align * align
        if tidx == 0:
            sOffset[E] = total
            if write_out:
                mOffsets[E] = total
        cute.arch.sync_threads()

    @cute.jit
    def route_in_registers(mIds, mPos, sCount, sOffset, sWarp, mOffsets, mPadStart):
        """Decode routing by one block, each thread's pairs held in registers from the count to
        the final position (no round trip of slots through global memory)."""
        tidx, _, _ = cute.arch.thread_idx()
        pairs = mIds.shape[0] * K
        rIds = cute.make_rmem_tensor(reg_pairs, Int32)
        rSlot = cute.make_rmem_tensor(reg_pairs, Int32)
        for j in cutlass.range_constexpr(reg_pairs):
            i = tidx + j * threads
            rIds[j] = Int32(-1)
            if i < pairs:
                rIds[j] = mIds[i // K, i % K]
        for j in cutlass.range_constexpr(reg_pairs):
            e = rIds[j] - e0
            rSlot[j] = Int32(-1)
            if rIds[j] >= 0 and rIds[j] < n_experts and e >= 0 and e < E:
                rSlot[j] = cute.arch.atomic_add(sCount.iterator + e, Int32(1), scope="cta")
        cute.arch.sync_threads()
        scan_experts(sCount, sOffset, sWarp, mOffsets, mPadStart, True)
        for j in cutlass.range_constexpr(reg_pairs):
            i = tidx + j * threads
            if i < pairs:
                row = Int32(-1)
                if rSlot[j] >= 0:
                    row = sOffset[rIds[j] - e0] + rSlot[j]
                mPos[i // K, i % K] = row

    @cute.jit
    def copy_rows(mX, mXs, mOut, mOutS, mOffsets, mPos, mCounts, mPadStart, first_warp, warp_step,
                  clear_counts):
        """A warp per (token, k) copy, then a warp per expert for its padding rows."""
        tidx, _, _ = cute.arch.thread_idx()
        lane = tidx % 32
        pairs = mPos.shape[0] * K
        tXrX = cute.make_rmem_tensor((vec, COPY_CHUNK), dtype)
        for w in cutlass.range(first_warp, pairs + E, warp_step):
            if w < pairs:
                t = w // K
                row = mPos[t, w % K]
                if row >= 0:
                    gX = cute.zipped_divide(mX[t, None], (vec,))
                    gO = cute.zipped_divide(mOut[row, None], (vec,))
                    for c in cutlass.range_constexpr(-(-V // (32 * COPY_CHUNK))):
                        for i in cutlass.range_constexpr(COPY_CHUNK):
                            j = lane + (c * COPY_CHUNK + i) * 32
                            if j < V:
                                cute.autovec_copy(gX[(None, j)], tXrX[None, i])
                        for i in cutlass.range_constexpr(COPY_CHUNK):
                            j = lane + (c * COPY_CHUNK + i) * 32
                            if j < V:
                                cute.autovec_copy(tXrX[None, i], gO[(None, j)])
                    if const_expr(G > 0):
                        for g in cutlass.range(lane, G, 32):
                            mOutS[row, g] = mXs[t, g]
            else:
                e = w - pairs
                tXrX.fill(0)
                for row in cutlass.range(mPadStart[e], mOffsets[e + 1]):
                    gO = cute.zipped_divide(mOut[row, None], (vec,))
                    for j in cutlass.range(lane, V, 32):
                        cute.autovec_copy(tXrX[None, 0], gO[(None, j)])
                    if const_expr(G > 0):
                        for g in cutlass.range(lane, G, 32):
                            mOutS[row, g] = cutlass.Float32(0.0)
                if clear_counts and lane == 0:
                    mCounts[e] = Int32(0)  # leave the workspace zero for the next launch

    @cute.jit
    def body(mX, mIds, mXs, mOut, mOutS, mOffsets, mPos, mBar, mCounts, mPadStart):
        pdl_prologue(pdl)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        blocks = cute.arch.grid_dim()[0]
        alloc = SharedMemory(smem, f"moe_dispatch {variant.name}")
        sCount = alloc.tensor(Int32, E + 1)
        sBase = alloc.tensor(Int32, E + 1)
        sOffset = alloc.tensor(Int32, E + 1)
        sWarp = alloc.tensor(Int32, warps)
        for e in cutlass.range(tidx, E, threads):
            sCount[e] = Int32(0)
        cute.arch.sync_threads()
        if const_expr(phase == "decode"):
            if bidx == 0:
                pairs = mIds.shape[0] * K
                if pairs <= threads * reg_pairs:
                    route_in_registers(mIds, mPos, sCount, sOffset, sWarp, mOffsets, mPadStart)
                else:
                    count_pairs(mIds, mPos, sCount, tidx, threads)
                    cute.arch.sync_threads()
                    scan_experts(sCount, sOffset, sWarp, mOffsets, mPadStart, True)
                    for i in cutlass.range(tidx, pairs, threads):
                        t = i // K
                        k = i % K
                        slot = mPos[t, k]
                        if slot >= 0:
                            mPos[t, k] = slot + sOffset[mIds[t, k] - e0]
            grid_barrier(mBar.iterator)
            copy_rows(mX, mXs, mOut, mOutS, mOffsets, mPos, mCounts, mPadStart,
                      bidx * warps + tidx // 32, blocks * warps, False)
        if const_expr(phase == "route"):
            count_pairs(mIds, mPos, sCount, bidx * threads + tidx, blocks * threads)
            cute.arch.sync_threads()
            # This block's first slot inside each expert, from the global per-expert counts.
            for e in cutlass.range(tidx, E, threads):
                sBase[e] = cute.arch.atomic_add(mCounts.iterator + e, sCount[e], scope="gpu")
            grid_barrier(mBar.iterator)
            for e in cutlass.range(tidx, E, threads):
                sCount[e] = cute.arch.atomic_add(mCounts.iterator + e, Int32(0), scope="gpu")
            cute.arch.sync_threads()
            scan_experts(sCount, sOffset, sWarp, mOffsets, mPadStart, bidx == 0)
            pairs = mIds.shape[0] * K
            for i in cutlass.range(bidx * threads + tidx, pairs, blocks * threads):
                t = i // K
                k = i % K
                slot = mPos[t, k]
                if slot >= 0:
                    e = mIds[t, k] - e0
                    mPos[t, k] = sOffset[e] + sBase[e] + slot
        if const_expr(phase == "copy"):
            copy_rows(mX, mXs, mOut, mOutS, mOffsets, mPos, mCounts, mPadStart,
                      bidx * warps + tidx // 32, blocks * warps, True)

    @cute.kernel
    def dispatch_kernel(mX: cute.Tensor, mIds: cute.Tensor, mOut: cute.Tensor,
                        mOffsets: cute.Tensor, mPos: cute.Tensor, mBar: cute.Tensor,
                        mCounts: cute.Tensor, mPadStart: cute.Tensor):
        body(mX, mIds, None, mOut, None, mOffsets, mPos, mBar, mCounts, mPadStart)

    @cute.kernel
    def dispatch_scaled_kernel(mX: cute.Tensor, mIds: cute.Tensor, mXs: cute.Tensor,
                               mOut: cute.Tensor, mOutS: cute.Tensor, mOffsets: cute.Tensor,
                               mPos: cute.Tensor, mBar: cute.Tensor, mCounts: cute.Tensor,
                               mPadStart: cute.Tensor):
        body(mX, mIds, mXs, mOut, mOutS, mOffsets, mPos, mBar, mCounts, mPadStart)

    cooperative = variant.cooperative
    block = list(variant.block)

    if G:

        @cute.jit
        def launch_scaled(mX: cute.Tensor, mIds: cute.Tensor, mXs: cute.Tensor, mOut: cute.Tensor,
                          mOutS: cute.Tensor, mOffsets: cute.Tensor, mPos: cute.Tensor,
                          mBar: cute.Tensor, mCounts: cute.Tensor, mPadStart: cute.Tensor,
                          grid_x: Int32, grid_y: Int32, grid_z: Int32, stream: cuda.CUstream):
            dispatch_scaled_kernel(
                mX, mIds, mXs, mOut, mOutS, mOffsets, mPos, mBar, mCounts, mPadStart
            ).launch(grid=[grid_x, grid_y, grid_z], block=block, smem=smem, stream=stream,
                     cooperative=cooperative)

        return launch_scaled

    @cute.jit
    def launch(mX: cute.Tensor, mIds: cute.Tensor, mOut: cute.Tensor, mOffsets: cute.Tensor,
               mPos: cute.Tensor, mBar: cute.Tensor, mCounts: cute.Tensor,
               mPadStart: cute.Tensor, grid_x: Int32, grid_y: Int32, grid_z: Int32,
               stream: cuda.CUstream):
        dispatch_kernel(mX, mIds, mOut, mOffsets, mPos, mBar, mCounts, mPadStart).launch(
            grid=[grid_x, grid_y, grid_z], block=block, smem=smem, stream=stream,
            cooperative=cooperative,
        )

    return launch
