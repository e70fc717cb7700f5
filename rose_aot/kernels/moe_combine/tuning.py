"""moe_combine launch-shape choices, per the H200 measurements they come from.

benchmarks/results/moe-h200.md (`python benchmarks/bench_moe.py`, H200, driver 580.159.04,
2026-11-30; 128 experts, top-8, bf16): with one block per token the combine is bound by what
one SM can pull. One token at hidden 7168 reads 8 rows of 14 KB through one SM: 2.75 µs,
against 2.04 µs for 8 rows of 4 KB (hidden 2048), about 0.7 µs for the extra 82 KB, and
torch.compile, which spreads the row over many blocks, took 1.52 µs. At 128 tokens every SM has
a token and the one-block-per-token decode reaches the copy bandwidth (3.80 µs, 4.35 TB/s).

So below one token per SM the split variant gives each token's row to several one-warp blocks
(a 512-byte chunk of every row per block on sm_90a, 1 KB on sm_100a), using every SM; from one
token per SM on, the decode/prefill rule of rms_norm applies. These thresholds follow from the
measurements above, not yet from a sweep of the split variant itself:
`python benchmarks/bench_moe.py BUNDLE --combine-sweep` times every variant forced at 1-128
tokens for top-2/4/8 next to torch.compile, which is the measurement to revise them with.
"""

from __future__ import annotations

__all__ = ["SPLIT_WARPS", "SPLIT_MAX_TOKENS_PER_SM", "SPLIT_MAX_BLOCKS_PER_SM"]

# Warps per block of the split variant, one vector per thread and row: the smallest chunk, so a
# single token's rows spread over the most SMs (28 blocks at hidden 7168 in bf16 on sm_90a).
SPLIT_WARPS = 1
# Split while tokens < SPLIT_MAX_TOKENS_PER_SM x SMs: below that the decode grid leaves SMs idle.
SPLIT_MAX_TOKENS_PER_SM = 1
# ...and while its grid fits one wave of resident blocks (Hopper and Blackwell run at most 32
# blocks per SM), so each block's griddepcontrol prologue is paid once, in parallel.
SPLIT_MAX_BLOCKS_PER_SM = 32
