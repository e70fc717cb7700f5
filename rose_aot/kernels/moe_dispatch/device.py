"""CuTeDSL device code of moe_dispatch (see moe_dispatch.py for semantics and launch plans)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from ...archs import Arch
from ..device_utils import (
    SharedMemory,
    block_exclusive_sum,
    cutlass_dtype,
    grid_barrier,
    pdl_prologue,
    quotient,
    quotient_factors,
)
from ..fp8_group_quant.device import group_scale
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
    scale_group = getattr(config, "scale_group", 0)
    G = H // scale_group if scale_group else 0  # float8 tokens: scales copied with their rows
    # moe_dispatch_fp8_quant: rows quantized on the way (fp8_group_quant's rule), a group being
    # `lanes` consecutive lanes' vectors; out is e4m3 and out_scales [rows, hidden / group]
    lanes = variant.constants.get("group_lanes", 0)
    quant = lanes > 0
    eps = float(config.eps) if quant else 0.0
    ue8m0 = bool(config.ue8m0) if quant else False
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
    # small variant: a unit of work is U vectors per lane of one row slice of 32 * U vectors
    U = variant.constants.get("vecs_per_lane", 1)
    units_per_row = -(-V // (32 * U))
    # moe_dispatch_fp8_quant's small variant: a unit is a slice of a token row, quantized once
    # and stored to each of the token's rows (plain dispatch: a slice of one (token, k) copy)
    token_units = bool(variant.constants.get("token_units", False))
    assert quant or not token_units, "token units are for quantizing dispatch"
    # a work item is a token (token units) or a (token, k) pair: item = pair // item_pairs,
    # token = item // item_tokens
    item_pairs, item_tokens = (K, 1) if token_units else (1, K)
    max_pairs = variant.constants.get("max_pairs", 0)
    rank_chunks = -(-max_pairs // 32)
    # small variants: every warp of the block ranks this many chunks of 32 pairs (rank_pairs)
    chunks_per_warp = -(-rank_chunks // warps)
    search_steps = (E - 1).bit_length()  # binary search over E experts

    @cute.jit
    def quantize_vector(tXv, tQv, zero: cutlass.Constexpr = False) -> Float32:
        """One vector of a lane: its group's scale (fp8_group_quant's rule, bit for bit; the
        group's max is a shuffle over `lanes` lanes, so the whole warp calls it) and, unless
        `zero`, its e4m3 codes into tQv."""
        tYrY = cute.make_rmem_tensor((vec,), Float32)
        tYrY.store(tXv.load().to(Float32))
        amax = Float32(0.0)
        for k in cutlass.range_constexpr(vec):
            amax = cute.arch.fmax(amax, cute.math.absf(tYrY[k]))
        scale = group_scale(amax, lanes, eps, ue8m0)
        if const_expr(not zero):
            divisor, recip = quotient_factors(scale)
            for k in cutlass.range_constexpr(vec):
                tYrY[k] = quotient(tYrY[k], divisor, recip)
            tQv.store(tYrY.load().to(cutlass.Float8E4M3FN))
        return scale

    @cute.jit
    def store_codes(tQrQ, tS, mOut, mOutS, row, base, n: cutlass.Constexpr,
                    static_base: cutlass.Constexpr, zero: cutlass.Constexpr = False):
        """Vectors base + i*32 + lane (i < n) of quantized codes into row `row` of out, and
        with `tS` (one scale per vector) the scales into out_scales (the group's first lane).
        `zero`: zero bytes instead of tQrQ (padding rows). `static_base` as in `emit`."""
        lane = cute.arch.thread_idx()[0] % 32
        gO = cute.zipped_divide(mOut[row, None], (vec,))
        if const_expr(zero):
            tZero = cute.make_rmem_tensor((vec,), cutlass.Uint8)
            tZero.fill(0)
            gO = cute.zipped_divide(cute.recast_tensor(mOut, cutlass.Uint8)[row, None], (vec,))
        for i in cutlass.range_constexpr(n):
            if const_expr(static_base < 0 or static_base + i * 32 < V):
                j = base + i * 32 + lane
                if j < V:
                    if const_expr(tS is not None):
                        if lane % lanes == 0:
                            mOutS[row, j // lanes] = tS[i]
                    if const_expr(zero):
                        cute.autovec_copy(tZero, gO[(None, j)])
                    else:
                        cute.autovec_copy(tQrQ[None, i], gO[(None, j)])

    @cute.jit
    def emit(tXrX, mOut, mOutS, row, base, n: cutlass.Constexpr, static_base: cutlass.Constexpr,
             zero: cutlass.Constexpr = False):
        """Store vectors base + i*32 + lane (i < n) of a token row into row `row` of out; with
        quantization, each vector's group scale goes to out_scales as soon as it is known, the
        codes after all of them. The whole warp calls it (group maxima are warp shuffles).
        `static_base`: base is that compile-time value (vectors past the row are then skipped
        statically); -1: not known at compile time. `zero`: tXrX is all +0 (padding rows): the
        codes are stored as zero bytes, never converted. (A compile-time zero converted with
        cvt.rn.satfinite.e4m3x2 and duplicated into a 32-bit word, {%rs, %rs}, was packed by
        ptxas with a stale register's upper half: the H200 wrote nonzero codes into padding
        rows.)"""
        lane = cute.arch.thread_idx()[0] % 32
        if const_expr(quant):
            tQrQ = cute.make_rmem_tensor((vec, n), cutlass.Float8E4M3FN)
            for i in cutlass.range_constexpr(n):
                if const_expr(static_base < 0 or static_base + i * 32 < V):
                    scale = quantize_vector(tXrX[None, i], tQrQ[None, i], zero)
                    j = base + i * 32 + lane
                    if j < V and lane % lanes == 0:
                        mOutS[row, j // lanes] = scale
            store_codes(tQrQ, None, mOut, mOutS, row, base, n, static_base, zero)
        else:
            gO = cute.zipped_divide(mOut[row, None], (vec,))
            for i in cutlass.range_constexpr(n):
                j = base + i * 32 + lane
                if j < V:
                    cute.autovec_copy(tXrX[None, i], gO[(None, j)])

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
        if const_expr(quant):
            tXrX.fill(0)
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
                        if const_expr(quant):
                            emit(tXrX, mOut, mOutS, row, c * COPY_CHUNK * 32, COPY_CHUNK,
                                 c * COPY_CHUNK * 32)
                        else:
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
                    if const_expr(quant):
                        # a zero row quantized: codes 0, every scale that of an all-zero group
                        for c in cutlass.range_constexpr(-(-V // (32 * COPY_CHUNK))):
                            emit(tXrX, mOut, mOutS, row, c * COPY_CHUNK * 32, COPY_CHUNK,
                                 c * COPY_CHUNK * 32, True)
                    else:
                        gO = cute.zipped_divide(mOut[row, None], (vec,))
                        for j in cutlass.range(lane, V, 32):
                            cute.autovec_copy(tXrX[None, 0], gO[(None, j)])
                    if const_expr(G > 0):
                        for g in cutlass.range(lane, G, 32):
                            mOutS[row, g] = cutlass.Float32(0.0)
                if clear_counts and lane == 0:
                    mCounts[e] = Int32(0)  # leave the workspace zero for the next launch

    @cute.jit
    def large_body(mX, mIds, mXs, mOut, mOutS, mOffsets, mPos, mBar, mCounts, mPadStart):
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

    # --- small variant: every block routes the few pairs itself --------------------------------
    @cute.jit
    def rank_pairs(mIds, sCount, sMore, sExp, sRank):
        """Each pair's local expert (or -1) and its rank among the pairs of that expert in
        (token, k) order, and the per-expert counts. Deterministic, so every block of the grid
        computes the same rows. Warp w ranks the pairs of chunks [w * chunks_per_warp, (w + 1)
        * chunks_per_warp), 32 pairs at a time: match.any groups the lanes of one expert, the
        lowest lane of a group adds the group's size to the warp's count of that expert (warp
        0: sCount, warp w > 0: sMore[:, w - 1]), and each lane's rank is that count before
        plus the lanes of its group below it. combine_ranks then adds to each rank of warp w
        the pairs of its expert in the warps before. (One warp ranking every pair, the earlier
        form, was a chain of max_pairs / 32 such steps.)"""
        tidx, _, _ = cute.arch.thread_idx()
        lane = tidx % 32
        warp = tidx // 32
        pairs = mIds.shape[0] * K
        first = warp * chunks_per_warp
        if first * 32 < pairs:
            rKey = cute.make_rmem_tensor(chunks_per_warp, Int32)
            for c in cutlass.range_constexpr(chunks_per_warp):
                i = (first + c) * 32 + lane
                rKey[c] = Int32(-1)
                if i < pairs:
                    ident = mIds[i // K, i % K]
                    e = ident - e0
                    if ident >= 0 and ident < n_experts and e >= 0 and e < E:
                        rKey[c] = e
            below_mask = cute.arch.lanemask_lt()
            for c in cutlass.range_constexpr(chunks_per_warp):
                if (first + c) * 32 < pairs:
                    key = rKey[c]
                    peers = cute.arch.match_sync(Int32(-1), key, "any")
                    below = Int32(cute.arch.popc(peers & below_mask))
                    base = Int32(0)
                    if key >= 0:
                        if warp == 0:
                            base = sCount[key]
                        else:
                            base = sMore[key, warp - 1]
                    cute.arch.sync_warp()
                    if key >= 0 and below == 0:
                        if warp == 0:
                            sCount[key] = base + Int32(cute.arch.popc(peers))
                        else:
                            sMore[key, warp - 1] = base + Int32(cute.arch.popc(peers))
                    cute.arch.sync_warp()
                    i = (first + c) * 32 + lane
                    if i < pairs:
                        sExp[i] = key
                        sRank[i] = base + below

    @cute.jit
    def combine_ranks(mIds, sCount, sMore, sExp, sRank):
        """After rank_pairs and a block barrier, if warps past 0 ranked pairs: sCount[e]
        becomes the count of expert e over all warps, and each rank of a warp w > 0 grows by
        expert e's pairs in warps 0 .. w - 1. The whole block calls it (barriers inside)."""
        tidx, _, _ = cute.arch.thread_idx()
        pairs = mIds.shape[0] * K
        if pairs > chunks_per_warp * 32:
            for e in cutlass.range(tidx, E, threads):
                running = sCount[e]
                for w in cutlass.range_constexpr(warps - 1):
                    n = sMore[e, w]
                    sMore[e, w] = running
                    running = running + n
                sCount[e] = running
            cute.arch.sync_threads()
            for i in cutlass.range(chunks_per_warp * 32 + tidx, pairs, threads):
                key = sExp[i]
                if key >= 0:
                    sRank[i] = sRank[i] + sMore[key, i // (chunks_per_warp * 32) - 1]
            cute.arch.sync_threads()

    @cute.jit
    def scan_small(sCount, sOffset, sPad, sWarp, mOffsets, write_out):
        """sOffset[e] = first row of expert e; sPad[e] = padding rows of the experts before e
        (sPad[E] = all padding rows). Only block 0 writes expert_offsets."""
        tidx, _, _ = cute.arch.thread_idx()
        mine = Int32(0)
        pad_mine = Int32(0)
        for j in cutlass.range_constexpr(per_thread):
            e = tidx * per_thread + j
            if e < E:
                n = sCount[e]
                padded = (n + (align - 1)) // align * align
                mine = mine + padded
                pad_mine = pad_mine + padded - n
        start, total = block_exclusive_sum(mine, sWarp, threads)
        pad_start = Int32(0)
        pad_total = Int32(0)
        if const_expr(align > 1):
            pad_start, pad_total = block_exclusive_sum(pad_mine, sWarp, threads)
        for j in cutlass.range_constexpr(per_thread):
            e = tidx * per_thread + j
            if e < E:
                n = sCount[e]
                padded = (n + (align - 1)) // align * align
                sOffset[e] = start
                sPad[e] = pad_start
                if write_out:
                    mOffsets[e] = start
                start = start + padded
                pad_start = pad_start + padded - n
        if tidx == 0:
            sOffset[E] = total
            sPad[E] = pad_total
            if write_out:
                mOffsets[E] = total
        cute.arch.sync_threads()

    @cute.jit
    def load_slice(mX, t, s, tXrX):
        """Slice s of row t: lane l holds vectors s*32U + i*32 + l (i < U)."""
        lane = cute.arch.thread_idx()[0] % 32
        gX = cute.zipped_divide(mX[t, None], (vec,))
        for i in cutlass.range_constexpr(U):
            j = s * (32 * U) + i * 32 + lane
            if j < V:
                cute.autovec_copy(gX[(None, j)], tXrX[None, i])

    @cute.jit
    def copy_unit(mX, mXs, mOut, mOutS, t, row, s, tXrX):
        emit(tXrX, mOut, mOutS, row, s * (32 * U), U, -1)
        if const_expr(G > 0):
            if s == 0:
                for g in cutlass.range(cute.arch.thread_idx()[0] % 32, G, 32):
                    mOutS[row, g] = mXs[t, g]

    @cute.jit
    def small_copy(mX, mXs, mOut, mOutS, u, sExp, sOffset, sRank, tXrX, load: cutlass.Constexpr):
        """Unit u of the small variant (tXrX holds its slice unless `load`)."""
        s = u % units_per_row
        if const_expr(token_units):
            t = u // units_per_row
            if const_expr(load):
                load_slice(mX, t, s, tXrX)
            tQrQ = cute.make_rmem_tensor((vec, U), cutlass.Float8E4M3FN)
            tS = cute.make_rmem_tensor((U,), Float32)
            for i in cutlass.range_constexpr(U):
                tS[i] = quantize_vector(tXrX[None, i], tQrQ[None, i])
            for k in cutlass.range_constexpr(K):
                key = sExp[t * K + k]
                if key >= 0:
                    store_codes(tQrQ, tS, mOut, mOutS, sOffset[key] + sRank[t * K + k],
                                s * (32 * U), U, -1)
        else:
            p = u // units_per_row
            key = sExp[p]
            if key >= 0:
                if const_expr(load):
                    load_slice(mX, p // K, s, tXrX)
                copy_unit(mX, mXs, mOut, mOutS, p // K, sOffset[key] + sRank[p], s, tXrX)

    @cute.jit
    def small_body(mX, mIds, mXs, mOut, mOutS, mOffsets, mPos):
        pdl_prologue(pdl)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        blocks = cute.arch.grid_dim()[0]
        warp = tidx // 32
        lane = tidx % 32
        alloc = SharedMemory(smem, f"moe_dispatch {variant.name}")
        sCount = alloc.tensor(Int32, E + 1)
        sOffset = alloc.tensor(Int32, E + 1)
        sPad = alloc.tensor(Int32, E + 1)
        sMore = None
        if const_expr(warps > 1):  # the counts of ranking warps 1.. (rank_pairs)
            sMore = alloc.tensor(Int32, (E + 1, warps - 1))
        sExp = alloc.tensor(Int32, max_pairs)
        sRank = alloc.tensor(Int32, max_pairs)
        sWarp = alloc.tensor(Int32, warps)
        pairs = mIds.shape[0] * K
        copies = pairs // item_pairs * units_per_row
        stride = blocks * warps
        first = bidx * warps + warp
        # The token row a warp copies first does not depend on the routing: load it now.
        tXrX = cute.make_rmem_tensor((vec, U), dtype)
        if const_expr(quant):
            tXrX.fill(0)  # lanes past the row end form whole groups of their own
        if first < copies:
            load_slice(mX, first // units_per_row // item_tokens, first % units_per_row, tXrX)
        for e in cutlass.range(tidx, E, threads):
            sCount[e] = Int32(0)
            for w in cutlass.range_constexpr(warps - 1):
                sMore[e, w] = Int32(0)
        cute.arch.sync_threads()
        rank_pairs(mIds, sCount, sMore, sExp, sRank)
        cute.arch.sync_threads()
        if const_expr(warps > 1):
            combine_ranks(mIds, sCount, sMore, sExp, sRank)
        scan_small(sCount, sOffset, sPad, sWarp, mOffsets, bidx == 0)
        if bidx == 0:
            for i in cutlass.range(tidx, pairs, threads):
                key = sExp[i]
                row = Int32(-1)
                if key >= 0:
                    row = sOffset[key] + sRank[i]
                mPos[i // K, i % K] = row
        if first < copies:
            small_copy(mX, mXs, mOut, mOutS, first, sExp, sOffset, sRank, tXrX, False)
        for u in cutlass.range(first + stride, copies, stride):
            small_copy(mX, mXs, mOut, mOutS, u, sExp, sOffset, sRank, tXrX, True)
        if const_expr(align > 1):
            tZ = cute.make_rmem_tensor((vec, U), dtype)
            tZ.fill(0)
            for u in cutlass.range(first, sPad[E] * units_per_row, stride):
                q = u // units_per_row
                s = u % units_per_row
                lo = Int32(0)
                hi = Int32(E)
                for _ in cutlass.range_constexpr(search_steps):
                    if hi - lo > 1:
                        mid = (lo + hi) // 2
                        if sPad[mid] <= q:
                            lo = mid
                        else:
                            hi = mid
                row = sOffset[lo] + sCount[lo] + q - sPad[lo]
                emit(tZ, mOut, mOutS, row, s * (32 * U), U, -1, True)
                if const_expr(G > 0):
                    if s == 0:
                        for g in cutlass.range(lane, G, 32):
                            mOutS[row, g] = cutlass.Float32(0.0)

    @cute.jit
    def body(mX, mIds, mXs, mOut, mOutS, mOffsets, mPos, mBar, mCounts, mPadStart):
        if const_expr(phase == "small"):
            small_body(mX, mIds, mXs, mOut, mOutS, mOffsets, mPos)
        else:
            large_body(mX, mIds, mXs, mOut, mOutS, mOffsets, mPos, mBar, mCounts, mPadStart)

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

    @cute.kernel
    def dispatch_quant_kernel(mX: cute.Tensor, mIds: cute.Tensor, mOut: cute.Tensor,
                              mOutS: cute.Tensor, mOffsets: cute.Tensor, mPos: cute.Tensor,
                              mBar: cute.Tensor, mCounts: cute.Tensor, mPadStart: cute.Tensor):
        body(mX, mIds, None, mOut, mOutS, mOffsets, mPos, mBar, mCounts, mPadStart)

    cooperative = variant.cooperative
    block = list(variant.block)

    if quant:

        @cute.jit
        def launch_quant(mX: cute.Tensor, mIds: cute.Tensor, mOut: cute.Tensor,
                         mOutS: cute.Tensor, mOffsets: cute.Tensor, mPos: cute.Tensor,
                         mBar: cute.Tensor, mCounts: cute.Tensor, mPadStart: cute.Tensor,
                         grid_x: Int32, grid_y: Int32, grid_z: Int32, stream: cuda.CUstream):
            dispatch_quant_kernel(
                mX, mIds, mOut, mOutS, mOffsets, mPos, mBar, mCounts, mPadStart
            ).launch(grid=[grid_x, grid_y, grid_z], block=block, smem=smem, stream=stream,
                     cooperative=cooperative)

        return launch_quant

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
