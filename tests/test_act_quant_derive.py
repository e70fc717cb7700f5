"""Derivation of the activation / FP8 quantization points from the model configs in
tests/data/hf_configs (per-family derive.py; the manifest deriver wires them in)."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import pytest

from rose_aot.errors import ManifestError
from rose_aot.kernels import get_family
from rose_aot.kernels.act_and_mul import derive as act_derive
from rose_aot.kernels.act_and_mul_fp8_quant import derive as fused_derive
from rose_aot.kernels.fp8_group_quant import derive as quant_derive
from rose_aot.manifest.from_config import _ARCHITECTURES, _View

CONFIGS = Path(__file__).resolve().parent / "data" / "hf_configs"


def _view(config: dict, name: str = "model"):
    architecture = config["architectures"][0]
    nested = _ARCHITECTURES[architecture][1]
    data = config[nested] if nested else config
    return _View(data, f"{name}/config.json", architecture, nested + "." if nested else ""), architecture


def _load(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def _entries(config, tp=1, archs=("sm_90a",)):
    out = {}
    for key, mod in (("act", act_derive), ("quant", quant_derive), ("fused", fused_derive)):
        view, arch = _view(config)
        out[key] = [(e.family, dict(e.fields)) for e in mod.derive(view, architecture=arch, tp=tp,
                                                                   dtype="bfloat16", archs=archs)]
    return out


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
    assert [f["d"] for _, f in e["act"]] == widths
    assert all(f["activation"] == act and f["dtype"] == "bfloat16" for _, f in e["act"])
    for family, values in _points(e["act"]):
        get_family(family).make_config(**values)


def test_fp8_points_of_deepseek_v3():
    e = _entries(_load("deepseek-v3"), tp=8)
    assert e["quant"] == [("fp8_group_quant", dict(hidden=7168, group=128, dtype="bfloat16",
                                                   scale_layout="col_major_tma", ue8m0=False))]
    assert [f["d"] for _, f in e["fused"]] == [2304, 2048, 256]
    assert all(f["group"] == 128 and f["activation"] == "silu" for _, f in e["fused"])
    for family, values in _points(e["quant"] + e["fused"]):
        get_family(family).make_config(**values)


def test_blackwell_targets_add_ue8m0_scales():
    e = _entries(_load("deepseek-v3"), archs=("sm_90a", "sm_100a"))
    assert e["quant"][0][1]["ue8m0"] == [False, True]
    assert len(list(_points(e["fused"]))) == 2 * len(e["fused"])


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b", "gemma-3-12b", "gpt-oss-120b"])
def test_unquantized_or_non_fp8_models_get_no_fp8_points(name):
    e = _entries(_load(name))
    assert e["quant"] == [] and e["fused"] == []  # gpt-oss is mxfp4, not fp8 blocks


def test_qwen3_fp8_release():
    config = _load("qwen3-8b")
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128], "fmt": "e4m3"}
    e = _entries(config, tp=2)
    assert [f["hidden"] for _, f in e["quant"]] == [4096]
    assert [f["d"] for _, f in e["fused"]] == [6144]


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
    from rose_aot.kernels.block_scaled_quant import derive as block_derive

    view, arch = _view(config)
    return [dict(e.fields) for e in block_derive.derive(view, architecture=arch, tp=tp,
                                                          dtype="bfloat16", archs=archs)]


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
    for family, values in _points([("block_scaled_quant", p) for p in pts]):
        get_family(family).make_config(**values)
    # unquantized and fp8 models: none
    assert _block_scaled(_load("qwen3-8b"), ("sm_100a",)) == []
    assert _block_scaled(_load("deepseek-v3"), ("sm_100a",)) == []
    config["quantization_config"]["group_size"] = 32
    with pytest.raises(ManifestError, match="group_size"):
        _block_scaled(config, ("sm_100a",))
