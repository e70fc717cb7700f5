"""all_reduce on the CPU: configs, arguments, variants, launch plans, real compiles (records
checked against PTX and cubin; the PTX's cross-GPU flag instructions; no multicast), parameter
packing of the scalar rank, references, manifest derivation, the distributed module's guards."""

from __future__ import annotations

import re
import struct
import subprocess
import sys

import pytest
import torch

from rose_aot.archs import ARCHS
from rose_aot.errors import ArgumentError, ConfigError
from rose_aot.kernels import get_family
from rose_aot.kernels.all_reduce import tuning
from rose_aot.kernels.all_reduce.family import FLAG_BYTES, MAX_BLOCKS, MAX_RANKS
from rose_aot.kernels.spec import ScalarArg, param_size
from rose_aot.manifest.model import ModelFacts

AR = get_family("all_reduce")
H90 = ARCHS["sm_90a"]


def plain(**overrides):
    return AR.make_config(**{"world_size": 2, "dtype": "bfloat16", **overrides})


def combine(**overrides):
    values = {"world_size": 2, "dtype": "bfloat16", "fusion": "moe_combine", "hidden": 7168,
              "top_k": 8, **overrides}
    return AR.make_config(**values)


def fused(**overrides):
    values = {"world_size": 2, "dtype": "bfloat16", "fusion": "residual_rms_norm",
              "hidden": 7168, **overrides}
    return AR.make_config(**values)


# --- configs ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, overrides, field",
    [
        (plain, {"world_size": 1}, "world_size"),
        (plain, {"world_size": MAX_RANKS + 1}, "world_size"),
        (plain, {"dtype": "float8_e4m3fn"}, "dtype"),
        (plain, {"fusion": "gelu"}, "fusion"),
        (fused, {"hidden": 0}, "hidden"),
        (fused, {"hidden": 7164}, "hidden"),  # not a multiple of 8 bf16 (16-byte vectors)
        (fused, {"hidden": 32768}, "hidden"),
        (fused, {"eps": 0.0}, "eps"),
        (combine, {"top_k": 0}, "top_k"),
        (combine, {"top_k": 33}, "top_k"),
        (combine, {"dtype": "float32"}, "dtype"),
        (combine, {"hidden": 100}, "hidden"),
    ],
)
def test_bad_configs_name_the_field(make, overrides, field):
    with pytest.raises(ConfigError) as info:
        make(**overrides)
    assert info.value.field == field


def test_fields_a_fusion_does_not_use_are_dropped_one_key():
    assert plain(hidden=4096, eps=1e-5, top_k=8) == plain()
    assert AR.key(plain(weight_offset=1.0)) == AR.key(plain())
    assert AR.key(fused()) != AR.key(fused(eps=1e-5))
    assert fused(top_k=8) == fused()
    assert combine(eps=1e-3, weight_offset=1.0) == combine()
    assert AR.key(combine()) != AR.key(combine(top_k=4))


# --- arguments and variants -------------------------------------------------------------------
def test_plain_arguments_rank_is_a_runtime_scalar_and_ptrs_follow_world_size():
    for w in (2, 4, 8):
        args = AR.args(plain(world_size=w), H90)
        assert [a.name for a in args] == ["x", "out", "buffer", "ptrs", "state", "rank"]
        by = {a.name: a for a in args}
        assert isinstance(by["rank"], ScalarArg) and by["rank"].dtype == "int32"
        assert by["ptrs"].shape == (2, w) and by["ptrs"].dtype == "int64"
        assert by["state"].role == "inout" and by["buffer"].role == "inout"
        assert by["x"].shape[0].divisibility == 8  # whole 16-byte bf16 vectors
        assert by["buffer"].shape[0].divisibility == 16  # two halves of whole vectors
    sizes = [param_size(a) for a in AR.args(plain(), H90)]
    assert sizes == [16, 16, 16, 8, 8, 4]


