"""qk_norm launch-shape choices measured on real GPUs, per target arch.

Read off benchmarks/results/tuning-h200.json (`python benchmarks/tune_norms.py`, H200, driver
580.159.04, 2026-11-29). Archs without a measurement use the seed's rules.
"""

from __future__ import annotations

__all__ = ["prefill_warps", "decode_max_warps", "PDL_EARLY_MAX_THREADS", "PDL_LATE_MAX_THREADS"]

# Warps per prefill block: 4 beats 8/16/32 on all three shapes at 8192 + 32768 tokens
# (e.g. 32/4/128: 182.2 vs 183.6, 188.7, 197.2 µs).
PREFILL_WARPS: dict[str, int] = {"sm_90a": 4}

# The one-warp-per-block decode variant is used while the work needs fewer warps than this.
# The seed's rule is the SM count; on the H200 the 4-warp blocks were faster even at 1 token
# (1.26 vs 1.33 µs), so decode is never chosen there.
DECODE_MAX_WARPS: dict[str, int] = {"sm_90a": 0}


# Programmatic dependent launch for the prefill block's small launches, in two twins of it
# (family.py): `pdl`, the next kernel launched at the top, to PDL_EARLY_MAX_THREADS threads;
# `pdl_late`, launched after the stores, to PDL_LATE_MAX_THREADS; beyond, prefill (no
# griddepcontrol: its prologue alone cost 23% at 32768 tokens, 2026-11-30). Measured on one
# H200, 2026-12-02, each twin forced against prefill, in one process (`python
# benchmarks/ab_qk_norm.py base=BUNDLE new=BUNDLE --heads
# 32/4/128,32/8/128,64/4/128,16/8/256,8/4/256 --tokens 1,4,16,64,128,512 --force
# new:prefill,new:prefill_pdl,new:prefill_late --rounds 2`, the twins then named
# prefill_pdl / prefill_late; benchmarks/results/norm-narrow-pdl-experiment-h200.md):
# - the top trigger: 28-34% less time at every launch of up to 6144 threads (48 blocks of 128;
#   32/4/128 x 1 1.24 -> 0.86 µs, x 4 1.31 -> 0.91, 8/4/256 x 16 1.37 -> 0.95), and at one token
#   0.84-0.96 µs in the two runs after it (the A/B of the kept plan, the norms table); at
#   9216-12288 threads unsteady: 32/8/128 x 16 (80 blocks) 0.98, 1.30 and 1.50 µs in three runs
#   (prefill 1.35-1.37; the late twin 1.09), 32/4/128 x 16 (72) 0.95, 1.03 and 1.56; from
#   36864 threads level or up to 36% more (32/4/128 x 64 1.50 -> 1.75);
# - after the stores: 3-22% less at every launch of up to 49152 threads (32/4/128 x 16 1.36 ->
#   1.09, x 64 1.50 -> 1.32, 16/8/256 x 64 1.57 -> 1.50), 2-32% more from 69632 (64/4/128 x 64
#   1.66 -> 1.70, x 128 1.93 -> 2.39); no point measured between.
# So the top trigger to 6144 threads, the late one to 65536 (as rms_norm's decode_late). Archs
# without a measurement take the same twins and limits where their plan takes the prefill block
# (sm_100a: past the one-warp decode's range), unmeasured there.
PDL_EARLY_MAX_THREADS = 6144
PDL_LATE_MAX_THREADS = 65536


def prefill_warps(arch: str, override: int = 0) -> int:
    return override or PREFILL_WARPS.get(arch, PREFILL_WARPS["sm_90a"])


def decode_max_warps(arch: str) -> int:
    """Recorded as a constant of the decode variant; -1 means the device's SM count."""
    return DECODE_MAX_WARPS.get(arch, -1)
