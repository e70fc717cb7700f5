"""all_reduce launch choices per target arch.

World size 2 is measured (benchmarks/results/multigpu-2xh200.md, 2 x H200, NVLink, driver
580.159.04, 2026-11-30: `tests/multigpu/run.sh --bench`, both variants forced at 8 KB-64 MB).
World sizes 4 and 8 are still first guesses from the peers in ../shared/notes/perf-anchors.md,
to be replaced by the same benchmark on 4 and 8 GPUs. The block caps are guesses the block-count
sweep of that run left standing (cap 132 was best or within 3% at every size from 1 MB on).
"""

from __future__ import annotations

__all__ = [
    "THREADS",
    "ONE_SHOT_MAX_BLOCKS",
    "TWO_SHOT_MAX_BLOCKS",
    "FUSED_MAX_BLOCKS",
    "TWO_SHOT_MIN_BYTES",
]

# Threads per block of the plain all-reduce variants (one 16-byte vector per thread and step).
THREADS = 512

# Blocks of the one-shot variant at most: it pulls world_size x the message over NVLink, so
# it is meant for small messages; 64 blocks x 512 threads keep 512 KB of 16-byte loads in
# flight per peer. Guess, not measured.
ONE_SHOT_MAX_BLOCKS = 64

# Blocks of the two-shot variant at most (one per SM on an H100/H200). Guess, not measured.
TWO_SHOT_MAX_BLOCKS = 132

# Blocks of the fused all-reduce + residual + RMSNorm kernel (one row per block and step).
FUSED_MAX_BLOCKS = 128

# Messages of at least this many bytes take the two-shot variant, per world size (fewer
# ranks: one-shot's extra reads cost less). 2 ranks, measured: one-shot is faster up to 4 MB
# (1 MB: 8.96 vs 11.74 µs; 4 MB: 20.07 vs 20.48), two-shot from 8 MB (34.60 vs 34.84).
# 4 and 8 ranks: guesses, not measured.
TWO_SHOT_MIN_BYTES: dict[int, int] = {2: 8 * 1024 * 1024, 4: 128 * 1024, 8: 64 * 1024}


def two_shot_min_bytes(world_size: int) -> int:
    return TWO_SHOT_MIN_BYTES.get(world_size, 64 * 1024 if world_size > 4 else 128 * 1024)
