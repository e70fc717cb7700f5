"""What a model needs from rose-aot, as read from its config.json: the facts each kernel
family's ``derive`` module turns into [[kernel]] entries (``manifest from-config``).

Plain data; no family imports, so family folders can import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MoeFacts", "KernelEntry", "ModelFacts", "fp8_block_size"]


def fp8_block_size(view) -> int:
    """weight_block_size[1] of an fp8 block-quantized checkpoint (quantization_config with
    quant_method fp8: DeepSeek-V3, Qwen3 -FP8), else 0. `view` is from-config's reader of the
    config; a malformed block size fails naming the field."""
    quant = view.data.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "fp8":
        return 0
    block = quant.get("weight_block_size")
    if (
        not isinstance(block, list)
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        view.fail("quantization_config.weight_block_size", "must be two positive integers for fp8")
    return block[1]


@dataclass(frozen=True)
class MoeFacts:
    """The MoE layers of a model, as the moe_dispatch / moe_combine points will need them."""

    num_experts: int  # routed experts
    top_k: int  # experts per token
    hidden: int  # token width dispatched to the experts
    intermediate_size: int  # one expert's FFN width
    shared_experts: int  # always-on experts beside the routed ones
    moe_layers: int  # decoder layers with an MoE block
    scoring: str  # router score: "softmax" or "sigmoid"
    renormalize: bool  # top-k weights renormalized to sum to 1
    tp: int  # tensor-parallel ranks; each holds experts_per_rank experts
    experts_per_rank: int
    expert_groups: int = 1  # group-limited routing (DeepSeek n_group / topk_group)
    topk_groups: int = 1
    routed_scaling_factor: float = 1.0
    # float8 block quantization of the activations (DeepSeek-V3's quantization_config): the
    # tokens are dispatched in float8 with one fp32 scale per this many elements; 0 = none.
    fp8_block: int = 0

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class KernelEntry:
    """One [[kernel]] entry: a family, its fields in write order (a list value expands)."""

    family: str
    fields: tuple[tuple[str, Any], ...]
    comment: str = ""
    sources: tuple[tuple[str, str], ...] = ()  # kernel field -> config.json field it comes from

    def to_json(self) -> dict:
        return {"family": self.family, **{k: v for k, v in self.fields}}


@dataclass(frozen=True)
class ModelFacts:
    """One model under one deployment's options (dtype, tensor parallelism)."""

    hidden: int
    eps: float
    dtype: str = "bfloat16"
    tp: int = 1
    weight_offset: float = 0.0
    norm_comment: str = "input_layernorm, post_attention_layernorm and the final norm"
    extra_norms: tuple[tuple[int, str, str], ...] = ()  # (width, config field, comment): plain
    qk_heads: tuple[int, int, int] | None = None  # (q heads, kv heads, head_dim) of ONE rank
    moe: MoeFacts | None = None
    # Gated MLPs (act_and_mul): the activation (act_and_mul's name) and every distinct width d
    # of act(gate) * up on one rank as (d, config field, what); None / () when the model's MLP
    # is not an act_and_mul (gpt-oss) or the facts were not read. Read by
    # kernels/act_and_mul/derive.py: read_mlp.
    mlp_activation: str | None = None
    mlp_widths: tuple[tuple[int, str, str], ...] = ()
    # Activation quantization of the checkpoint: the FP8 block group (weight_block_size[1]) or
    # 0; the format of its Blackwell block-scaled GEMMs ("nvfp4", "mxfp8") or None.
    fp8_group: int = 0
    block_scaled: str | None = None
    archs: tuple[str, ...] = ()  # the deployment's target archs
    # Expert-parallel ranks over NVLink (``--ep N``): the MoE layers' experts split over N
    # data-parallel ranks, tokens dispatched to them (moe_ep_dispatch / moe_ep_combine).
    ep: int = 1
