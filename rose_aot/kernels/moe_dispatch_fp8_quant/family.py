"""moe_dispatch_fp8_quant: moe_dispatch of bf16/fp16 tokens that writes them FP8-quantized.

Inputs x [tokens, hidden] (bf16/fp16, rows may be strided) and topk_ids [tokens, top_k];
outputs exactly what fp8_group_quant applied to moe_dispatch's `out` would give, in one pass
over the tokens (the FP8 grouped GEMM's input, without a bf16 intermediate):
- out [rows, hidden] float8_e4m3fn: each copy of a token row quantized per group of `group`
  elements, expert segments and padding as in moe_dispatch (padding rows are quantized zero
  rows: codes 0, and the scale of an all-zero group, max(0, eps) / 448 or its UE8M0 rounding);
- out_scales [rows, hidden / group] fp32 in `scale_layout`: ``row_major`` (contiguous) or
  ``col_major_tma`` (a buffer [hidden / group, rows padded to 4] passed as ``buf.t()[:rows]``,
  the layout DeepGEMM-style grouped FP8 GEMMs read);
- expert_offsets [local_experts + 1] and positions [tokens, top_k] as moe_dispatch.
Rows past expert_offsets[-1] are not written. The quantization rule (scale = max(absmax, eps)
/ 448 per group, optionally rounded up to a power of two; codes rounded to nearest even e4m3,
saturated; the non-finite policy) is fp8_group_quant's, bit for bit (family.py there): the
device code is the same instructions. Expert ids, the tensor-parallel range and the order of
rows inside an expert follow moe_dispatch (unspecified but in the small variants; compare through
positions).

Launch plans, workspace and variants are moe_dispatch's (small / decode / prefill), quantizing
rows on the way, plus "small_wide": small with room for SMALL_WIDE_MAX_PAIRS pairs (128 tokens
of top-8), for the pairs above small's, where decode took 10-12 µs at hidden 7168 whatever the
count (moe_dispatch/tuning.py). The small variants' unit is a slice of a token row
(SMALL_QUANT_VECS_PER_LANE vectors per lane), quantized once and stored to each of the token's
rows; decode and prefill quantize each copy, top_k times per token (recomputing is cheaper
than another pass).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...archs import Arch
from ..base import choice
from ..fp8_group_quant.family import SCALE_LAYOUTS, validate_quant
from ..moe_dispatch.family import MoeDispatch
from ..moe_dispatch.tuning import SMALL_MAX_PAIRS, SMALL_QUANT_VECS_PER_LANE, SMALL_WIDE_MAX_PAIRS
from ..rowwise import row_align
from ..spec import Dim, TensorArg, Variant

__all__ = ["MoeDispatchFp8QuantConfig", "MoeDispatchFp8Quant"]


@dataclass(frozen=True)
class MoeDispatchFp8QuantConfig:
    num_experts: int
    top_k: int
    hidden: int
    group: int = choice(64, 128, default=128, doc="elements per scale")
    dtype: str = choice("bfloat16", "float16", default="bfloat16", doc="input token dtype")
    scale_layout: str = choice(*SCALE_LAYOUTS, default="row_major", doc="layout of out_scales")
    ue8m0: bool = False  # scales rounded up to a power of two
    eps: float = 1e-10  # lower bound of a group's absmax (all-zero groups)
    expert_alignment: int = choice(1, 16, 32, 64, 128, 256, default=1)
    expert_start: int = 0  # first expert of this rank (tensor parallelism)
    local_experts: int = 0  # experts of this rank; 0 = all from expert_start


class MoeDispatchFp8Quant(MoeDispatch):
    name = "moe_dispatch_fp8_quant"
    Config = MoeDispatchFp8QuantConfig
    device_module = "rose_aot.kernels.moe_dispatch_fp8_quant.device"
    shape_fields = ("num_experts", "top_k", "hidden", "expert_start", "local_experts")
    plan_choices = ("small", "small_wide", "decode", "prefill")
    small_variants = (("small", SMALL_MAX_PAIRS), ("small_wide", SMALL_WIDE_MAX_PAIRS))

    def validate(self, c: MoeDispatchFp8QuantConfig) -> None:
        self.validate_routing(c)
        validate_quant(self.name, c, "hidden", c.hidden)

    def args(self, c: MoeDispatchFp8QuantConfig, arch: Arch) -> tuple[TensorArg, ...]:
        tokens, rows = Dim("tokens"), Dim("rows")
        nbytes, vec = self._access(c, arch)
        h, k, g = c.hidden, c.top_k, c.hidden // c.group
        x_stride = Dim("x_row_stride", width=64, divisibility=vec)
        if c.scale_layout == "row_major":
            scales = TensorArg("out_scales", "float32", (rows, g), (g, 1), 4, "output",
                               "row_major")
        else:
            padded = Dim("scales_rows_padded", width=64, divisibility=4)
            scales = TensorArg("out_scales", "float32", (rows, g), (1, padded), 16, "output",
                               "col_major_tma")
        return (
            TensorArg("x", c.dtype, (tokens, h), (x_stride, 1), row_align(c.dtype, vec, nbytes)),
            TensorArg("topk_ids", "int32", (tokens, k), (k, 1), 4),
            # e4m3 codes are stored a vector (vec bytes) at a time
            TensorArg("out", "float8_e4m3fn", (rows, h), (h, 1), vec, "output"),
            scales,
            TensorArg("expert_offsets", "int32", (self.local(c) + 1,), (1,), 4, "output"),
            TensorArg("positions", "int32", (tokens, k), (k, 1), 4, "output"),
        )

    def variants(self, c: MoeDispatchFp8QuantConfig, arch: Arch) -> tuple[Variant, ...]:
        """moe_dispatch's variants; a group is `group_lanes` consecutive lanes' vectors; the
        small variants' units are token slices."""
        out = []
        small = {name for name, _ in self.small_variants}
        for v in super().variants(c, arch):
            constants = {**v.constants, "group_lanes": c.group // v.constants["vec"]}
            if v.name in small:
                constants.update(token_units=True, vecs_per_lane=SMALL_QUANT_VECS_PER_LANE)
            out.append(dataclasses.replace(v, constants=constants))
        return tuple(out)

    def op_suffix(self, c: MoeDispatchFp8QuantConfig) -> str:
        return ""
