"""rms_norm launch-shape choices measured on real GPUs, per target arch.

Every number here is read off a committed measurement: benchmarks/results/tuning-h200.json,
made with `python benchmarks/tune_norms.py build/tune-norms.rosebundle` on an H200 (driver
580.159.04, 2026-11-29), which times every variant forced at 1 to 32768 tokens. Archs without a
measurement of their own use sm_90a's.
"""

from __future__ import annotations

__all__ = ["prefill_warps", "DECODE_ROW_WARPS", "DECODE_WARPS_PER_SM", "PREFILL_MIN_BYTES",
           "PLAIN_GRID_RULE_ROW_BYTES", "MID_ROW_BYTES", "MID_WARPS", "MID_MIN_BLOCKS",
           "MID_MAX_BYTES",
           "DECODE_BLOCK_WARPS", "MID_BLOCK_ROW_BYTES", "WEIGHT_FIRST_ROW_BYTES",
           "DECODE_LATE_PDL_MAX_THREADS", "LATE_TRIGGER_ROW_BYTES"]

# Warps per block of the prefill variant: 4 and 8 tie (1616.0 vs 1616.1 µs summed over the six
# shapes at 8192 and 32768 tokens); 16 and 32 are slower.
PREFILL_WARPS: dict[str, int] = {"sm_90a": 4}

