"""The expert-parallel (data-parallel) MoE protocol over NVLink, in plain Python: the byte
layout of every rank's peer-visible region and of the local state, shared by moe_ep_dispatch,
moe_ep_combine and rose_aot.distributed.ep (which allocates them). No cutlass.

One call of the protocol is a *step*: a dispatch, then its combine. The dispatch raises the
step's epoch; its combine uses the same epoch. Every region below exists twice, selected by the
epoch's parity, so a rank one step ahead never writes where a slower peer still reads.

Region of every rank (torch symmetric memory, same layout on every rank; byte offsets from
:func:`region_layout`; ``W`` ranks, ``cap`` slots per sender, ``p`` the parity):

    header        int32 words: count flag [p][sender] at COUNT_FLAGS, done flag [p][receiver]
                  at DONE_FLAGS (HEADER_BYTES in all)
    send_flags    int32 [2][W][cap]   per-slot release flag of a dispatched row (epoch)
    return_flags  int32 [2][W][cap]   per-slot release flag of a returned expert output row
    return_rows   16-bit [2][W][cap][hidden]  expert outputs sent back to this rank (combine)
    -- the dispatch part (the combine does not read it) --
    counts        int32 [2][W][local_experts rounded to 4]  rows per local expert from a sender
    meta          int32 [2][W][cap]   the local expert of each received slot
    recv_rows     dtype [2][W][cap][hidden]   rows received from each sender
    recv_scales   fp32  [2][W][cap][groups]   their scales (float8 tokens)

Local state of every rank (int32 [STATE_WORDS], zeroed once, never reset): the epoch of the
last step per block (each block of every launch reads its own word, so no block can see a
later value written by another block of the same launch), the rows received from each sender
in the last dispatch (for the combine), and a self-resetting grid-barrier word.
"""

from __future__ import annotations

__all__ = [
    "MAX_RANKS",
    "MAX_BLOCKS",
    "STATE_WORDS",
    "RECV_TOTALS",
    "BARRIER_WORD",
    "HEADER_BYTES",
    "COUNT_FLAGS",
    "DONE_FLAGS",
    "ACCESS_BYTES",
    "SLOT_ALIGN",
    "RETURN_ELEM_BYTES",
    "slots_for",
    "shared_layout",
    "region_layout",
    "region_bytes",
]

MAX_RANKS = 8
MAX_BLOCKS = 256  # grids never exceed it; one epoch word per block
RECV_TOTALS = MAX_BLOCKS  # state[RECV_TOTALS + s]: rows received from sender s
BARRIER_WORD = MAX_BLOCKS + MAX_RANKS  # the dispatch's grid barrier (self-resetting)
STATE_WORDS = MAX_BLOCKS + 16
COUNT_FLAGS = 0  # header word of the count flag of (parity p, sender s): p * MAX_RANKS + s
DONE_FLAGS = 2 * MAX_RANKS  # header word of the done flag of (parity p, receiver r)
HEADER_BYTES = 256
ACCESS_BYTES = 16  # one 128-bit vector per lane and step, local and over NVLink
SLOT_ALIGN = 4  # slots per sender are a multiple of 4: every int32 array stays 16-byte aligned
RETURN_ELEM_BYTES = 2  # expert outputs travel back in bfloat16 / float16


def slots_for(max_tokens: int, top_k: int) -> int:
    """Slots per sender for up to `max_tokens` tokens per rank: every (token, k) copy may go to
    one rank (skewed routing), so max_tokens x top_k, rounded up to SLOT_ALIGN."""
    n = max(1, max_tokens * top_k)
    return -(-n // SLOT_ALIGN) * SLOT_ALIGN


def shared_layout(world_size, cap, hidden) -> dict:
    """Byte offsets of the part both families use. `cap` may be a device value (Int64) in
    kernels; the other arguments are Python ints."""
    W = world_size
    out = {"send_flags": HEADER_BYTES}
    out["return_flags"] = out["send_flags"] + 2 * W * 4 * cap
    out["return_rows"] = out["return_flags"] + 2 * W * 4 * cap
    out["end"] = out["return_rows"] + 2 * W * hidden * RETURN_ELEM_BYTES * cap
    return out


def local_padded(local_experts: int) -> int:
    return -(-local_experts // 4) * 4


def region_layout(world_size, cap, hidden, local_experts, elem_bytes, groups) -> dict:
    """Byte offsets of every array of a rank's region (see the module docstring), and "end",
    its size. `elem_bytes`: bytes of one dispatched element; `groups`: fp32 scales per row
    (0 without)."""
    W = world_size
    out = shared_layout(W, cap, hidden)
    out["counts"] = out["end"]
    out["meta"] = out["counts"] + 2 * W * 4 * local_padded(local_experts)
    out["recv_rows"] = out["meta"] + 2 * W * 4 * cap
    out["recv_scales"] = out["recv_rows"] + 2 * W * hidden * elem_bytes * cap
    out["end"] = out["recv_scales"] + 2 * W * groups * 4 * cap
    return out


def region_bytes(world_size: int, cap: int, hidden: int, local_experts: int, elem_bytes: int,
                 groups: int) -> int:
    return region_layout(world_size, cap, hidden, local_experts, elem_bytes, groups)["end"]