def test_fused_arguments_and_variant():
    c = fused()
    assert [a.name for a in AR.args(c, H90)] == [
        "x", "residual", "weight", "out", "buffer", "ptrs", "state", "rank"
    ]
    (v,) = AR.variants(c, H90)
    # 7168 bf16 = 896 vectors: 14 warps x 2 vectors per thread cover a row exactly
    assert v.name == "one_shot" and v.block == (448, 1, 1)
    assert v.constants["warps_per_row"] == 14 and v.constants["vecs_per_thread"] == 2
    assert v.smem == 4 * 14 and v.cooperative


def test_moe_combine_arguments_and_variant():
    c = combine()
    args = AR.args(c, H90)
    assert [a.name for a in args] == [
        "y", "positions", "weights", "out", "buffer", "ptrs", "state", "rank"
    ]
    by = {a.name: a for a in args}
    assert by["y"].shape[0].name == "rows" and by["out"].shape[0].name == "n"
    assert by["positions"].shape == (by["out"].shape[0], 8) and by["weights"].dtype == "float32"
    (v,) = AR.variants(c, H90)
    assert v.block == (448, 1, 1) and v.smem == 0 and v.cooperative
    assert plan(c, 16)[0].grid == (16, 1, 1)


def test_plain_variants_are_cooperative_and_within_the_flag_region():
    for v in AR.variants(plain(), H90):
        assert v.cooperative
        assert v.constants["max_blocks"] <= MAX_BLOCKS
        assert v.constants["flag_bytes"] == FLAG_BYTES == 4 * 2 * MAX_RANKS * MAX_BLOCKS


# --- plans --------------------------------------------------------------------------------------
def plan(c, n, capacity=None, sm=132, force=None):
    variants = {v.name: v for v in AR.variants(c, H90)}
    if capacity is None:
        capacity = 2 * (n if c.fusion == "none" else n * c.hidden) + 64
        capacity -= capacity % 16
    return AR.plan(c, variants, {"n": n, "capacity": capacity}, sm, force)


