"""Launch-shape knobs of act_and_mul and the FP8 quantization families.

Measured for act_and_mul (H200, 2026-11-30, `bash benchmarks/run_gpu.sh act_quant`,
benchmarks/results/act_quant-act_and_mul-h200.md): the decode shape (one vector per thread,
128-thread blocks) beat the prefill shape (4 vectors per thread, 256-thread blocks) at every
width 2048-14336 and token count 1-32768, by about 1.9x from 8192 tokens on (silu, d 2048,
32768 tokens: 100.3 vs 182.9 µs; the decode shape reaches 94% of the copy bandwidth). So
act_and_mul plans decode at every size. For the FP8 families the knobs below are still
NOT MEASURED: they are the seed's recipe (one vector per thread and small blocks for
decode; a few vectors per thread in 256-thread blocks for prefill; decode while the batch is a
small multiple of the SM count), to be replaced by H200 measurements from
benchmarks/bench_act_quant.py with both variants forced.
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
