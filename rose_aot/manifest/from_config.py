"""`rose-aot manifest from-config`: a deployment manifest derived from a Hugging Face config.json.

Reads the fields that decide kernel points (hidden size, heads, head_dim, eps, the Gemma
``(1 + w)`` weight offset, experts and top-k) and writes the [[kernel]] entries of the families
rose-aot has: ``rms_norm`` for the decoder norms (plain and fused residual add) plus any other
RMSNorm width the architecture has (DeepSeek's MLA latent norms), and ``qk_norm`` for the
architectures with per-head Q/K norms (Qwen3, Gemma 3). Under ``--tp N`` the Q/K heads are the
heads of one rank.

MoE layers are derived too (:class:`MoeFacts`: experts, top-k, hidden, experts per rank under
``--tp``), but not yet turned into moe_dispatch / moe_combine points: they go into a comment
block of the written manifest and into the ``--json`` output, and :func:`moe_kernel_entries` is
the one function that will turn them into [[kernel]] entries.

Each architecture reads only the fields it needs, and a missing or mistyped field is a
ManifestError naming the file, the architecture and the field (``text_config.hidden_size`` for
Gemma 3's nested text config). Where transformers' config class supplies a default that the
published config.json files rely on (Gemma 3: head_dim, heads, rms_norm_eps), that default is
used and said so in the written header.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..archs import DEFAULT_ARCHS, get_arch
from ..bundle.format import MAGIC as BUNDLE_MAGIC
from ..errors import ConfigError, ManifestError
from ..kernels import FAMILIES, get_family
from ..kernels.act_and_mul.derive import read_mlp
from ..kernels.moe_ep_dispatch.protocol import MAX_RANKS as EP_MAX_RANKS
from ..kernels.block_scaled_quant.derive import read_block_scaled
from ..kernels.fp8_group_quant.derive import read_fp8_group
from .model import KernelEntry, ModelFacts, MoeFacts, fp8_block_size
from .schema import Manifest, parse_manifest

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "MoeFacts",
    "KernelEntry",
    "DerivedManifest",
    "load_model_config",
    "derive_manifest",
    "manifest_from_config",
    "moe_kernel_entries",
]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_REQUIRED = object()


# --- reading config.json ------------------------------------------------------------------------
def load_model_config(path: str | os.PathLike) -> tuple[dict, Path]:
    """Read a config.json (or the config.json inside a model directory) -> (dict, its path)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ManifestError(path, "no such file; pass a model's config.json or its directory")
    if not path.is_file():
        raise ManifestError(path, "is not a regular file; pass a model's config.json")
    try:
        data = path.read_bytes()
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        raise ManifestError(path, f"cannot read the file: {reason}") from exc
    if data.startswith(BUNDLE_MAGIC):
        raise ManifestError(path, "is a rose-aot bundle, not a model config.json")
    try:
        doc = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise ManifestError(
            path, f"is not UTF-8 text (offset {exc.start}); pass a config.json"
        ) from exc
    except json.JSONDecodeError as exc:
        raise ManifestError(path, f"invalid JSON: {exc}") from exc
    except RecursionError as exc:
        raise ManifestError(path, "invalid JSON: nested too deeply for a config.json") from exc
    except ValueError as exc:  # e.g. an integer of thousands of digits
        reason = str(exc).split(";")[0]
        raise ManifestError(path, f"invalid JSON: {reason}") from exc
    if not isinstance(doc, dict):
        raise ManifestError(path, f"must hold a JSON object (got a {type(doc).__name__})")
    return doc, path


