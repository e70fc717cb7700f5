"""The serving-side loader on a CPU machine: no cutlass behind it, lookups with helpful misses,
argument checks that quote the numbers, the bundle-vs-spec consistency check, and the exact
bytes of packed kernel parameters.

Uses the shipped manifests' bundle built once per session (tests/fixtures_build.py).
"""

from __future__ import annotations

import ctypes
import json
import struct
import subprocess
import sys
import textwrap

import pytest
import torch

from rose_aot.bundle import BundleReader, write_bundle
from rose_aot.errors import (
    ArgumentError,
    BundleError,
    ConfigError,
    KernelNotFoundError,
    RoseAotError,
)
from rose_aot.kernels.record import ParamRecord
from rose_aot.kernels.spec import Dim, TensorArg, param_size
from rose_aot.loader import KernelBundle, open_bundle
from rose_aot.loader.args import ArgBinder, ParamPacker
from loader_samples import shipped_samples

QK = dict(num_q_heads=32, num_k_heads=4, head_dim=128, eps=1e-6)  # Qwen3-30B-A3B's q/k norm
TOKENS = 5
# A qk_norm call of QK launched without programmatic dependent launch (its prefill block past
# 65536 threads: 200 x 36 heads in blocks of 8), so it takes the plain launch api
PLAIN_TOKENS = 200
BF16 = torch.bfloat16
# Top-level modules of the DSL distribution. The wheel's .pth file imports the empty namespace
# package nvidia_cutlass_dsl into EVERY interpreter of this venv at startup (to extend sys.path),
# so the check is on what rose_aot adds, plus "cutlass" itself never being loaded.
DSL_ROOTS = ("cutlass", "cutlass_dsl", "nvidia_cutlass_dsl")


@pytest.fixture(scope="module")
def bundle(shipped_build):
    return open_bundle(shipped_build.path)


@pytest.fixture(scope="module")
def qk(bundle):
    return bundle.kernel("qk_norm", **QK)


# ------------------------------------------------------------------------------ (a) no cutlass

_PROBE = textwrap.dedent(
    """
    import json, sys
    baseline = set(sys.modules)
    ROOTS = {roots!r}

    def dsl_modules():
        return sorted(m for m in sys.modules if m.split(".")[0] in ROOTS)

    {body}
    print(json.dumps({{
        "new_dsl": [m for m in dsl_modules() if m not in baseline],
        "all_dsl": dsl_modules(),
        "cuda_bindings": sorted(m for m in sys.modules if m == "cuda" or m.startswith("cuda.")),
        "result": result,
    }}))
    """
)


def _probe(body: str) -> dict:
    code = _PROBE.format(roots=DSL_ROOTS, body=textwrap.dedent(body))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _assert_no_dsl(report: dict):
    assert report["new_dsl"] == [], f"rose_aot imported the DSL: {report['new_dsl']}"
    # Whatever the site hook preloads, the compiler package itself is never there.
    assert not [m for m in report["all_dsl"] if m.split(".")[0] in ("cutlass", "cutlass_dsl")]
    assert [m for m in report["all_dsl"] if m.startswith("nvidia_cutlass_dsl.")] == []


def test_import_rose_aot_loads_no_dsl_and_no_driver_bindings():
    report = _probe(
        """
        import rose_aot
        result = sorted(rose_aot.__all__)
        """
    )
    _assert_no_dsl(report)
    assert "open_bundle" in report["result"]
    # driver.py promises cuda.bindings is imported on first use, not at import.
    assert report["cuda_bindings"] == []


def test_serving_path_on_cpu_loads_no_dsl(shipped_build):
    report = _probe(
        f"""
        import rose_aot, rose_aot.loader
        from rose_aot.loader.args import ParamPacker

        bundle = rose_aot.loader.open_bundle({str(shipped_build.path)!r})
        handle = bundle.kernel("qk_norm", num_q_heads=32, num_k_heads=4, head_dim=128, eps=1e-6)
        # What a launch on an H200 uses: the bundle's record, planned for 132 SMs.
        record = bundle.record(handle.key, "sm_90a")
        plan = handle.family.plan(handle.config, record.by_name, {{"tokens": 7}}, 132)
        positions = {{a.name: i for i, a in enumerate((*record.args, *record.workspace))}}
        packer = ParamPacker(positions, record.variant(plan[0].variant).params)
        # q: ptr, tokens, stride; k: ptr, tokens, stride; q_weight: ptr; k_weight: ptr
        packer.pack([0x1000, 7, 4096, 0x2000, 7, 512, 0x3000, 0x4000])
        result = {{
            "key": handle.key,
            "points": len(bundle.points()),
            "plan": [[l.variant, list(l.grid), list(record.variant(l.variant).block)]
                     for l in plan],
            "packed": bytes(packer.buffer.raw).hex(),
        }}
        """
    )
    _assert_no_dsl(report)
    result = report["result"]
    assert result["key"].startswith("qk_norm(num_q_heads=32,num_k_heads=4,head_dim=128,")
    assert result["points"] >= 1 and len(result["plan"]) == 1
    packed = bytes.fromhex(result["packed"])
    assert struct.unpack_from("<Qi4xq", packed, 0) == (0x1000, 7, 4096)
    assert struct.unpack_from("<Qi4xq", packed, 24) == (0x2000, 7, 512)
    assert struct.unpack_from("<QQ", packed, 48) == (0x3000, 0x4000)


# ------------------------------------------------------------------------------ (b) lookups


def test_missing_point_lists_nearest_points_and_the_differing_field(bundle):
    with pytest.raises(KernelNotFoundError) as info:
        bundle.kernel("qk_norm", **{**QK, "head_dim": 64})
    err = info.value
    msg = str(err)
    assert isinstance(err, RoseAotError) and isinstance(err, KeyError)
    assert "head_dim=64" in err.requested and "head_dim=64" in msg
    have = bundle.kernel("qk_norm", **QK).key  # the bundle's point that differs only in head_dim
    assert err.nearest and err.nearest[0].startswith(have)
    assert "differs: head_dim=128" in err.nearest[0]
    assert have in msg and "add the point to a manifest" in msg
    # Only this family's points are offered.
    assert all(n.startswith("qk_norm(") for n in err.nearest)


def test_missing_rms_norm_point_names_the_nearest_hidden(bundle):
    with pytest.raises(KernelNotFoundError) as info:
        bundle.kernel("rms_norm", hidden=4096, eps=1e-6, weight_offset=0.5)
    nearest = info.value.nearest
    assert nearest and "differs: weight_offset=0.0" in nearest[0] and "hidden=4096" in nearest[0]
    assert all(n.startswith("rms_norm(") for n in nearest)