# rms_norm keeps its decode variant (one row per block; rows of 1-2 warps: DECODE_BLOCK_WARPS
# below) when the row needs at most DECODE_ROW_WARPS warps (hidden <= 6144 in bf16) and the
# call moves less than PREFILL_MIN_BYTES (below), or while its grid has at most
# DECODE_WARPS_PER_SM warps per SM (hidden 7168: prefill wins from 512 tokens, 4.09 vs 4.33 µs).
# These were measured with the earlier prefill shape (8 vectors per thread, no cache hints),
# against which decode was never slower for rows of <= 8 warps, within 1%. The prefill variant
# of 2026-12-01 (2 vectors, hints, x read twice) is level with or ahead of torch.compile from
# 1024 tokens at hidden 5120-8192 except 6144 and 8192 at 1024 tokens (0.93-0.94x;
# norms-wide-joined-h200.md). At 512-1024 tokens of 6144-8192 it was 3-9% behind in three of
# four A/B runs; the decode variant and eight other prefill shapes and load orders were forced
# there and none was better across token counts
# (benchmarks/results/norm-mid-tokens-experiment-h200.md); for rows of 14-16 KiB the `mid`
# variant below is.
# DECODE_ROW_WARPS was 8 until the wide rows were timed from a reset L2 as well (one H200,
# 2026-12-01, `python benchmarks/ab_norms.py wide=build/bench-norms-wide.rosebundle --hidden
# 5120,6144,8192 --tokens 256,512,1024,2048,4096 --fused 0,1 --rounds 2 --force decode,prefill`,
# benchmarks/results/norm-wide-rows-reset-ab-h200.log): plain rows of 10 and 12 warps (hidden
# 5120, 6144) ran 2-5% faster on the decode variant at 512-1024 tokens (5120 x 1024: 4.94 vs
# 5.21 µs; 6144 x 512: 3.50 vs 3.69), prefill 1-4% faster from 2048 (40-48 MiB; 6144 x 2048:
# 13.48 vs 14.07), the 32 MiB rule again; fused rows of 10-12 warps level (within 1%) at 512-1024.
# At 16 warps (hidden 8192) decode was 5-8% slower from 512 tokens (16 MiB; 8192 x 1024: 7.67
# vs 7.21), so those rows keep the grid rule alone. (The earlier A/B without the reset found the
# same at 5120-6144 for a prefill block keeping x in registers: norm-mid-tokens-experiment-h200.md,
# "nr".)
DECODE_ROW_WARPS = 12
DECODE_WARPS_PER_SM = 32
# Rows of 4-12 warps (hidden 2048-6144 in bf16; since 2026-12-02 the plain ones below 8 KiB take
# the grid rule alone: PLAIN_GRID_RULE_ROW_BYTES below) take the prefill variant all the same
# from this many bytes moved per call (rows read and written, residual included;
# bytes_per_token): there the prefill block is the decode block, one row, with the cache hints.
# Both forced side by side, every timing from an L2 without lines an earlier kernel kept at
# evict_last
# (benchmarks/common.reset_l2_priorities; benchmarks/results/norm-narrow-hints-experiment-h200.md,
# calls 9-10, bf16, hidden 2048-4096, 512-65536 tokens): decode won 2-5% up to 12.6 MB
# (512-1024 tokens; plain 2048 x 1024: 2.83 vs 2.89 µs); from 16.8 to 50 MB the two were within
# 2% either way (plain 4096 x 2048: decode 6.87 vs 6.93; plain 3072 x 2048: prefill 5.43 vs
# 5.54) but for plain 2048 x 4096 (34 MB: prefill 6.67 vs 6.93); prefill won 1-5% from 67 MB on
# (plain 4096 x 4096: 17.38 vs 18.31; fused 4096 x 2048: 15.43 vs 16.05; fused 4096 x 65536:
# 507.2 vs 532.4, Liger 524.0). 32 MiB (33.5 MB) is where prefill's gains at plain 2048 x 4096
# and fused 4096 x 1024 begin. (The first runs of that experiment put the switch at 448 MiB:
# their decode figures came after hinted kernels had run on the same tensors and gained 4-7%
# from the lines those left in L2.)
PREFILL_MIN_BYTES = 32 << 20
# Plain rows of PLAIN_GRID_RULE_ROW_BYTES (3 KiB up to 8 KiB: hidden 1536-4095 in bf16) take the
# grid rule alone, as rows of more than DECODE_ROW_WARPS warps do: past
# DECODE_WARPS_PER_SM warps per SM the prefill variant (their records carry a prefill_min_bytes
# of 0; bundles built before keep 32 MiB). The 32 MiB rule was measured before the prefill
# variant loaded the weight first (WEIGHT_FIRST below); since, it beats these rows' decode long
# before 32 MiB. One H200, 2026-12-02, each variant forced (`python benchmarks/ab_norms.py
# main=BUNDLE --hidden 1024,1536,2048 --tokens 1024,2048,3072,4096,6144 --fused 0,1 --force
# decode,prefill`, then `grid=BUNDLE --hidden 1536,2048,2560,3072,3584 --tokens
# 512,768,1024,1536,2048,3072 --fused 0 --force decode,prefill`;
# benchmarks/results/norm-plain-grid-rule-{sweep,ab}-h200.log): at every point the plan changes
# (past the grid rule, below 32 MiB: 19 points of hidden 1536-3584 at 768-4096 tokens, 23
# timings) prefill took 2.8-12.7% less time than decode (1536 x 2048 3.61 -> 3.24 µs, 2048 x
# 2048 4.23 -> 3.83, 2560 x 1536 4.10 -> 3.58, 3584 x 1024 4.05 -> 3.61, 3072 x 768 2.97 ->
# 2.88), and the new plan's own column matched it; inside the grid rule decode was level or
# ahead (2048 x 512 2.17 vs 2.24) but at 2048 x 1024 (2.80 vs 2.71), left on decode. Rows of
# 2 KiB (hidden 1024) and the fused rows were level, within 3.5% either way (1024 x 4096 3.96
# vs 4.04, fused 1536 x 3072 6.61 vs 6.83, fused 2048 x 4096 15.71 vs 15.24): they keep 32 MiB.
PLAIN_GRID_RULE_ROW_BYTES = (3 << 10, 8 << 10)

