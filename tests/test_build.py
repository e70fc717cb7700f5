"""The builder with the real CuTeDSL (no mocks): single points, PTX properties, the parameter ABI of
every shipped point, the shipped bundle (round trip, cache, determinism, corruption) and errors.

Compiles run in this process where a test calls compile_point directly (the DSL import costs
~1 s once), and in spawned workers where it goes through build_bundle. The shipped manifests are
built once per session by the `shipped_build` fixture (tests/fixtures_build.py).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata as md
import json
import pickle
import re
import struct

import pytest
from click.testing import CliRunner

from fixtures_build import BUILD_JOBS, MANIFEST_DIR
from rose_aot.archs import get_arch
from rose_aot.builder.build import ArtifactCache, WorkItem, _compile_task, build_bundle
from rose_aot.bundle import FORMAT_VERSION, HEADER_SIZE, MAGIC, BundleReader
from rose_aot.cli import main as cli
from rose_aot.errors import BuildError, BundleError, RoseAotError
from rose_aot.kernels import get_family, kernel_source_digest
from rose_aot.kernels.qk_norm.family import QkNormConfig
from rose_aot.kernels.record import RECORD_VERSION, PointRecord
from rose_aot.kernels.rms_norm.family import RmsNormConfig
from rose_aot.kernels.spec import param_align, param_fields, param_size
from rose_aot.loader import open_bundle
from rose_aot.manifest import Point, load_manifest, load_manifests

ARCH_NAMES = ("sm_90a", "sm_100a")
SHIPPED = load_manifests([MANIFEST_DIR])  # plain TOML + config validation; no build
SHIPPED_ITEMS = sorted(
    {(p.family, p.key, arch) for m in SHIPPED for p in m.points for arch in m.archs}
)
SHIPPED_CONFIGS = {p.key: p.config for m in SHIPPED for p in m.points}

# ------------------------------------------------------------------------------ PTX reading
# Independent of rose_aot.builder.ptx on purpose: these tests check the builder's own parser too.

_ENTRY = re.compile(r"\.visible\s+\.entry\s+([\w$]+)\s*\(([^)]*)\)\s*([^{]*)\{", re.S)
_PARAM_ARRAY = re.compile(r"^\s*\.param\s+(?:\.align\s+(\d+)\s+)?\.b8\s+[\w$]+\[(\d+)\]\s*$")
_PARAM_SCALAR = re.compile(r"^\s*\.param\s+\.[usbf](8|16|32|64)\s+[\w$]+\s*$")
_GLOBAL_ACCESS = re.compile(r"^\s*(?:@!?%p\d+\s+)?((?:ld|st)\.global[\w.:]*)\s", re.M)


def ptx_entries(ptx: str) -> dict[str, dict]:
    """{entry name: {"params": [bytes...], "directives": text between ')' and '{'}}."""
    entries = {}
    for m in _ENTRY.finditer(ptx):
        decls = [d for d in m.group(2).split(",") if d.strip()]
        sizes = []
        for d in decls:
            if a := _PARAM_ARRAY.match(d):
                sizes.append(int(a.group(2)))
            elif s := _PARAM_SCALAR.match(d):
                sizes.append(int(s.group(1)) // 8)
            else:
                raise AssertionError(f"unparsed PTX parameter {d!r}")
        entries[m.group(1)] = {"params": sizes, "directives": m.group(3)}
    return entries


def reqntid(directives: str) -> tuple[int, int, int] | None:
    m = re.search(r"\.reqntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?", directives)
    return None if m is None else tuple(int(g or 1) for g in m.groups())


def access_bits(op: str) -> int:
    """Bits moved by one ld/st instruction, e.g. ld.global.v4.b32 -> 128."""
    m = re.search(r"(?:\.v(\d))?\.[busf](8|16|32|64|128)$", op)
    assert m, f"cannot size {op}"
    return int(m.group(1) or 1) * int(m.group(2))


# ------------------------------------------------------------------------------ (a) compile_point


@functools.cache
def _compiled(family_name: str, values: tuple, arch: str):
    from rose_aot.builder.compile import compile_point

    config = get_family(family_name).make_config(**dict(values))
    return config, compile_point(family_name, config, arch)


SINGLE_POINTS = [
    ("rms_norm", (("hidden", 4096), ("eps", 1e-5))),
    ("qk_norm", (("num_q_heads", 32), ("num_k_heads", 4), ("head_dim", 128))),
]


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("family_name,values", SINGLE_POINTS, ids=[f for f, _ in SINGLE_POINTS])
def test_compile_point(family_name, values, arch):
    config, compiled = _compiled(family_name, values, arch)
    family = get_family(family_name)
    target = get_arch(arch)
    variants = family.variants(config, target)
    args = {a.name: a for a in family.kernel_args(config, target)}
    record = compiled.record
    assert isinstance(record, PointRecord)
    assert record.args == family.args(config, target)
    assert record.workspace == family.workspace(config, target)
    assert [r.name for r in record.variants] == [v.name for v in variants]
    assert list(compiled.artifacts) == list(compiled.seconds) == [v.name for v in variants]
    # The record survives its JSON form (bundle index, cache entry) unchanged.
    assert PointRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    for r, v in zip(record.variants, variants):
        ptx, cubin = compiled.artifacts[v.name]
        assert re.search(rf"^\.target\s+{arch}\s*$", ptx, re.M), "PTX for another arch"
        assert re.search(r"^\.version\s+\d+\.\d+\s*$", ptx, re.M)
        assert "// Cuda compilation tools, release" in ptx
        assert cubin[:4] == b"\x7fELF" and cubin[4] == 2  # ELF64
        assert struct.unpack_from("<H", cubin, 18)[0] == 190  # e_machine EM_CUDA
        assert r.cubin_sha256 == hashlib.sha256(cubin).hexdigest()
        assert r.ptx_sha256 == hashlib.sha256(ptx.encode()).hexdigest()
        entries = ptx_entries(ptx)
        assert r.entries and set(r.entries) <= set(entries)
        want = [param_size(args[p]) for p in v.params]
        for name in r.entries:
            assert entries[name]["params"] == want, name
            assert reqntid(entries[name]["directives"]) == v.block
        # The record's launch facts are the variant's, its parameters the spec's packing.
        assert (r.block, r.smem, r.cooperative, r.pdl, r.cluster) == (
            v.block, v.smem, v.cooperative, v.pdl, v.cluster
        )
        assert r.constants == v.constants
        assert [p.name for p in r.params] == list(v.params)
        assert [p.size for p in r.params] == want
        assert [p.align for p in r.params] == [param_align(args[n]) for n in v.params]
        assert [p.fields for p in r.params] == [param_fields(args[n]) for n in v.params]
        # Resource usage read from the cubin, per entry.
        assert set(r.resources) == set(r.entries)
        for res in r.resources.values():
            assert res["registers"] > 0 and res["static_smem"] >= 0
            assert res["param_bytes"] >= sum(want)
        r.check_cubin(cubin)  # the cubin's entries, block and parameter sizes agree
        assert compiled.seconds[v.name] > 0


# ------------------------------------------------------------------------------ (b) qk_norm PTX


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_qk_norm_ptx_is_vectorized_shuffled_and_register_only(head_dim, arch):
    values = (
        ("num_q_heads", 32), ("num_k_heads", 8), ("head_dim", head_dim), ("dtype", "bfloat16")
    )
    config, compiled = _compiled("qk_norm", values, arch)
    variants = {v.name: v for v in get_family("qk_norm").variants(config, get_arch(arch))}
    records = compiled.record.by_name
    assert set(variants) == set(records) == set(compiled.artifacts) == {"decode", "prefill",
                                                                        "pdl", "pdl_late"}
    # bf16 heads of 64, 128 and 256 elements are whole 32-byte vectors: sm_100a moves 256 bits
    # (v8.b32) per access, sm_90a 128 bits (v4.b32).
    bits = 256 if arch == "sm_100a" else 128
    for name, (ptx, _cubin) in compiled.artifacts.items():
        v, r = variants[name], records[name]
        lanes = v.constants["lanes_per_head"]
        assert lanes == min(32, head_dim * 16 // bits)
        assert v.constants["vec"] == bits // 16
        where = f"head_dim={head_dim} {arch} {name}"

        accesses = _GLOBAL_ACCESS.findall(ptx)
        assert len(accesses) == len(re.findall(r"\b(?:ld|st)\.global\b", ptx)), "unparsed access"
        loads = [a for a in accesses if a.startswith("ld.")]
        stores = [a for a in accesses if a.startswith("st.")]
        # q or k + its weight per vector, loaded; q or k stored.
        assert loads and stores, f"{where}: no global loads/stores found"
        other = sorted({a for a in accesses if access_bits(a) != bits})
        assert not other, f"{where}: global accesses other than {bits} bits: {other}"
        if bits == 256:
            assert any(re.search(r"\.v8\.b32$", a) for a in loads), f"{where}: no v8 loads"
            assert any(re.search(r"\.v8\.b32$", a) for a in stores), f"{where}: no v8 stores"

        shuffles = re.findall(r"shfl\.sync\.bfly\.b32\s+%r\d+,\s*%r\d+,\s*(\d+),", ptx)
        rounds = lanes.bit_length() - 1  # log2(lanes)
        assert len(shuffles) == rounds, f"{where}: {len(shuffles)} butterfly rounds, want {rounds}"
        assert sorted(map(int, shuffles), reverse=True) == [lanes >> (i + 1) for i in range(rounds)]
        assert not re.search(r"shfl\.sync\.(?!bfly)", ptx), f"{where}: other shuffles"

        local = re.findall(r"\.local\b|\bld\.local|\bst\.local", ptx)
        assert not local, f"{where}: local memory (register spills or a stack array): {local}"

        entries = ptx_entries(ptx)
        assert len(r.entries) == 1
        block = (32 * v.constants["warps"], 1, 1)
        assert reqntid(entries[r.entries[0]]["directives"]) == v.block == r.block == block


# ------------------------------------------------------------------------------ (c) rms_norm PTX


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("hidden", [4096, 8192])
def test_rms_norm_prefill_loads_carry_the_cache_policy(hidden, fused, arch):
    """The prefill variant's global loads carry L1 and L2 eviction hints made by createpolicy:
    evict_last on a first read (x, residual, weight), evict_first on the second read of x (not
    fused). The decode variant's loads, those of `mid` (rows of 8192, 16 KiB, and plain rows of
    4096, 8 KiB) and every store carry none (hints cost decode latency). All hold 32 bytes of
    the row per thread; full-width accesses, no local memory."""
    values = (("hidden", hidden), ("dtype", "bfloat16"), ("fused_residual", fused))
    config, compiled = _compiled("rms_norm", values, arch)
    variants = {v.name: v for v in get_family("rms_norm").variants(config, get_arch(arch))}
    with_mid = hidden == 8192 or not fused
    names = {"decode", "mid", "prefill"} if with_mid else {"decode", "prefill"}
    if hidden == 4096:  # rows under 13 KiB (rms_norm/tuning.py, LATE_TRIGGER_ROW_BYTES)
        names.add("decode_late")
    assert set(variants) == set(compiled.artifacts) == names
    bits = 256 if arch == "sm_100a" else 128
    for name, (ptx, _cubin) in compiled.artifacts.items():
        v = variants[name]
        where = f"hidden={hidden} fused={fused} {arch} {name}"
        per_thread = v.constants["vecs_per_thread"]
        assert per_thread * bits == 2 * 128, where
        accesses = _GLOBAL_ACCESS.findall(ptx)
        assert len(accesses) == len(re.findall(r"\b(?:ld|st)\.global\b", ptx)), "unparsed access"
        loads = [a for a in accesses if a.startswith("ld.")]
        stores = [a for a in accesses if a.startswith("st.")]
        assert all(access_bits(a) == bits for a in accesses), f"{where}: {sorted(set(accesses))}"
        streams = 2 if fused else 1  # x (and the residual), each read once, stored once
        assert len(stores) == streams * per_thread and all("::" not in a for a in stores), where
        prefill = name == "prefill"
        reload = prefill and not fused
        assert (v.constants["cache_hints"], v.constants["reload_x"]) == (int(prefill), int(reload))
        first = [a for a in loads if a.startswith("ld.global.L1::evict_last.L2::cache_hint.")]
        last = [a for a in loads if a.startswith("ld.global.L1::evict_first.L2::cache_hint.")]
        plain = [a for a in loads if "::" not in a]
        reads = (streams + 1) * per_thread  # + the weight
        if prefill:
            assert (len(first), len(last), len(plain)) == (reads, per_thread * reload, 0), where
            assert "createpolicy.fractional.L2::evict_last.b64" in ptx
            assert ("createpolicy.fractional.L2::evict_first.b64" in ptx) == reload
        else:
            assert (len(first), len(last), len(plain)) == (0, 0, reads), where
            assert "createpolicy" not in ptx, where
        assert not re.search(r"\.local\b", ptx), f"{where}: local memory"


@pytest.mark.parametrize("family_name,values,early,late", [
    ("rms_norm", (("hidden", 4096), ("dtype", "bfloat16"), ("fused_residual", False)),
     {"decode"}, {"decode_late"}),
    ("rms_norm", (("hidden", 8192), ("dtype", "bfloat16"), ("fused_residual", True)),
     set(), {"decode"}),
    ("rms_norm", (("hidden", 512), ("dtype", "bfloat16"), ("fused_residual", True)),
     {"decode"}, {"decode_late"}),
    ("moe_combine", (("top_k", 8), ("hidden", 7168)),
     {"decode", "split", "split_wide", "split_block"}, {"split_block_late"}),
    ("qk_norm", (("num_q_heads", 32), ("num_k_heads", 4), ("head_dim", 128)),
     {"pdl"}, {"pdl_late"}),
], ids=["rms_norm-4096", "rms_norm-8192-fused", "rms_norm-512-fused", "moe_combine", "qk_norm"])
def test_pdl_variants_trigger_the_next_kernel_early_or_after_their_stores(family_name, values,
                                                                          early, late):
    """In the PTX, a variant with PDL waits for the previous grid before its first global load;
    the early ones let the next kernel launch before that wait, the late ones (rms_norm's
    decode_late and the decode of rows of 13 KiB and more, moe_combine's split_block_late,
    qk_norm's pdl_late) after their last global store; the others (prefill, mid, qk_norm's
    decode) carry no griddepcontrol instruction. The records say the same (pdl_late)."""
    config, compiled = _compiled(family_name, values, "sm_90a")
    variants = {v.name: v for v in get_family(family_name).variants(config, get_arch("sm_90a"))}
    for name, (ptx, _cubin) in compiled.artifacts.items():
        lines = ptx.splitlines()

        def at(text):
            return [i for i, line in enumerate(lines) if text in line]

        triggers, waits = at("griddepcontrol.launch_dependents"), at("griddepcontrol.wait")
        v = variants[name]
        assert v.constants.get("pdl_late", 0) == int(name in late), name
        if name not in early | late:
            assert not triggers and not waits and v.pdl == 0, name
            continue
        (trigger,), (wait,) = triggers, waits
        assert v.pdl > 0 and wait < min(at("ld.global")), name
        if name in early:
            assert trigger < wait, name
        else:
            assert max(at("st.global")) < trigger, name


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("family_name,values", [
    ("nvfp4_quant", (("hidden", 2048),)),
    ("block_scaled_quant", (("hidden", 2048), ("format", "mxfp8"))),
], ids=["nvfp4", "mxfp8"])
def test_bf16_input_conversion_of_the_block_scaled_kernels(family_name, values, arch):
    """NVFP4 on sm_90a widens its bf16 input to fp32 one instruction per element (a shift for
    the lower lane, a mask for the upper: every element's quotient is fp32 there, and the
    generic conversion's byte permute and shift per upper lane cost it 1-3.5%); MXFP8 keeps
    the generic conversion (the same change made it up to 4% slower) and sm_100a, which
    converts with native instructions, too."""
    config, compiled = _compiled(family_name, values, arch)
    variants = {v.name: v for v in get_family(family_name).variants(config, get_arch(arch))}
    for name, (ptx, _cubin) in compiled.artifacts.items():
        c = variants[name].constants
        elements = c["vec"] * c["vecs_per_thread"]
        masks = re.findall(r"\band\.b32\s+%r\d+,\s*%r\d+,\s*0xFFFF0000;", ptx)
        shifts = re.findall(r"\bshl\.b32\s+%r\d+,\s*%r\d+,\s*16;", ptx)
        explicit = family_name == "nvfp4_quant" and arch == "sm_90a"
        want = elements // 2 if explicit else 0
        assert (len(masks), len(shifts)) == (want, want), f"{family_name} {arch} {name}"


@pytest.mark.parametrize("fused", [False, True])
def test_rms_norm_mid_fits_four_blocks_per_sm(fused):
    """`mid` (rows of 14-16 KiB, one 16-warp row per block) is compiled for at least 4 blocks
    per SM: the PTX asks for it (.minnctapersm) and the cubin's entry takes at most 32
    registers (4 x 512 threads x 32 = the SM's 65536), where the decode variant of the same
    row takes more and fits only 3 (why `mid` exists: rms_norm/tuning.py)."""
    values = (("hidden", 7168), ("dtype", "bfloat16"), ("fused_residual", fused))
    config, compiled = _compiled("rms_norm", values, "sm_90a")
    records = {r.name: r for r in compiled.record.variants}
    ptx, _cubin = compiled.artifacts["mid"]
    assert re.search(r"\.minnctapersm\s+4\b", ptx)
    assert not re.search(r"\.minnctapersm", compiled.artifacts["decode"][0])
    (mid_registers,) = [r["registers"] for r in records["mid"].resources.values()]
    (decode_registers,) = [r["registers"] for r in records["decode"].resources.values()]
    assert records["mid"].block == (512, 1, 1)
    assert 4 * 512 * mid_registers <= 65536 < 4 * records["decode"].threads * decode_registers


def test_rms_norm_hinted_loads_split_a_wider_weight_vector():
    """An fp32 weight beside bf16 rows: each 8-element weight vector (256 bits) is loaded as two
    hinted 128-bit accesses on sm_90a (its rows are only 16-byte aligned), never one wide one."""
    values = (("hidden", 4096), ("dtype", "bfloat16"), ("weight_dtype", "float32"),
              ("out_dtype", "float32"))
    config, compiled = _compiled("rms_norm", values, "sm_90a")
    (prefill,) = [v for v in get_family("rms_norm").variants(config, get_arch("sm_90a"))
                  if v.name == "prefill"]
    per_thread = prefill.constants["vecs_per_thread"]
    ptx, _cubin = compiled.artifacts["prefill"]
    loads = [a for a in _GLOBAL_ACCESS.findall(ptx) if a.startswith("ld.")]
    assert all(access_bits(a) == 128 and "L2::cache_hint" in a for a in loads), loads
    # x once, x again (evict_first), the weight as two halves per vector
    assert len(loads) == (1 + 1 + 2) * per_thread
    assert sum("evict_first" in a for a in loads) == per_thread


# ------------------------------------------------------------------------------ shipped bundle


@pytest.fixture(scope="module")
def shipped(shipped_build):
    return open_bundle(shipped_build.path)


# (c) every shipped point x arch: the PTX parameter sizes are the spec's packed sizes.
@pytest.mark.parametrize(
    "family_name,key,arch", SHIPPED_ITEMS, ids=[f"{k}@{a}" for _, k, a in SHIPPED_ITEMS]
)
def test_ptx_param_sizes_equal_spec_for_every_shipped_point(shipped, family_name, key, arch):
    family = get_family(family_name)
    config = SHIPPED_CONFIGS[key]
    target = get_arch(arch)
    args = {a.name: a for a in family.kernel_args(config, target)}
    (point,) = [p for p in shipped.index["points"] if p["key"] == key and p["arch"] == arch]
    # The index holds the point's record: its call arguments and workspace are the family's
    # spec for this arch, and the loader reads the same record back.
    assert point["args"] == [a.to_json() for a in family.args(config, target)]
    assert point["workspace"] == [a.to_json() for a in family.workspace(config, target)]
    record_of_point = shipped.record(key, arch)
    assert record_of_point == PointRecord.from_json(point)
    specs = {v.name: v for v in family.variants(config, target)}
    assert [v["name"] for v in point["variants"]] == list(specs)
    for record, parsed in zip(point["variants"], record_of_point.variants):
        spec = specs[record["name"]]
        assert record["record_version"] == RECORD_VERSION
        want = [param_size(args[p]) for p in spec.params]
        ptx = shipped.reader.blob(record["ptx"]).decode()
        cubin = shipped.reader.blob(record["cubin"])
        assert record["ptx_sha256"] == hashlib.sha256(ptx.encode()).hexdigest()
        assert record["cubin_sha256"] == hashlib.sha256(cubin).hexdigest()
        entries = ptx_entries(ptx)
        assert record["entries"] and set(record["entries"]) <= set(entries)
        assert re.search(rf"^\.target\s+{arch}\s*$", ptx, re.M)
        for name in record["entries"]:
            assert entries[name]["params"] == want, f"{key}@{arch}/{record['name']} {name}"
            assert reqntid(entries[name]["directives"]) == tuple(record["block"]) == spec.block
        # a variant names its parameters; the point holds each one's layout once
        assert record["params"] == list(spec.params)
        layouts = {p["name"]: p for p in point["params"]}
        assert len(layouts) == len(point["params"])
        assert [layouts[n]["size"] for n in record["params"]] == want
        assert [layouts[n]["align"] for n in record["params"]] == [
            param_align(args[n]) for n in spec.params
        ]
        assert [layouts[n]["fields"] for n in record["params"]] == [
            [f.to_json() for f in param_fields(args[n])] for n in spec.params
        ]
        assert record["smem"] == spec.smem and record["cooperative"] == spec.cooperative
        assert record["constants"] == spec.constants
        assert len(record["resources"]) == len(record["entries"])  # one per entry, in order
        assert parsed.resources == dict(zip(record["entries"], record["resources"]))
        parsed.check_cubin(cubin)


# (d) the shipped bundle itself.
def test_shipped_bundle_round_trip(shipped_build, shipped):
    summary = shipped_build.summary
    assert summary.compiled == len(SHIPPED_ITEMS) and summary.cached == 0
    assert summary.points == len(SHIPPED_CONFIGS)
    assert summary.bundle_bytes == shipped_build.path.stat().st_size
    assert [(d, t) for d, t, *_ in shipped_build.progress] == [
        (i + 1, len(SHIPPED_ITEMS)) for i in range(len(SHIPPED_ITEMS))
    ]

    assert shipped.archs == sorted(ARCH_NAMES)
    assert shipped.points() == sorted(SHIPPED_CONFIGS)
    for arch in ARCH_NAMES:
        assert shipped.points(arch) == sorted(SHIPPED_CONFIGS)
    recorded_items = sorted((p["family"], p["key"], p["arch"]) for p in shipped.index["points"])
    assert recorded_items == SHIPPED_ITEMS

    recorded = shipped.index["manifests"]
    assert [m["name"] for m in recorded] == sorted(m.name for m in SHIPPED)
    for m in SHIPPED:
        (rec,) = [r for r in recorded if r["name"] == m.name]
        file_digest = hashlib.sha256((MANIFEST_DIR / f"{m.name}.toml").read_bytes()).hexdigest()
        assert rec["digest"] == m.digest == file_digest
        assert rec["archs"] == list(m.archs)
        assert rec["points"] == sorted(p.key for p in m.points)

    assert set(shipped.index["families"]) == {f for f, _, _ in SHIPPED_ITEMS}
    for name, fam in shipped.index["families"].items():
        assert fam["source_digest"] == get_family(name).source_digest() == kernel_source_digest()

    # Every shipped point is found by its config, as a serving engine would look it up.
    for key, config in SHIPPED_CONFIGS.items():
        family_name = key.split("(")[0]
        handle = shipped.kernel(family_name, **dataclasses.asdict(config))
        assert handle.key == key


def test_kernel_bundles_store_cubins_and_compress_ptx(shipped_build):
    # A preload decompresses every cubin of its arch: they are stored (a copy to
    # "decompress"); the PTX, read only by the reported fallback, stays compressed.
    reader = BundleReader.from_bytes(shipped_build.data)
    cubins = [n for n in reader.blob_names() if n.endswith(".cubin")]
    ptx = [n for n in reader.blob_names() if n.endswith(".ptx")]
    assert cubins and len(cubins) == len(ptx)
    for name in cubins:
        info = reader.blob_info(name)
        assert info["size"] >= info["raw_size"] * 0.9, (name, info)
    stored_ptx = sum(reader.blob_info(n)["size"] for n in ptx)
    assert stored_ptx < 0.5 * sum(reader.blob_info(n)["raw_size"] for n in ptx)


def test_shipped_bundle_records_the_toolchain(shipped):
    tc = shipped.index["toolchain"]
    installed = {}
    for name in (
        "nvidia-cutlass-dsl",
        "nvidia-cutlass-dsl-libs-base",
        "nvidia-cutlass-dsl-libs-core",
        "nvidia-cutlass-dsl-libs-cu12",
        "nvidia-cutlass-dsl-libs-cu13",
    ):
        try:
            installed[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    assert tc["packages"] == installed and "nvidia-cutlass-dsl-libs-cu12" in installed
    assert tc["cuda_flavour"] == "cu12"
    assert re.fullmatch(r"\d+\.\d+", tc["ptx_isa"])
    assert tc["compiler"].startswith("Cuda compilation tools, release")
    assert sorted(tc["cubin_elf_abi"]) == sorted(ARCH_NAMES)
    seen = {arch: set() for arch in ARCH_NAMES}
    for point in shipped.index["points"]:
        for v in point["variants"]:
            cubin = shipped.reader.blob(v["cubin"])
            assert cubin[:4] == b"\x7fELF"
            seen[point["arch"]].add(cubin[8])  # EI_ABIVERSION
            ptx = shipped.reader.blob(v["ptx"]).decode()
            assert re.search(rf"^\.version\s+{re.escape(tc['ptx_isa'])}\s*$", ptx, re.M)
            assert f"// {tc['compiler']}" in ptx
    assert seen == {arch: {tc["cubin_elf_abi"][arch]} for arch in ARCH_NAMES}


def test_rebuild_with_the_same_cache_compiles_nothing_and_is_byte_identical(
    shipped_build, tmp_path
):
    events = []
    summary = build_bundle(
        shipped_build.manifests,
        tmp_path / "again.rosebundle",
        jobs=BUILD_JOBS,
        cache=ArtifactCache(shipped_build.cache_dir),
        progress=lambda done, total, r: events.append(r.cached),
    )
    assert (summary.compiled, summary.cached) == (0, len(SHIPPED_ITEMS))
    assert events == [True] * len(SHIPPED_ITEMS)
    assert (tmp_path / "again.rosebundle").read_bytes() == shipped_build.data


def test_rebuild_from_scratch_is_byte_identical(shipped_build, tmp_path, monkeypatch):
    # The determinism test: fresh cache, fresh worker processes, another job count and
    # another working directory give the same bytes.
    monkeypatch.chdir(tmp_path)
    summary = build_bundle(
        shipped_build.manifests,
        tmp_path / "fresh.rosebundle",
        jobs=1,
        cache=ArtifactCache(tmp_path / "fresh-cache"),
    )
    assert (summary.compiled, summary.cached) == (len(SHIPPED_ITEMS), 0)
    fresh = (tmp_path / "fresh.rosebundle").read_bytes()
    if fresh != shipped_build.data:
        a = BundleReader.from_bytes(fresh)
        b = BundleReader.from_bytes(shipped_build.data)
        names = sorted(set(a.blob_names()) | set(b.blob_names()))
        differing = [n for n in names if n not in a.blob_names() or n not in b.blob_names()
                     or a.blob_info(n)["raw_sha256"] != b.blob_info(n)["raw_sha256"]]
        pytest.fail(
            f"the rebuild differs; artifacts that differ: {differing[:5]}; "
            f"index equal: {a.index == b.index}"
        )


def test_cache_entries_hold_the_record_and_serve_only_their_own_key(shipped_build, tmp_path):
    """ArtifactCache.get(key, item) gives the item's result with its checked record (the one
    the bundle index holds), and ignores, with a CacheWarning, an entry written for another key
    or whose artifacts are not the ones its record names."""
    from rose_aot.builder.build import BuildPlan, CacheWarning
    from rose_aot.bundle import write_bundle

    plan = BuildPlan.from_manifests(shipped_build.manifests)
    cache = ArtifactCache(shipped_build.cache_dir)
    bundle = open_bundle(shipped_build.path)
    a, b = plan.items[0], plan.items[1]
    hit = cache.get(plan.cache_key(a), a)
    assert hit is not None and hit.cached and hit.item == a
    assert hit.record == bundle.record(a.key, a.arch)
    assert [v["name"] for v in hit.variants] == [r.name for r in hit.record.variants]
    for v, r in zip(hit.variants, hit.record.variants):
        assert hashlib.sha256(v["cubin"]).hexdigest() == r.cubin_sha256
        assert hashlib.sha256(v["ptx"].encode()).hexdigest() == r.ptx_sha256

    other = ArtifactCache(tmp_path / "cache")
    misplaced = other._path(plan.cache_key(b))
    misplaced.parent.mkdir(parents=True)
    misplaced.write_bytes(cache._path(plan.cache_key(a)).read_bytes())
    with pytest.warns(CacheWarning, match="written for key"):
        assert other.get(plan.cache_key(b), b) is None

    # The right key, but the two variants' cubins swapped: the record check refuses it.
    reader = BundleReader.open(cache._path(plan.cache_key(a)))
    blobs = {n: reader.blob(n) for n in reader.blob_names()}
    cubins = sorted(n for n in blobs if n.endswith(".cubin"))
    assert len(cubins) >= 2
    blobs[cubins[0]], blobs[cubins[1]] = blobs[cubins[1]], blobs[cubins[0]]
    swapped = other._path(plan.cache_key(a))
    swapped.parent.mkdir(parents=True, exist_ok=True)
    write_bundle(swapped, reader.index, blobs)
    with pytest.warns(CacheWarning, match="cubin is not the one its record names"):
        assert other.get(plan.cache_key(a), a) is None


# Corruption of the real bundle: `rose-aot verify` refuses every damaged copy; open refuses
# damage to the header and the index (which covers the blob table), and a load refuses a damaged
# artifact before the driver sees it.


def _expect_rejected(path, what: str):
    with pytest.raises(BundleError) as info:
        open_bundle(path)
    assert str(path) in str(info.value), f"{what}: the message does not name the file"
    result = CliRunner().invoke(cli, ["verify", str(path)])
    assert result.exit_code == 1, f"{what}: verify exited {result.exit_code}: {result.output}"
    assert "Error:" in result.output
    return info.value


def test_every_sampled_bit_flip_is_rejected(shipped_build, tmp_path):
    data = shipped_build.data
    size = len(data)
    intact = BundleReader.from_bytes(data)
    region_start = HEADER_SIZE + struct.unpack_from("<Q", data, 16)[0]
    blob_at = {}  # file offset of each blob's frame -> (name, its frame size)
    for name in intact.blob_names():
        info = intact.blob_info(name)
        blob_at[region_start + info["offset"]] = (name, info["size"])
    offsets = sorted({0, size - 1} | {round(i * (size - 1) / 199) for i in range(200)})
    assert len(offsets) >= 200 and max(offsets) >= region_start
    path = tmp_path / "flipped.rosebundle"
    for n, offset in enumerate(offsets):
        damaged = bytearray(data)
        damaged[offset] ^= 1 << (n % 8)
        path.write_bytes(bytes(damaged))
        what = f"bit {n % 8} of byte {offset}/{size}"
        if offset < region_start:
            _expect_rejected(path, what)
            continue
        start = max(s for s in blob_at if s <= offset)
        name, frame_size = blob_at[start]
        assert offset < start + frame_size
        result = CliRunner().invoke(cli, ["verify", str(path)])
        assert result.exit_code == 1 and "Error:" in result.output, f"{what}: {result.output}"
        # A load of the artifact (the cubin; the PTX with use_ptx) refuses it, unless the flip
        # left what the frame decompresses to unchanged, or the same bytes were checked already
        # under another name (split and split_wide at top-8; blob_view, what a load reads,
        # then returns those): then the load gets the right bytes.
        # A flip in the frame's header (4 magic bytes, at most 14 of descriptor) is refused
        # already at open, which checks every frame's header.
        try:
            bundle = open_bundle(path, use_ptx=name.endswith(".ptx"))
        except BundleError as exc:
            assert offset - start < 18 and str(path) in str(exc), (what, offset - start, exc)
            continue
        try:
            bundle.check_artifacts()
        except BundleError as exc:
            assert str(path) in str(exc), what
        else:
            assert bundle.reader.blob_view(name) == intact.blob(name), what


def test_every_sampled_truncation_is_rejected(shipped_build, tmp_path):
    data = shipped_build.data
    size = len(data)
    (index_size,) = struct.unpack_from("<Q", data, 16)
    special = {0, 1, 7, 8, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + index_size - 1,
               HEADER_SIZE + index_size, HEADER_SIZE + index_size + 1, size - 1}
    lengths = sorted(special | {round(i * (size - 1) / 49) for i in range(50)})
    assert len(lengths) >= 50 and max(lengths) < size
    path = tmp_path / "truncated.rosebundle"
    for length in lengths:
        path.write_bytes(data[:length])
        _expect_rejected(path, f"truncated to {length}/{size} bytes")


@pytest.mark.parametrize(
    "magic", [b"ROSEAOT\x01", b"\x7fELF\x02\x01\x01\x00", b"\0" * 8, b"roseaot\0"]
)
def test_wrong_magic_is_rejected(shipped_build, tmp_path, magic):
    path = tmp_path / "magic.rosebundle"
    path.write_bytes(magic + shipped_build.data[len(MAGIC):])
    err = _expect_rejected(path, f"magic {magic!r}")
    assert "not a rose-aot bundle" in str(err)


@pytest.mark.parametrize("version", [0, FORMAT_VERSION + 1, 2**32 - 1])
def test_wrong_version_is_rejected(shipped_build, tmp_path, version):
    data = bytearray(shipped_build.data)
    struct.pack_into("<I", data, 8, version)
    path = tmp_path / "version.rosebundle"
    path.write_bytes(bytes(data))
    err = _expect_rejected(path, f"version {version}")
    assert f"format version {version}" in str(err)
    assert f"format version {FORMAT_VERSION}" in str(err)


def test_verify_accepts_the_intact_bundle(shipped_build):
    result = CliRunner().invoke(cli, ["verify", "--json", str(shipped_build.path)])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["ok"] is True and info["artifacts"] == 2 * sum(
        len(p["variants"]) for p in open_bundle(shipped_build.path).index["points"]
    )


# ------------------------------------------------------------------------------ (e) BuildError

BROKEN = [
    # Configs that make_config rejects, built directly to reach the compiler.
    pytest.param("rms_norm", RmsNormConfig(hidden=0), "sm_90a", id="rms_norm-hidden0-sm_90a"),
    pytest.param(
        "qk_norm", QkNormConfig(num_q_heads=2, num_k_heads=2, head_dim=4), "sm_100a",
        id="qk_norm-head_dim4-sm_100a",
    ),
]


@pytest.mark.parametrize("family_name,config,arch", BROKEN)
def test_compile_error_names_the_point_and_arch(family_name, config, arch):
    item = WorkItem(family_name, config, arch)
    with pytest.raises(BuildError) as info:
        _compile_task(item)
    err = info.value
    assert item.key.startswith(family_name + "(")
    assert err.point == item.key and err.arch == arch
    assert item.key in str(err) and arch in str(err)
    assert err.reason and err.reason in str(err)  # the compiler's own message is kept

    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is BuildError and isinstance(copy, RoseAotError)
    assert (copy.point, copy.arch, copy.reason) == (err.point, err.arch, err.reason)
    assert str(copy) == str(err)


def test_build_error_pickles_with_its_fields():
    err = BuildError("rms_norm(hidden=12,...)", "sm_100a", "DSLRuntimeError: something\nline 2")
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is BuildError
    assert (copy.point, copy.arch, copy.reason) == (err.point, err.arch, err.reason)
    assert str(copy) == str(err) and copy.args == err.args


def test_failing_point_in_a_worker_fails_the_build_and_writes_nothing(tmp_path):
    # Through the spawned process pool: the error crosses a process boundary intact.
    source = tmp_path / "broken.toml"
    source.write_text(
        '[deployment]\nname = "broken"\narchs = ["sm_90a"]\n\n'
        '[[kernel]]\nfamily = "rms_norm"\nhidden = 1024\n'
    )
    manifest = load_manifest(source)
    bad = RmsNormConfig(hidden=0)  # make_config refuses it; a manifest cannot hold it
    manifest = dataclasses.replace(manifest, points=(*manifest.points, Point("rms_norm", bad)))
    out = tmp_path / "out" / "broken.rosebundle"
    cache = ArtifactCache(tmp_path / "cache")
    with pytest.raises(BuildError) as info:
        build_bundle([manifest], out, jobs=1, cache=cache)
    bad_key = WorkItem("rms_norm", bad, "sm_90a").key
    assert info.value.point == bad_key and info.value.arch == "sm_90a"
    assert bad_key in str(info.value)
    assert not out.exists()
    # No bundle and no temporary file left behind.
    assert not out.parent.exists() or not any(out.parent.iterdir())