@pytest.mark.parametrize(
    "family,values,field",
    [
        ("softmax", {"dim": 8}, "family"),
        ("qk_norm", {**QK, "heads": 3}, "heads"),
        ("qk_norm", {**QK, "head_dim": 96}, "head_dim"),
        ("rms_norm", {"hidden": 4096, "dtype": "bf16"}, "dtype"),
    ],
)
def test_unknown_family_or_field_is_a_config_error(bundle, family, values, field):
    with pytest.raises(ConfigError) as info:
        bundle.kernel(family, **values)
    assert info.value.field == field and field in str(info.value)


# ------------------------------------------------------------------------------ (c) argument checks


def _qk_tensors(tokens: int = TOKENS, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, 32, 128, generator=gen).to(BF16)
    k = torch.randn(tokens, 4, 128, generator=gen).to(BF16)
    qw = torch.randn(128, generator=gen).to(BF16)
    kw = torch.randn(128, generator=gen).to(BF16)
    return [q, k, qw, kw]


def _q_transposed():
    return torch.zeros(TOKENS, 128, 32, dtype=BF16).transpose(1, 2)  # strides (4096, 1, 32)


def _q_odd_row_stride():
    return torch.zeros(TOKENS, 32 * 128 + 4, dtype=BF16)[:, : 32 * 128].view(TOKENS, 32, 128)


def _q_misaligned():
    flat = torch.zeros(TOKENS * 32 * 128 + 8, dtype=BF16)
    assert flat.data_ptr() % 16 == 0
    return flat[1 : 1 + TOKENS * 32 * 128].view(TOKENS, 32, 128)


# (argument index, replacement factory, fragments the message must contain). The first
# argument is the subject: it is checked before any other argument can fail on being on the CPU.
# A fragment given as a dict is arch-dependent: CPU tensors name no device, so the handle checks
# them against one of the bundle's archs (sm_90a: 128-bit accesses, 16-byte pointers and row
# strides in multiples of 8 bf16; sm_100a: 256-bit, 32 bytes and 16), and the message must
# agree with exactly one arch throughout.
_ROW_RULES = {"sm_90a": (8, 16), "sm_100a": (16, 32)}  # (stride elements, pointer bytes)
BAD_ARGS = [
    pytest.param(0, lambda: torch.zeros(TOKENS, 32, 128, dtype=torch.float16),
                 ["'q'", "dtype bfloat16", "torch.float16"], id="dtype"),
    pytest.param(0, lambda: torch.zeros(TOKENS, 32 * 128, dtype=BF16),
                 ["'q'", "3 dimensions", "[tokens, 32, 128]", f"({TOKENS}, 4096)"], id="rank"),
    pytest.param(0, lambda: torch.zeros(TOKENS, 16, 128, dtype=BF16),
                 ["'q'", "[tokens, 32, 128]", f"({TOKENS}, 16, 128)"], id="static-extent"),
    pytest.param(0, _q_transposed,
                 ["'q'", "strides (*, 128, 1)", "(4096, 1, 32)"], id="head-dim-not-contiguous"),
    pytest.param(0, _q_odd_row_stride,
                 ["'q'", "stride 4100",
                  {a: f"multiple of {e} elements" for a, (e, _) in _ROW_RULES.items()}],
                 id="row-stride-not-mult-of-8"),
    pytest.param(0, _q_misaligned,
                 ["'q'",
                  {a: f"not {b}-byte aligned; slice at a multiple of {e} elements"
                   for a, (e, b) in _ROW_RULES.items()}],
                 id="misaligned-pointer"),
    pytest.param(0, lambda: [[0.0] * 128] * 32, ["'q'", "torch.Tensor", "list"], id="not-a-tensor"),
]
# Problems in later arguments, found while the earlier (correct) arguments are CPU tensors.
BAD_LATER_ARGS = [
    (1, lambda: torch.zeros(TOKENS, 8, 128, dtype=BF16),
     ["'k'", "[tokens, 4, 128]", f"({TOKENS}, 8, 128)"]),
    (1, lambda: torch.zeros(TOKENS + 1, 4, 128, dtype=BF16),
     ["'k'", f"is {TOKENS + 1}", f"'tokens' = {TOKENS}"]),
    (1, lambda: torch.zeros(TOKENS, 4, 128, dtype=torch.float32),
     ["'k'", "dtype bfloat16", "torch.float32"]),
    (3, lambda: torch.zeros(64, dtype=BF16), ["'k_weight'", "[128]", "(64,)"]),
]


@pytest.mark.parametrize("entry", ["plan", "call"])
@pytest.mark.parametrize("index,make,fragments", BAD_ARGS)
def test_bad_argument_is_an_argument_error_quoting_the_numbers(qk, entry, index, make, fragments):
    tensors = _qk_tensors()
    tensors[index] = make()
    call = qk.plan if entry == "plan" else qk
    with pytest.raises(ArgumentError) as info:
        call(*tensors)
    msg = str(info.value)
    assert qk.key in msg  # names the kernel
    for fragment in fragments:
        if isinstance(fragment, dict):
            matching = [arch for arch, text in fragment.items() if text in msg]
            assert len(matching) == 1, f"none or several of {fragment} in: {msg}"
        else:
            assert fragment in msg, f"{fragment!r} not in: {msg}"


def test_every_argument_is_checked_before_the_cpu_device_is_refused(qk):
    """ArgBinder.bind says the device is "checked last so that every other check also runs on CPU
    tensors", but it is checked at the end of EACH argument: a correct CPU `q` hides every
    problem of k, q_weight and k_weight (token mismatches included) behind "must be on a CUDA
    device". Fails until the device check moves after the loop over all arguments."""
    wrong = []
    for index, make, fragments in BAD_LATER_ARGS:
        tensors = _qk_tensors()
        tensors[index] = make()
        for call in (qk.plan, qk):
            with pytest.raises(ArgumentError) as info:
                call(*tensors)
            missing = [f for f in fragments if f not in str(info.value)]
            if missing:
                wrong.append(f"arg {index}: {missing} not in {str(info.value)!r}")
    assert not wrong, "\n".join(wrong)


def test_misaligned_pointer_message_quotes_the_address(qk):
    tensors = _qk_tensors()
    tensors[0] = _q_misaligned()
    with pytest.raises(ArgumentError) as info:
        qk.plan(*tensors)
    assert f"0x{tensors[0].data_ptr():x}" in str(info.value)


@pytest.mark.parametrize("entry", ["plan", "call"])
def test_wrong_argument_count(qk, entry):
    call = qk.plan if entry == "plan" else qk
    with pytest.raises(ArgumentError, match=r"takes 4 arguments, got 3"):
        call(*_qk_tensors()[:3])


