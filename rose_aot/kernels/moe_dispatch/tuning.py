"""moe_dispatch launch choices measured on the H200 (benchmarks/results/moe-h200.md)."""

from __future__ import annotations

__all__ = ["BLOCK_THREADS", "DECODE_MAX_PAIRS_PER_SM"]

BLOCK_THREADS = 256
# Decode (one cooperative launch) while there are at most this many (token, k) pairs per SM of
# the device. Measured on the H200, 128 experts, top-8, hidden 2048: decode 6.35 vs prefill
# 7.23 µs at 128 tokens (1024 pairs), 8.61 vs 8.23 µs at 256 tokens (2048 pairs);
# 8 x 132 SMs = 1056 pairs puts the switch between.
DECODE_MAX_PAIRS_PER_SM = 8
