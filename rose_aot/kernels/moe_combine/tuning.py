"""moe_combine launch-shape choices, per the H200 measurements they come from.

benchmarks/results/moe-h200.md (`python benchmarks/bench_moe.py`, H200, driver 580.159.04,
2026-11-30; 128 experts, top-8, bf16): with one block per token the combine is bound by what
one SM can pull. One token at hidden 7168 reads 8 rows of 14 KB through one SM: 2.75 µs,
against 2.04 µs for 8 rows of 4 KB (hidden 2048), about 0.7 µs for the extra 82 KB, and
torch.compile, which spreads the row over many blocks, took 1.52 µs. At 128 tokens every SM has
a token and the one-block-per-token decode reaches the copy bandwidth (3.80 µs, 4.35 TB/s).

So below one token per SM the split variant gives each token's row to several one-warp blocks
(a 512-byte chunk of every row per block on sm_90a, 1 KB on sm_100a), using every SM; from one
token per SM on, the decode/prefill rule of rms_norm applies.

The sweep of the split variant (`python benchmarks/bench_moe.py BUNDLE --combine-sweep`, H200,
2026-11-30, benchmarks/results/moe-combine-sweep-h200.log: top-2/4 x hidden 2048-7168 x 1-128
tokens, every variant forced, torch.compile next to it; the run's time limit stopped it before
top-8 and the last top-4 points) set the block limit: split is fastest
at one token everywhere (0.82-0.95 µs against decode 1.00-1.52 and torch.compile 1.44-1.76)
and mostly up to about 1000 blocks (top-4, T=64 at hidden 4096: 1.91 vs decode 2.03), slower
beyond (top-2, T=128 at hidden 4096: 3.12 vs 1.96; T=64 at hidden 6144: 2.50 vs 1.69), where one-warp blocks
stop paying for themselves. Hence at most 8 blocks per SM (1056 on an H200).
"""

from __future__ import annotations

__all__ = ["SPLIT_WARPS", "SPLIT_MAX_TOKENS_PER_SM", "SPLIT_MAX_BLOCKS_PER_SM", "SPLIT_WIDE_LOADS",
           "SPLIT_WIDE_TOP_K", "SPLIT_WIDE_MIN_TOKENS", "SPLIT_WIDE_OVER_CAP_TOP_K",
           "SPLIT_BLOCK_WARPS", "SPLIT_BLOCK_PDL_MAX_THREADS", "SPLIT_BLOCK_LATE_BEYOND_TOP_K"]