@pytest.mark.parametrize("entry", ["plan", "call"])
@pytest.mark.parametrize("tokens", [1, TOKENS, 0])
def test_correct_cpu_tensors_must_be_on_a_cuda_device(qk, entry, tokens):
    call = qk.plan if entry == "plan" else qk
    with pytest.raises(ArgumentError) as info:
        call(*_qk_tensors(tokens))
    msg = str(info.value)
    assert "'q'" in msg and "must be on a CUDA device" in msg and "cpu" in msg


def test_single_token_row_stride_is_not_checked(qk):
    # With one token the row stride is never applied: an odd one is accepted (up to the device).
    q = torch.zeros(32 * 128 + 4, dtype=BF16).as_strided((1, 32, 128), (4100, 128, 1))
    with pytest.raises(ArgumentError, match="must be on a CUDA device"):
        qk.plan(q, *_qk_tensors(1)[1:])


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_binder_of_each_arch_checks_that_arch_access_rules(bundle, qk, arch):
    """Each arch's record carries its own argument spec: a row stride of 4104 bf16 (a multiple of
    8 elements but not of 16) passes sm_90a's checks and fails sm_100a's 256-bit ones."""
    binder = ArgBinder(qk.key, bundle.record(qk.key, arch).args)
    q = torch.zeros(TOKENS, 32 * 128 + 8, dtype=BF16)[:, : 32 * 128].view(TOKENS, 32, 128)
    with pytest.raises(ArgumentError) as info:
        binder.bind((q, *_qk_tensors()[1:]))
    if arch == "sm_90a":
        assert "must be on a CUDA device" in str(info.value)
    else:
        assert "stride 4104" in str(info.value) and "multiple of 16 elements" in str(info.value)
    # A pointer 16 bytes past a 32-byte boundary: fine for 128-bit accesses only.
    flat = torch.zeros(TOKENS * 32 * 128 + 32, dtype=BF16)
    offset = (-flat.data_ptr() % 32) // 2 + 8  # elements to a 16-mod-32 address
    q = flat[offset : offset + TOKENS * 32 * 128].view(TOKENS, 32, 128)
    assert q.data_ptr() % 32 == 16
    with pytest.raises(ArgumentError) as info:
        binder.bind((q, *_qk_tensors()[1:]))
    if arch == "sm_90a":
        assert "must be on a CUDA device" in str(info.value)
    else:
        assert "not 32-byte aligned" in str(info.value)


def test_fast_bind_returns_none_for_cpu_tensors(bundle, qk):
    binder = ArgBinder(qk.key, bundle.record(qk.key, "sm_90a").args)
    assert binder.fast_bind(tuple(_qk_tensors())) is None
    assert binder.fast_bind(tuple(_qk_tensors()[:3])) is None  # wrong count: None, no exception
    with pytest.raises(ArgumentError, match="must be on a CUDA device"):
        binder.bind(tuple(_qk_tensors()))


# ------------------------------------------------------------------------------ bundle vs spec


def _rewrite(path, out, change):
    reader = BundleReader.open(path)
    index = json.loads(json.dumps(reader.index))
    blobs = {name: reader.blob(name) for name in reader.blob_names()}
    change(index, blobs)
    write_bundle(out, index, blobs)
    return out


def _point(index):
    """The first rms_norm point record (its first parameter has several fields)."""
    return next(p for p in index["points"] if p["family"] == "rms_norm")


def _first_variant(index):
    return _point(index)["variants"][0]


def _variant_of(index, family, name, beside):
    """Variant `name` of the first `family` point that also has a variant `beside`."""
    for point in index["points"]:
        names = {v["name"] for v in point["variants"]}
        if point["family"] == family and {name, beside} <= names:
            return next(v for v in point["variants"] if v["name"] == name)
    raise AssertionError(f"no {family} point with {name} and {beside}")


def _swap_cubins(index):
    a, b = _point(index)["variants"][:2]
    a["cubin"], b["cubin"] = b["cubin"], a["cubin"]


TAMPER = [
    pytest.param(lambda i, b: _first_variant(i).update(block=[64, 1, 1]), "block", id="block"),
    # The packing check at open sees a wrong size before the cubin's first load would.
    pytest.param(lambda i, b: _point(i)["params"][0].update(
        size=_point(i)["params"][0]["size"] + 8), "is not the packing", id="param-sizes"),
    pytest.param(lambda i, b: _first_variant(i)["params"].pop(), "parameter sizes",
                 id="param-missing"),
    pytest.param(lambda i, b: _first_variant(i).update(
        entries=[e + "_x" for e in _first_variant(i)["entries"]]), "no kernel entry",
                 id="entry-name"),
    pytest.param(lambda i, b: _first_variant(i).update(cubin_sha256="0" * 64), "sha256 differs",
                 id="cubin-sha256"),
    pytest.param(lambda i, b: _first_variant(i).update(ptx_sha256="0" * 64), "sha256 differs",
                 id="ptx-sha256"),
    pytest.param(lambda i, b: _swap_cubins(i), "sha256 differs", id="cubins-swapped"),
    pytest.param(lambda i, b: _first_variant(i).update(record_version=1), "record version",
                 id="record-version"),
    pytest.param(lambda i, b: _first_variant(i)["constants"].pop("rows_per_block"),
                 "does not understand the record", id="constant-missing"),
    # read only where split_block_late's twin launches beyond its PDL limit (131 tokens of the
    # sample sizes)
    pytest.param(lambda i, b: _variant_of(i, "moe_combine", "split_block_late", "split_block")[
        "constants"].pop("late_beyond_top_k"), "does not understand the record",
                 id="late-constant-missing"),
    pytest.param(lambda i, b: _point(i)["config"].update(eps=0.5), "does not match",
                 id="key-vs-config"),
    pytest.param(lambda i, b: _point(i).update(family="softmax"), "not understood",
                 id="unknown-family"),
    pytest.param(lambda i, b: b.pop(_first_variant(i)["cubin"]), "missing", id="missing-cubin"),
    pytest.param(lambda i, b: _point(i).update(variants=_point(i)["variants"][1:]),
                 "does not understand the record", id="missing-variant"),
    # The old loader compared the recorded variants with this rose-aot's spec; the record is
    # now authoritative, so the equivalents are: every variant a plan can launch (forced ones
    # too) is in the record, and every parameter is the packing of the record's own argument.
    pytest.param(lambda i, b: _point(i).update(variants=_point(i)["variants"][:1]),
                 "prefill", id="missing-forced-variant"),
    pytest.param(lambda i, b: _point(i)["params"][0]["fields"][1].__setitem__(1, "q"),
                 "param", id="param-layout"),
    pytest.param(lambda i, b: i.update(kind="something else"), "not a rose-aot kernel bundle",
                 id="kind"),
]