# Rows of 1-2 warps (hidden <= 1024 in bf16; DeepSeek-V3's kv_a_layernorm at 512) share a decode
# block of this many warps, the prefill block's (4 rows of one warp, 2 of two), so that they follow
# the 32 MiB rule above as the one-row blocks of 4-12 warps do: decode is that block without cache
# hints and with x kept in registers.
# Before, decode launched one row per block and the plan never left it: a grid of one- or two-warp
# blocks is bound by how fast the SMs take in blocks (plain 512 x 16384: 11.4 µs, the 4-row block
# 6.6). One H200, 2026-12-02 (benchmarks/results/norm-narrow-rows-experiment-h200.md): first every
# variant forced (`python benchmarks/ab_norms.py main=BUNDLE nh=BUNDLE --hidden
# 128,256,512,1024,1536 --tokens 128,1024,4096,16384,65536 --force decode,prefill`, nh the 4-warp
# block without hints), then main's plan against this one, both in one process (`... old=BUNDLE
# b=BUNDLE --hidden 256,512,1024 --tokens 1,16,128,256,512,1024,2048,4096,16384,65536 --force
# decode,prefill`): 0.5-65% less time from 1024 tokens at hidden 256-1024 (plain 512 x 4096 3.76 ->
# 2.79, x 16384 11.42 -> 6.59; torch.compile 2.48, 6.43), 2-13% at 1-1024 tokens of two-warp rows
# (plain 1024 x 1: 1.45 -> 1.29; fused 1024 x 1024: 2.63 -> 2.30); at 16-512 tokens of 512, up to
# 5% more (plain x 512: 1.65 -> 1.73; fused x 16: 1.44 -> 1.50; x 128 level), where one-row blocks
# spread the few rows over more SMs. Forced, the 4-row block with the hints was 0.6-2.2% faster
# than without from 32 MiB (fused 512 x 65536: 64.99 vs 66.23) but at fused 1024 x 4096 (32 MiB
# exactly: 6.09 vs 5.86) and plain 256 x 65536 (18.28 vs 17.70), whose rows stay partly in the L2
# between replays.
DECODE_BLOCK_WARPS = 4

# Rows of 14-16 KiB (hidden 7168-8192 in bf16: 14-16 warps of 2 vectors) have a third
# variant, `mid`, for the calls between the decode range (the grid rule above) and
# MID_MAX_BYTES moved per call: one row per block of 16 warps (a 14-warp row's last vectors
# predicated off), no cache hints, x kept in registers, and compiled for at least 4 blocks per
# SM (nvvm.minctasm: at most 32 registers).
# Why: the decode variant takes 40 registers, so only 3 of its 14- or 16-warp blocks fit an SM
# (396 rows at a time, two waves at 512 tokens), and the prefill variant's hints and second
# read of x cost at these sizes what they save from 64 MiB. Measured on one H200, 2026-12-02
# (benchmarks/results/norm-mid-variant-experiment-h200.md, `python benchmarks/ab_norms.py
# LABEL=BUNDLE ... --hidden 5120,6144,7168,8192 --fused 0,1 --force ...`): the block forced
# (with decode's PDL instructions, which mid drops) at plain 7168 x 512 / 1024 / 2048 3.93 /
# 6.22 / 16.11 µs against the prefill variant's 4.05 / 6.44 / 16.49, 8192 x 512 / 1024 4.32 /
# 7.07 against 4.43 / 7.21, fused 7168 x 512 / 1024 5.43 / 12.30 against 5.83 / 12.66, fused
# 8192 x 512 6.30 against 6.47; slower than prefill from 64 MiB (plain 8192 x 2048: 19.02 vs
# 18.05; 7168 x 8192: 57.66 vs 56.78; fused 8192 x 1024: 16.04 vs 15.86) and than decode at
# 1-128 tokens (1-3%: 8192 x 16 2.06 vs 2.00), where decode stays. The plan with mid against
# the plan before, alternating in one process: 1.7-8.2% less time at 512-1024 tokens of
# 7168-8192 (plain 8192 x 1024: 7.22 -> 7.02; fused 7168 x 512: 5.85 -> 5.37), 7168 x 2048
# level (16.42 -> 16.51). Rows of 10-12 KiB (hidden 5120-6144) gained nothing from 16 warps
# and 32 registers (6144 x 512: 3.73 vs decode 3.70); their plain rows have a mid of another
# shape (MID_BLOCK_ROW_BYTES below). The plain 14-16 KiB mid loads the weight first and forms
# x * w before the sum (WEIGHT_FIRST below).
MID_ROW_BYTES = (14 << 10, 16 << 10)  # the rows (input bytes) whose points have this `mid`
MID_WARPS = 16
MID_MIN_BLOCKS = 4
MID_MAX_BYTES = 64 << 20