class _View:
    """The part of config.json one architecture reads; remembers what it read, in order."""

    def __init__(self, data: dict, path: str, architecture: str, prefix: str = ""):
        self.data = data
        self.path = path
        self.architecture = architecture
        self.prefix = prefix
        self.read: dict[str, Any] = {}  # field (with prefix) -> value used
        self.defaulted: list[str] = []

    def fail(self, name: str, message: str):
        raise ManifestError(self.path, message, entry=self.architecture, field=self.prefix + name)

    def _get(self, name: str, default: Any, purpose: str) -> tuple[Any, bool]:
        if name in self.data and self.data[name] is not None:
            return self.data[name], False
        if default is _REQUIRED:
            self.fail(name, f"missing; {self.architecture} needs it for {purpose}")
        self.defaulted.append(self.prefix + name)
        return default, True

    def int(self, name: str, purpose: str, default: Any = _REQUIRED, minimum: int = 1) -> int:
        value, _ = self._get(name, default, purpose)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(name, f"must be an integer (got {json.dumps(value)})")
        if value < minimum:
            self.fail(name, f"must be >= {minimum} (got {value})")
        self.read[self.prefix + name] = value
        return value

    def float(self, name: str, purpose: str, default: Any = _REQUIRED) -> float:
        value, _ = self._get(name, default, purpose)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(name, f"must be a number (got {json.dumps(value)})")
        self.read[self.prefix + name] = value
        return float(value)

    def bool(self, name: str, purpose: str, default: Any = _REQUIRED) -> bool:
        value, _ = self._get(name, default, purpose)
        if not isinstance(value, bool):
            self.fail(name, f"must be true or false (got {json.dumps(value)})")
        self.read[self.prefix + name] = value
        return value

    def str(self, name: str, purpose: str, default: Any = _REQUIRED) -> str:
        value, _ = self._get(name, default, purpose)
        if not isinstance(value, str):
            self.fail(name, f"must be a string (got {json.dumps(value)})")
        self.read[self.prefix + name] = value
        return value

    def int_list(self, name: str, purpose: str, default: Any = _REQUIRED) -> list[int]:
        value, _ = self._get(name, default, purpose)
        if not isinstance(value, list) or any(
            isinstance(v, bool) or not isinstance(v, int) for v in value
        ):
            self.fail(name, f"must be a list of integers (got {json.dumps(value)})")
        self.read[self.prefix + name] = value
        return value

    def optional_int(self, name: str, purpose: str) -> int | None:
        if self.data.get(name) is None:
            self.read[self.prefix + name] = None
            return None
        return self.int(name, purpose)


# --- what a model needs -------------------------------------------------------------------------
@dataclass(frozen=True)
class _Model:
    hidden: int
    eps: float
    weight_offset: float = 0.0
    qk_heads: tuple[int, int, int] | None = None  # (q heads, kv heads, head_dim) of the model
    norm_comment: str = "input_layernorm, post_attention_layernorm and the final norm"
    extra_norms: tuple[tuple[int, str, str], ...] = ()  # (width, config field, comment): plain
    moe: dict | None = None  # MoeFacts fields except tp / experts_per_rank
    moe_field: str = ""  # config field holding the expert count (for the --tp error)


def _dense_heads(v: _View) -> tuple[int, int, int]:
    return (
        v.int("num_attention_heads", "the Q/K head norm"),
        v.int("num_key_value_heads", "the Q/K head norm"),
        v.int("head_dim", "the Q/K head norm"),
    )


def _qwen3(v: _View) -> _Model:
    hidden = v.int("hidden_size", "the decoder RMSNorm")
    eps = v.float("rms_norm_eps", "the RMSNorm eps")
    return _Model(hidden, eps, qk_heads=_dense_heads(v))


def _qwen3_moe(v: _View) -> _Model:
    return _qwen_moe(v, _qwen3(v), shared_experts=0)


def _qwen2_moe(v: _View) -> _Model:
    """Qwen1.5-MoE and Qwen2-MoE (Qwen2-57B-A14B): Qwen3-MoE's routing and layers without the
    per-head Q/K norm, and one shared expert, shared_expert_intermediate_size wide, beside the
    routed ones (its sigmoid gate is a GEMM's business)."""
    model = _llama(v)
    shared = v.int("shared_expert_intermediate_size", "the shared expert", minimum=0)
    return _qwen_moe(v, model, shared_experts=int(shared > 0))