# Warps per block of the split variant, one vector per thread and row: the smallest chunk, so a
# single token's rows spread over the most SMs (28 blocks at hidden 7168 in bf16 on sm_90a).
SPLIT_WARPS = 1
# Split while tokens < SPLIT_MAX_TOKENS_PER_SM x SMs: below that the decode grid leaves SMs idle.
SPLIT_MAX_TOKENS_PER_SM = 1
# ...and while its grid has at most this many blocks per SM (measured: see above).
SPLIT_MAX_BLOCKS_PER_SM = 8
# Row loads in flight per thread of the split_wide variant: vectors per thread = this / top_k
# (at least 1), so top-2 takes 4 vectors (4 x fewer blocks than split) and top-4 takes 2: the same
# 8 loads of 16 bytes per thread either way (top-2 at 64-128 tokens ran 2-10% behind
# torch.compile with decode and split; top-4 with 4 vectors, 16 loads, still 3-5% behind at 64
# tokens of hidden 6144-7168).
SPLIT_WIDE_LOADS = 8
# The sweep with split_wide (`bash benchmarks/run_gpu.sh moe_sweep`, SWEEP_TOKENS=16,32,64,128,
# H200, 2026-11-30, benchmarks/results/moe-combine-sweep-h200.{md,json}; every variant forced):
# - top-2: split_wide was the fastest variant at 15 of the 16 points (hidden 2048-7168, 16-128
#   tokens; the other a tie), e.g. hidden 7168 at 64 tokens 1.82 µs against decode 1.92, split
#   2.84 and torch.compile 2.06; at 16-32 tokens of hidden 2048-4096 its grid is small enough for
#   programmatic dependent launch (1.03-1.05 against 1.48-1.51 for split);
# - top-4: where split passes its block limit (64-128 tokens at hidden 6144-7168) split_wide
#   beat decode by 3-6% (hidden 7168, 64 tokens: 2.17 vs 2.31); at hidden 4096 and 128 tokens
#   it lost 4% (2.35 vs 2.25), the one loss of the rule; below the limit split stays best;
# - top-8: split or decode everywhere (split_wide 3-40% slower).
# With 8 loads per thread (top-4: 2 vectors instead of 4; sweep of 2026-11-30, SWEEP_TOP_K=2,4,
# SWEEP_TOKENS=16,32,64,128, the previous bundle's split_wide run after it on the other GPU of
# the same call): top-4's split_wide became the fastest or within 2% of it at 13 of 16 points
# (hidden 4096, 64 tokens: 1.86 vs 2.08 with 4 vectors; 6144, 32 tokens: 1.75 vs split 1.86),
# so the plan takes it for top-4 from 16 tokens like top-2. It lost at hidden 7168 and 128
# tokens (2.88, against 2.63 with 4 vectors and decode 2.76) and hidden 4096 at 16 tokens
# (1.59 vs split 1.53).
SPLIT_WIDE_TOP_K = 4  # split_wide from SPLIT_WIDE_MIN_TOKENS tokens (below one token per SM)
SPLIT_WIDE_MIN_TOKENS = 16  # below it the sweep of the previous session chose split (1-16 tokens)
SPLIT_WIDE_OVER_CAP_TOP_K = 4  # split_wide instead of decode where split's grid is over its limit
# Top-8 where split's grid is over its limit takes split_block (family.py). The sweep of top-8
# with every variant forced (`SWEEP_TOP_K=8 SWEEP_TOKENS=16,32,64,128 bash benchmarks/run_gpu.sh
# moe_sweep`, H200, 2026-12-01, benchmarks/results/moe-combine-sweep-top8-h200.{md,json}): at
# the five points over the limit split_block was 8-21% faster than decode, which the plan took
# before (hidden 7168, 64 tokens: 2.71 vs 3.42 µs; 128 tokens: 3.50 vs 3.81; 6144 x 128: 3.31 vs
# 3.54; 4096 x 128: 2.89 vs 3.17; 6144 x 64: 2.62 vs 3.23), and split forced there was up to
# 45% slower than split_block (7168 x 128: 5.06) or within 2% of it (6144 x 64: 2.57); under the
# limit split stays fastest (e.g. 7168 x 32: 2.20 vs 2.44).
# Warps per block of the split_block variant (one vector per thread and row, a 128-vector chunk
# of the row per block): split's work split in torch.compile's block size, a quarter of split's
# blocks without split_wide's longer threads. The sweep with it (2026-11-30, SWEEP_TOP_K=2,4,
# SWEEP_TOKENS=16,32,64,128, benchmarks/results/moe-combine-sweep-h200.{md,json}, every
# variant forced): split_wide stays fastest where its whole launch is at most PDL_MAX_THREADS
# threads, so that it gets programmatic dependent launch (top-2 at 16-32 tokens of 2048 and 16
# of 4096: 1.03-1.05 µs against 1.39-1.50; top-4 at 16 tokens of 2048: 0.98 vs 1.58); beyond
# that split_block was the fastest at 21 of the 28 points and within 5% at the others (top-2,
# hidden 7168, 128 tokens: 1.97 µs against split_wide 2.18 and torch.compile 2.11; top-4, 7168,
# 64 tokens: 2.06 against 2.19). The plan takes it there (family.py). It is ahead of
# torch.compile at each of those points but top-4 at hidden 7168 and 128 tokens (2.63 vs 2.55).
SPLIT_BLOCK_WARPS = 4
# split_block's launches (always above spec.PDL_MAX_THREADS threads in the plan) of at most this
# many threads take its twin `split_block_late` (family.py): programmatic dependent launch with
# the next kernel launched after the stores (device_utils.pdl_epilogue), like rms_norm's
# decode_late, and the weights read after the row loads are issued (device.py). Measured on one
# H200, 2026-12-02, in one process against the shipped variants (`python
# benchmarks/ab_combine.py base=BUNDLE late=BUNDLE --top-k 2,4,8 --hidden 2048,4096,6144,7168
# --tokens 1,16,64,96,128`, the late cubin in split_block's place; benchmarks/results/
# norm-late-pdl-experiment-h200.md, call 4): 11-25% less time at every launch of 8192-65536
# threads it takes (top-2 7168 x 16 1.47 -> 1.20 µs; top-4 4096 x 16 1.62 -> 1.22, x 128 2.20 ->
# 1.90, 7168 x 64 2.04 -> 1.74; top-8 7168 x 64 2.74 -> 2.39, 4096 x 128 2.86 -> 2.46; top-2
# 4096 x 128 1.74 -> 1.73). Beyond 65536 threads, launched without the attribute, the late cubin
# was 2-4% faster at top-4 (6144 x 128 2.51 -> 2.41, 7168 x 128 2.65 -> 2.58; 6-7% in call 2,
# with the weights read before the rows) but 5-11% slower at top-2 (7168 x 128 2.03 -> 2.26,
# 6144 x 128 1.88 -> 2.07; 7-13% in calls 2-3) and 1-4% at top-8 (7168 x 128 3.48 -> 3.59), so
# those launches take split_block_late at SPLIT_BLOCK_LATE_BEYOND_TOP_K and split_block (its
# cubin as before) at the other top_k; split_block is compiled only where such a launch exists.
# The other variants keep the trigger at the top: `split` lost 20-24% at one token with the late
# one (call 1: top-4 4096 x 1 0.90 -> 1.12) and 12% at top-8 4096 x 64 (2.24 -> 2.51).
SPLIT_BLOCK_PDL_MAX_THREADS = 65536
SPLIT_BLOCK_LATE_BEYOND_TOP_K = 4
