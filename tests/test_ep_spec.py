"""Expert-parallel MoE (moe_ep_dispatch, moe_ep_combine) on the CPU: configs, arguments,
launch plans, the region layout, a Python model of the slot / row arithmetic the kernels use,
real compiles for sm_90a and sm_100a (system-scope flags, no multicast), references, manifest
derivation (--ep), the distributed module's guards."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rose_aot.archs import ARCHS
from rose_aot.errors import ArgumentError, ConfigError
from rose_aot.kernels import get_family
from rose_aot.kernels.moe_ep_dispatch import protocol
from rose_aot.kernels.spec import ScalarArg

D = get_family("moe_ep_dispatch")
C = get_family("moe_ep_combine")
H90 = ARCHS["sm_90a"]
CONFIGS = Path(__file__).parent / "data" / "hf_configs"


def dispatch(**overrides):
    return D.make_config(**{"world_size": 2, "num_experts": 16, "top_k": 4, "hidden": 512,
                            **overrides})


def combine(**overrides):
    return C.make_config(**{"world_size": 2, "top_k": 4, "hidden": 512, **overrides})


# --- configs ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, overrides, field",
    [
        (dispatch, {"world_size": 1}, "world_size"),
        (dispatch, {"world_size": 9}, "world_size"),
        (dispatch, {"num_experts": 15}, "num_experts"),  # not a multiple of world_size
        (dispatch, {"num_experts": 2048}, "num_experts"),
        (dispatch, {"top_k": 0}, "top_k"),
        (dispatch, {"top_k": 17}, "top_k"),  # more than the experts
        (dispatch, {"hidden": 100}, "hidden"),
        (dispatch, {"hidden": 520, "dtype": "float8_e4m3fn", "scale_group": 8}, "hidden"),
        (dispatch, {"scale_group": 128}, "scale_group"),  # bf16 carries no scales
        (dispatch, {"dtype": "float8_e4m3fn", "scale_group": 100}, "scale_group"),
        (dispatch, {"expert_alignment": 3}, "expert_alignment"),
        (combine, {"world_size": 1}, "world_size"),
        (combine, {"top_k": 33}, "top_k"),
        (combine, {"dtype": "float8_e4m3fn"}, "dtype"),
        (combine, {"hidden": 100}, "hidden"),
    ],
)
def test_bad_configs_name_the_field(make, overrides, field):
    with pytest.raises(ConfigError) as info:
        make(**overrides)
    assert info.value.field == field


def test_float8_defaults_to_128_element_scales():
    c = dispatch(dtype="float8_e4m3fn")
    assert c.scale_group == 128 and D.groups(c) == 4


# --- arguments and plans ------------------------------------------------------------------------
def test_arguments_rank_is_a_runtime_scalar_and_ptrs_follow_world_size():
    for w in (2, 4, 8):
        args = D.args(dispatch(world_size=w), H90)
        names = [a.name for a in args]
        assert names == ["x", "topk_ids", "out", "expert_offsets", "send_slots", "recv_pos",
                         "ptrs", "state", "counters", "rank"]
        by = {a.name: a for a in args}
        assert by["ptrs"].shape == (w,) and by["ptrs"].dtype == "int64"
        assert by["state"].shape == (protocol.STATE_WORDS,)
        assert isinstance(by["rank"], ScalarArg)
        assert by["expert_offsets"].shape == (16 // w + 1,)
    scaled = [a.name for a in D.args(dispatch(dtype="float8_e4m3fn"), H90)]
    assert scaled[:5] == ["x", "topk_ids", "x_scales", "out", "out_scales"]
    assert [a.name for a in C.args(combine(), H90)] == [
        "y", "send_slots", "weights", "out", "recv_pos", "ptrs", "state", "rank"]


def test_one_cooperative_variant_within_shared_memory():
    for c in (dispatch(), dispatch(num_experts=1024, world_size=8, top_k=8, hidden=7168)):
        (v,) = D.variants(c, H90)
        assert v.cooperative and v.name == "one_launch"
        assert v.smem <= 48 * 1024  # no opt-in attribute needed
    (v,) = C.variants(combine(), H90)
    assert v.cooperative and v.smem == 0


def _variants(fam, c):
    return {v.name: v for v in fam.variants(c, H90)}


def test_plan_launches_even_with_no_tokens_and_fits_the_device():
    c = dispatch()
    cap = protocol.slots_for(64, 4)
    sizes = {"tokens": 0, "rows": D.max_rows(c, cap), "slots": 2 * cap}
    (launch,) = D.plan(c, _variants(D, c), sizes, 132)
    assert launch.grid == (1, 1, 1)  # peers wait for this rank's counts: it must launch
    for tokens in (1, 7, 64):
        for sm in (1, 78, 132):
            (launch,) = D.plan(c, _variants(D, c), {**sizes, "tokens": tokens}, sm)
            assert 1 <= launch.grid[0] <= min(sm, protocol.MAX_BLOCKS)
    cc = combine()
    for tokens in (0, 1, 64):
        (launch,) = C.plan(cc, _variants(C, cc), {"tokens": tokens, "slots": 2 * cap}, 132)
        assert 1 <= launch.grid[0] <= 132


def test_plan_refuses_what_the_workspace_cannot_hold():
    c = dispatch(expert_alignment=64)
    cap = protocol.slots_for(8, 4)  # 32 slots per sender
    ok = {"tokens": 8, "rows": D.max_rows(c, cap), "slots": 2 * cap}
    assert D.max_rows(c, cap) == 2 * 32 + 8 * 63
    D.plan(c, _variants(D, c), ok, 132)
    with pytest.raises(ArgumentError, match="max_tokens >= 9"):
        D.plan(c, _variants(D, c), {**ok, "tokens": 9}, 132)
    with pytest.raises(ArgumentError, match="rows"):
        D.plan(c, _variants(D, c), {**ok, "rows": ok["rows"] - 1}, 132)
    with pytest.raises(ArgumentError, match="world_size"):
        D.plan(c, _variants(D, c), {**ok, "slots": 2 * cap + 2}, 132)
    with pytest.raises(ArgumentError, match="slots per sender"):
        C.plan(combine(), _variants(C, combine()), {"tokens": 9, "slots": 2 * cap}, 132)


# --- the region layout --------------------------------------------------------------------------
@pytest.mark.parametrize("w, cap, hidden, experts, eb, groups", [
    (2, 4, 512, 16, 2, 0), (2, 32768, 7168, 256, 2, 0), (8, 1028, 2048, 1024, 1, 16),
    (3, 12, 64, 9, 1, 4)])
def test_region_layout_is_aligned_and_the_combine_part_is_shared(w, cap, hidden, experts, eb,
                                                                  groups):
    lay = protocol.region_layout(w, cap, hidden, experts // w, eb, groups)
    shared = protocol.shared_layout(w, cap, hidden)
    for name in ("send_flags", "return_flags", "return_rows"):
        assert lay[name] == shared[name]
    assert lay["counts"] == shared["end"]
    offsets = sorted(lay.values())
    assert all(o % 16 == 0 for o in offsets), lay
    assert offsets[0] == protocol.HEADER_BYTES
    assert protocol.DONE_FLAGS + 2 * protocol.MAX_RANKS <= protocol.HEADER_BYTES // 4
    # the int32 arrays hold [2][W][cap] each; rows [2][W][cap][hidden]
    assert lay["return_flags"] - lay["send_flags"] == 2 * w * cap * 4
    assert lay["counts"] - lay["return_rows"] == 2 * w * cap * hidden * 2
    assert lay["recv_scales"] - lay["recv_rows"] == 2 * w * cap * hidden * eb
    assert lay["end"] - lay["recv_scales"] == 2 * w * cap * groups * 4


def test_slots_cover_every_copy_of_a_rank():
    assert protocol.slots_for(1, 8) == 8
    assert protocol.slots_for(3, 1) == 4
    assert protocol.slots_for(4096, 8) == 32768
    assert protocol.slots_for(0, 8) == 4


# --- a Python model of the kernels' slot and row arithmetic ------------------------------------
def _simulate(c, all_ids):
    """The dispatch's arithmetic, step by step as device.py does it (counts per expert, slot
    starts per destination, then each receiver's expert offsets and row deltas), with the
    per-block atomics replaced by any order. Returns per rank (out rows as (sender, token, k),
    expert_offsets) and each sender's send_slots."""
    W, E = c.world_size, c.num_experts
    L = E // W
    a = c.expert_alignment
    cap = protocol.slots_for(max(ids.shape[0] for ids in all_ids), c.top_k)
    sends, regions = [], [dict() for _ in range(W)]  # regions[d][(s, slot)] = (t, k, j)
    counts = []  # counts[s][e]
    for s, ids in enumerate(all_ids):
        cnt = [0] * E
        order = [(t, k) for t in range(ids.shape[0]) for k in range(c.top_k)]
        random.Random(s).shuffle(order)  # atomics: any order
        local = {}
        for t, k in order:
            e = int(ids[t, k])
            if 0 <= e < E:
                local[(t, k)] = cnt[e]
                cnt[e] += 1
        prefix = [0] * (E + 1)
        for e in range(E):
            prefix[e + 1] = prefix[e] + cnt[e]
        start = [prefix[e] - prefix[(e // L) * L] for e in range(E)]
        send = torch.full((ids.shape[0], c.top_k), -1, dtype=torch.int64)
        for (t, k), n in local.items():
            e = int(ids[t, k])
            d = e // L
            slot = start[e] + n
            assert slot < cap
            send[t, k] = d * cap + slot
            assert (s, slot) not in regions[d]
            regions[d][(s, slot)] = (t, k, e - d * L)
        sends.append(send)
        counts.append(cnt)
    results = []
    for r in range(W):
        rc = [counts[s][r * L + j] for s in range(W) for j in range(L)]  # [sender][local]
        p = [0] * (E + 1)
        for i in range(E):
            p[i + 1] = p[i] + rc[i]
        totals = [sum(rc[s * L + j] for s in range(W)) for j in range(L)]
        off = [0] * (L + 1)
        for j in range(L):
            off[j + 1] = off[j] + (totals[j] + a - 1) // a * a
        delta = [off[i % L] + sum(rc[s2 * L + i % L] for s2 in range(i // L))
                 - (p[i] - p[(i // L) * L]) for i in range(E)]
        rows, recv_pos = {}, {}
        for g in range(p[E]):
            s = max(s2 for s2 in range(W) if g >= p[s2 * L])
            slot = g - p[s * L]
            t, k, j = regions[r][(s, slot)]
            row = delta[s * L + j] + slot
            assert off[j] <= row < off[j] + totals[j], (row, j)
            assert row not in rows
            rows[row] = (s, t, k)
            recv_pos[(s, slot)] = row
        results.append((rows, off, recv_pos))
    return results, sends


@pytest.mark.parametrize("routing", ["random", "skewed", "empty", "invalid", "uneven"])
@pytest.mark.parametrize("w, experts, align", [(2, 16, 1), (2, 16, 64), (4, 32, 16), (8, 64, 1)])
def test_slot_and_row_arithmetic_places_every_copy_in_its_expert(routing, w, experts, align):
    from rose_aot.kernels.moe_ep_dispatch.reference import expected_layout

    c = dispatch(world_size=w, num_experts=experts, expert_alignment=align)
    gen = torch.Generator().manual_seed(w * 100 + experts)
    all_ids = []
    for s in range(w):
        tokens = {"uneven": 3 * s, "empty": 0 if s == 1 else 5}.get(routing, 9)
        ids = torch.randint(0, experts, (tokens, 4), generator=gen, dtype=torch.int32)
        if routing == "skewed":
            ids.fill_(experts - 1)
        if routing == "invalid":
            ids[::2] = -1
            ids[1::3, 0] = experts + 5
        all_ids.append(ids)
    results, sends = _simulate(c, all_ids)
    L = experts // w
    for r, (rows, off, _) in enumerate(results):
        want_off, copies = expected_layout(c, all_ids, r)
        assert off == want_off.tolist()
        assert sorted(rows.values()) == sorted((s, t, k) for s, t, k, _ in copies)
        for row, (s, t, k) in rows.items():
            j = int(all_ids[s][t, k]) - r * L
            assert off[j] <= row < off[j + 1]
    for s, send in enumerate(sends):
        ids = all_ids[s]
        valid = (ids >= 0) & (ids < experts)
        assert torch.equal(send >= 0, valid)


# --- compiles -----------------------------------------------------------------------------------
_COMPILED: dict = {}


def compiled(fam, c, arch):
    from rose_aot.builder.compile import compile_point

    key = (fam.key(c), arch)
    if key not in _COMPILED:
        _COMPILED[key] = compile_point(fam.name, c, arch)
    return _COMPILED[key]


@pytest.mark.parametrize(
    "fam, config, arch",
    [
        (D, dispatch(), "sm_90a"),
        (D, dispatch(), "sm_100a"),
        (D, dispatch(expert_alignment=64, world_size=4), "sm_90a"),
        (D, dispatch(dtype="float8_e4m3fn", num_experts=32, hidden=1024), "sm_90a"),
        (D, dispatch(dtype="float8_e4m3fn", num_experts=32, hidden=1024), "sm_100a"),
        (D, dispatch(world_size=8, num_experts=256, top_k=8, hidden=7168), "sm_90a"),
        (C, combine(), "sm_90a"),
        (C, combine(), "sm_100a"),
        (C, combine(world_size=8, top_k=8, hidden=7168, dtype="float16"), "sm_90a"),
    ],
    ids=lambda v: v if isinstance(v, str) else getattr(v, "name", None) or str(v),
)
def test_compiles_with_system_scope_flags_and_no_multicast(fam, config, arch):
    """compile_point checks the record against the PTX and the cubin; here the PTX must hold
    the cross-GPU protocol (release stores and acquire loads at system scope) and nothing of
    NVLink multicast."""
    point = compiled(fam, config, arch)
    (v,) = point.record.variants
    ptx, cubin = point.artifacts[v.name]
    assert v.cooperative
    assert [p.name for p in v.params] == [a.name for a in fam.args(config, ARCHS[arch])]
    assert "st.release.sys.global.b32" in ptx
    assert "ld.acquire.sys.global.b32" in ptx
    assert "multimem" not in ptx and "multicast" not in ptx
    assert cubin[:4] == b"\x7fELF"


def test_dispatch_publishes_counts_and_slots_and_reads_peers_relaxed():
    ptx, _ = compiled(D, dispatch(), "sm_90a").artifacts["one_launch"]
    # count flag, per-slot flag; the receiver's count / meta reads at system scope
    assert ptx.count("st.release.sys.global.b32") >= 2
    assert "ld.relaxed.sys.global.b32" in ptx
    assert "atom.add" in ptx or "atom.global.add" in ptx or "red." in ptx  # routing counters


# --- references ---------------------------------------------------------------------------------
def test_dispatch_reference_places_rows_by_sender_then_token():
    from rose_aot.kernels.moe_ep_dispatch.reference import reference

    c = dispatch(expert_alignment=16)
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(5, 512, generator=gen).to(torch.bfloat16) for _ in range(2)]
    ids = [torch.randint(0, 16, (5, 4), generator=gen, dtype=torch.int32) for _ in range(2)]
    out = torch.full((2 * 20 + 8 * 15, 512), float("nan"), dtype=torch.bfloat16)
    offsets = torch.empty(9, dtype=torch.int32)
    reference(c, xs, ids, 1, out, offsets)
    # the single-GPU dispatch of rank 1's experts over the concatenated tokens has the same
    # offsets (the same counts)
    md = get_family("moe_dispatch")
    mc = md.make_config(num_experts=16, top_k=4, hidden=512, expert_start=8, local_experts=8,
                        expert_alignment=16)
    out1 = torch.zeros(md.max_rows(mc, 10), 512, dtype=torch.bfloat16)
    off1, pos1 = torch.empty(9, dtype=torch.int32), torch.empty(10, 4, dtype=torch.int32)
    md.reference(mc, torch.cat(xs), torch.cat(ids), out1, off1, pos1)
    assert torch.equal(offsets, off1)
    n = int(offsets[-1])
    assert torch.equal(out[:n], out1[:n])  # same (sender, token, k) order inside each expert


def test_combine_reference_is_moe_combine_of_the_gathered_rows():
    gen = torch.Generator().manual_seed(4)
    c = combine()
    rows = torch.randn(6, 4, 512, generator=gen).to(torch.bfloat16)
    weights = torch.rand(6, 4, generator=gen)
    valid = torch.rand(6, 4, generator=gen) > 0.3
    out = torch.empty(6, 512, dtype=torch.bfloat16)
    C.reference(c, rows, weights, valid, out)
    mc = get_family("moe_combine")
    y = rows.reshape(24, 512)
    positions = torch.where(valid, torch.arange(24).view(6, 4), torch.full((6, 4), -1)).int()
    want = torch.empty_like(out)
    mc.reference(mc.make_config(top_k=4, hidden=512), y, positions, weights, want)
    assert torch.equal(out, want)


# --- manifest derivation ------------------------------------------------------------------------
def test_from_config_ep_adds_dispatch_and_combine_points():
    from rose_aot.manifest.from_config import manifest_from_config

    points = manifest_from_config(CONFIGS / "qwen3-30b-a3b", ep=2).manifest().points
    ep = sorted((p.family, p.key) for p in points if p.family.startswith("moe_ep"))
    assert [f for f, _ in ep] == ["moe_ep_combine", "moe_ep_dispatch"]
    d = next(p.config for p in points if p.family == "moe_ep_dispatch")
    assert (d.world_size, d.num_experts, d.top_k, d.hidden) == (2, 128, 8, 2048)
    assert not [p for p in manifest_from_config(CONFIGS / "qwen3-30b-a3b").manifest().points
                if p.family.startswith("moe_ep")]
    assert not [p for p in manifest_from_config(CONFIGS / "qwen3-8b", ep=2).manifest().points
                if p.family.startswith("moe_ep")]  # dense: nothing to dispatch
    deepseek = manifest_from_config(CONFIGS / "deepseek-v3", ep=8).manifest().points
    dtypes = sorted(p.config.dtype for p in deepseek if p.family == "moe_ep_dispatch")
    assert dtypes == ["bfloat16", "float8_e4m3fn"]


def test_from_config_ep_errors_name_the_problem():
    from rose_aot.errors import ManifestError
    from rose_aot.manifest.from_config import manifest_from_config

    with pytest.raises(ManifestError, match="--ep"):
        manifest_from_config(CONFIGS / "qwen3-30b-a3b", ep=2, tp=2)
    with pytest.raises(ManifestError, match="--ep 3"):
        manifest_from_config(CONFIGS / "qwen3-30b-a3b", ep=3)
    with pytest.raises(ManifestError, match="--ep"):
        manifest_from_config(CONFIGS / "qwen3-30b-a3b", ep=0)
    # 16 divides the experts but is more ranks than the kernels serve: an error, not a manifest
    # silently without the expert-parallel points
    with pytest.raises(ManifestError, match="--ep 16: .*2-8 ranks"):
        manifest_from_config(CONFIGS / "deepseek-v3", ep=16)


def test_cli_from_config_takes_ep_and_dp():
    from click.testing import CliRunner

    from rose_aot.cli import main

    for flag in ("--ep", "--dp"):
        result = CliRunner().invoke(
            main, ["manifest", "from-config", str(CONFIGS / "qwen3-30b-a3b"), flag, "2"])
        assert result.exit_code == 0, result.output
        assert 'family = "moe_ep_dispatch"' in result.output
        assert "expert parallel 2" in result.output


# --- the distributed module ---------------------------------------------------------------------
def test_ep_module_imports_no_cutlass_and_refuses_multicast_env():
    code = (
        "import os, sys\n"
        "os.environ['NCCL_NVLS_ENABLE'] = '1'\n"
        "os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST'] = '1'\n"
        "from rose_aot.distributed import EpWorkspace, DistributedError\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('cutlass', 'cutlass_dsl')]\n"
        "try:\n"
        "    EpWorkspace(num_experts=16, top_k=4, hidden=512, max_tokens=8)\n"
        "except DistributedError as e:\n"
        "    assert 'NCCL_NVLS_ENABLE=0' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no error with NCCL_NVLS_ENABLE=1')\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_expert_parallel_moe_refuses_bad_requests_with_its_own_error(tiny_build):
    # Wrong sizes, no process group, no GPU: DistributedError before any device or group call
    # (a one-process gloo group on the CPU machine stands in for torchrun).
    code = (
        "import os, sys\n"
        "os.environ['NCCL_NVLS_ENABLE'] = '0'\n"
        "os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST'] = '1'\n"
        "import torch.distributed as dist\n"
        "from rose_aot.distributed import ExpertParallelMoe, DistributedError\n"
        "from rose_aot import open_bundle\n"
        "bundle = open_bundle(sys.argv[1])\n"
        "good = dict(num_experts=16, top_k=4, hidden=512, max_tokens=8)\n"
        "def refused(kw, text):\n"
        "    try:\n"
        "        ExpertParallelMoe(bundle, **{**good, **kw})\n"
        "    except DistributedError as e:\n"
        "        assert text in str(e), (kw, str(e))\n"
        "    else:\n"
        "        raise SystemExit(f'accepted {kw}')\n"
        "refused({}, 'not initialised')\n"
        "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, world_size=1)\n"
        "refused({'max_tokens': 'x'}, \"max_tokens='x'\")\n"
        "refused({'top_k': 0, 'hidden': True}, 'top_k=0, hidden=True')\n"
        "refused({}, 'CUDA device')\n"
        "dist.destroy_process_group()\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(tiny_build.path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_ep_scripts_parse_and_the_launcher_runs_them():
    root = Path(__file__).resolve().parent.parent
    for rel in ("tests/multigpu/check_ep.py", "benchmarks/bench_ep.py"):
        text = (root / rel).read_text()
        compile(text, rel, "exec")
        assert "multimem" not in text and "cuMulticast" not in text
    launcher = (root / "tests/multigpu/run.sh").read_text()
    assert "check_ep.py" in launcher and "bench_ep.py" in launcher


def _load_check_ep():
    import importlib.util

    root = Path(__file__).resolve().parent / "multigpu"
    sys.path.insert(0, str(root))
    try:
        spec = importlib.util.spec_from_file_location("rose_check_ep", root / "check_ep.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(root))
    return module


@pytest.mark.parametrize("align", [1, 16])
def test_check_ep_accepts_the_modelled_layout_and_names_a_misplaced_row(align):
    """The two-GPU script's dispatch check (run on CPU tensors here) accepts outputs built
    from the Python model above and reports a swapped row: the check itself is tested before
    it runs unattended on the GPU machine."""
    from types import SimpleNamespace

    check_ep = _load_check_ep()
    c = dispatch(expert_alignment=align)
    W, E, H = 2, 16, 512
    gen = torch.Generator().manual_seed(7)
    counts = [6, 3]
    all_ids = [torch.randint(0, E, (n, 4), generator=gen, dtype=torch.int32) for n in counts]
    all_ids[0][2, 1] = -1
    all_x = [torch.randn(n, H, generator=gen).to(torch.bfloat16) for n in counts]
    results, sends = _simulate(c, all_ids)
    cap = protocol.slots_for(max(counts), 4)
    for r in range(W):
        rows, off, recv_pos = results[r]
        out = torch.zeros(D.max_rows(c, cap), H, dtype=torch.bfloat16)
        for row, (s, t, k) in rows.items():
            out[row] = all_x[s][t]
        pos = torch.zeros(W * cap, dtype=torch.int32)
        for (s, slot), row in recv_pos.items():
            pos[s * cap + slot] = row
        ws = SimpleNamespace(slots=cap, recv_pos=pos)
        bufs = SimpleNamespace(out=out, expert_offsets=torch.tensor(off, dtype=torch.int32),
                               out_scales=None)
        slots = [sd.int() for sd in sends]
        problems = check_ep.check_dispatch(c, ws, bufs, counts, all_x, all_ids, None, slots, r)
        assert problems == [], problems
        if len(rows) >= 2:
            a, b = sorted(rows)[:2]
            if not torch.equal(out[a], out[b]):
                swapped = out.clone()
                swapped[[a, b]] = out[[b, a]]
                bufs.out = swapped
                problems = check_ep.check_dispatch(c, ws, bufs, counts, all_x, all_ids, None,
                                                   slots, r)
                assert problems and "differ bitwise" in problems[0], problems