@pytest.mark.parametrize("change,fragment", TAMPER)
def test_bundle_whose_launch_facts_disagree_with_the_spec_is_refused(
    shipped_build, tmp_path, change, fragment
):
    path = _rewrite(shipped_build.path, tmp_path / "tampered.rosebundle", change)
    # open_bundle checks the records; the cubins, at their first load (check_artifacts is the
    # CPU side of every load, what preload verifies before the driver sees a byte).
    with pytest.raises(BundleError) as info:
        open_bundle(path).check_artifacts()
    assert fragment in str(info.value) and str(path) in str(info.value)
    with pytest.raises(BundleError) as eager:  # rose-aot verify's way: everything at once
        KernelBundle(BundleReader.open(path))
    assert str(eager.value) == str(info.value)


def test_a_plan_branch_the_record_check_does_not_reach_is_refused_as_the_check_would(
        shipped_build, tmp_path):
    """The record check runs each plan at its family's sample sizes only. moe_combine's decode
    (132-528 tokens of top-8 at hidden 4096 on 132 SMs) is past them: a crafted record whose
    decode lacks a constant the plan reads there opens, and a call of that size raises the
    record check's BundleError, not a KeyError."""
    def change(index, blobs):
        for point in index["points"]:
            if point["family"] == "moe_combine" and point["config"]["top_k"] == 8 \
                    and point["config"]["hidden"] == 4096 and point["arch"] == "sm_90a":
                decode = next(v for v in point["variants"] if v["name"] == "decode")
                del decode["constants"]["rows_per_block"]

    path = _rewrite(shipped_build.path, tmp_path / "tampered.rosebundle", change)
    bundle = open_bundle(path)
    bundle.check_records("sm_90a")  # the sample sizes do not reach decode
    handle = bundle.kernel("moe_combine", top_k=8, hidden=4096)
    record = bundle.record(handle.key, "sm_90a")
    assert handle._plan(record, {"tokens": 7}, 132, None)[0].variant == "split"
    with pytest.raises(BundleError, match="launch plan does not understand the record") as info:
        handle._plan(record, {"tokens": 200}, 132, None)
    assert str(path) in str(info.value) and "rows_per_block" in str(info.value)


def _break_top8_split_wide(index, blobs):
    """A record only a forced plan misreads: moe_combine's top-8 points without split_wide's
    `chunks`, which their plan reads only when split_wide is forced (it picks that variant for
    top-2/4 only: tests/test_variants_planned.py)."""
    for point in index["points"]:
        if point["family"] == "moe_combine" and point["config"]["top_k"] == 8:
            wide = next(v for v in point["variants"] if v["name"] == "split_wide")
            del wide["constants"]["chunks"]


def test_forced_plans_are_checked_at_their_first_use_and_by_verify(shipped_build, tmp_path):
    """A serving process launches only its plans' own choices: opening, check_records and the
    artifacts' verification (preload's CPU side) check those, and a point's forced plans
    (tests, benchmarks) wait for its first forced launch: check_forced_plans, the same
    BundleError. `rose-aot verify` (KernelBundle(reader)) checks them all at once."""
    path = _rewrite(shipped_build.path, tmp_path / "forced-misread.rosebundle",
                    _break_top8_split_wide)
    bundle = open_bundle(path)
    assert bundle.check_artifacts() > 0  # a serving start of every arch
    keys = sorted({p["key"] for p in bundle.index["points"]
                   if p["family"] == "moe_combine" and p["config"]["top_k"] == 8})
    assert keys, "the shipped manifests have no top-8 moe_combine point"
    other = next(k for k in bundle.points("sm_90a") if not k.startswith("moe_combine"))
    bundle.check_forced_plans(other, "sm_90a")  # the other points' forced plans pass
    for attempt in range(2):  # a failed point stays unchecked: raised again
        with pytest.raises(BundleError) as info:
            bundle.check_forced_plans(keys[0], "sm_90a")
        message = str(info.value)
        assert "'chunks'" in message and "rebuild" in message and keys[0] in message
    with pytest.raises(BundleError, match="chunks"):
        bundle.check_forced_plans()
    with pytest.raises(BundleError, match="chunks"):  # rose-aot verify's way
        KernelBundle(BundleReader.open(path))
    open_bundle(shipped_build.path).check_forced_plans()  # every forced plan of the shipped
    for key, arch in (("nope", "sm_90a"), (["list"], None), (keys[0], "sm_90")):
        with pytest.raises(ArgumentError, match="no point|no arch"):
            bundle.check_forced_plans(key, arch)


def test_malformed_index_record_is_a_bundle_error(shipped_build, tmp_path):
    """Every problem of a bundle is a BundleError (errors.py). A sha-verified container whose
    index records lack a field, or whose variant has no entries / no recorded parameter sizes,
    must be refused with a BundleError (at open, or for what only the cubin can tell at its
    first load, which check_artifacts runs), not a bare KeyError (which callers would confuse
    with KernelNotFoundError, a KeyError too) and not accepted with the ABI check skipped.
    Fails until KernelBundle._check_point turns malformed records into BundleError."""
    cases = {
        "point without key": lambda i, b: _point(i).pop("key"),
        "point without variants": lambda i, b: _point(i).pop("variants"),
        "variant without name": lambda i, b: _first_variant(i).pop("name"),
        "variant without cubin": lambda i, b: _first_variant(i).pop("cubin"),
        "variant without entries": lambda i, b: _first_variant(i).pop("entries"),
        "variant with no entries": lambda i, b: _first_variant(i).update(entries=[], params=[]),
        "variant with no params": lambda i, b: _first_variant(i).update(params=[]),
        "variant without record_version": lambda i, b: _first_variant(i).pop("record_version"),
        "variant with a block of two dims": lambda i, b: _first_variant(i).update(block=[64, 1]),
        "variant with a string smem": lambda i, b: _first_variant(i).update(smem="0"),
        "param without fields": lambda i, b: _point(i)["params"][0].pop("fields"),
        "point without params": lambda i, b: _point(i).pop("params"),
        "variant naming no parameter of its point": lambda i, b: _first_variant(i)[
            "params"].__setitem__(0, "nope"),
        "variant naming a parameter by a number": lambda i, b: _first_variant(i)[
            "params"].__setitem__(0, 0),
        "parameter named twice": lambda i, b: _point(i)["params"].append(_point(i)["params"][0]),
        "resources not one per entry": lambda i, b: _first_variant(i)["resources"].append({}),
        "point without args": lambda i, b: _point(i).pop("args"),
        "point without workspace": lambda i, b: _point(i).pop("workspace"),
        "arg with an unknown dtype": lambda i, b: _point(i)["args"][0].update(dtype="bfloat17"),
        "workspace that is not a workspace": lambda i, b: _point(i)["workspace"].append(
            _point(i)["args"][0]
        ),
    }
    wrong = []
    for n, (what, change) in enumerate(cases.items()):
        path = _rewrite(shipped_build.path, tmp_path / f"malformed{n}.rosebundle", change)
        try:
            open_bundle(path).check_artifacts()
        except BundleError:
            continue
        except Exception as exc:  # noqa: BLE001 - the point is which type escapes
            wrong.append(f"{what}: {type(exc).__name__}: {exc}")
        else:
            wrong.append(f"{what}: opened without error")
    assert not wrong, "\n".join(wrong)