# WEIGHT_FIRST: where the weight's load is issued before x's (the variant constant weight_first)
# and x * w formed before the row's sum (scale_before_sum). Loaded after x, as the variants were
# first written, ptxas issues the weight's load once x has arrived (it gives the weight x's
# registers), so its latency (an L2 hit at best) follows x's instead of overlapping it, and the
# row's sum hides only part of it. Measured on one H200, 2026-12-02, every variant's plan against
# main's in one process (`python benchmarks/ab_norms.py main=BUNDLE new=BUNDLE ... --hidden
# 128,256,512,1024,2048,4096,5120,6144,7168,8192 --tokens 1,16,128,512,1024,4096 --fused 0,1
# --rounds 2`, and 16384 / 65536 tokens with prefill forced;
# benchmarks/results/norm-weight-first-experiment-h200.md):
# - decode of rows of one warp of WEIGHT_FIRST_ROW_BYTES (1 KiB: hidden 512 in bf16, two 16-byte
#   vectors per thread on sm_90a; no exchange between warps to hide the weight behind): 5-10%
#   less time at 16-4096 tokens (plain 512 x 16 1.41 -> 1.29 µs, x 1024 1.80 -> 1.68, x 4096
#   2.80 -> 2.52; fused 512 x 128 1.62 -> 1.45).
#   Rows of 256-512 bytes (hidden 128-256) gained 5-10% fused at 16-1024 tokens but lost
#   5-7% elsewhere (plain 256 x 4096 1.97 -> 2.08, fused 256 x 16384 5.79 -> 6.18), and the
#   decode of rows of 2-16 warps gained nothing at 1-128 tokens or lost up to 6% (fused 1024 x 1
#   1.34 -> 1.42): those load it after x.
# - prefill, rows of at least 1 KiB (hidden >= 512 in bf16): 1-5% at 4096-16384 tokens (plain
#   2048 x 4096 6.71 -> 6.35, 512 x 16384 6.59 -> 6.32, 1024 x 16384 17.39 -> 16.72), within
#   0.5% from 64 MiB; the plain prefill of rows of 8-12 warps became faster than their decode
#   from 768 tokens (4096 x 1024: 3.95 against 4.37), which `mid` below now covers.
# - mid: see MID_BLOCK_ROW_BYTES; the 14-16 KiB rows' plain mid, with both, 3-9% at 512-1024
#   tokens (8192 x 512 4.28 -> 4.02, 8192 x 1024 7.04 -> 6.60, 7168 x 1024 6.35 -> 5.95). With
#   the fused residual the 14-16 KiB mid was 9% slower with both at 8192 x 512 in one build and
#   3% faster in another, so it loads the weight after x.
# Archs without a measurement of their own (sm_100a: 32-byte vectors) follow the same row bytes.
WEIGHT_FIRST_ROW_BYTES = 1 << 10

# Plain rows of 8-12 KiB (hidden 4096-6144 in bf16: 8-12 warps of 2 vectors) have a `mid` of
# their own, used between the grid rule (DECODE_WARPS_PER_SM) and MID_MAX_BYTES, as the 14-16 KiB
# rows' `mid`: the decode block with the weight loaded first and x * w formed before the row's
# sum (32 registers where decode takes 40-42), without PDL. Forced against the plan before (decode
# to 32 MiB, then prefill), one H200, 2026-12-02 (`python benchmarks/ab_norms.py main=BUNDLE
# new=BUNDLE m8=BUNDLE --hidden 4096,5120,6144 --tokens 256,384,512,768,1024,1280,1536,2048
# --fused 0 --force decode,mid,prefill`): 1-14% less time from the grid rule's switch on (4096
# x 1024 4.35 -> 3.87 µs, 5120 x 1280 5.92 -> 5.11, 6144 x 1024 5.72 -> 4.99, 6144 x 512 3.50 ->
# 3.37; torch.compile 4.44, 6.80, 5.65, 3.44), still 2-3.5% at 32-48 MiB (6144 x 2048 12.83 ->
# 12.38); level with decode at the switch (6144 x 384 3.02 vs 3.03). The same code as the decode
# variant lost 2-8% at 16-128 tokens (one block per SM or fewer), so decode keeps its own. With
# the fused residual, not measured: those rows have no mid.
MID_BLOCK_ROW_BYTES = (8 << 10, 12 << 10)


