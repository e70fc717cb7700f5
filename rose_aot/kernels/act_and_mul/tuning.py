"""Launch-shape knobs of act_and_mul and the FP8 quantization families.

Measured for act_and_mul (H200, 2026-11-30, `bash benchmarks/run_gpu.sh act_quant`,
benchmarks/results/act_quant-act_and_mul-h200.md): the decode shape (one vector per thread,
128-thread blocks) beat the prefill shape (4 vectors per thread, 256-thread blocks) at every
width 2048-14336 and token count 1-32768, by about 1.9x from 8192 tokens on (silu, d 2048,
32768 tokens: 100.3 vs 182.9 µs; the decode shape reaches 94% of the copy bandwidth). So
act_and_mul plans decode at every size. (A later run with the current prefill shape, one H200,
2026-12-01: level at 8192 tokens, prefill 1-3.5% faster at 32768 (silu 2048: 93.49 vs 96.17
µs); with the grid order below, decode is level or faster everywhere again (7168 x 32768:
322.1 vs 331.8 µs; benchmarks/results/act_quant-act_and_mul-h200.md).)

Grid order (chunked_rows.chunk_grid, `chunks_in_x`): act_and_mul's grid is (chunks, rows), so
consecutive blocks stream through memory in address order; with (rows, chunks) they read the
same chunk of consecutive rows, a row stride apart. Both orders built from one tree and
alternated twice in one call (one H200, 2026-12-01, benchmarks/results/
act-grid-order-experiment-h200.md): 2.4% faster at 2048 x 32768, 3.3-4.5% at 7168-14336 from
8192 tokens (7168 x 32768: 334.5 -> 320.9 µs, torch.compile's flat kernel 321.7), level at
1-1024 tokens. Two vectors per thread on top lost at 1-1024 tokens and won nothing beyond.
The quantizers keep (rows, chunks): fp8_group_quant's column-major scales were 2-3.5% slower
in the new order at 64-128 tokens (7168 x 128: 2.10 -> 2.17 µs), act_and_mul_fp8_quant level
to 0.6% slower at 1024-8192 tokens, the block-scaled formats level within the noise.

`bulk` (act_and_mul and act_and_mul_fp8_quant; chunked_rows.bulk_variant): the decode shape
without the programmatic-dependent-launch prologue, which the plan takes once the decode-shaped
launch has more threads than the PDL limit (the loader launches those without the attribute,
so griddepcontrol.wait waits for nothing, but each block still executes it). Both forms built
from one tree and alternated in one call (`bench_act_quant.py BUNDLE --family act_and_mul,
act_and_mul_fp8_quant --no-peers --tokens 1024,8192,32768`, one H200, 2026-12-01,
benchmarks/results/act-bulk-experiment-h200.md): at 1024 tokens act_and_mul 7-26% faster at
d 2048-4096 (silu 4096: 5.77 -> 4.29 µs), 2-3% at 7168, level at 14336; the fused family 1.5-6%
(7168: 9.59 -> 9.00); at 8192-32768 act_and_mul level (within 0.2%), the fused family -0.5% to
3.5% faster (14336 x 32768: 587.3 -> 566.6).

The same holds for act_and_mul_fp8_quant (act_quant-act_and_mul_fp8_quant-h200.md, both
variants forced in one run): decode is faster at every width and token count, 2.3-2.6x from
8192 tokens (d 7168, 32768 tokens: 400 vs 1044 µs), so it plans decode at every size too; and
for nvfp4_quant before its e2m1 and scale paths were shortened (see below).
fp8_group_quant, fp8_token_quant, block_scaled_quant (MXFP8/MXFP4) and nvfp4_quant switch to the prefill
shape with the batch: there it wins from 8192 tokens (fp8_group_quant hidden 7168, 32768 tokens:
198 vs 277 µs). Where: decode while tokens x vectors per row (width / 8 for bf16) <= 32 x
warps-per-SM x SMs, with the warps per SM from a sweep of both shapes forced at 128, 256, 512,
1024, 2048 and 4096 tokens of width 2048-14336 (H200, 2026-11-30, `ACT_QUANT_TOKENS=128,256,
512,1024,2048,4096`, benchmarks/results/act_quant-<family>-switch-sweep-h200.{md,json}):
- fp8_group_quant: decode wins up to 131072 vectors (512 tokens of 2048: 1.92 vs 2.48 µs; 128 of
  7168: 1.83 vs 2.28), prefill from 262144 (1024 of 2048: 2.93 vs 3.16); at 229376 (256 of 7168,
  128 of 14336) the two layouts split (row-major prefill by 5%, column-major decode by 8-10%).
  40 warps per SM (168960 vectors on 132 SMs); the seed's 16 (67584) left 128 tokens of 7168 and
  256-512 tokens of 2048-4096 on prefill, 17-30% slower;
- MXFP8: the same crossover (decode up to 131072 by 13-30%, prefill from 229376 by 1-4%): 40;
- MXFP4, whose packing cost the prefill shape more before the FP4 codes moved to the FMA pipe:
  decode up to 262144 by 2-19% (1024 tokens of 2048: 3.27 vs 3.67), prefill from 458752, 100
  warps per SM (422400). Re-swept after that change (same command, one H200, 2026-11-30,
  act_quant-block_scaled_quant-switch-sweep-fp4-h200.{md,json}): decode up to 229376 vectors
  (512 tokens of 2048: 2.14 vs 2.38 µs; 256 of 7168: 2.82 vs 2.88; 128 of 14336 level, 2.83 vs
  2.84), prefill from 262144 by 6-9% (1024 tokens of 2048: 2.86 vs 3.15; 512 of 4096: 2.94 vs
  3.14): 56 warps per SM (236544). Swept again after MXFP4's 16-element prefill units (below;
  one H200, 2026-12-01, act_quant-block_scaled_quant-switch-sweep-fp4-16-h200.md): decode up to
  131072 vectors (512 tokens of 2048: 2.16 vs 2.26 µs; 256 of 4096: 2.13 vs 2.40), level at
  229376 (256 of 7168: 2.82 vs 2.83; 128 of 14336: 2.80 vs 2.76), prefill from 262144 (1024 of
  2048: 3.13 vs 2.75; 512 of 4096: 3.12 vs 2.81), so the switch holds.
- fp8_token_quant keeps 16: decode up to 65536 (2048 at 256 tokens: 1.75 vs 1.87), prefill
  from 114688 (7168 at 128: 2.00 vs 2.25);
- nvfp4_quant: decode won at every size while each element took 31-33 instructions; with the
  round-to-odd e2m1 and the branch-free scale (23-26) the prefill shape wins from 8192 tokens by
  14-19% (7168 x 32768: 227.6 vs 279.8 µs) and decode at 1-128 tokens (7168 x 128: 2.53 vs
  2.89; H200, 2026-11-30, both forced: act_quant-block_scaled_quant-h200.md as committed in
  ad95070, the first run with this plan; the run that chose it was not committed and the file
  has been rewritten by later runs since). Between 128 and 8192
  tokens it took MXFP4's switch then, 100; the sweep above, after the FP4 change, measured NVFP4
  on its own: decode up to 262144 vectors (512 tokens of 4096: 3.39 vs 3.47 µs; 1024 of 2048
  level, 3.54 vs 3.51), prefill from 458752 by 3-6% (512 of 7168: 4.68 vs 5.00; 256 of 14336:
  4.86 vs 5.01), so it keeps 100 (422400). MXFP8 keeps 40: in that sweep 131072 vectors are
  level (512 tokens of 2048: 2.03 vs 1.98; 256 of 4096: 2.05 vs 2.05), 114688 decode (128 of
  7168: 1.99 vs 2.17), 229376 prefill (2.53 vs 2.84).
  Its prefill shape kept 4 vectors per thread (56 registers, 55% occupancy): 2 vectors (32
  registers, full occupancy, 22.5 instead of 21.3 instructions per element) measured 1-6%
  slower from 8192 tokens (7168 x 32768: 243.8 vs 229.1 µs; same H200 session). After the FP4
  codes moved off the ALU pipe (block_scaled_quant/device.py), the prefill shapes (128, 4),
  (256, 2) and (512, 4) (threads, vectors per thread) were built and forced against the shipped
  (256, 4) for MXFP4 and NVFP4 in one call: none faster at most points (NVFP4 (256, 2) 1-7%
  slower at 8192 tokens; benchmarks/results/fp4-ab-and-prefill-shapes-h200.md), so it stays.
  Its unit of work is a whole 16-element block instead of one 16-byte access (block_scaled_quant/
  family.py; two loads per unit on sm_90a, the access is already 32 bytes on sm_100a): each
  block's scale is computed once instead of on both lanes, with no shuffle, 639 -> 573 SASS
  instructions per 32 elements at 7168 wide (54 -> 40 registers). Both in one H200 call,
  alternating old, new, old, new (benchmarks/results/block-scaled-whole-block-experiment-h200.md):
  2-5% faster at every width and 8192 / 32768 tokens (7168 x 8192: 50.2 -> 47.5 µs). The same
  unit for MXFP8 and MXFP4 (a 32-element block, 64 bytes per thread) was 40-52% slower for MXFP8
  and -5% to +5% for MXFP4; 16-element units for them (half a block, two lanes per block; one
  call, alternating old, new, old, new, benchmarks/results/block-scaled-half-block-experiment-
  h200.md) made MXFP4 3.7-13% faster at every width and 8192 / 32768 tokens (7168 x 8192: 39.9
  -> 37.5 µs; 401 -> 345 SASS instructions per 32 elements) and MXFP8 2-18% slower. So both FP4
  formats take 16-element units (FP4_PREFILL_UNIT) and MXFP8 one access.

fp8_group_quant's prefill shape for narrow rows (at most NARROW_ROW_VECTORS vectors: hidden 2048
in bf16): NARROW_PREFILL_THREADS-thread blocks of one row, NARROW_PREFILL_MAX_VECS vectors per
thread, instead of four 64-thread rows of 4 vectors in a 256-thread block. Hidden 2048 at 8192
tokens: row-major 13.16 vs 13.58 µs (92% vs 89% of the copy bandwidth), column-major 13.86 vs
14.17; at 32768 tokens 49.61 vs 49.20 and 52.06 vs 50.84 (both still >= 90%); hidden 4096 no
better (26.45 vs 26.13 at 8192). The other shapes tried at 2048 x 8192 (row-major): two 64-thread
rows of 4 vectors per block 13.45, two 128-thread rows of 2 vectors 13.66, eight 64-thread rows
of 4 vectors 15.12, eight 32-thread rows of 8 vectors 16.78. H200, 2026-11-30, each shape built
into its own bundle and timed in one device call (`bench_act_quant.py --family fp8_group_quant
--widths 2048,4096 --tokens 128,8192,32768 --no-peers`; benchmarks/results/
act_quant-shape-sweep-2048-h200.md). With it shipped: 13.06 and 13.92 µs (91% and 86%) in the
suite's run (act_quant-fp8_group_quant-h200.md). The same narrow shape for act_and_mul_fp8_quant
at d 2048 (one H200 call, benchmarks/results/act_quant-fused-narrow-sweep-h200.md) lost to its
decode shape at every token count but 4096: 24.83 vs 22.58 µs at 8192 tokens, 89.36 vs 82.97 at
32768; so the fused family keeps decode at every size.
"""

