"""qk_norm launch-shape choices measured on real GPUs, per target arch.

Read off benchmarks/results/tuning-h200.json (`python benchmarks/tune_norms.py`, H200, driver
580.159.04, 2026-11-29). Archs without a measurement use the seed's rules.
"""

from __future__ import annotations

__all__ = ["prefill_warps", "decode_max_warps"]

# Warps per prefill block: 4 beats 8/16/32 on all three shapes at 8192 + 32768 tokens
# (e.g. 32/4/128: 182.2 vs 183.6, 188.7, 197.2 µs).
PREFILL_WARPS: dict[str, int] = {"sm_90a": 4}

# The one-warp-per-block decode variant is used while the work needs fewer warps than this.
# The seed's rule is the SM count; on the H200 the 4-warp blocks were faster even at 1 token
# (1.26 vs 1.33 µs), so decode is never chosen there.
DECODE_MAX_WARPS: dict[str, int] = {"sm_90a": 0}


def prefill_warps(arch: str, override: int = 0) -> int:
    return override or PREFILL_WARPS.get(arch, PREFILL_WARPS["sm_90a"])


def decode_max_warps(arch: str) -> int:
    """Recorded as a constant of the decode variant; -1 means the device's SM count."""
    return DECODE_MAX_WARPS.get(arch, -1)
