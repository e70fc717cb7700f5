"""`rose-aot manifest from-config`: every shipped config.json derives exactly the shipped
manifest's points and archs; the numbers per model (explicit data below); tensor parallelism;
MoE facts; errors that name the field for missing or bad fields and unknown architectures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rose_aot.cli import main as cli
from rose_aot.errors import ManifestError
from rose_aot.kernels import get_family
from rose_aot.manifest import load_manifest
from rose_aot.manifest.from_config import (
    SUPPORTED_ARCHITECTURES,
    MoeFacts,
    derive_manifest,
    load_model_config,
    manifest_from_config,
    moe_kernel_entries,
)

from conftest import REPO

CONFIGS = REPO / "tests" / "data" / "hf_configs"
MANIFESTS = REPO / "manifests"
NAMES = sorted(p.name for p in CONFIGS.iterdir() if (p / "config.json").is_file())


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def rms(**values) -> str:
    fam = get_family("rms_norm")
    return fam.key(fam.make_config(**values))


def qk(**values) -> str:
    fam = get_family("qk_norm")
    return fam.key(fam.make_config(**values))


def dispatch(**values) -> str:
    fam = get_family("moe_dispatch")
    return fam.key(fam.make_config(**values))


def combine(**values) -> str:
    fam = get_family("moe_combine")
    return fam.key(fam.make_config(**values))


def moe_points(experts: int, top_k: int, hidden: int) -> list[str]:
    return [
        dispatch(num_experts=experts, top_k=top_k, hidden=hidden),
        combine(top_k=top_k, hidden=hidden),
    ]


def config(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


# What each shipped config.json must give at tp 1: architecture, points, MoE (experts, top-k).
EXPECTED = {
    "qwen3-8b": (
        "Qwen3ForCausalLM",
        [
            rms(hidden=4096, eps=1e-6, fused_residual=False),
            rms(hidden=4096, eps=1e-6, fused_residual=True),
            qk(num_q_heads=32, num_k_heads=8, head_dim=128, eps=1e-6),
            "act_and_mul(d=12288,activation=silu,dtype=bfloat16,out_dtype=bfloat16)",
        ],
        None,
    ),
    "qwen3-235b-a22b": (
        "Qwen3MoeForCausalLM",
        [
            rms(hidden=4096, eps=1e-6, fused_residual=False),
            rms(hidden=4096, eps=1e-6, fused_residual=True),
            qk(num_q_heads=64, num_k_heads=4, head_dim=128, eps=1e-6),
            *moe_points(128, 8, 4096),
            "act_and_mul(d=1536,activation=silu,dtype=bfloat16,out_dtype=bfloat16)",
        ],
        (128, 8),
    ),
    "qwen3-30b-a3b": (
        "Qwen3MoeForCausalLM",
        [
            rms(hidden=2048, eps=1e-6, fused_residual=False),
            rms(hidden=2048, eps=1e-6, fused_residual=True),
            qk(num_q_heads=32, num_k_heads=4, head_dim=128, eps=1e-6),
            *moe_points(128, 8, 2048),
            "act_and_mul(d=768,activation=silu,dtype=bfloat16,out_dtype=bfloat16)",
        ],
        (128, 8),
    ),
    "llama-3.1-8b": (
        "LlamaForCausalLM",
        [
            rms(hidden=4096, eps=1e-5, fused_residual=False),
            rms(hidden=4096, eps=1e-5, fused_residual=True),
            "act_and_mul(d=14336,activation=silu,dtype=bfloat16,out_dtype=bfloat16)",
        ],
        None,
    ),
    "mistral-7b": (
        "MistralForCausalLM",
        [
            rms(hidden=4096, eps=1e-5, fused_residual=False),
            rms(hidden=4096, eps=1e-5, fused_residual=True),
            "act_and_mul(d=14336,activation=silu,dtype=bfloat16,out_dtype=bfloat16)",
        ],
        None,
    ),
    "mixtral-8x7b": (
        "MixtralForCausalLM",
        [
            rms(hidden=4096, eps=1e-5, fused_residual=False),
            rms(hidden=4096, eps=1e-5, fused_residual=True),
            *moe_points(8, 2, 4096),
            "act_and_mul(d=14336,activation=silu,dtype=bfloat16,out_dtype=bfloat16)",
        ],
        (8, 2),
    ),
    "gemma-3-12b": (
        "Gemma3ForConditionalGeneration",
        [
            rms(hidden=3840, eps=1e-6, weight_offset=1.0, fused_residual=False),
            rms(hidden=3840, eps=1e-6, weight_offset=1.0, fused_residual=True),
            qk(num_q_heads=16, num_k_heads=8, head_dim=256, eps=1e-6, weight_offset=1.0),
            "act_and_mul(d=15360,activation=gelu_tanh,dtype=bfloat16,out_dtype=bfloat16)",
        ],
        None,
    ),
    "deepseek-v3": (
        "DeepseekV3ForCausalLM",
        [
            rms(hidden=7168, eps=1e-6, fused_residual=False),
            rms(hidden=7168, eps=1e-6, fused_residual=True),
            rms(hidden=1536, eps=1e-6),
            rms(hidden=512, eps=1e-6),
            dispatch(num_experts=256, top_k=8, hidden=7168),
            dispatch(
                num_experts=256, top_k=8, hidden=7168, dtype="float8_e4m3fn", scale_group=128
            ),
            "moe_dispatch_fp8_quant(num_experts=256,top_k=8,hidden=7168,group=128,dtype=bfloat16,scale_layout=col_major_tma,ue8m0=false,eps=1e-10,expert_alignment=1,expert_start=0,local_experts=256)",
            "moe_dispatch_fp8_quant(num_experts=256,top_k=8,hidden=7168,group=128,dtype=bfloat16,scale_layout=col_major_tma,ue8m0=true,eps=1e-10,expert_alignment=1,expert_start=0,local_experts=256)",
            combine(top_k=8, hidden=7168),
            "act_and_mul(d=18432,activation=silu,dtype=bfloat16,out_dtype=bfloat16)",
            "act_and_mul(d=2048,activation=silu,dtype=bfloat16,out_dtype=bfloat16)",
            "fp8_group_quant(hidden=7168,group=128,dtype=bfloat16,scale_layout=col_major_tma,ue8m0=false,eps=1e-10)",
            "fp8_group_quant(hidden=7168,group=128,dtype=bfloat16,scale_layout=col_major_tma,ue8m0=true,eps=1e-10)",
            "act_and_mul_fp8_quant(d=18432,activation=silu,group=128,dtype=bfloat16,scale_layout=col_major_tma,ue8m0=false,eps=1e-10)",
            "act_and_mul_fp8_quant(d=18432,activation=silu,group=128,dtype=bfloat16,scale_layout=col_major_tma,ue8m0=true,eps=1e-10)",
            "act_and_mul_fp8_quant(d=2048,activation=silu,group=128,dtype=bfloat16,scale_layout=col_major_tma,ue8m0=false,eps=1e-10)",
            "act_and_mul_fp8_quant(d=2048,activation=silu,group=128,dtype=bfloat16,scale_layout=col_major_tma,ue8m0=true,eps=1e-10)",
        ],
        (256, 8),
    ),
    "gpt-oss-20b": (
        "GptOssForCausalLM",
        [
            rms(hidden=2880, eps=1e-5, fused_residual=False),
            rms(hidden=2880, eps=1e-5, fused_residual=True),
            *moe_points(32, 4, 2880),
            "block_scaled_quant(hidden=2880,format=mxfp8,dtype=bfloat16,scale_layout=swizzled_128x4)",
        ],
        (32, 4),
    ),
    "gpt-oss-120b": (
        "GptOssForCausalLM",
        [
            rms(hidden=2880, eps=1e-5, fused_residual=False),
            rms(hidden=2880, eps=1e-5, fused_residual=True),
            *moe_points(128, 4, 2880),
            "block_scaled_quant(hidden=2880,format=mxfp8,dtype=bfloat16,scale_layout=swizzled_128x4)",
        ],
        (128, 4),
    ),
}


def test_every_shipped_config_is_covered():
    assert NAMES == sorted(EXPECTED)
    covered = {EXPECTED[n][0] for n in NAMES}
    # Every supported architecture has a shipped config but the text-only Gemma 3 class, Qwen2,
    # Phi-3, Gemma 2, Qwen2-MoE and DeepSeek-V2 (tests from their config fields below), which no
    # shipped manifest uses.
    assert set(SUPPORTED_ARCHITECTURES) - covered == {
        "Gemma3ForCausalLM", "Qwen2ForCausalLM", "Phi3ForCausalLM", "Gemma2ForCausalLM",
        "Qwen2MoeForCausalLM", "DeepseekV2ForCausalLM"}


# ------------------------------------------------------------------------------ shipped manifests
@pytest.mark.parametrize("name", NAMES)
def test_shipped_manifest_equals_what_from_config_derives(name):
    shipped = load_manifest(MANIFESTS / f"{name}.toml")
    derived = manifest_from_config(CONFIGS / name, archs=shipped.archs).manifest()
    assert derived.name == shipped.name == name
    assert derived.archs == shipped.archs
    assert sorted(p.key for p in derived.points) == sorted(p.key for p in shipped.points)


@pytest.mark.parametrize("name", NAMES)
def test_derived_points_and_moe_facts(name, tmp_path):
    architecture, points, moe = EXPECTED[name]
    out = tmp_path / f"{name}.toml"
    result = run(
        "manifest",
        "from-config",
        CONFIGS / name / "config.json",
        "--arch",
        "sm_90a",
        "--arch",
        "sm_100a",
        "-o",
        out,
        "--json",
    )
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["architecture"] == architecture and info["tp"] == 1
    assert info["points"] == points
    written = load_manifest(out)
    assert [p.key for p in written.points] == points
    assert written.archs == ("sm_90a", "sm_100a") and written.name == name
    assert f"{name}/config.json" in out.read_text()
    if moe is None:
        assert info["moe"] is None and "MoE layers" not in out.read_text()
    else:
        assert (info["moe"]["num_experts"], info["moe"]["top_k"]) == moe
        assert info["moe"]["experts_per_rank"] == moe[0]
        text = out.read_text()
        assert "# MoE layers (the moe_dispatch and moe_combine points below" in text
        assert f"#   num_experts = {moe[0]}\n" in text and f"#   top_k = {moe[1]}\n" in text


def test_stdout_is_the_manifest_text(tmp_path):
    result = run("manifest", "from-config", CONFIGS / "qwen3-8b")
    assert result.exit_code == 0, result.output
    path = tmp_path / "qwen3-8b.toml"
    path.write_text(result.output)
    manifest = load_manifest(path)
    assert manifest.archs == ("sm_90a",)  # the default arch
    assert [p.key for p in manifest.points] == EXPECTED["qwen3-8b"][1]
    assert "eps = 1e-6\n" in result.output


# ------------------------------------------------------------------------------ per-model facts
def test_gemma3_reads_text_config_and_transformers_defaults():
    derived = manifest_from_config(CONFIGS / "gemma-3-12b")
    assert derived.config_fields["text_config.hidden_size"] == 3840
    assert derived.defaulted == (
        "text_config.rms_norm_eps", "text_config.head_dim", "text_config.hidden_activation"
    )
    assert (
        "transformers' defaults for this class apply: text_config.rms_norm_eps 1e-6, "
        "text_config.head_dim 256" in " ".join(derived.to_toml().replace("#", " ").split())
    )
    norms = [e for e in derived.entries if e.family in ("rms_norm", "qk_norm")]
    assert norms and all(dict(e.fields).get("weight_offset") == 1.0 for e in norms)


def test_gemma3_text_only_model_at_the_top_level():
    text = config("gemma-3-12b")["text_config"]
    derived = derive_manifest(
        {"architectures": ["Gemma3ForCausalLM"], **text}, path="g/config.json"
    )
    assert [p.key for p in derived.manifest().points] == EXPECTED["gemma-3-12b"][1]


def test_deepseek_v3_moe_facts():
    moe = manifest_from_config(CONFIGS / "deepseek-v3", tp=8).moe
    assert moe == MoeFacts(
        num_experts=256,
        top_k=8,
        hidden=7168,
        intermediate_size=2048,
        shared_experts=1,
        moe_layers=58,
        scoring="sigmoid",
        renormalize=True,
        tp=8,
        experts_per_rank=32,
        expert_groups=8,
        topk_groups=4,
        routed_scaling_factor=2.5,
        fp8_block=128,
    )


def test_qwen3_moe_layers_follow_sparse_step_and_dense_layers():
    cfg = config("qwen3-30b-a3b")
    cfg.update(decoder_sparse_step=2, mlp_only_layers=[1, 3])
    moe = derive_manifest(cfg, path="q/config.json").moe
    assert moe.moe_layers == 22  # layers 2, 4, ..., 48 minus layer index 3 (the 4th)
    assert moe.renormalize is True and moe.scoring == "softmax"


def test_gpt_oss_takes_experts_per_token_when_the_hf_field_is_absent():
    cfg = config("gpt-oss-20b")
    del cfg["num_experts_per_tok"]
    assert derive_manifest(cfg, path="g/config.json").moe.top_k == 4


# The fields a manifest reads of two published config.json files, with a few it must ignore
# (q/k/v biases live in the GEMMs, sliding windows and RoPE scaling in attention):
# Qwen/Qwen2.5-7B-Instruct (also Qwen2-7B's numbers) and microsoft/Phi-3-mini-4k-instruct.
QWEN2_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
    "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
    "num_key_value_heads": 4, "num_hidden_layers": 28, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 131072, "use_sliding_window": False,
    "max_window_layers": 28, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "vocab_size": 152064,
}
PHI3_MINI = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_act": "silu",
    "hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 32,
    "num_key_value_heads": 32, "num_hidden_layers": 32, "rms_norm_eps": 1e-05,
    "rope_scaling": None, "sliding_window": 2047, "original_max_position_embeddings": 4096,
    "torch_dtype": "bfloat16", "vocab_size": 32064,
}


@pytest.mark.parametrize("cfg, hidden, eps, inter", [(QWEN2_7B, 3584, 1e-6, 18944),
                                                      (PHI3_MINI, 3072, 1e-5, 8192)],
                         ids=["qwen2", "phi3"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_llama_like_models_derive_the_llama_points(cfg, hidden, eps, inter, tp):
    """Qwen2 / Qwen2.5 and Phi-3 dense models: the decoder norms (plain and fused residual add)
    and the gated SiLU MLP split over the tensor-parallel ranks, as Llama; no Q/K head norm."""
    derived = derive_manifest(dict(cfg), path="m/config.json", tp=tp)
    assert derived.architecture == cfg["architectures"][0] and derived.moe is None
    points = derived.manifest().points
    assert [p.key for p in points if p.family != "all_reduce"] == [
        rms(hidden=hidden, eps=eps, fused_residual=False),
        rms(hidden=hidden, eps=eps, fused_residual=True),
        f"act_and_mul(d={inter // tp},activation=silu,dtype=bfloat16,out_dtype=bfloat16)",
    ]
    # and, across ranks, the all-reduce points of a TP decoder (tests/test_all_reduce_spec.py)
    assert any(p.family == "all_reduce" for p in points) == (tp > 1)
    without = {k: v for k, v in cfg.items() if k != "architectures"}
    assert derive_manifest(without, path="m/config.json").architecture == cfg["architectures"][0]


# google/gemma-2-9b's config.json: the fields a manifest reads and a few it must ignore.
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
    "num_key_value_heads": 8, "num_hidden_layers": 42, "rms_norm_eps": 1e-06,
    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "torch_dtype": "float32",
}


def test_gemma2_derives_gemma_norms_and_the_tanh_geglu_without_qk_norm():
    """Gemma 2: (1 + w) norms, GeGLU with the tanh GELU of `hidden_activation`, no per-head Q/K
    norm (Gemma 3's); eps, when a file leaves it out, from Gemma2Config's default, said so."""
    derived = derive_manifest(dict(GEMMA2_9B), path="gemma-2-9b/config.json", tp=2)
    assert derived.architecture == "Gemma2ForCausalLM"
    points = [p.key for p in derived.manifest().points if p.family != "all_reduce"]
    assert points == [
        rms(hidden=3584, eps=1e-6, weight_offset=1.0, fused_residual=False),
        rms(hidden=3584, eps=1e-6, weight_offset=1.0, fused_residual=True),
        "act_and_mul(d=7168,activation=gelu_tanh,dtype=bfloat16,out_dtype=bfloat16)",
    ]
    bare = {k: v for k, v in GEMMA2_9B.items() if k not in ("rms_norm_eps", "architectures")}
    derived = derive_manifest(bare, path="g/config.json")
    assert derived.architecture == "Gemma2ForCausalLM" and "rms_norm_eps" in derived.defaulted
    assert rms(hidden=3584, eps=1e-6, weight_offset=1.0, fused_residual=False) in [
        p.key for p in derived.manifest().points]


# Qwen/Qwen1.5-MoE-A2.7B's config.json: the fields a manifest reads and a few it must ignore.
QWEN15_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
    "norm_topk_prob": False, "decoder_sparse_step": 1, "num_attention_heads": 16,
    "num_key_value_heads": 16, "num_hidden_layers": 24, "rms_norm_eps": 1e-06,
    "max_window_layers": 21, "use_sliding_window": False, "sliding_window": 32768,
    "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "vocab_size": 151936,
}


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_qwen2_moe_derives_routed_and_shared_expert_points(tp):
    """Qwen1.5-MoE / Qwen2-MoE: the decoder norms, no Q/K head norm, the MoE dispatch and
    combine of each rank's experts, and two SiLU widths: the routed experts' (whole on a rank)
    and the one shared expert's, split over the ranks."""
    derived = derive_manifest(dict(QWEN15_MOE), path="qwen1.5-moe/config.json", tp=tp)
    assert derived.architecture == "Qwen2MoeForCausalLM"
    moe = derived.moe
    assert (moe.num_experts, moe.top_k, moe.hidden, moe.intermediate_size) == (60, 4, 2048, 1408)
    assert (moe.shared_experts, moe.moe_layers, moe.renormalize, moe.scoring) == (
        1, 24, False, "softmax")
    assert moe.experts_per_rank == 60 // tp
    keys = [p.key for p in derived.manifest().points if p.family != "all_reduce"]
    assert keys[:2] == [rms(hidden=2048, eps=1e-6, fused_residual=False),
                        rms(hidden=2048, eps=1e-6, fused_residual=True)]
    assert not any(k.startswith("qk_norm") for k in keys)
    # at tp 4 the shared expert's share (5632 / 4) is the routed width: one point serves both
    assert [k for k in keys if k.startswith("act_and_mul")] == list(dict.fromkeys([
        "act_and_mul(d=1408,activation=silu,dtype=bfloat16,out_dtype=bfloat16)",
        f"act_and_mul(d={5632 // tp},activation=silu,dtype=bfloat16,out_dtype=bfloat16)",
    ]))
    dispatches = [p.config for p in derived.manifest().points if p.family == "moe_dispatch"]
    assert [(c.expert_start, c.local_experts) for c in dispatches] == [
        (r * 60 // tp, 60 // tp) for r in range(tp)]
    assert combine(top_k=4, hidden=2048) in keys
    without = {k: v for k, v in QWEN15_MOE.items() if k != "architectures"}
    assert derive_manifest(without, path="q/config.json").architecture == "Qwen2MoeForCausalLM"


def test_qwen2_moe_without_a_shared_expert_and_with_dense_layers():
    """A shared_expert_intermediate_size of 0 gives no shared-expert width; mlp_only_layers
    takes layers out of the MoE count and adds the dense MLP's width."""
    cfg = dict(QWEN15_MOE, shared_expert_intermediate_size=0, mlp_only_layers=[0, 1])
    derived = derive_manifest(cfg, path="q/config.json")
    assert (derived.moe.shared_experts, derived.moe.moe_layers) == (0, 22)
    assert [p.key for p in derived.manifest().points if p.family == "act_and_mul"] == [
        "act_and_mul(d=1408,activation=silu,dtype=bfloat16,out_dtype=bfloat16)",
        "act_and_mul(d=5632,activation=silu,dtype=bfloat16,out_dtype=bfloat16)",  # dense layers
    ]


@pytest.mark.parametrize("field, value, words", [
    ("shared_expert_intermediate_size", None, "missing; Qwen2MoeForCausalLM needs it"),
    ("shared_expert_intermediate_size", -1, "must be >= 0"),
    ("shared_expert_intermediate_size", "5632", "must be an integer"),
])
def test_qwen2_moe_bad_shared_expert_fields_name_the_field(field, value, words):
    cfg = dict(QWEN15_MOE)
    if value is None:
        del cfg[field]
    else:
        cfg[field] = value
    with pytest.raises(ManifestError, match=words) as err:
        derive_manifest(cfg, path="q/config.json")
    assert field in str(err.value)


def test_qwen2_moe_shared_expert_that_does_not_split_over_tp():
    cfg = dict(QWEN15_MOE, shared_expert_intermediate_size=5630)
    with pytest.raises(ManifestError, match="does not split evenly over --tp 4") as err:
        derive_manifest(cfg, path="q/config.json", tp=4)
    assert "shared_expert_intermediate_size" in str(err.value)


# deepseek-ai/DeepSeek-V2's and DeepSeek-V2-Lite's config.json: the fields a manifest reads and
# a few it must ignore.
DEEPSEEK_V2 = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_act": "silu",
    "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
    "n_routed_experts": 160, "n_shared_experts": 2, "num_experts_per_tok": 6,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_hidden_layers": 60,
    "n_group": 8, "topk_group": 3, "topk_method": "group_limited_greedy",
    "scoring_func": "softmax", "norm_topk_prob": False, "routed_scaling_factor": 16.0,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "num_attention_heads": 128, "num_key_value_heads": 128,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "torch_dtype": "bfloat16", "vocab_size": 102400,
}
DEEPSEEK_V2_LITE = dict(
    DEEPSEEK_V2, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
    n_routed_experts=64, num_hidden_layers=27, n_group=1, topk_group=1, topk_method="greedy",
    routed_scaling_factor=1.0, q_lora_rank=None, num_attention_heads=16, num_key_value_heads=16,
)


@pytest.mark.parametrize("cfg, hidden, latents, experts, widths, groups", [
    (DEEPSEEK_V2, 5120, (1536, 512), 160, (12288, 1536, 3072), (8, 3, 16.0)),
    # no q_lora_rank (queries not compressed): the key/value latent's norm only
    (DEEPSEEK_V2_LITE, 2048, (512,), 64, (10944, 1408, 2816), (1, 1, 1.0)),
], ids=["v2", "v2-lite"])
def test_deepseek_v2_derives_v3s_norms_and_experts_with_softmax_routing(
        cfg, hidden, latents, experts, widths, groups):
    """DeepSeek-V2 and V2-Lite: the decoder norms and MLA latent norms, 6 of the routed experts
    with softmax routing (group-limited in V2), MoE from the second layer, and three SiLU widths:
    the dense first layer, a routed expert, the two shared experts together."""
    derived = derive_manifest(dict(cfg), path="deepseek-v2/config.json")
    assert derived.architecture == "DeepseekV2ForCausalLM"
    moe = derived.moe
    assert (moe.num_experts, moe.top_k, moe.shared_experts, moe.moe_layers) == (
        experts, 6, 2, cfg["num_hidden_layers"] - 1)
    assert (moe.scoring, moe.renormalize, moe.fp8_block) == ("softmax", False, 0)
    assert (moe.expert_groups, moe.topk_groups, moe.routed_scaling_factor) == groups
    keys = [p.key for p in derived.manifest().points]
    assert keys == [
        rms(hidden=hidden, eps=1e-6, fused_residual=False),
        rms(hidden=hidden, eps=1e-6, fused_residual=True),
        *(rms(hidden=w, eps=1e-6) for w in latents),
        *moe_points(experts, 6, hidden),
        *(f"act_and_mul(d={d},activation=silu,dtype=bfloat16,out_dtype=bfloat16)" for d in widths),
    ]
    text = derived.to_toml()
    assert "the MTP" not in text
    assert "input_layernorm, post_attention_layernorm and the final norm" in text
    without = {k: v for k, v in cfg.items() if k != "architectures"}
    assert derive_manifest(without, path="d/config.json").architecture == "DeepseekV2ForCausalLM"


def test_deepseek_v2_missing_routing_field_names_it():
    cfg = {k: v for k, v in DEEPSEEK_V2.items() if k != "n_group"}
    with pytest.raises(ManifestError, match="missing; DeepseekV2ForCausalLM needs it") as err:
        derive_manifest(cfg, path="d/config.json")
    assert "n_group" in str(err.value)


def test_model_type_alone_names_the_architecture():
    cfg = config("llama-3.1-8b")
    del cfg["architectures"]
    assert derive_manifest(cfg, path="l/config.json").architecture == "LlamaForCausalLM"


def test_moe_points_come_from_one_function_one_point_per_rank():
    moe = manifest_from_config(CONFIGS / "mixtral-8x7b").moe
    entries = moe_kernel_entries(moe, "bfloat16")
    assert [e.family for e in entries] == ["moe_dispatch", "moe_combine"]
    assert dict(entries[0].fields) == {
        "num_experts": 8, "top_k": 2, "hidden": 4096, "dtype": "bfloat16"
    }
    derived = manifest_from_config(CONFIGS / "qwen3-30b-a3b", tp=4).manifest()
    ranks = [p.config for p in derived.points if p.family == "moe_dispatch"]
    assert [(c.expert_start, c.local_experts) for c in ranks] == [(0, 32), (32, 32), (64, 32), (96, 32)]


# ------------------------------------------------------------------------------ tensor parallel
@pytest.mark.parametrize(
    "name, tp, heads, experts_per_rank",
    [
        ("qwen3-8b", 2, (16, 4), None),
        ("qwen3-8b", 8, (4, 1), None),
        ("qwen3-8b", 16, (2, 1), None),  # fewer KV heads than ranks: one replicated per rank
        ("qwen3-30b-a3b", 4, (8, 1), 32),
        ("qwen3-30b-a3b", 8, (4, 1), 16),
        ("gemma-3-12b", 2, (8, 4), None),
        ("mixtral-8x7b", 8, None, 1),
        ("gpt-oss-120b", 4, None, 32),
    ],
)
def test_tp_splits_heads_and_experts(name, tp, heads, experts_per_rank, tmp_path):
    result = run("manifest", "from-config", CONFIGS / name, "--tp", tp, "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["tp"] == tp
    qk_entries = [k for k in info["kernels"] if k["family"] == "qk_norm"]
    if heads is None:
        assert not qk_entries
    else:
        (entry,) = qk_entries
        assert (entry["num_q_heads"], entry["num_k_heads"]) == heads
    rms_hidden = {k["hidden"] for k in info["kernels"] if k["family"] == "rms_norm"}
    assert rms_hidden == {rms_entry_hidden(name)}  # norms over the full hidden on every rank
    if experts_per_rank is not None:
        assert info["moe"]["experts_per_rank"] == experts_per_rank and info["moe"]["tp"] == tp


def rms_entry_hidden(name: str) -> int:
    cfg = config(name)
    return cfg.get("text_config", cfg)["hidden_size"]


@pytest.mark.parametrize(
    "name, tp, field, says",
    [
        ("mixtral-8x7b", 3, "num_local_experts", "8 experts do not split evenly over --tp 3"),
        ("qwen3-8b", 3, "num_attention_heads", "32 heads do not split evenly over --tp 3"),
        ("qwen3-30b-a3b", 64, "num_attention_heads", "32 heads do not split evenly over --tp 64"),
    ],
)
def test_tp_that_does_not_divide_names_the_field(name, tp, field, says):
    with pytest.raises(ManifestError) as info:
        manifest_from_config(CONFIGS / name, tp=tp)
    assert info.value.field == field and says in str(info.value)


@pytest.mark.parametrize(
    "kv, tp, says",
    [
        (6, 4, "6 KV heads do not split evenly over --tp 4"),
        (3, 8, "3 KV heads cannot be replicated evenly over --tp 8"),
    ],
)
def test_kv_heads_that_do_not_split_name_the_nested_field(kv, tp, says):
    cfg = config("gemma-3-12b")
    cfg["text_config"]["num_key_value_heads"] = kv
    with pytest.raises(ManifestError) as info:
        derive_manifest(cfg, path="gemma/config.json", tp=tp)
    assert info.value.field == "text_config.num_key_value_heads" and says in str(info.value)


# ------------------------------------------------------------------------------ errors
def broken(tmp_path, name, edit) -> Path:
    cfg = config(name)
    edit(cfg)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize(
    "name, edit, field, says",
    [
        (
            "qwen3-8b",
            lambda c: c.pop("hidden_size"),
            "hidden_size",
            "missing; Qwen3ForCausalLM needs it for the decoder RMSNorm",
        ),
        (
            "qwen3-8b",
            lambda c: c.pop("head_dim"),
            "head_dim",
            "missing; Qwen3ForCausalLM needs it for the Q/K head norm",
        ),
        ("qwen3-8b", lambda c: c.update(rms_norm_eps=None), "rms_norm_eps", "missing"),
        (
            "gemma-3-12b",
            lambda c: c["text_config"].pop("hidden_size"),
            "text_config.hidden_size",
            "missing; Gemma3ForConditionalGeneration needs it",
        ),
        (
            "gemma-3-12b",
            lambda c: c.pop("text_config"),
            "text_config",
            "missing or not an object; Gemma3ForConditionalGeneration keeps its language model's",
        ),
        (
            "llama-3.1-8b",
            lambda c: c.update(hidden_size="4096"),
            "hidden_size",
            'must be an integer (got "4096")',
        ),
        (
            "llama-3.1-8b",
            lambda c: c.update(hidden_size=4100),
            "hidden_size",
            "rose-aot's rms_norm cannot take it: 4100 is not supported",
        ),
        (
            "qwen3-8b",
            lambda c: c.update(head_dim=96),
            "head_dim",
            "rose-aot's qk_norm cannot take it: 96 is not supported",
        ),
        (
            "mixtral-8x7b",
            lambda c: c.pop("num_local_experts"),
            "num_local_experts",
            "missing; MixtralForCausalLM needs it for the MoE dispatch",
        ),
        ("deepseek-v3", lambda c: c.pop("kv_lora_rank"), "kv_lora_rank", "missing"),
        (
            "deepseek-v3",
            lambda c: c.update(norm_topk_prob="yes"),
            "norm_topk_prob",
            "must be true or false",
        ),
        (
            "qwen3-8b",
            lambda c: c.update(architectures=["FooForCausalLM"]),
            "architectures",
            "['FooForCausalLM'] is not supported; from-config knows DeepseekV2ForCausalLM, "
            "DeepseekV3ForCausalLM",
        ),
        (
            "qwen3-8b",
            lambda c: (c.pop("architectures"), c.update(model_type="foo")),
            "model_type",
            '"foo" is not supported',
        ),
        (
            "qwen3-8b",
            lambda c: (c.pop("architectures"), c.pop("model_type")),
            "architectures",
            "missing (and no model_type)",
        ),
    ],
    ids=[
        "no-hidden",
        "no-head-dim",
        "null-eps",
        "gemma-nested",
        "gemma-no-text-config",
        "string-hidden",
        "unsupported-hidden",
        "unsupported-head-dim",
        "no-experts",
        "no-kv-lora",
        "bad-bool",
        "unknown-arch",
        "unknown-model-type",
        "no-arch",
    ],
)
def test_missing_or_bad_fields_name_the_field(tmp_path, name, edit, field, says):
    folder = broken(tmp_path, name, edit)
    with pytest.raises(ManifestError) as info:
        manifest_from_config(folder)
    assert info.value.field == field, str(info.value)
    assert says in str(info.value)
    assert str(folder / "config.json") in str(info.value)
    result = run("manifest", "from-config", folder)
    assert result.exit_code == 2 and f"field '{field}'" in result.output


def test_unreadable_inputs(tiny_build, tmp_path):
    cases = {
        tmp_path / "missing": "no such file",
        tiny_build.path: "is a rose-aot bundle, not a model config.json",
    }
    (tmp_path / "array.json").write_text("[1, 2]")
    cases[tmp_path / "array.json"] = "must hold a JSON object (got a list)"
    (tmp_path / "bad.json").write_text("{nope")
    cases[tmp_path / "bad.json"] = "invalid JSON"
    empty = tmp_path / "empty-model"
    empty.mkdir()
    cases[empty] = "config.json: no such file"
    for path, says in cases.items():
        with pytest.raises(ManifestError) as info:
            load_model_config(path)
        assert says in str(info.value), (path, str(info.value))
        result = run("manifest", "from-config", path)
        assert result.exit_code == 2 and says in result.output


def test_bad_options(tmp_path):
    result = run("manifest", "from-config", CONFIGS / "qwen3-8b", "--arch", "sm_75")
    assert result.exit_code == 2 and "unknown arch 'sm_75'" in result.output
    result = run("manifest", "from-config", CONFIGS / "qwen3-8b", "--tp", "0")
    assert result.exit_code == 2
    result = run("manifest", "from-config", CONFIGS / "qwen3-8b", "--name", "no spaces")
    assert result.exit_code == 2 and "is not a usable name" in result.output
    weird = tmp_path / "Weird Name"
    weird.mkdir()
    (weird / "config.json").write_text((CONFIGS / "qwen3-8b" / "config.json").read_text())
    result = run("manifest", "from-config", weird)
    assert result.exit_code == 2 and "pass --name" in result.output
    result = run("manifest", "from-config", weird, "--name", "ok-name", "--dtype", "float16")
    assert result.exit_code == 0 and 'name = "ok-name"' in result.output
    assert 'dtype = "float16"' in result.output