def test_untampered_rewrite_opens(shipped_build, tmp_path):
    # The control for the tampering tests: the rewrite itself changes nothing that matters.
    path = _rewrite(shipped_build.path, tmp_path / "same.rosebundle", lambda i, b: None)
    assert open_bundle(path).points() == open_bundle(shipped_build.path).points()


# ------------------------------------------------------------------------------ (d) ParamPacker

_T = Dim("tokens")
_H = Dim("hidden")
HAND_ARGS = (
    # {ptr, i32 tokens, i32 hidden, i64 stride} = 24 bytes
    TensorArg("x", "bfloat16", (_T, _H), (Dim("x_stride", 64, 8), 1)),
    # fully static: {ptr} = 8 bytes
    TensorArg("w", "float32", (256,), (1,)),
    # {ptr, i32 tokens} + 4 bytes tail padding = 16 bytes
    TensorArg("lens", "int32", (_T,), (1,)),
    # {ptr, i32 tokens, pad, i64 stride} = 24 bytes
    TensorArg("y", "bfloat16", (_T, 64), (Dim("y_stride", 64, 8), 1), role="output"),
)
HAND_POSITIONS = {a.name: i for i, a in enumerate(HAND_ARGS)}
HAND_PARAMS = {a.name: ParamRecord.of(a) for a in HAND_ARGS}


def _hand_packer(names) -> ParamPacker:
    """The packer of a kernel taking the hand-made arguments `names`, in that order."""
    return ParamPacker(HAND_POSITIONS, tuple(HAND_PARAMS[n] for n in names))


def _read_params(packer: ParamPacker) -> tuple[bytes, list[int]]:
    raw = ctypes.string_at(packer.buffer, ctypes.sizeof(packer.buffer))
    base = ctypes.addressof(packer.buffer)
    array = ctypes.cast(packer.address, ctypes.POINTER(ctypes.c_void_p))
    return raw, [array[i] - base for i in range(len(packer.params))]


def test_param_packer_bytes_for_a_hand_made_spec():
    assert [param_size(a) for a in HAND_ARGS] == [24, 8, 16, 24]
    packer = _hand_packer(("x", "w", "lens", "y"))
    assert packer.sizes == [24, 8, 16, 24]
    assert ctypes.sizeof(packer.buffer) == 72
    values = [0x7F00_0000_1000, 33, 4096, 4104, 0x7F00_0000_2000, 0x7F00_0000_3000, 33,
              0x7F00_0000_4000, 33, 64]
    address = packer.pack(values)
    assert address == packer.address == ctypes.addressof(packer.pointers)
    raw, offsets = _read_params(packer)
    assert offsets == [0, 24, 32, 48]
    assert struct.unpack_from("<Qiiq", raw, 0) == (0x7F00_0000_1000, 33, 4096, 4104)
    assert struct.unpack_from("<Q", raw, 24) == (0x7F00_0000_2000,)
    assert struct.unpack_from("<Qi", raw, 32) == (0x7F00_0000_3000, 33)
    assert struct.unpack_from("<Qi", raw, 48) == (0x7F00_0000_4000, 33)
    assert struct.unpack_from("<q", raw, 64) == (64,)
    # Padding is zero: the tail of "lens" and the hole between y's i32 and i64.
    assert raw[44:48] == b"\0" * 4 and raw[60:64] == b"\0" * 4


def test_param_packer_follows_kernel_order_and_repacks_in_place():
    packer = _hand_packer(("y", "w"))  # a variant may pass a subset, in its own order
    assert packer.sizes == [24, 8]
    packer.pack([0xA000, 3, 128, 0xB000])
    raw, offsets = _read_params(packer)
    assert offsets == [0, 24]
    assert struct.unpack_from("<QiiqQ", raw, 0) == (0xA000, 3, 0, 128, 0xB000)
    buffer_address = ctypes.addressof(packer.buffer)
    packer.pack([0xC000, 9, 256, 0xD000])
    raw, _ = _read_params(packer)
    assert struct.unpack_from("<QiiqQ", raw, 0) == (0xC000, 9, 0, 256, 0xD000)
    assert ctypes.addressof(packer.buffer) == buffer_address  # no reallocation per launch


def test_param_packer_values_come_from_tensors_and_dims():
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, 512, generator=gen).to(BF16)
    w = torch.randn(256, generator=gen)
    lens = torch.arange(3, dtype=torch.int32)
    y = torch.empty(3, 64, dtype=BF16)
    # ArgBinder.bind's form: per argument (in HAND_ARGS order) its data pointer.
    pointers = [t.data_ptr() for t in (x, w, lens, y)]
    dims = {"tokens": 3, "hidden": 512, "x_stride": 512, "y_stride": 64}
    packer = _hand_packer(("x", "w", "lens", "y"))
    values = packer.values(pointers, dims)
    assert values == [
        x.data_ptr(), 3, 512, 512, w.data_ptr(), lens.data_ptr(), 3, y.data_ptr(), 3, 64
    ]
    # the hot path's generated checks + pack write the same bytes
    binder = ArgBinder("hand", HAND_ARGS, allow_cpu=True)
    generated = _packed(packer, packer.compile(binder.atoms, len(HAND_ARGS))(
        binder.fast_bind((x, w, lens, y))[2], ()))
    packer.pack(values)
    raw, _ = _read_params(packer)
    assert raw == generated
    assert struct.unpack_from("<Q", raw, 24)[0] == w.data_ptr()


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_packer_of_a_shipped_point_matches_its_recorded_layout(bundle, qk, arch):
    # The recorded layout in the bundle index (raw JSON) and the packer built from the parsed
    # record, as the handle builds it, agree field by field.
    (point,) = [p for p in bundle.index["points"] if p["key"] == qk.key and p["arch"] == arch]
    record = bundle.record(qk.key, arch)
    positions = {a.name: i for i, a in enumerate((*record.args, *record.workspace))}
    for raw_variant, variant in zip(point["variants"], record.variants):
        assert raw_variant["name"] == variant.name
        packer = ParamPacker(positions, variant.params)
        recorded = {p["name"]: p for p in point["params"]}
        raw_params = [recorded[name] for name in raw_variant["params"]]
        assert packer.sizes == [p["size"] for p in raw_params]
        assert packer.params == tuple(raw_variant["params"])
        layouts = [p["fields"] for p in raw_params]
        n = sum(len(layout) for layout in layouts)
        packer.pack(list(range(1, n + 1)))
        raw, offsets = _read_params(packer)
        value = 1
        for base, layout in zip(offsets, layouts):
            for kind, fmt, offset, _mode, _dim in layout:
                assert struct.unpack_from("<" + fmt, raw, base + offset)[0] == value, (kind, offset)
                value += 1