# Programmatic dependent launch for decode launches beyond spec.PDL_MAX_THREADS (2048), with
# the next kernel launched only after this one's stores (device_utils.pdl_epilogue), as
# act_and_mul's `mid` (act_and_mul/tuning.py): triggered at the top, the next grid's blocks
# took the SMs these larger grids still needed (spec.py), so such launches went without PDL.
# Measured on one H200, 2026-12-02, the decode variant of rows of 4+ warps with the late trigger
# and the attribute to 65536 threads against the shipped one, in one process (`python
# benchmarks/ab_norms.py base=BUNDLE late=BUNDLE --hidden 2048,4096,7168,8192 --tokens
# 1,16,64,128,256 --fused 0,1 --rounds 2`; benchmarks/results/norm-late-pdl-experiment-h200.md):
# - launches of 2049-65536 threads: 16-27% less time at every width and token count measured
#   (plain 4096 x 16 1.61 -> 1.17 µs, 2048 x 64 1.58 -> 1.22, 7168 x 128 2.28 -> 1.75; fused
#   8192 x 128 2.70 -> 2.10; 2048 and 4096 x 256 16-22%); the kept split (decode, decode_late)
#   against the shipped variants in a second call, hidden 2048-7168 plain and fused at 1-128
#   tokens: 18-29% at every such launch, level at the others (plain 5120 x 16 1.70 -> 1.23,
#   6144 x 128 2.19 -> 1.64);
# - beyond 65536 threads (without the attribute; 7168-8192 x 256): 2-4% less with the late
#   cubin (plain 7168 x 256 2.88 -> 2.77);
# - launches of at most 2048 threads, where decode triggers at the top: 12-21% more time for
#   rows of 4-8 KiB (plain 2048 x 1 0.96 -> 1.12, 4096 x 1 1.03 -> 1.15, fused 2048 x 16 1.11
#   -> 1.27; fused 4096 x 1 7% less, 1.22 -> 1.14), level for rows of 14-16 KiB (plain 7168 x 1
#   1.32 -> 1.29, 8192 x 1 1.36 -> 1.38, fused 8192 x 1 1.66 -> 1.61).
# So rows of at least LATE_TRIGGER_ROW_BYTES trigger late at every size, in their one decode
# cubin; narrower rows of 4+ warps keep `decode` (the trigger at the top, to 2048 threads) and
# add `decode_late` for 2049-65536 threads. Beyond, decode without the attribute, as before.
# Rows of 10-12 KiB (hidden 5120-6144) were not measured at one token: they follow the 4-8 KiB
# rows.
DECODE_LATE_PDL_MAX_THREADS = 65536
LATE_TRIGGER_ROW_BYTES = 13 << 10

# Rows of 1-3 warps (hidden <= 1536 in bf16; DeepSeek-V3's 512 and 1536 norms) had no PDL: with
# one-warp blocks (hidden 128, before such rows shared a block) the griddepcontrol prologue had
# doubled the time at 32768 tokens (2026-11-30). Measured again on one H200, 2026-12-02, their
# shared 4-warp block (3 warps for hidden 1536) with the trigger at the top and after the
# stores, forced, against the block without PDL, in one process (`python benchmarks/ab_norms.py
# base=BUNDLE new=BUNDLE --hidden 512,1024,1536 --tokens 1,4,16,64,256 --fused 0,1 --force
# decode_early --rounds 2`; benchmarks/results/norm-narrow-pdl-experiment-h200.md, call 2):
# - the trigger at the top: 25-37% less time at every launch of up to 2048 threads (plain 512 x
#   1 1.25 -> 0.79 µs, 512 x 64 1.35 -> 0.88; fused 1536 x 16 1.53 -> 1.14), the same in the
#   next call (plain 512 x 64 1.33 -> 0.88); at 4096-6144 threads (1024 and 1536 x 64) ahead of
#   or behind the late trigger by turns, in two calls (plain 1536 x 64 1.17 and 1.38 against
#   1.22); from 8192 threads (256 tokens) 20-51% more at 5 of 6 points (fused 1024 x 256 1.70 ->
#   2.56), as spec.py found for wider rows past 2048 threads;
# - after the stores: 13-22% less at every launch of 2049-24576 threads measured (plain 1024 x
#   64 1.44 -> 1.13, 512 x 256 1.40 -> 1.10; fused 1024 x 256 1.70 -> 1.47);
# - beyond 65536 threads, where the decode cubin (with the top trigger's instructions) runs
#   without the attribute: level (-3% to +2%, plain 512-1536 x 2048 and 8192 tokens).
# So these rows take the wider rows' rule: decode triggers at the top to spec.PDL_MAX_THREADS,
# `decode_late` to DECODE_LATE_PDL_MAX_THREADS.


def prefill_warps(arch: str, override: int = 0) -> int:
    """The config's explicit choice, else the measured one for the arch, else sm_90a's."""
    return override or PREFILL_WARPS.get(arch, PREFILL_WARPS["sm_90a"])
