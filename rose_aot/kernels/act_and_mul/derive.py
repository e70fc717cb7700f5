"""act_and_mul points of a model (``manifest from-config``), and the reader of the facts they
need from config.json (:func:`read_mlp`, called by the manifest deriver with its config view).

The gated MLPs of a model and the width d of act(gate) * up in each (one point per distinct d):
- dense MLP layers: ``intermediate_size`` split over the tensor-parallel ranks (column-parallel
  gate/up projections), so d = intermediate_size / tp;
- routed experts (Qwen2/3-MoE ``moe_intermediate_size``, Mixtral ``intermediate_size``, DeepSeek
  V2/V3 ``moe_intermediate_size``): whole experts live on a rank, so d is the expert width;
- DeepSeek's shared experts: moe_intermediate_size * n_shared_experts, split over the ranks;
  Qwen2-MoE's one shared expert: shared_expert_intermediate_size, split over the ranks.
The activation comes from ``hidden_act`` (``hidden_activation`` for Gemma 2 and 3, whose
transformers default is ``gelu_pytorch_tanh``). gpt-oss's MLP is a clamped SwiGLU
(``swiglu_limit``, alpha 1.702, (up + 1)), a different function: it gets no act_and_mul point.

`view` is the manifest deriver's reader of the (language model part of the) config:
``view.data``, ``view.int/str(name, purpose[, default])`` and ``view.fail(name, message)``.
"""

from __future__ import annotations

from ...manifest.model import KernelEntry, ModelFacts

__all__ = ["ACTIVATION_NAMES", "read_mlp", "derive"]

# config.json activation names -> act_and_mul's activation
ACTIVATION_NAMES = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
}

_GEMMA = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
_DENSE = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM",
          "Phi3ForCausalLM", *_GEMMA)


def _activation(view, architecture: str) -> str | None:
    if architecture == "GptOssForCausalLM":
        return None
    if architecture in _GEMMA:
        field = "hidden_activation"
        name = view.str(field, "the MLP activation", "gelu_pytorch_tanh")
    else:
        field = "hidden_act"
        name = view.str(field, "the MLP activation")
    if name not in ACTIVATION_NAMES:
        view.fail(field, f"activation {name!r} has no act_and_mul form; known: "
                         f"{', '.join(sorted(ACTIVATION_NAMES))}")
    return ACTIVATION_NAMES[name]


def _per_rank(view, field: str, width: int, tp: int) -> int:
    if width % tp:
        view.fail(field, f"{width} does not split evenly over --tp {tp} ranks")
    return width // tp


def _widths(view, architecture: str, tp: int) -> list[tuple[int, str, str]]:
    out: list[tuple[int, str, str]] = []

    def add(d, field, what):
        if d not in [w for w, _, _ in out]:
            out.append((d, field, what))

    rank = f" (one of {tp} ranks)" if tp > 1 else ""
    if architecture in _DENSE:
        inter = view.int("intermediate_size", "the MLP activation")
        add(_per_rank(view, "intermediate_size", inter, tp), "intermediate_size", "dense MLP" + rank)
    elif architecture in ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"):
        add(view.int("moe_intermediate_size", "the expert activation"), "moe_intermediate_size",
            "routed experts")
        if architecture == "Qwen2MoeForCausalLM":
            shared = view.int("shared_expert_intermediate_size", "the shared expert", minimum=0)
            if shared:
                add(_per_rank(view, "shared_expert_intermediate_size", shared, tp),
                    "shared_expert_intermediate_size", "shared expert" + rank)
        if view.data.get("mlp_only_layers") or view.data.get("decoder_sparse_step", 1) != 1:
            inter = view.int("intermediate_size", "the dense MLP activation")
            add(_per_rank(view, "intermediate_size", inter, tp), "intermediate_size",
                "dense MLP layers" + rank)
    elif architecture == "MixtralForCausalLM":
        add(view.int("intermediate_size", "the expert activation"), "intermediate_size",
            "routed experts")
    elif architecture in ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"):
        if view.int("first_k_dense_replace", "the dense MLP layers", minimum=0) > 0:
            inter = view.int("intermediate_size", "the dense MLP activation")
            add(_per_rank(view, "intermediate_size", inter, tp), "intermediate_size",
                "dense MLP layers" + rank)
        expert = view.int("moe_intermediate_size", "the expert activation")
        add(expert, "moe_intermediate_size", "routed experts")
        shared = view.int("n_shared_experts", "the shared experts", minimum=0)
        if shared:
            add(_per_rank(view, "n_shared_experts", expert * shared, tp), "n_shared_experts",
                "shared experts" + rank)
    return out


def read_mlp(view, architecture: str, tp: int) -> dict:
    """ModelFacts fields of the gated MLPs: {"mlp_activation": ..., "mlp_widths": ...}."""
    activation = _activation(view, architecture)
    if activation is None:
        return {"mlp_activation": None, "mlp_widths": ()}
    return {"mlp_activation": activation, "mlp_widths": tuple(_widths(view, architecture, tp))}


def derive(model: ModelFacts) -> list[KernelEntry]:
    act = model.mlp_activation
    if act is None:
        return []
    return [
        KernelEntry(
            "act_and_mul",
            (("d", d), ("activation", act), ("dtype", model.dtype)),
            f"{act}(gate) * up of the {what}.",
            (("d", source), ("activation", "hidden_act")),
        )
        for d, source, what in model.mlp_widths
    ]
