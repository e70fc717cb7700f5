"""moe_dispatch launch choices measured on the H200 (benchmarks/results/moe-h200.md)."""

from __future__ import annotations

__all__ = [
    "BLOCK_THREADS",
    "DECODE_MAX_PAIRS_PER_SM",
    "SMALL_BLOCK_THREADS",
    "SMALL_MAX_PAIRS",
    "SMALL_WIDE_MAX_PAIRS",
    "SMALL_VECS_PER_LANE",
    "SMALL_QUANT_VECS_PER_LANE",
    "SMALL_BLOCKS_PER_SM",
]

BLOCK_THREADS = 256
# Decode (one cooperative launch) while there are at most this many (token, k) pairs per SM of
# the device. Measured on the H200, 128 experts, top-8, hidden 2048: decode 6.35 vs prefill
# 7.23 µs at 128 tokens (1024 pairs), 8.61 vs 8.23 µs at 256 tokens (2048 pairs);
# 8 x 132 SMs = 1056 pairs puts the switch between.
DECODE_MAX_PAIRS_PER_SM = 8

# The "small" variant (every block routes redundantly, no grid barrier, plain launch with PDL).
# Measured on the H200 (benchmarks/results/moe-h200.md, 128 experts, top-8): up to its capacity
# of 256 pairs it beat the cooperative decode at every token count, 1.51 vs 4.87 µs at 1 token
# and 3.68 vs 4.69 at 32 tokens (hidden 2048; 7168: 1.64 vs 6.40, 4.89 vs 6.52). The block
# shape and per-SM limit below are first choices, not swept.
# Pairs (tokens x top_k) up to which the plan uses it; also its capacity (shared-memory arrays
# of one int32 each per pair, and the registers of the warps that rank the pairs).
# Its warps rank the pairs together, each a share of 32-pair steps, since 2026-12-01: one warp
# ranking them all was a chain of max_pairs / 32 steps in every block. With that, 512 pairs
# instead of 256: two trees alternated twice in one call (H200, 2026-12-01, benchmarks/results/
# dispatch-small-wide-experiment-h200.md, `bench_dispatch_fp8.py --no-peers`): the plain
# dispatch 5-10% faster at 1-17 tokens (one token of 2048: 1.52 -> 1.37 µs), 20-33% at 32-48
# (32 tokens of 7168: 4.8 -> 3.8) and 9-25% at 64, where the plan took the cooperative decode;
# the fused dispatch 1-4% at 1-17 tokens, 16-26% at 32-48 and 9-25% at 64. With 1024 pairs
# (11.3 KB of shared memory per block instead of 7.2, 8 more registers in the plain dispatch)
# the same code was 1-10% slower than one warp at 1-32 tokens, and slower than decode at 96-128
# tokens of the plain dispatch (up to +38%), so 512.
SMALL_MAX_PAIRS = 512
# moe_dispatch_fp8_quant only: "small_wide", small with room for this many pairs, for those
# above SMALL_MAX_PAIRS (65-128 tokens of top-8). The cooperative decode it replaces there
# quantized each of a token's copies with one block per SM, 10-12 µs at hidden 7168 whatever
# the count; small_wide quantizes a token's slice once for all its copies: 7168 row-major 96
# tokens 10.4 -> 7.5 µs, 128 tokens 10.9 -> 9.0 (same experiment).
SMALL_WIDE_MAX_PAIRS = 1024
# Threads per block: the redundant routing is per block, so blocks stay small.
SMALL_BLOCK_THREADS = 128
# Vectors (16 B on sm_90a, 32 B on sm_100a) each lane of a warp moves per unit of work: a unit
# is 32 x this many vectors of one row (a one-token 7168-wide bf16 row is 7 units on sm_90a).
SMALL_VECS_PER_LANE = 4
# At most this many blocks per SM (further units go to the same warps in a grid-stride loop).
SMALL_BLOCKS_PER_SM = 4
# moe_dispatch_fp8_quant's small variant: a unit is a slice of a token row, quantized once and
# stored to each of the token's top_k rows, and each lane quantizes this many vectors (a chain
# of shuffles and two divisions per vector, so fewer per lane and more warps). Measured on the
# H200 against 2 and 4 and against the per-copy units of 4 vectors it replaced
# (benchmarks/results/dispatch-fp8-token-units-experiment-h200.md; 128 experts, top-8, 1-32
# tokens of 2048 and 7168): 1 fastest everywhere, 5-18% under the per-copy units (one token of
# 7168: 2.57 -> 2.11 µs) and 21-43% under moe_dispatch then fp8_group_quant.
SMALL_QUANT_VECS_PER_LANE = 1
