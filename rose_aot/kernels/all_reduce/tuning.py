"""all_reduce launch choices per target arch.

NOT YET MEASURED. The numbers below are first guesses, chosen from the peers measured on the
two-H200 machine (../shared/notes/perf-anchors.md, "Two H200s": torch symm_mem's two-shot is
at or below its one-shot from 8 KB on, and clearly below from 1 MB). They must be replaced by
the crossover `benchmarks/bench_multigpu.py` prints ("suggested two_shot_min_bytes"), which
times both variants forced at every size, and the measurement committed beside them.
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
# ranks: one-shot's extra reads cost less). Guess, not measured.
TWO_SHOT_MIN_BYTES: dict[int, int] = {2: 256 * 1024, 4: 128 * 1024, 8: 64 * 1024}


def two_shot_min_bytes(world_size: int) -> int:
    return TWO_SHOT_MIN_BYTES.get(world_size, 64 * 1024 if world_size > 4 else 128 * 1024)