def _qwen_moe(v: _View, model: _Model, shared_experts: int) -> _Model:
    """The MoE layers of Qwen2-MoE and Qwen3-MoE: every decoder_sparse_step-th layer but the
    mlp_only_layers, softmax routing."""
    layers = v.int("num_hidden_layers", "counting the MoE layers")
    step = v.int("decoder_sparse_step", "counting the MoE layers", default=1)
    dense = set(v.int_list("mlp_only_layers", "counting the MoE layers", default=[]))
    experts = v.int("num_experts", "the MoE dispatch")
    moe = {
        "num_experts": experts,
        "top_k": v.int("num_experts_per_tok", "the MoE dispatch"),
        "hidden": model.hidden,
        "intermediate_size": v.int("moe_intermediate_size", "the MoE experts"),
        "shared_experts": shared_experts,
        # Counted, not looped: num_hidden_layers comes from the file and may be huge.
        "moe_layers": layers // step
        - sum(1 for i in dense if 0 <= i < layers and (i + 1) % step == 0),
        "scoring": "softmax",
        "renormalize": v.bool("norm_topk_prob", "the MoE routing", default=False),
    }
    return _replace(model, moe=moe, moe_field="num_experts")


def _llama(v: _View) -> _Model:
    hidden = v.int("hidden_size", "the decoder RMSNorm")
    eps = v.float("rms_norm_eps", "the RMSNorm eps")
    return _Model(hidden, eps)


def _mixtral(v: _View) -> _Model:
    model = _llama(v)
    moe = {
        "num_experts": v.int("num_local_experts", "the MoE dispatch"),
        "top_k": v.int("num_experts_per_tok", "the MoE dispatch"),
        "hidden": model.hidden,
        "intermediate_size": v.int("intermediate_size", "the MoE experts"),
        "shared_experts": 0,
        "moe_layers": v.int("num_hidden_layers", "counting the MoE layers"),
        "scoring": "softmax",
        "renormalize": True,  # softmax, top-k, then divided by the top-k sum
    }
    return _replace(model, moe=moe, moe_field="num_local_experts")


# Gemma3TextConfig's defaults, which the published gemma-3 config.json files rely on (the 12B
# text_config states neither head_dim nor rms_norm_eps, the 4B not even its heads).
_GEMMA3_DEFAULTS = {
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "rms_norm_eps": 1e-6,
}


# Gemma 2 and 3: four RMSNorms per layer, each scaling by (1 + w)
_GEMMA_NORMS = ("input, post-attention, pre- and post-feedforward norms and the final norm; "
                "Gemma scales by (1 + w)")


def _gemma3(v: _View) -> _Model:
    hidden = v.int("hidden_size", "the decoder RMSNorm")
    eps = v.float("rms_norm_eps", "the RMSNorm eps", _GEMMA3_DEFAULTS["rms_norm_eps"])
    heads = (
        v.int("num_attention_heads", "the Q/K head norm", _GEMMA3_DEFAULTS["num_attention_heads"]),
        v.int("num_key_value_heads", "the Q/K head norm", _GEMMA3_DEFAULTS["num_key_value_heads"]),
        v.int("head_dim", "the Q/K head norm", _GEMMA3_DEFAULTS["head_dim"]),
    )
    return _Model(
        hidden,
        eps,
        weight_offset=1.0,  # Gemma's RMSNorm scales by (1 + w), the Q/K norms too
        qk_heads=heads,
        norm_comment=_GEMMA_NORMS,
    )


def _gemma2(v: _View) -> _Model:
    """Gemma 2: Gemma 3's four (1 + w) norms per layer and its GeGLU, no Q/K head norm."""
    hidden = v.int("hidden_size", "the decoder RMSNorm")
    # Gemma2Config's default, as Gemma 3's
    eps = v.float("rms_norm_eps", "the RMSNorm eps", _GEMMA3_DEFAULTS["rms_norm_eps"])
    return _Model(
        hidden,
        eps,
        weight_offset=1.0,
        norm_comment=_GEMMA_NORMS,
    )


def _deepseek_v3(v: _View) -> _Model:
    return _deepseek(v, "input_layernorm, post_attention_layernorm, the MTP and final norms")


def _deepseek_v2(v: _View) -> _Model:
    """DeepSeek-V2 and V2-Lite: V3's MLA latent norms, shared experts and MoE layer count, with
    V2's softmax routing (group-limited in V2, greedy in V2-Lite), read from the same fields;
    no MTP module."""
    return _deepseek(v, "input_layernorm, post_attention_layernorm and the final norm")