# ------------------------------------------------------------------ the generated fast path


def _hand_tensors(tokens=5, x_stride=512, y_stride=64):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(tokens, x_stride, generator=gen).to(BF16)[:, :512]
    w = torch.randn(256, generator=gen)
    lens = torch.arange(tokens, dtype=torch.int32)
    y = torch.zeros(tokens, y_stride, dtype=BF16)[:, :64]
    return [x, w, lens, y]


def _packed(packer, address) -> bytes:
    assert address == packer.address
    return ctypes.string_at(packer.buffer, ctypes.sizeof(packer.buffer))


@pytest.mark.parametrize("x_stride, y_stride", [(512, 64), (520, 72), (1024, 128)])
def test_generated_fast_path_packs_what_the_checked_path_packs(x_stride, y_stride):
    # The generated checks + generated pack and the full checks + generic pack write the same
    # parameter bytes, for every kernel parameter order a variant may use.
    binder = ArgBinder("hand", HAND_ARGS, [(0, 0), (0, 1)], allow_cpu=True)
    values = _hand_tensors(x_stride=x_stride, y_stride=y_stride)
    device, sizes, atoms = binder.fast_bind(tuple(values))
    assert device == -1 and sizes == (5, 512)
    dims, pointers, _ = binder.bind(tuple(values), meta=True)
    pointers = [t.data_ptr() for t in values]
    for names in (("x", "w", "lens", "y"), ("y", "w"), ("lens",), ("w", "x")):
        packer = _hand_packer(names)
        pack = packer.compile(binder.atoms, len(HAND_ARGS))
        fast = _packed(packer, pack(atoms, ()))
        slow = _packed(packer, packer.pack(packer.values(pointers, dims)))
        assert fast == slow
        assert struct.unpack_from("<Q", fast, 0)[0] == values[HAND_POSITIONS[names[0]]].data_ptr()


def _hand_mutations():
    """(what, arguments) pairs the generated checks must refuse (the full checks then decide)."""
    ok = _hand_tensors()
    x, w, lens, y = ok
    yield "argument count", ok[:3]
    yield "dtype", [x.float(), w, lens, y]
    yield "static extent", [x, w[:128], lens, y]
    yield "dynamic extent of another argument", [x, w, lens[:4], y]
    yield "static extent of a dynamic tensor", [x, w, lens, y[:, :32]]
    yield "rank", [x, w, lens, y[None]]
    yield "stride divisibility", [torch.zeros(5, 515, dtype=BF16)[:, :512], w, lens, y]
    yield "static stride", [x, w, lens, torch.zeros(64, 5, dtype=BF16).t()]
    yield "not contiguous (static)", [x, torch.zeros(512)[::2], lens, y]
    yield "misaligned pointer", [torch.zeros(5 * 512 + 8, dtype=BF16)[1:2561].view(5, 512), w, lens, y]
    yield "not a tensor", [x, w.tolist(), lens, y]


@pytest.mark.parametrize("what, values", list(_hand_mutations()), ids=lambda v: v if isinstance(v, str) else "")
def test_generated_fast_path_refuses_what_the_full_checks_refuse(what, values):
    binder = ArgBinder("hand", HAND_ARGS, [(0, 0)], allow_cpu=True)
    assert binder.fast_bind(tuple(_hand_tensors())) is not None
    assert binder.fast_bind(tuple(values)) is None, what
    with pytest.raises(ArgumentError):
        binder.bind(tuple(values), meta=what != "misaligned pointer")


def test_generated_fast_path_requires_a_cuda_device_unless_told():
    values = tuple(_hand_tensors())
    assert ArgBinder("hand", HAND_ARGS).fast_bind(values) is None  # CPU tensors: full checks
    assert ArgBinder("hand", HAND_ARGS, allow_cpu=True).fast_bind(values) is not None


class _Config:
    """Stands in for a launch config (ctypes or cuda.bindings CUlaunchConfig): the launcher
    writes only its stream."""
    hStream = None


class _StreamObject(tuple):
    """Stands in for cuda.bindings' CUstream of a raw stream."""


def _recording_launcher(names_per_launch, calls, codes=None, apis=None, lock=None):
    """A generated launcher for the hand-made spec whose driver calls are Python callables
    recording (launch index, stream the driver got, parameter bytes at call time), each called
    the way its driver API calls (driver.PreparedLaunch): "ctypes-ex" gets the raw stream
    written into its config, "bindings" gets the stream object and the kernelParams address as
    arguments, "bindings-ex" gets the stream object in its config. It tests the generated code
    only; launches on the GPU are the GPU suite's."""
    import threading

    from rose_aot.loader.runtime import _launcher_factory

    apis = apis or ("ctypes-ex",) * len(names_per_launch)
    binder = ArgBinder("hand", HAND_ARGS, [(0, 0), (0, 1)], allow_cpu=True)
    packers = [_hand_packer(names) for names in names_per_launch]
    make = _launcher_factory("hand", [p.exprs(binder.atom_names, len(HAND_ARGS)) for p in packers],
                             binder.atom_count, False, apis)
    bound = []
    for j, (packer, api) in enumerate(zip(packers, apis)):
        config = _Config() if api != "bindings" else None

        def call(*args, j=j, packer=packer, config=config, api=api):
            if api == "bindings":
                stream, address, extra = args
                assert address == packer.address and extra == 0
            else:
                assert args == ()
                stream = config.hStream
            calls.append((j, stream, _packed(packer, packer.address)))
            code = (codes or {}).get(j, 0)
            return code if api == "ctypes-ex" else (code,)  # cuda.bindings returns a tuple

        bound += [packer.struct.pack_into, packer.buffer, config, call, packer.address]
    failures = []
    streams = {}

    def new_stream(raw):
        streams[raw] = _StreamObject(("stream object", raw))
        return streams[raw]

    def fail(code, j):
        failures.append((code, j))
        if code == 999:
            raise RuntimeError("launch failed")

    lock = lock or threading.Lock()
    go = make(lock.acquire, lock.release, fail, None, streams, new_stream, *bound)
    return binder, packers, go, failures


