"""Device-side helpers shared by the CuTeDSL kernels. Imports cutlass: builder and tests only."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

__all__ = ["CUTLASS_DTYPES", "cutlass_dtype", "butterfly_sum"]

CUTLASS_DTYPES = {
    "bfloat16": cutlass.BFloat16,
    "float16": cutlass.Float16,
    "float32": cutlass.Float32,
    "float8_e4m3fn": cutlass.Float8E4M3FN,
    "int32": cutlass.Int32,
    "int64": cutlass.Int64,
}


def cutlass_dtype(name: str):
    return CUTLASS_DTYPES[name]


@cute.jit
def butterfly_sum(value: Float32, lanes: cutlass.Constexpr) -> Float32:
    """Sum over groups of `lanes` consecutive lanes (a power of two <= 32); every lane of a group
    gets the group's total. Only log2(lanes) shuffle rounds, so sub-warp groups stay independent."""
    offset = lanes // 2
    for _ in cutlass.range_constexpr(lanes.bit_length() - 1):
        value = value + cute.arch.shuffle_sync_bfly(value, offset=offset)
        offset = offset // 2
    return value
