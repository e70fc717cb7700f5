"""rms_norm launch-shape choices measured on real GPUs, per target arch.

Every number here is read off a committed measurement: benchmarks/results/tuning-h200.json,
made with `python benchmarks/tune_norms.py build/tune-norms.rosebundle` on an H200 (driver
580.159.04, 2026-11-29), which times every variant forced at 1 to 32768 tokens. Archs without a
measurement of their own use sm_90a's.
"""

from __future__ import annotations

__all__ = ["prefill_warps", "DECODE_ROW_WARPS", "DECODE_WARPS_PER_SM"]

# Warps per block of the prefill variant: 4 and 8 tie (1616.0 vs 1616.1 µs summed over the six
# shapes at 8192 and 32768 tokens); 16 and 32 are slower.
PREFILL_WARPS: dict[str, int] = {"sm_90a": 4}

# rms_norm keeps one row per block (its decode variant) when the row needs at most
# DECODE_ROW_WARPS warps (hidden <= 4096 in bf16: decode was never slower than any prefill
# shape at any token count, within 1%), or while its grid has at most DECODE_WARPS_PER_SM warps
# per SM (hidden 7168: prefill wins from 512 tokens, 4.09 vs 4.33 µs).
# These were measured with the earlier prefill shape (8 vectors per thread, no cache hints);
# the prefill variant of 2026-12-01 (2 vectors, hints, x read twice) has not been swept: the
# norms tables of that day show it level with or ahead of torch.compile from 1024 tokens at
# hidden 5120-8192 except 6144 and 8192 at 1024 tokens (0.93-0.94x; norms-wide-joined-h200.md). At
# 512-1024 tokens of 6144-8192 it was 3-9% behind in three of four A/B runs; the decode variant
# and eight other prefill shapes and load orders were forced there and none was better across
# token counts (benchmarks/results/norm-mid-tokens-experiment-h200.md), nor the prefill variant
# for rows of <= 8 warps at hidden 2048-4096.
DECODE_ROW_WARPS = 8
DECODE_WARPS_PER_SM = 32


def prefill_warps(arch: str, override: int = 0) -> int:
    """The config's explicit choice, else the measured one for the arch, else sm_90a's."""
    return override or PREFILL_WARPS.get(arch, PREFILL_WARPS["sm_90a"])
