"""Launch-shape knobs of act_and_mul and the FP8 quantization families.

Measured for act_and_mul (H200, 2026-11-30, `bash benchmarks/run_gpu.sh act_quant`,
benchmarks/results/act_quant-act_and_mul-h200.md): the decode shape (one vector per thread,
128-thread blocks) beat the prefill shape (4 vectors per thread, 256-thread blocks) at every
width 2048-14336 and token count 1-32768, by about 1.9x from 8192 tokens on (silu, d 2048,
32768 tokens: 100.3 vs 182.9 µs; the decode shape reaches 94% of the copy bandwidth). So
act_and_mul plans decode at every size.

The same holds for act_and_mul_fp8_quant (act_quant-act_and_mul_fp8_quant-h200.md, both
variants forced in one run): decode is faster at every width and token count, 2.3-2.6x from
8192 tokens (d 7168, 32768 tokens: 400 vs 1044 µs), so it plans decode at every size too; and
for nvfp4_quant (act_quant-block_scaled_quant-h200.md: 1.04-1.4x from 128 tokens).
fp8_group_quant, fp8_token_quant and block_scaled_quant (MXFP8/MXFP4) keep the switch below:
there the prefill shape wins from 8192 tokens (fp8_group_quant hidden 7168, 32768 tokens: 198
vs 277 µs). The switch point itself (DECODE_WARPS_PER_SM) is the seed's recipe: at 128 tokens
of width 7168-14336 the forced decode shape was 10-30% faster than the plan's prefill, and
no token count between 128 and 8192 was measured.
"""

from __future__ import annotations

__all__ = ["DECODE_THREADS", "DECODE_MAX_VECS", "PREFILL_THREADS", "PREFILL_MAX_VECS",
           "DECODE_WARPS_PER_SM"]

DECODE_THREADS = 128
DECODE_MAX_VECS = 1
PREFILL_THREADS = 256
PREFILL_MAX_VECS = 4
# decode while tokens * vectors_per_row <= 32 * DECODE_WARPS_PER_SM * sm_count
DECODE_WARPS_PER_SM = 16
