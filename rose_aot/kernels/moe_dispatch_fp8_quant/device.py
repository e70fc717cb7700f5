"""CuTeDSL device code of moe_dispatch_fp8_quant: moe_dispatch's kernels, quantizing each row
copy with fp8_group_quant's instructions (the variant's `group_lanes` turns it on)."""

from __future__ import annotations

from ..moe_dispatch.device import host_function

__all__ = ["host_function"]