def _deepseek(v: _View, norm_comment: str) -> _Model:
    hidden = v.int("hidden_size", "the decoder RMSNorm")
    eps = v.float("rms_norm_eps", "the RMSNorm eps")
    extra = []
    q_lora = v.optional_int("q_lora_rank", "the MLA query latent norm")
    if q_lora is not None:  # V2-Lite has none: its queries are not compressed
        extra.append((q_lora, "q_lora_rank", "q_a_layernorm over the query latent (q_lora_rank)"))
    kv_lora = v.int("kv_lora_rank", "the MLA key/value latent norm")
    extra.append(
        (
            kv_lora,
            "kv_lora_rank",
            "kv_a_layernorm over the key/value latent (kv_lora_rank; its rows are strided: the "
            "rope part follows each)",
        )
    )
    layers = v.int("num_hidden_layers", "counting the MoE layers")
    first_dense = v.int("first_k_dense_replace", "counting the MoE layers", minimum=0)
    freq = v.int("moe_layer_freq", "counting the MoE layers", default=1)
    moe = {
        "num_experts": v.int("n_routed_experts", "the MoE dispatch"),
        "top_k": v.int("num_experts_per_tok", "the MoE dispatch"),
        "hidden": hidden,
        "intermediate_size": v.int("moe_intermediate_size", "the MoE experts"),
        "shared_experts": v.int("n_shared_experts", "the MoE experts", minimum=0),
        # Multiples of freq in [first_dense, layers), counted (the layer count may be huge).
        "moe_layers": max(0, (layers - 1) // freq - (first_dense - 1) // freq),
        "scoring": v.str("scoring_func", "the MoE routing"),
        "renormalize": v.bool("norm_topk_prob", "the MoE routing"),
        "expert_groups": v.int("n_group", "the MoE routing"),
        "topk_groups": v.int("topk_group", "the MoE routing"),
        "routed_scaling_factor": v.float("routed_scaling_factor", "the MoE routing"),
        "fp8_block": fp8_block_size(v),
    }
    return _Model(
        hidden,
        eps,
        norm_comment=norm_comment,
        extra_norms=tuple(extra),
        moe=moe,
        moe_field="n_routed_experts",
    )


def _gpt_oss(v: _View) -> _Model:
    model = _llama(v)
    if v.data.get("num_experts_per_tok") is None and v.data.get("experts_per_token") is not None:
        top_k = v.int("experts_per_token", "the MoE dispatch")
    else:
        top_k = v.int("num_experts_per_tok", "the MoE dispatch")
    moe = {
        "num_experts": v.int("num_local_experts", "the MoE dispatch"),
        "top_k": top_k,
        "hidden": model.hidden,
        "intermediate_size": v.int("intermediate_size", "the MoE experts"),
        "shared_experts": 0,
        "moe_layers": v.int("num_hidden_layers", "counting the MoE layers"),
        "scoring": "softmax",
        "renormalize": True,  # top-k of the logits, then a softmax over those k
    }
    return _replace(model, moe=moe, moe_field="num_local_experts")


def _replace(model: _Model, **changes) -> _Model:
    return _Model(**{**model.__dict__, **changes})


# architecture -> (reader, nested text config key or None)
_ARCHITECTURES: dict[str, tuple[Callable[[_View], _Model], str | None]] = {
    "Qwen3ForCausalLM": (_qwen3, None),
    "Qwen3MoeForCausalLM": (_qwen3_moe, None),
    "Qwen2MoeForCausalLM": (_qwen2_moe, None),
    "LlamaForCausalLM": (_llama, None),
    "MistralForCausalLM": (_llama, None),
    # Qwen2 and Qwen2.5 dense: Llama's norms and gated SiLU MLP (their q/k/v biases are the
    # GEMMs' business); no per-head Q/K norm, which came with Qwen3
    "Qwen2ForCausalLM": (_llama, None),
    # Phi-3 mini / medium, Phi-3.5-mini, Phi-4: Llama's norms; the MLP's one gate_up_proj
    # gives [gate | up], act_and_mul's input (Phi3SmallForCausalLM is another design)
    "Phi3ForCausalLM": (_llama, None),
    "MixtralForCausalLM": (_mixtral, None),
    "Gemma2ForCausalLM": (_gemma2, None),
    "Gemma3ForCausalLM": (_gemma3, None),
    "Gemma3ForConditionalGeneration": (_gemma3, "text_config"),
    "DeepseekV3ForCausalLM": (_deepseek_v3, None),
    "DeepseekV2ForCausalLM": (_deepseek_v2, None),
    "GptOssForCausalLM": (_gpt_oss, None),
}
_MODEL_TYPES = {
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}
SUPPORTED_ARCHITECTURES = tuple(sorted(_ARCHITECTURES))


def _architecture(config: dict, path: str) -> str:
    archs = config.get("architectures")
    if archs is not None:
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise ManifestError(
                path,
                f"must be a list of class names (got {json.dumps(archs)})",
                field="architectures",
            )
        for name in archs:
            if name in _ARCHITECTURES:
                return name
        raise ManifestError(
            path,
            f"{archs} is not supported; from-config knows {', '.join(SUPPORTED_ARCHITECTURES)}",
            field="architectures",
        )
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    if model_type is not None:
        raise ManifestError(
            path,
            f"{json.dumps(model_type)} is not supported and there is no 'architectures' list; "
            f"from-config knows model types {', '.join(sorted(_MODEL_TYPES))}",
            field="model_type",
        )
    raise ManifestError(
        path,
        "missing (and no model_type); a Hugging Face config.json names its model class, "
        'e.g. "architectures": ["Qwen3ForCausalLM"]',
        field="architectures",
    )


# --- the derived manifest -----------------------------------------------------------------------
@dataclass(frozen=True)
class DerivedManifest:
    name: str
    source: str  # "<model dir>/config.json", as written into the header
    architecture: str
    model_type: str | None
    tp: int
    dtype: str
    archs: tuple[str, ...]
    entries: tuple[KernelEntry, ...]
    moe: MoeFacts | None
    config_fields: dict[str, Any]  # every config.json field read, with the value used
    defaulted: tuple[str, ...] = field(default=())  # fields taken from transformers' defaults
    description: str = ""
    ep: int = 1  # expert-parallel ranks (--ep)

    def to_toml(self) -> str:
        lines = [
            f"# Derived by `rose-aot manifest from-config` from {_comment_text(self.source)}:",
            f"# {self.architecture}"
            + (f" (model_type {_comment_text(self.model_type)})" if self.model_type else "")
            + f", tensor parallel {self.tp}"
            + (f", expert parallel {self.ep}" if self.ep > 1 else "")
            + f", {self.dtype} activations.",
        ]
        lines += _wrap_comment(
            "config.json: "
            + ", ".join(
                f"{k} {_fact(v)}" for k, v in self.config_fields.items() if k not in self.defaulted
            )
            + "."
        )
        if self.defaulted:
            lines += _wrap_comment(
                "Not in the file, so transformers' defaults for this class apply: "
                + ", ".join(f"{k} {_fact(self.config_fields[k])}" for k in self.defaulted)
                + "."
            )
        if self.moe is not None:
            lines += [
                "#",
                "# MoE layers (the moe_dispatch and moe_combine points below come from these):",
            ]
            lines += [f"#   {k} = {_toml_value(v)}" for k, v in self.moe.to_json().items()]
        lines += [
            "",
            "[deployment]",
            f"name = {_toml_value(self.name)}",
            f"description = {_toml_value(self.description)}",
            f"archs = {_toml_value(list(self.archs))}",
        ]
        for entry in self.entries:
            lines.append("")
            if entry.comment:
                lines += _wrap_comment(entry.comment)
            lines.append("[[kernel]]")
            lines.append(f"family = {_toml_value(entry.family)}")
            lines += [f"{k} = {_toml_value(v)}" for k, v in entry.fields]
        return "\n".join(lines) + "\n"

    def manifest(self) -> Manifest:
        """The written manifest, parsed and validated like any manifest file."""
        return parse_manifest(self.to_toml().encode(), f"{self.name}.toml")

    def to_json(self) -> dict:
        manifest = self.manifest()
        return {
            "name": self.name,
            "source": self.source,
            "architecture": self.architecture,
            "model_type": self.model_type,
            "tp": self.tp,
            "ep": self.ep,
            "dtype": self.dtype,
            "archs": list(self.archs),
            "kernels": [e.to_json() for e in self.entries],
            "points": [p.key for p in manifest.points],
            "moe": self.moe.to_json() if self.moe else None,
            "config_fields": self.config_fields,
            "defaulted": list(self.defaulted),
        }


def moe_kernel_entries(moe: MoeFacts, dtype: str) -> list[KernelEntry]:
    """The [[kernel]] entries of a model's MoE layers (the MoE families' own derivations)."""
    model = ModelFacts(hidden=moe.hidden, eps=1e-6, dtype=dtype, tp=moe.tp, moe=moe)
    return [e for name in ("moe_dispatch", "moe_combine") for e in FAMILIES[name].derive(model)]


def derive_manifest(
    config: dict,
    *,
    path: str | os.PathLike = "config.json",
    name: str | None = None,
    tp: int = 1,
    ep: int = 1,
    archs: tuple[str, ...] | None = None,
    dtype: str = "bfloat16",
) -> DerivedManifest:
    """Derive the manifest of one model from its config dict (`path` names it in errors)."""
    path = Path(path)
    label = str(path)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ManifestError(label, f"--tp must be a positive integer (got {tp!r})", field="tp")
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ManifestError(label, f"--ep must be a positive integer (got {ep!r})", field="ep")
    if ep > EP_MAX_RANKS:
        raise ManifestError(
            label,
            f"--ep {ep}: expert parallelism over NVLink is built for 2-{EP_MAX_RANKS} ranks of "
            f"one node; use --ep {EP_MAX_RANKS} or fewer",
            field="ep",
        )
    if ep > 1 and tp > 1:
        raise ManifestError(
            label,
            f"--ep {ep} with --tp {tp}: expert parallelism is derived for data-parallel ranks "
            "(tp 1) only; choose one",
            field="ep",
        )
    archs = tuple(archs) if archs else tuple(DEFAULT_ARCHS)
    for arch in archs:
        try:
            get_arch(arch)
        except ConfigError as exc:
            raise ManifestError(label, exc.reason, field="arch") from None
    name = _name(path, name)

    architecture = _architecture(config, label)
    reader, nested = _ARCHITECTURES[architecture]
    data, prefix = config, ""
    if nested is not None:
        data = config.get(nested)
        if not isinstance(data, dict):
            raise ManifestError(
                label,
                f"missing or not an object; {architecture} keeps its language model's fields "
                f"in {nested}",
                entry=architecture,
                field=nested,
            )
        prefix = nested + "."
    view = _View(data, label, architecture, prefix)
    model = reader(view)

    qk_heads = _heads_per_rank(view, model.qk_heads, tp) if model.qk_heads is not None else None
    moe = None
    if model.moe is not None:
        experts = model.moe["num_experts"]
        if experts % tp:
            view.fail(
                model.moe_field,
                f"{experts} experts do not split evenly over --tp {tp} ranks; use a --tp that "
                f"divides {experts}",
            )
        if ep > 1 and experts % ep:
            view.fail(
                model.moe_field,
                f"{experts} experts do not split evenly over --ep {ep} ranks; use an --ep that "
                f"divides {experts}",
            )
        moe = MoeFacts(**model.moe, tp=tp, experts_per_rank=experts // tp)
    facts = ModelFacts(
        hidden=model.hidden,
        eps=model.eps,
        dtype=dtype,
        tp=tp,
        weight_offset=model.weight_offset,
        norm_comment=model.norm_comment,
        extra_norms=model.extra_norms,
        qk_heads=qk_heads,
        moe=moe,
        archs=archs,
        fp8_group=read_fp8_group(view),
        block_scaled=read_block_scaled(view),
        **read_mlp(view, architecture, tp),
        ep=ep,
    )
    # Each registered family derives its own points (its folder's derive module).
    entries = [entry for family in FAMILIES.values() for entry in family.derive(facts)]

    parts = ["decoder RMSNorms (plain and fused add)"]
    if model.extra_norms:
        parts.append(f"{len(model.extra_norms)} more RMSNorm widths")
    if model.qk_heads is not None:
        parts.append("Q/K head norms")
    if moe is not None:
        parts.append("MoE dispatch and combine")
        if ep > 1:
            parts.append(f"expert-parallel dispatch and combine over {ep} ranks")
    description = f"{architecture}, {dtype}, tp {tp}: " + ", ".join(parts)

    derived = DerivedManifest(
        name,
        f"{path.parent.name}/{path.name}" if path.parent.name else path.name,
        architecture,
        config.get("model_type") if isinstance(config.get("model_type"), str) else None,
        tp,
        dtype,
        archs,
        tuple(entries),
        moe,
        dict(view.read),
        tuple(view.defaulted),
        description,
        ep,
    )
    for entry in entries:
        _validate(entry, view)
    derived.manifest()  # the written text loads as a manifest (raises if rose-aot broke that)
    return derived


def manifest_from_config(path: str | os.PathLike, **options) -> DerivedManifest:
    """Read a config.json (or a model directory holding one) and derive its manifest."""
    config, file = load_model_config(path)
    return derive_manifest(config, path=file, **options)


def _validate(entry: KernelEntry, view: _View) -> None:
    """Each point of the entry through its family's make_config; an unsupported value is
    reported against the config.json field it came from."""
    family = get_family(entry.family)
    fields = dict(entry.fields)
    axes = [v if isinstance(v, list) else [v] for v in fields.values()]
    sources = dict(entry.sources)
    for combination in itertools.product(*axes):
        try:
            family.make_config(**dict(zip(fields, combination, strict=True)))
        except ConfigError as exc:
            source = sources.get(exc.field)
            message = f"rose-aot's {entry.family} cannot take it: {exc.reason}"
            if source is None:
                raise ManifestError(
                    view.path, message, entry=view.architecture, field=exc.field
                ) from None
            view.fail(source, message)


def _heads_per_rank(view: _View, heads: tuple[int, int, int], tp: int) -> tuple[int, int, int]:
    q, kv, head_dim = heads
    if q % tp:
        view.fail("num_attention_heads", f"{q} heads do not split evenly over --tp {tp} ranks")
    if kv >= tp:
        if kv % tp:
            view.fail(
                "num_key_value_heads", f"{kv} KV heads do not split evenly over --tp {tp} ranks"
            )
        kv_per_rank = kv // tp
    else:
        if tp % kv:
            view.fail(
                "num_key_value_heads",
                f"{kv} KV heads cannot be replicated evenly over --tp {tp} ranks",
            )
        kv_per_rank = 1  # fewer KV heads than ranks: each rank holds a copy of one
    return q // tp, kv_per_rank, head_dim


def _name(path: Path, name: str | None) -> str:
    if name is None:
        stem = path.parent.name if path.name == "config.json" else path.stem
        name = stem.lower()
        if not _NAME.fullmatch(name):
            raise ManifestError(
                path,
                f"the default deployment name {name!r} (from the file's folder) is not usable; "
                "pass --name",
                field="name",
            )
    elif not _NAME.fullmatch(name):
        raise ManifestError(
            path,
            f"{name!r} is not a usable name; use letters, digits, '.', '_' and '-'",
            field="name",
        )
    return name


# --- TOML text ----------------------------------------------------------------------------------
def _toml_float(x: float) -> str:
    text = repr(float(x))
    if "e" in text:
        mantissa, exponent = text.split("e")
        return f"{mantissa}e{int(exponent)}"
    return text


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _toml_float(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string is a JSON string for this text
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def _fact(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, float):
        return _toml_float(v)
    if isinstance(v, str):
        return _comment_text(v)
    return json.dumps(v) if not isinstance(v, int) or isinstance(v, bool) else str(v)


def _comment_text(text: str) -> str:
    """Text from config.json as it may appear in a TOML comment: on one line, no control
    characters (a newline would end the comment and inject TOML)."""
    if text.isprintable():
        return text
    return json.dumps(text)[1:-1]


def _wrap_comment(text: str, width: int = 98) -> list[str]:
    lines, line = [], "#"
    for word in text.split():
        if len(line) + 1 + len(word) > width and line != "#":
            lines.append(line)
            line = "#  "
        line += " " + word
    lines.append(line)
    return lines
