"""Derivation of the activation / quantization points from the model configs in
tests/data/hf_configs: the config readers (read_mlp, read_fp8_group, read_block_scaled) fill
ModelFacts, and each family's derive module (reached through KernelFamily.derive, as
``manifest from-config`` does) turns the facts into [[kernel]] entries."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import pytest

from rose_aot.errors import ManifestError
from rose_aot.kernels import get_family
from rose_aot.kernels.act_and_mul.derive import read_mlp
from rose_aot.kernels.block_scaled_quant.derive import read_block_scaled
from rose_aot.kernels.fp8_group_quant.derive import read_fp8_group
from rose_aot.manifest.from_config import _ARCHITECTURES, _View
from rose_aot.manifest.model import ModelFacts, MoeFacts

CONFIGS = Path(__file__).resolve().parent / "data" / "hf_configs"
FAMILIES = ("act_and_mul", "fp8_group_quant", "act_and_mul_fp8_quant", "block_scaled_quant",
            "nvfp4_quant")


def _load(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def _facts(config: dict, tp: int = 1, archs=("sm_90a",)) -> ModelFacts:
    """ModelFacts as the manifest deriver builds them, plus this issue's readers."""
    architecture = config["architectures"][0]
    reader, nested = _ARCHITECTURES[architecture]
    data = config[nested] if nested else config
    view = _View(data, "model/config.json", architecture, nested + "." if nested else "")
    model = reader(view)
    moe = None
    if model.moe is not None:
        moe = MoeFacts(**model.moe, tp=tp, experts_per_rank=model.moe["num_experts"] // tp)
    return ModelFacts(hidden=model.hidden, eps=model.eps, tp=tp, moe=moe, archs=tuple(archs),
                      **read_mlp(view, architecture, tp), fp8_group=read_fp8_group(view),
                      block_scaled=read_block_scaled(view))


def _entries(config, tp=1, archs=("sm_90a",)):
    facts = _facts(config, tp, archs)
    return {name: [(e.family, dict(e.fields)) for e in get_family(name).derive(facts)]
            for name in FAMILIES}


def _points(entries):
    for family, fields in entries:
        axes = [v if isinstance(v, list) else [v] for v in fields.values()]
        for combo in itertools.product(*axes):
            yield family, dict(zip(fields, combo))


@pytest.mark.parametrize(
    "name,tp,widths,act",
    [
        ("llama-3.1-8b", 1, [14336], "silu"),
        ("llama-3.1-8b", 2, [7168], "silu"),
        ("mistral-7b", 4, [3584], "silu"),
        ("qwen3-8b", 1, [12288], "silu"),
        ("qwen3-30b-a3b", 4, [768], "silu"),  # experts are whole on a rank
        ("qwen3-235b-a22b", 1, [1536], "silu"),
        ("mixtral-8x7b", 2, [14336], "silu"),
        ("gemma-3-12b", 2, [7680], "gelu_tanh"),  # transformers' default hidden_activation
        ("deepseek-v3", 1, [18432, 2048], "silu"),  # one shared expert = expert width
        ("deepseek-v3", 8, [2304, 2048, 256], "silu"),
        ("gpt-oss-20b", 1, [], None),  # clamped SwiGLU: not act_and_mul
    ],
)
def test_activation_points(name, tp, widths, act):
    e = _entries(_load(name), tp)
    assert [f["d"] for _, f in e["act_and_mul"]] == widths
    assert all(f["activation"] == act and f["dtype"] == "bfloat16" for _, f in e["act_and_mul"])
    for family, values in _points(e["act_and_mul"]):
        get_family(family).make_config(**values)


def test_fp8_points_of_deepseek_v3():
    e = _entries(_load("deepseek-v3"), tp=8)
    assert e["fp8_group_quant"] == [("fp8_group_quant", dict(hidden=7168, group=128, dtype="bfloat16",
                                                   scale_layout="col_major_tma", ue8m0=False))]
    assert [f["d"] for _, f in e["act_and_mul_fp8_quant"]] == [2304, 2048, 256]
    assert all(f["group"] == 128 and f["activation"] == "silu" for _, f in e["act_and_mul_fp8_quant"])
    for family, values in _points(e["fp8_group_quant"] + e["act_and_mul_fp8_quant"]):
        get_family(family).make_config(**values)


def test_blackwell_targets_add_ue8m0_scales():
    e = _entries(_load("deepseek-v3"), archs=("sm_90a", "sm_100a"))
    assert e["fp8_group_quant"][0][1]["ue8m0"] == [False, True]
    assert len(list(_points(e["act_and_mul_fp8_quant"]))) == 2 * len(e["act_and_mul_fp8_quant"])


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b", "gemma-3-12b", "gpt-oss-120b"])
def test_unquantized_or_non_fp8_models_get_no_fp8_points(name):
    e = _entries(_load(name))
    assert e["fp8_group_quant"] == [] and e["act_and_mul_fp8_quant"] == []  # gpt-oss is mxfp4, not fp8 blocks


def test_qwen3_fp8_release():
    config = _load("qwen3-8b")
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128], "fmt": "e4m3"}
    e = _entries(config, tp=2)
    assert [f["hidden"] for _, f in e["fp8_group_quant"]] == [4096]
    assert [f["d"] for _, f in e["act_and_mul_fp8_quant"]] == [6144]


def test_errors_name_the_field():
    with pytest.raises(ManifestError, match="intermediate_size"):
        _entries(_load("llama-3.1-8b"), tp=3)
    config = copy.deepcopy(_load("deepseek-v3"))
    config["quantization_config"]["weight_block_size"] = [128, 96]
    with pytest.raises(ManifestError, match="weight_block_size"):
        _entries(config)
    config = _load("qwen3-8b")
    config["hidden_act"] = "relu2"
    with pytest.raises(ManifestError, match="hidden_act"):
        _entries(config)


def _block_scaled(config, archs, tp=1):
    e = _entries(config, tp, archs)
    return [f for _, f in e["block_scaled_quant"]] + [
        {**f, "format": "nvfp4"} for _, f in e["nvfp4_quant"]]


def test_block_scaled_points():
    # gpt-oss: MXFP4 expert weights -> MXFP8 activations on Blackwell, none for Hopper only
    assert _block_scaled(_load("gpt-oss-20b"), ("sm_90a",)) == []
    pts = _block_scaled(_load("gpt-oss-120b"), ("sm_90a", "sm_100a"))
    assert pts == [dict(hidden=2880, format="mxfp8", dtype="bfloat16", scale_layout="swizzled_128x4")]
    # a ModelOpt NVFP4 checkpoint of Llama 3.1 8B
    config = _load("llama-3.1-8b")
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                     "group_size": 16}
    pts = _block_scaled(config, ("sm_100a",), tp=2)
    assert [(p["hidden"], p["format"]) for p in pts] == [(4096, "nvfp4"), (7168, "nvfp4")]
    e = _entries(config, tp=2, archs=("sm_100a",))
    assert e["block_scaled_quant"] == [] and len(e["nvfp4_quant"]) == 2
    for family, values in _points(e["nvfp4_quant"]):
        get_family(family).make_config(**values)
    # unquantized and fp8 models: none
    assert _block_scaled(_load("qwen3-8b"), ("sm_100a",)) == []
    assert _block_scaled(_load("deepseek-v3"), ("sm_100a",)) == []
    config["quantization_config"]["group_size"] = 32
    with pytest.raises(ManifestError, match="group_size"):
        _block_scaled(config, ("sm_100a",))
