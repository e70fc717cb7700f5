"""Device helpers shared by moe_ep_dispatch and moe_ep_combine (CuTeDSL; builder and tests
only): raw-address views of rows in peer regions, plain 32-bit loads and stores at raw
addresses, flag waits, the warp row copy and the per-block epoch bookkeeping."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm

from ..device_utils import load_acquire_sys, trap
from .protocol import MAX_BLOCKS

__all__ = ["row_view", "st_i32", "ld_i32", "wait_flag", "copy_row", "finish", "check_rank",
           "COPY_CHUNK"]

# 128-bit vectors a lane loads before it stores them (64 registers), as moe_dispatch.
COPY_CHUNK = 16


def row_view(dtype, address, vec: int, vectors: int):
    """A [vec, vectors] view of the 16-byte-aligned row at `address` (Int64, any GPU's memory
    mapped here)."""
    ptr = cute.make_ptr(dtype, address, cute.AddressSpace.gmem, assumed_align=16)
    return cute.make_tensor(ptr, cute.make_layout((vec, vectors), stride=(1, vec)))


def st_i32(address, value) -> None:
    """Plain st.global.b32 at a raw address (ordered for peers by a later release)."""
    llvm.inline_asm(
        None,
        [Int64(address).ir_value(), Int32(value).ir_value()],
        "st.global.b32 [$0], $1;",
        "l,r,~{memory}",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


def ld_i32(address) -> Int32:
    """ld.relaxed.sys.global.b32 at a raw address, after the acquire (by this thread, or by a
    thread of its block before a block barrier) that made the peer's write visible; relaxed at
    system scope so that no stale L1 line from an earlier step can answer."""
    return Int32(
        llvm.inline_asm(
            Int32.mlir_type,
            [Int64(address).ir_value()],
            "ld.relaxed.sys.global.b32 $0, [$1];",
            "=r,l,~{memory}",
            has_side_effects=True,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@cute.jit
def wait_flag(address: Int64, epoch: Int32):
    """Spin with system-scope acquire loads until the flag reaches `epoch` (wrap-safe: a flag
    never runs more than one step ahead of a waiter, see protocol.py)."""
    seen = load_acquire_sys(address)
    while seen - epoch < 0:
        seen = load_acquire_sys(address)


@cute.jit
def copy_row(gSrc: cute.Tensor, gDst: cute.Tensor, lane: Int32, dtype: cutlass.Constexpr,
             vec: cutlass.Constexpr, vectors: cutlass.Constexpr):
    """One warp copies a [vec, vectors] row: COPY_CHUNK loads in flight per lane, then the
    stores."""
    rV = cute.make_rmem_tensor((vec, COPY_CHUNK), dtype)
    for c in cutlass.range_constexpr(-(-vectors // (32 * COPY_CHUNK))):
        for i in cutlass.range_constexpr(COPY_CHUNK):
            j = lane + (c * COPY_CHUNK + i) * 32
            if j < vectors:
                cute.autovec_copy(gSrc[None, j], rV[None, i])
        for i in cutlass.range_constexpr(COPY_CHUNK):
            j = lane + (c * COPY_CHUNK + i) * 32
            if j < vectors:
                cute.autovec_copy(rV[None, i], gDst[None, j])


@cute.jit
def check_rank(rank: Int32, world_size: cutlass.Constexpr):
    # A rank outside [0, world_size) would index the pointer table out of bounds.
    if rank < 0 or rank >= world_size:
        trap()


@cute.jit
def finish(mState: cute.Tensor, epoch: Int32, threads: cutlass.Constexpr):
    """Record the step's epoch: every block in its own word, block 0 also in the words of the
    blocks this launch did not have, so the next launch (any grid) reads it."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    blocks, _, _ = cute.arch.grid_dim()
    if tidx == 0:
        mState[bidx] = epoch
    if bidx == 0:
        for i in cutlass.range(blocks + tidx, MAX_BLOCKS, threads):
            mState[i] = epoch