API_MIXES = [("ctypes-ex", "ctypes-ex"), ("bindings", "bindings"), ("bindings-ex", "ctypes-ex"),
             ("ctypes-ex", "bindings")]


@pytest.mark.parametrize("apis", API_MIXES, ids="+".join)
def test_generated_launcher_packs_every_launch_then_calls_each_on_the_stream(apis):
    calls = []
    names = [("x", "w", "lens", "y"), ("y", "lens")]
    binder, packers, go, failures = _recording_launcher(names, calls, apis=apis)
    values = _hand_tensors(x_stride=520, y_stride=72)
    _, _, atoms = binder.fast_bind(tuple(values))
    go(0xABC, *atoms)
    dims, _, _ = binder.bind(tuple(values), meta=True)
    pointers = [t.data_ptr() for t in values]
    want = []
    for packer in packers:  # the checked path's bytes
        want.append(_packed(packer, packer.pack(packer.values(pointers, dims))))
    stream = {"ctypes-ex": 0xABC, "bindings": ("stream object", 0xABC),
              "bindings-ex": ("stream object", 0xABC)}
    assert calls == [(0, stream[apis[0]], want[0]), (1, stream[apis[1]], want[1])]
    assert failures == []


@pytest.mark.parametrize("api", ["ctypes-ex", "bindings", "bindings-ex"])
def test_generated_launcher_reports_a_failed_launch_and_packs_nothing_out_of_range(api):
    import threading

    calls = []
    lock = threading.Lock()
    binder, packers, go, failures = _recording_launcher([("x",), ("lens",)], calls, codes={1: 700},
                                                        apis=(api, api), lock=lock)
    _, _, atoms = binder.fast_bind(tuple(_hand_tensors()))
    go(7, *atoms)
    assert [c[0] for c in calls] == [0, 1] and failures == [(700, 1)]
    assert not lock.locked()
    # An extent that does not fit its int32 field: struct.error before the first driver call,
    # and the handle's lock released.
    calls.clear()
    too_big = (atoms[0], 2**31, *atoms[2:])
    with pytest.raises(struct.error):
        go(7, *too_big)
    assert calls == [] and not lock.locked()


def test_generated_launcher_releases_the_lock_when_a_launch_error_is_raised():
    import threading

    calls = []
    lock = threading.Lock()
    codes = {0: 999}
    binder, _, go, failures = _recording_launcher([("x",), ("lens",)], calls, codes=codes,
                                                  lock=lock)
    _, _, atoms = binder.fast_bind(tuple(_hand_tensors()))
    with pytest.raises(RuntimeError, match="launch failed"):
        go(7, *atoms)
    assert failures == [(999, 0)] and [c[0] for c in calls] == [0]  # the second never runs
    assert not lock.locked()
    codes.clear()
    go(7, *atoms)  # the next call is not blocked
    assert [c[0] for c in calls] == [0, 0, 1]


def test_generated_launcher_makes_one_stream_object_per_stream():
    calls = []
    binder, _, go, _ = _recording_launcher([("x",)], calls, apis=("bindings",))
    _, _, atoms = binder.fast_bind(tuple(_hand_tensors()))
    go(5, *atoms)
    go(5, *atoms)
    go(6, *atoms)
    assert [c[1] for c in calls] == [("stream object", 5)] * 2 + [("stream object", 6)]
    assert calls[0][1] is calls[1][1]  # the same object: made once, then looked up


def test_generated_fast_launch_runs_the_resolved_launcher_with_the_bound_atoms():
    binder = ArgBinder("hand", HAND_ARGS, [(0, 0), (0, 1)], allow_cpu=True)
    seen = []
    launchers = {}
    fast = binder.compile_fast_launch(launchers, lambda device: ("stream of", device))
    values = tuple(_hand_tensors(tokens=3))
    assert fast(values) is False  # nothing resolved for (device, sizes) yet: the checked path
    launchers[(-1, 3, 512)] = lambda stream, *atoms: seen.append((stream, atoms))
    assert fast(values) is True
    assert seen == [(("stream of", -1), binder.fast_bind(values)[2])]
    assert fast(tuple(_hand_tensors(tokens=4))) is False  # another size: not resolved
    launchers[(-1, 5, 512)] = launchers[(-1, 3, 512)]  # the size _hand_mutations() start from
    assert fast(tuple(_hand_tensors())) is True and len(seen) == 2
    for what, bad in _hand_mutations():  # every refused call launches nothing
        assert fast(tuple(bad)) is False, what
    assert len(seen) == 2


def test_generated_fast_path_takes_parameters_and_refuses_other_tensor_subclasses():
    class Wrapped(torch.Tensor):  # a subclass may override any attribute the checks read
        pass

    binder = ArgBinder("hand", HAND_ARGS, [(0, 0)], allow_cpu=True)
    x, w, lens, y = _hand_tensors()
    assert binder.fast_bind((x, torch.nn.Parameter(w), lens, y)) is not None  # module weights
    assert binder.fast_bind((torch.nn.Parameter(x), w, lens, y)) is not None  # the first, too
    assert binder.fast_bind((x, w.as_subclass(Wrapped), lens, y)) is None
    assert binder.fast_bind((x.as_subclass(Wrapped), w, lens, y)) is None


# -------------------------------------------------- a handle's hot path on CPU (fake driver)


class _FakePrepared:
    """driver.PreparedLaunch without a driver: records each launch as (API, function, grid,
    stream the driver got, parameter bytes at call time), made the way its API makes it."""

    log: list = []

    def __init__(self, function, grid, block, smem, *, pdl=False, cooperative=False,
                 cluster=(1, 1, 1), api=None):
        from rose_aot.loader import driver

        attributed = pdl or cooperative or tuple(cluster) != (1, 1, 1)
        self.api = api or driver.launch_api()["attributed" if attributed else "plain"]
        self.function, self.grid, self.block, self.smem = function, tuple(grid), tuple(block), smem
        self.attributes = (6,) if pdl else ()
        self.config = _Config() if self.api != "bindings" else None

    def _record(self, stream, params):
        raw = ctypes.string_at(ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))[0], 64)
        self.log.append((self.api, self.function, self.grid, stream, raw))

    def bind(self, params):
        if self.api == "bindings":
            def call(stream, address, extra):
                assert address == params and extra == 0
                self._record(stream, params)
                return (0,)
        else:
            def call():
                self._record(self.config.hStream, params)
                return 0 if self.api == "ctypes-ex" else (0,)
        return call

    def __call__(self, stream, params):
        self._record(stream, params)
        return 0


