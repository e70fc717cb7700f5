"""moe_ep_dispatch launch choices. Not measured yet on two H200s (the benchmark is
benchmarks/bench_ep.py): the block size follows moe_dispatch's measured 256 threads."""

from __future__ import annotations

__all__ = ["BLOCK_THREADS", "COPIES_PER_WARP"]

BLOCK_THREADS = 256
# (token, k) copies per warp the plan sizes the grid for: one copy per warp at decode sizes,
# up to the SM count (one block per SM, cooperative) beyond.
COPIES_PER_WARP = 1
