"""Launch-shape choices measured on real GPUs, per target arch, in one place.

Every number here is read off a committed measurement: benchmarks/results/tuning-h200.json,
made with `python benchmarks/tune_norms.py build/tune-norms.rosebundle` on an H200 (driver
580.159.04, 2026-11-29), which times every variant forced at 1 to 32768 tokens. Archs without a
measurement of their own use the seed's rules with their own SM count.
"""

from __future__ import annotations

__all__ = [
    "prefill_warps",
    "qk_norm_decode_max_warps",
    "RMS_NORM_DECODE_ROW_WARPS",
    "RMS_NORM_DECODE_WARPS_PER_SM",
]

# Warps per block of the prefill variants: the fastest summed over 8192 and 32768 tokens.
# qk_norm: 4 beats 8/16/32 on all three shapes (e.g. 32/4/128: 182.2 vs 183.6, 188.7, 197.2 µs).
# rms_norm: 4 and 8 tie (1616.0 vs 1616.1 µs summed over the six shapes); 16 and 32 are slower.
PREFILL_WARPS: dict[str, dict[str, int]] = {
    "rms_norm": {"sm_90a": 4},
    "qk_norm": {"sm_90a": 4},
}

# qk_norm uses its one-warp-per-block decode variant while the work needs fewer warps than
# this. The seed's rule is the SM count; on the H200 the 4-warp blocks were faster even at
# 1 token (1.26 vs 1.33 µs), so decode is never chosen there.
QK_NORM_DECODE_MAX_WARPS: dict[str, int] = {"sm_90a": 0}


# rms_norm keeps one row per block (its decode variant) when the row needs at most
# RMS_NORM_DECODE_ROW_WARPS warps (hidden <= 4096 in bf16: decode was never slower than any
# prefill shape at any token count, within 1%), or while its grid has at most
# RMS_NORM_DECODE_WARPS_PER_SM warps per SM (hidden 7168: prefill wins from 512 tokens,
# 4.09 vs 4.33 µs).
RMS_NORM_DECODE_ROW_WARPS = 8
RMS_NORM_DECODE_WARPS_PER_SM = 32


def prefill_warps(family: str, arch: str, override: int = 0) -> int:
    """The config's explicit choice, else the measured one for the arch, else sm_90a's."""
    if override:
        return override
    table = PREFILL_WARPS[family]
    return table.get(arch, table["sm_90a"])


def qk_norm_decode_max_warps(arch: str, sm_count: int) -> int:
    return QK_NORM_DECODE_MAX_WARPS.get(arch, sm_count)