from __future__ import annotations

__all__ = ["DECODE_THREADS", "DECODE_MAX_VECS", "PREFILL_THREADS", "PREFILL_MAX_VECS",
           "DECODE_WARPS_PER_SM", "FP8_GROUP_DECODE_WARPS_PER_SM", "MX_DECODE_WARPS_PER_SM",
           "NARROW_ROW_VECTORS", "NARROW_PREFILL_THREADS", "NARROW_PREFILL_MAX_VECS",
           "DECODE_PDL_MAX_THREADS", "DECODE_LATE_PDL_MAX_THREADS"]

DECODE_THREADS = 128
DECODE_MAX_VECS = 1
PREFILL_THREADS = 256
PREFILL_MAX_VECS = 4
# The decode launches of act_and_mul and the quantizers (fp8_group_quant, act_and_mul_fp8_quant,
# block_scaled_quant, nvfp4_quant, fp8_token_quant) use programmatic dependent launch up to this
# many threads (64 blocks of 128: 16 tokens of d 4096, 32 of 2048), beyond the 2048 of
# spec.PDL_MAX_THREADS, which was measured on the norms. act_and_mul's decode variant with a
# 32768-thread limit against the same cubin with 2048 (so `bulk` from 2048), alternating twice
# in one call (one H200, 2026-12-01,
# `bench_act_quant.py BUNDLE --family act_and_mul --no-peers --tokens 16,64,128` per bundle,
# every timing from a reset L2; benchmarks/results/act-pdl-experiment-h200.md): at 16 tokens of d
# 2048-4096 (4096-8192 threads) 0.72-0.78 instead of 1.28-1.32 µs, SiLU and GELU-tanh, in both
# rounds and with the variant forced; at 16 tokens of d 7168 (14336 threads) SiLU 0.79-0.80
# but GELU-tanh 0.92-0.98 in the plan column and 1.68-1.72 forced in the same rows, and in the
# table run after the limit was set to 14336, SiLU 1.57 (forced 1.28; its bulk: 1.35): the
# early-launched grid then sometimes waits behind its predecessor for the SMs; from 16384
# threads slower or erratic (GELU-tanh 2048 x 64: 2.09 vs 1.40; 14336 x 16, 28672 threads: 1.75
# vs 1.45; 2048 x 128: 1.83 vs 1.49). The quantizers' decode variants with 8192 against 2048,
# alternating twice in one call (one H200, 2026-12-01, `bench_act_quant.py BUNDLE --family
# fp8_group_quant,act_and_mul_fp8_quant,block_scaled_quant,fp8_token_quant --no-peers --tokens
# 16,32,64 --widths 2048,4096,7168`, benchmarks/results/decode-pdl-stages-experiment-h200.md):
# 30-38% faster at every point of 4096-8192 threads (fp8_group_quant row-major 2048 x 32: 1.40
# -> 0.90 µs; nvfp4_quant 4096 x 16: 1.38 -> 0.94; act_and_mul_fp8_quant 2048 x 16, which took
# `bulk` before: 1.54 -> 1.08), and within 3.2% at the points beyond it (the same launches).
DECODE_PDL_MAX_THREADS = 8192
# Larger decode-shaped launches of these families, up to this many threads, take the `mid`
# variant (chunked_rows.decode_variants): PDL too, but the next kernel launched only after the
# stores (device_utils.pdl_epilogue). The late-triggered decode shape against the shipped
# records (`decode` to 8192 threads, then `bulk` or `decode` without the attribute), built from
# one tree and alternated (A, L, B, B, L, A) in one call (one H200, 2026-12-01,
# `bench_act_quant.py BUNDLE --no-peers`, every family, widths 2048 and 7168, tokens 16-8192;
# benchmarks/results/decode-pdl-stages-experiment-h200.md): 5-32% faster at 32 of the 34
# measured launches of 14336-65536 threads (act_and_mul 2048 x 64: 1.40 -> 0.96 µs;
# fp8_group_quant col-major 2048 x 64: 1.64 -> 1.32; nvfp4_quant 7168 x 16: 1.43 -> 1.15;
# fp8_token_quant 7168 x 64: 2.06 -> 1.60), 2% at fp8_group_quant row-major 7168 x 64 and 5.5%
# slower at its 2048 x 256 (1.63 -> 1.71). Beyond, slower: launched without the attribute 2-5%
# at 114688-131072 threads and up to 37% from 229376 (act_and_mul 7168 x 512: 4.02 -> 5.54);
# with it (the call before, act_and_mul only) level at 114688, 14-28% slower at 229376-262144
# (2048 x 1024: 2.81 -> 3.60). So the larger launches keep their variant without any
# griddepcontrol instruction. Measured and not kept (the call after, A and R alternating):
# one cubin whose trigger is chosen on the device from %nctaid (predicated griddepcontrol): at
# 14336-65536 threads 0.06-0.23 µs slower than `mid` measured in the call before, where `A` was
# level across both calls (act_and_mul 2048 x 64: 1.18 vs 0.96), at 4096-8192 threads up to 12%
# slower than `decode` (act_and_mul_fp8_quant 2048 x 16: 1.07 -> 1.20), and with the
# instructions predicated off beyond its limit 0.3-7% slower than `bulk` (7168 x 128: 2.21 vs
# 2.07).
DECODE_LATE_PDL_MAX_THREADS = 65536

# fp8_group_quant's prefill shape for rows of at most NARROW_ROW_VECTORS vectors (see above)
NARROW_ROW_VECTORS = 256
NARROW_PREFILL_THREADS = 128
NARROW_PREFILL_MAX_VECS = 2
# decode while tokens * vectors_per_row <= 32 * DECODE_WARPS_PER_SM * sm_count
DECODE_WARPS_PER_SM = 16
# fp8_group_quant and the block-scaled formats (measured: see above)
FP8_GROUP_DECODE_WARPS_PER_SM = 40
MX_DECODE_WARPS_PER_SM = {"mxfp8": 40, "mxfp4": 56, "nvfp4": 100}
