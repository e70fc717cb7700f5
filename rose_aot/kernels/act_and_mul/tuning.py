"""Launch-shape knobs of act_and_mul and the FP8 quantization families.

NOT MEASURED YET: these are the seed's recipe (one vector per thread and small blocks for
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