def test_plan_switches_to_two_shot_at_the_tuned_size():
    c = plain()
    switch = tuning.two_shot_min_bytes(2)
    (below,) = plan(c, switch // 2 - 8)
    (at,) = plan(c, switch // 2)
    assert below.variant == "one_shot" and at.variant == "two_shot"
    assert plan(c, 8, force="two_shot")[0].variant == "two_shot"
    assert plan(c, 1 << 24, force="one_shot")[0].variant == "one_shot"


@pytest.mark.parametrize("n", [8, 4096, 1 << 16, 1 << 20, 32 << 20])
@pytest.mark.parametrize("sm", [16, 78, 132])
def test_plan_grids_fit_the_flags_and_the_device(n, sm):
    c = plain()
    for force in ("one_shot", "two_shot"):
        (launch,) = plan(c, n, sm=sm, force=force)
        blocks = launch.grid[0]
        assert 1 <= blocks <= min(sm, MAX_BLOCKS)
        v = {v.name: v for v in AR.variants(c, H90)}[force]
        per_block = v.threads * (2 if force == "two_shot" else 1)
        vectors = n // 8
        # enough blocks for the work, up to the cap; never a block without work
        assert blocks == min(-(-vectors // per_block), v.constants["max_blocks"], sm)


def test_plan_refuses_what_the_buffer_cannot_hold_and_partial_vectors():
    c = plain()
    assert plan(c, 0) == ()
    with pytest.raises(ArgumentError, match="do not fit one half"):
        plan(c, 1024, capacity=1024)
    with pytest.raises(ArgumentError, match="multiple of 8 elements"):
        plan(c, 1020)
    with pytest.raises(ArgumentError, match="two halves"):
        plan(c, 8, capacity=1000)
    with pytest.raises(ArgumentError, match="do not fit"):
        plan(fused(), 3, capacity=2 * 2 * 7168)
    # a fused point has one variant: every forced name launches it (the loader plans them all)
    assert plan(fused(), 3, force="two_shot") == plan(fused(), 3)
    assert plan(combine(), 3, force="one_shot") == plan(combine(), 3)


def test_fused_plan_one_row_per_block_up_to_the_cap():
    c = fused()
    assert plan(c, 1)[0].grid == (1, 1, 1)
    assert plan(c, 7)[0].grid == (7, 1, 1)
    assert plan(c, 4096)[0].grid == (min(tuning.FUSED_MAX_BLOCKS, 132), 1, 1)
    assert plan(c, 4096, sm=78)[0].grid == (78, 1, 1)


# --- real compiles ------------------------------------------------------------------------------
_COMPILED: dict = {}


def compiled(c, arch):
    from rose_aot.builder.compile import compile_point

    key = (AR.key(c), arch)
    if key not in _COMPILED:
        _COMPILED[key] = compile_point("all_reduce", c, arch)
    return _COMPILED[key]


@pytest.mark.parametrize(
    "config, arch",
    [
        (plain(), "sm_90a"),
        (plain(world_size=4, dtype="float32"), "sm_90a"),
        (plain(world_size=8, dtype="float16"), "sm_90a"),
        (plain(), "sm_100a"),
        (fused(), "sm_90a"),
        (fused(hidden=2880, weight_offset=1.0), "sm_90a"),
        (fused(dtype="float32", hidden=2048, world_size=4), "sm_100a"),
        (combine(), "sm_90a"),
        (combine(dtype="float16", hidden=2880, top_k=4, world_size=8), "sm_100a"),
    ],
    ids=lambda v: v if isinstance(v, str) else AR.key(v),
)
def test_compiles_with_system_scope_flags_and_no_multicast(config, arch):
    """compile_point checks the record against the PTX and the cubin (entries, .reqntid,
    parameter sizes and alignments, shared memory); here the PTX of every variant must hold
    the cross-GPU protocol: release stores and acquire loads at system scope, no atomics, and
    nothing of NVLink multicast."""
    point = compiled(config, arch)
    assert [v.name for v in point.record.variants] == [v.name for v in AR.variants(config, ARCHS[arch])]
    for v in point.record.variants:
        ptx, _ = point.artifacts[v.name]
        assert "st.release.sys.global.b32" in ptx, v.name
        assert "ld.acquire.sys.global.b32" in ptx, v.name
        assert "atom." not in ptx, v.name  # the epoch needs no atomics: per-block counters
        assert "multimem" not in ptx and "multicast" not in ptx, v.name
        assert v.cooperative
        assert [p.name for p in v.params] == [a.name for a in AR.args(config, ARCHS[arch])]
        # one-shot: W peer loads per vector; two-shot: a second barrier (phase 1 flags)
        stores = ptx.count("st.release.sys.global.b32")
        assert stores == (2 if v.name == "two_shot" else 1), (v.name, stores)


def test_world_size_changes_the_peer_loads():
    """The rank loop is unrolled at compile time: world size W gives W 16-byte peer loads per
    vector in the one-shot sum (plus the staging load of the local input)."""
    for w in (2, 4):
        ptx, _ = compiled(plain(world_size=w, dtype="float32" if w == 4 else "bfloat16"),
                          "sm_90a").artifacts["one_shot"]
        assert ptx.count("ld.global.v4.b32") == w + 1, w


def test_scalar_rank_is_packed_where_the_record_says():
    """The loader packs the rank (a Python int) into its own 4-byte parameter, last, after
    the pointer table and the state: the record's parameter layout drives the packing."""
    from rose_aot.loader.args import ParamPacker

    record = compiled(plain(), "sm_90a").record
    v = record.variant("one_shot")
    positions = {a.name: i for i, a in enumerate(record.args)}
    packer = ParamPacker(positions, v.params)
    values = [0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 1]
    dims = {"n": 1024, "capacity": 4096}
    packer.pack(packer.values(values, dims))
    raw = bytes(packer.buffer)
    offsets = [0, 16, 32, 48, 56, 64]  # every parameter 8-aligned, sizes 16,16,16,8,8,4
    assert struct.unpack_from("<Qi", raw, offsets[0]) == (0x1000, 1024)
    assert struct.unpack_from("<Qi", raw, offsets[2]) == (0x3000, 4096)
    assert struct.unpack_from("<Q", raw, offsets[3]) == (0x4000,)
    assert struct.unpack_from("<i", raw, offsets[5]) == (1,)


# --- references ---------------------------------------------------------------------------------
def test_ordered_sum_matches_the_float64_reference_within_one_rounding():
    from rose_aot.kernels.all_reduce.reference import ordered_sum

    gen = torch.Generator().manual_seed(0)
    for w in (2, 3, 8):
        xs = [torch.randn(4096, generator=gen).to(torch.bfloat16) for _ in range(w)]
        out = torch.empty(4096, dtype=torch.bfloat16)
        AR.reference(plain(world_size=max(w, 2)), xs, out)
        got = ordered_sum(xs).double()
        err = (got - out.double()).abs() / out.double().abs().clamp(min=1.0)
        assert err.max().item() <= 2**-7, w
        if w == 2:  # two bf16 addends: the fp32 sum is exact, one rounding like float64's
            assert torch.equal(ordered_sum(xs), out)


def test_moe_combine_reference_is_the_sum_of_each_ranks_combine():
    """Each rank combines only its own experts (others at position -1); the fused reference
    is the float64 sum of the ranks' rounded moe_combine outputs, and with the experts split
    over two ranks it stays within one rounding of the single-GPU combine of all experts."""
    gen = torch.Generator().manual_seed(2)
    c = combine(hidden=64, top_k=4)
    tokens, rows = 6, 24
    y = [torch.randn(rows, 64, generator=gen).to(torch.bfloat16) for _ in range(2)]
    weights = torch.rand(tokens, 4, generator=gen)
    everything = torch.randint(0, rows, (tokens, 4), generator=gen, dtype=torch.int32)
    owner = torch.randint(0, 2, (tokens, 4), generator=gen)
    inputs = []
    for r in range(2):
        pos = torch.where(owner == r, everything, torch.full_like(everything, -1))
        inputs.append((y[r], pos, weights))
    out = torch.empty(tokens, 64, dtype=torch.bfloat16)
    AR.reference(c, inputs, out)

    mc = get_family("moe_combine")
    mcc = mc.make_config(top_k=4, hidden=64, dtype="bfloat16")
    partials = []
    for y_r, pos, w in inputs:
        part = torch.empty(tokens, 64, dtype=torch.bfloat16)
        mc.reference(mcc, y_r, pos, w, part)
        partials.append(part.double())
    assert torch.equal(out, (partials[0] + partials[1]).to(torch.bfloat16))
    # single GPU, every expert local: y of both ranks stacked, positions shifted for rank 1
    stacked = torch.cat(y)
    pos_all = torch.where(owner == 0, everything, everything + rows)
    single = torch.empty(tokens, 64, dtype=torch.bfloat16)
    mc.reference(mcc, stacked, pos_all, weights, single)
    err = (single.double() - out.double()).abs() / single.double().abs().clamp(min=1.0)
    assert err.max().item() <= 2**-7


def test_fused_reference_is_the_unfused_sequence():
    """all_reduce then rms_norm(fused_residual): the fused reference must produce the same
    residual and output as the two families' references applied in sequence."""
    gen = torch.Generator().manual_seed(1)
    c = fused(hidden=256, eps=1e-5, weight_offset=1.0)
    tokens = 5
    xs = [torch.randn(tokens, 256, generator=gen).to(torch.bfloat16) for _ in range(2)]
    residual = torch.randn(tokens, 256, generator=gen).to(torch.bfloat16)
    weight = (0.1 * torch.randn(256, generator=gen)).to(torch.bfloat16)
    res_fused, out_fused = residual.clone(), torch.empty_like(residual)
    AR.reference(c, xs, res_fused, weight, out_fused)

    summed = torch.empty(tokens, 256, dtype=torch.bfloat16)
    AR.reference(plain(), xs, summed)
    norm = get_family("rms_norm")
    nc = norm.make_config(hidden=256, dtype="bfloat16", eps=1e-5, weight_offset=1.0,
                          fused_residual=True)
    res_seq, out_seq = residual.clone(), torch.empty_like(residual)
    norm.reference(nc, summed, res_seq, weight, out_seq)
    assert torch.equal(res_fused, res_seq)
    assert torch.equal(out_fused, out_seq)
    assert not torch.equal(res_fused, residual)  # the residual was written


# --- manifest derivation ------------------------------------------------------------------------
def test_derive_adds_points_for_tensor_parallel_models_only():
    facts = ModelFacts(hidden=7168, eps=1e-6, dtype="bfloat16", tp=2)
    entries = AR.derive(facts)
    configs = [AR.make_config(**dict(e.fields)) for e in entries]
    assert configs == [plain(), fused(hidden=7168, eps=1e-6)]
    assert AR.derive(ModelFacts(hidden=7168, eps=1e-6, tp=1)) == []
    assert AR.derive(ModelFacts(hidden=7168, eps=1e-6, tp=16)) == []  # beyond one node
    gemma = AR.derive(ModelFacts(hidden=3840, eps=1e-6, tp=4, weight_offset=1.0))
    assert AR.make_config(**dict(gemma[1].fields)).weight_offset == 1.0
    assert len(gemma) == 2  # no MoE: no combine point


def test_from_config_tp_adds_all_reduce_points():
    from pathlib import Path

    from rose_aot.manifest.from_config import manifest_from_config

    configs = Path(__file__).parent / "data" / "hf_configs"
    points = manifest_from_config(configs / "qwen3-8b", tp=2).manifest().points
    ar = [p.config for p in points if p.family == "all_reduce"]
    assert {(c.world_size, c.fusion, c.hidden) for c in ar} == {
        (2, "none", 0), (2, "residual_rms_norm", 4096)
    }
    points = manifest_from_config(configs / "qwen3-8b", tp=1).manifest().points
    assert not [p for p in points if p.family == "all_reduce"]
    points = manifest_from_config(configs / "qwen3-30b-a3b", tp=4).manifest().points
    moe = [p.config for p in points if p.family == "all_reduce" and p.config.fusion == "moe_combine"]
    assert [(c.world_size, c.hidden, c.top_k) for c in moe] == [(4, 2048, 8)]


# --- the distributed module -------------------------------------------------------------------
def test_distributed_module_imports_no_cutlass_and_refuses_multicast_env():
    code = (
        "import os, sys\n"
        "os.environ.pop('NCCL_NVLS_ENABLE', None)\n"
        "os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST'] = '1'\n"
        "import rose_aot.distributed as d\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('cutlass', 'cutlass_dsl')]\n"
        "try:\n"
        "    d.check_no_multicast_env()\n"
        "except d.DistributedError as e:\n"
        "    assert 'NCCL_NVLS_ENABLE=0' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no error without NCCL_NVLS_ENABLE=0')\n"
        "os.environ['NCCL_NVLS_ENABLE'] = '0'\n"
        "d.check_no_multicast_env()\n"
        "assert d.size_class(1) == 1 << 20 and d.size_class((1 << 20) + 1) == 2 << 20\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_no_multicast_anywhere_in_the_sources():
    """No code path may create multicast objects or issue multimem instructions."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    files = [*(root / "rose_aot").rglob("*.py"), *(root / "tests" / "multigpu").rglob("*.py"),
             *(root / "benchmarks").rglob("*multigpu*.py")]
    bad = re.compile(r"cuMulticast|multimem\.|multicast_ptr\s*\(|enable_multicast|"
                     r"multimem_all_reduce|multimem_all_gather")
    hits = [f"{f}:{i + 1}" for f in files for i, line in enumerate(f.read_text().splitlines())
            if bad.search(line) and not line.lstrip().startswith("#")]
    assert not hits, hits


def test_multigpu_scripts_parse_and_set_the_no_multicast_environment():
    """The two-GPU scripts run unattended on a machine this CPU suite never sees: they must at
    least parse, and the launcher and the shared setup must switch NVLink multicast off."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for rel in ("tests/multigpu/check_all_reduce.py", "tests/multigpu/common.py",
                "tests/multigpu/test_multigpu.py", "benchmarks/bench_multigpu.py"):
        compile((root / rel).read_text(), rel, "exec")
    common = (root / "tests/multigpu/common.py").read_text()
    launcher = (root / "tests/multigpu/run.sh").read_text()
    for text in (common, launcher):
        assert "NCCL_NVLS_ENABLE" in text and "TORCH_SYMM_MEM_DISABLE_MULTICAST" in text
    # the environment is set before torch is imported
    assert common.index('os.environ["NCCL_NVLS_ENABLE"] = "0"') < common.index("import torch")