@pytest.fixture
def cpu_device_bundle(shipped_build, monkeypatch):
    """A bundle whose handles run on "device -1" (CPU tensors) through _FakePrepared: the
    record of sm_90a, 132 SMs, fake CUfunctions, raw stream 0x77 (its stream object
    ("stream object", 0x77))."""
    from rose_aot.loader import args as args_module, driver, runtime

    class CpuBinder(args_module.ArgBinder):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs, allow_cpu=True)

    monkeypatch.setattr(runtime, "ArgBinder", CpuBinder)
    monkeypatch.setattr(runtime, "_stream_getter", lambda: (lambda device: 0x77))
    monkeypatch.setattr(driver, "PreparedLaunch", _FakePrepared)
    monkeypatch.setattr(driver, "STREAM_OBJECTS", {})
    monkeypatch.setattr(driver, "stream_object", lambda raw: ("stream object", raw))
    monkeypatch.setattr(driver, "_launch_api", dict(driver._PYTHON_DEFAULT))
    bundle = open_bundle(shipped_build.path)
    bundle._device_arch[-1] = "sm_90a"  # as arch_for_device leaves it, which checks the
    bundle.check_records("sm_90a")  # arch's records first
    bundle._sm_counts[-1] = 132
    for (key, arch), record in bundle._records.items():
        for v in record.variants:
            functions = [0xF000 + 16 * i for i in range(len(v.entries))]
            bundle._device_kernels[(-1, key, arch, v.name)] = functions
    _FakePrepared.log = []
    return bundle


@pytest.mark.parametrize("checks", ["python", "native"])
def test_a_handle_generates_no_code_until_a_device_uses_it(cpu_device_bundle, monkeypatch, checks):
    from rose_aot.loader import args as args_module, driver, runtime

    if checks == "python":  # no C extension: the hot path's checks are generated Python
        monkeypatch.setattr(driver, "native", lambda: None)
    elif driver.native() is None:
        pytest.skip("the C extension rose_aot.loader._native is not built")
    compiled = []

    def counting(source, filename, mode):
        compiled.append(filename)
        return compile(source, filename, mode)

    monkeypatch.setattr(args_module, "compile", counting, raising=False)
    monkeypatch.setattr(runtime, "compile", counting, raising=False)
    handle = cpu_device_bundle.kernel("qk_norm", **QK)
    assert compiled == [] and handle._arch_state == {}
    binder = handle._any_binder  # the checks' text only
    assert compiled == [] and "fast_bind" not in vars(binder)
    assert binder.fast_bind(tuple(_qk_tensors())) is not None  # (this binder allows CPU)
    assert binder.fast_bind(tuple(_qk_tensors())) is not None
    assert [f.split()[1] for f in compiled] == ["fast_bind"]  # compiled once, on first use
    handle._state(-1)  # the first device: its arch's hot path (C checks: nothing generated)
    hot = ["fast_launch"] if checks == "python" else []
    assert [f.split()[1] for f in compiled] == ["fast_bind", *hot]
    handle._resolve(-1, (TOKENS,), None)  # a plan: its launcher (Python: the fake driver's)
    assert [f.split()[1] for f in compiled] == ["fast_bind", *hot, "launcher"]


@pytest.mark.parametrize("api", ["ctypes-ex", "bindings", "bindings-ex"])
def test_repeated_call_runs_the_generated_launcher_with_the_chosen_api(cpu_device_bundle, api):
    """handle(*args) on a resolved size: the generated checks, the launcher, and one driver
    call through `api` with the checked path's parameter bytes, on the current stream."""
    from rose_aot.loader import driver

    driver.set_launch_api(plain=api)
    handle = cpu_device_bundle.kernel("qk_norm", **QK)
    tokens = PLAIN_TOKENS
    q, k, wq, wk = _qk_tensors(tokens)
    args = (q, k, torch.nn.Parameter(wq), wk)
    handle._state(-1)
    ((packer, name, prepared),) = handle._resolve(-1, (tokens,), None)
    assert prepared.api == api and not prepared.attributes
    assert handle(*args) is None
    assert handle._fast_launch(args) is True
    binder = handle._state(-1)[1]
    dims, _, _ = binder.bind(args, meta=True)
    want = _packed(packer, packer.pack(packer.values([t.data_ptr() for t in args], dims)))
    function = cpu_device_bundle._device_kernels[(-1, handle.key, "sm_90a", name)][0]
    stream = 0x77 if api == "ctypes-ex" else ("stream object", 0x77)
    assert _FakePrepared.log == [(api, function, prepared.grid, stream, want[:64])] * 2
    # A size no launcher is resolved for, and refused arguments, launch nothing here.
    assert handle._fast_launch(tuple(_qk_tensors(tokens + 1))) is False
    assert handle._fast_launch((q, k, wq.double(), wk)) is False
    assert len(_FakePrepared.log) == 2


def test_launch_api_choice_is_checked():
    from rose_aot.loader import driver

    before = driver.launch_api()
    with pytest.raises(ArgumentError, match="'cublas' is not one of native, ctypes-ex, bindings"):
        driver.set_launch_api(plain="cublas")
    with pytest.raises(ArgumentError, match="cannot launch with attributes"):
        driver.set_launch_api(attributed="bindings")
    default = "native" if driver.native() else None
    assert driver.launch_api() == before == (
        {"plain": "native", "attributed": "native"} if default
        else {"plain": "bindings", "attributed": "ctypes-ex"})
    # cuLaunchKernel has no place for attributes: refused before the driver is touched.
    with pytest.raises(ArgumentError, match="only the -ex ones take attributes"):
        driver.PreparedLaunch(0x1000, (1, 1, 1), (32, 1, 1), 0, pdl=True, api="bindings")


def test_generated_fast_path_of_every_shipped_point_accepts_its_own_sample(bundle):
    # For each point and arch of the test bundle: tensors laid out exactly as the record says
    # (dynamic extents from the family's sample sizes) pass the generated checks, give the
    # sizes the plan reads, and pack the bytes the checked path packs.
    checked = 0
    for key, arch, record, values in shipped_samples(bundle):
        binder = ArgBinder(key, record.args, allow_cpu=True)
        bound = binder.fast_bind(tuple(values))
        assert bound is not None, (key, arch)
        dims, _, _ = binder.bind(tuple(values), meta=True)
        pointers = [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in values]
        positions = {a.name: i for i, a in enumerate((*record.args, *record.workspace))}
        workspace = tuple(0x1000 * (i + 1) for i in range(len(record.workspace)))
        for variant in record.variants:
            packer = ParamPacker(positions, variant.params)
            pack = packer.compile(binder.atoms, len(record.args))
            fast = _packed(packer, pack(bound[2], workspace))
            slow = _packed(packer, packer.pack(packer.values([*pointers, *workspace], dims)))
            assert fast == slow, (key, arch, variant.name)
        checked += 1
    assert checked >= 10
