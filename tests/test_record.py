"""The kernel record: built once, bound to its artifacts, never stale (issue: one trusted record).

Real builds in subprocesses and in-process, real cubins; nothing is mocked. Scenarios:
- a tuning knob changes between two builds sharing a cache: a cache miss, and the cached
  rebuild equals a clean build byte for byte;
- a valid cache entry copied under another point's key: refused (warned), recompiled;
- two variants' cubins swapped in a bundle (digests recomputed): refused by open or at the
  cubin's first load, and by verify;
- records round-trip through JSON and the loader launches from them unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures_tiny import rewrite_bundle

REPO = Path(__file__).resolve().parent.parent

ONE_POINT = """\
[deployment]
name = "one"

[[kernel]]
family = "rms_norm"
hidden = 2048
eps = {eps}
"""


def _build_in(package_root: Path, manifest: Path, output: Path, cache: Path) -> dict:
    """`rose-aot build --json` with rose_aot imported from `package_root` (a copy we may edit)."""
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    code = "import sys; from rose_aot.cli import main; sys.argv[0] = 'rose-aot'; main()"
    cmd = [sys.executable, "-c", code, "build", str(manifest), "-o", str(output),
           "--cache-dir", str(cache), "-j", "1", "--json"]
    done = subprocess.run(cmd, env=env, cwd=package_root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _prefill_block(bundle: Path) -> list[int]:
    from rose_aot.bundle import BundleReader

    (point,) = BundleReader.open(bundle).index["points"]
    return next(v["block"] for v in point["variants"] if v["name"] == "prefill")


def test_changed_tuning_is_a_cache_miss_and_equals_a_clean_build(tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(REPO / "rose_aot", copy / "rose_aot", ignore=shutil.ignore_patterns("__pycache__"))
    manifest = tmp_path / "one.toml"
    manifest.write_text(ONE_POINT.format(eps="1e-6"))
    cache = tmp_path / "cache"

    first = _build_in(copy, manifest, tmp_path / "a.rosebundle", cache)
    assert (first["compiled"], first["cached"]) == (1, 0)
    # hidden 2048 is a row of 4 warps: one row per block at the measured 4 warps, two at 8
    assert _prefill_block(tmp_path / "a.rosebundle") == [128, 1, 1]

    tuning = copy / "rose_aot" / "kernels" / "rms_norm" / "tuning.py"
    text = tuning.read_text()
    assert 'PREFILL_WARPS: dict[str, int] = {"sm_90a": 4}' in text
    tuning.write_text(text.replace('{"sm_90a": 4}', '{"sm_90a": 8}'))

    second = _build_in(copy, manifest, tmp_path / "b.rosebundle", cache)
    assert (second["compiled"], second["cached"]) == (1, 0), "a stale cache entry was used"
    assert _prefill_block(tmp_path / "b.rosebundle") == [256, 1, 1]

    clean = _build_in(copy, manifest, tmp_path / "c.rosebundle", tmp_path / "empty-cache")
    assert clean["compiled"] == 1
    assert (tmp_path / "b.rosebundle").read_bytes() == (tmp_path / "c.rosebundle").read_bytes()

    # The bundle's record and its cubin agree: the prefill cubin was compiled for 256 threads.
    from rose_aot.loader import open_bundle

    bundle = open_bundle(tmp_path / "b.rosebundle")
    (key,) = bundle.points()
    assert bundle.record(key, "sm_90a").variant("prefill").block == (256, 1, 1)


def test_cache_entry_copied_under_another_key_is_a_miss(tmp_path):
    from rose_aot.builder.build import ArtifactCache, BuildPlan, CacheWarning, build_bundle
    from rose_aot.manifest import load_manifest

    paths = {}
    for eps in ("1e-6", "1e-5"):
        paths[eps] = tmp_path / f"eps{eps}.toml"
        paths[eps].write_text(ONE_POINT.format(eps=eps))
    cache = ArtifactCache(tmp_path / "cache")
    manifests = {eps: [load_manifest(p)] for eps, p in paths.items()}
    for eps in paths:
        build_bundle(manifests[eps], tmp_path / f"{eps}.rosebundle", cache=cache)
    clean = (tmp_path / "1e-6.rosebundle").read_bytes()

    plan6 = BuildPlan.from_manifests(manifests["1e-6"])
    plan5 = BuildPlan.from_manifests(manifests["1e-5"])
    key6, key5 = plan6.cache_key(plan6.items[0]), plan5.cache_key(plan5.items[0])
    assert key6 != key5
    shutil.copyfile(cache._path(key5), cache._path(key6))  # eps=1e-5 code under eps=1e-6's key

    with pytest.warns(CacheWarning, match="written for key"):
        summary = build_bundle(manifests["1e-6"], tmp_path / "again.rosebundle", cache=cache)
    assert (summary.compiled, summary.cached) == (1, 0)
    assert (tmp_path / "again.rosebundle").read_bytes() == clean
    # The miss rewrote the entry: the next build takes it from the cache again.
    summary = build_bundle(manifests["1e-6"], tmp_path / "third.rosebundle", cache=cache)
    assert (summary.compiled, summary.cached) == (0, 1)


def test_cache_entry_with_artifacts_of_another_variant_is_a_miss(tmp_path, tiny_build):
    """An entry whose own key matches but whose cubins do not match its record."""
    from rose_aot.builder.build import ArtifactCache, BuildPlan, CacheWarning, compile_items
    from rose_aot.manifest import load_manifest

    cache_dir = tmp_path / "cache"
    shutil.copytree(tiny_build.cache_dir, cache_dir)
    cache = ArtifactCache(cache_dir)
    plan = BuildPlan.from_manifests([load_manifest(tiny_build.manifest)])
    item = next(i for i in plan.items if i.family == "rms_norm" and i.arch == "sm_90a")
    path = cache._path(plan.cache_key(item))
    rewrite_bundle(path, path, edit_blobs=lambda b: b.update(
        {"decode.cubin": b["prefill.cubin"], "prefill.cubin": b["decode.cubin"]}))
    with pytest.warns(CacheWarning, match="not the one its record names"):
        assert cache.get(plan.cache_key(item), item) is None
    with pytest.warns(CacheWarning):
        results = compile_items(plan, [item], cache=cache)
    assert not results[item].cached


def _swap(index: dict, fields: tuple[str, ...]) -> None:
    # qk_norm's decode (one warp) and prefill (four) blocks differ; rms_norm's two-warp rows of
    # hidden 1024 decode and prefill in the same 4-warp block
    point = next(p for p in index["points"] if p["family"] == "qk_norm" and p["arch"] == "sm_90a")
    decode, prefill = (next(v for v in point["variants"] if v["name"] == n) for n in ("decode", "prefill"))
    assert decode["block"] != prefill["block"]
    for f in fields:
        decode[f], prefill[f] = prefill[f], decode[f]


@pytest.mark.parametrize(
    "fields",
    [("cubin",), ("cubin", "cubin_sha256")],
    ids=["blob-names", "blob-names-and-record-digests"],
)
def test_swapped_variant_cubins_are_refused(tmp_path, tiny_build, fields):
    """Swap the decode and prefill cubins of one point in the index, digests recomputed (the
    file is rewritten through write_bundle): open_bundle and `rose-aot verify` refuse it."""
    from click.testing import CliRunner

    from rose_aot.cli import main
    from rose_aot.errors import BundleError
    from rose_aot.loader import open_bundle

    bad = rewrite_bundle(tiny_build.path, tmp_path / "swapped.rosebundle",
                         edit_index=lambda index: _swap(index, fields))
    # Refused at open (the names) or at the cubin's first load (the record check).
    with pytest.raises(BundleError, match=r"qk_norm\(num_q_heads=8.* on sm_90a: .*variant (decode|prefill)"):
        open_bundle(bad).check_artifacts("sm_90a")
    result = CliRunner().invoke(main, ["verify", str(bad)])
    assert result.exit_code == 1
    assert "does not match its record" in result.output or "not the artifact" in result.output


def test_swapped_blob_contents_are_refused(tmp_path, tiny_build):
    """The same swap done in the blobs, keeping the index's names: the record's digests catch it."""
    from rose_aot.errors import BundleError
    from rose_aot.loader import open_bundle

    def swap(blobs):
        # the point's decode and prefill cubins (it has decode_late too)
        (a,), (b,) = ([n for n in blobs if n.startswith("rms_norm(hidden=1024") and "@sm_90a/" in n
                       and "fused_residual=false" in n and n.endswith(f"/{variant}.cubin")]
                      for variant in ("decode", "prefill"))
        blobs[a], blobs[b] = blobs[b], blobs[a]

    bad = rewrite_bundle(tiny_build.path, tmp_path / "swapped.rosebundle", edit_blobs=swap)
    _refused_when_its_arch_is_used(bad, "sm_90a", "not the artifact its record was compiled with")


def _refused_when_its_arch_is_used(bad, arch: str, message: str) -> None:
    """A bundle whose records of `arch` are bad: it opens (open_bundle checks each arch's
    records at that arch's first use), the other arch serves, and every use of `arch` raises
    the same BundleError, again on a second try; verify's eager check refuses it at once."""
    from rose_aot.bundle import BundleReader
    from rose_aot.errors import BundleError
    from rose_aot.loader import KernelBundle, open_bundle

    bundle = open_bundle(bad)
    others = sorted({p["arch"] for p in bundle.index["points"]} - {arch})
    assert others  # the tiny build has two archs
    for other in others:
        bundle.check_records(other)
        key = bundle.points(other)[0]
        assert bundle.record(key, other).variants
    key = bundle.points(arch)[0]
    uses = [lambda: bundle.check_records(arch), lambda: bundle.check_records(),
            lambda: bundle.record(key, arch), lambda: bundle.check_artifacts(arch),
            lambda: bundle.check_records(arch)]
    for use in uses:
        with pytest.raises(BundleError, match=message):
            use()
    assert arch not in bundle._archs_checked
    with pytest.raises(BundleError, match=message):
        KernelBundle(BundleReader.open(bad))


def test_record_of_another_version_is_refused(tmp_path, tiny_build):
    from rose_aot.errors import BundleError
    from rose_aot.loader import open_bundle

    def bump(index):
        index["points"][0]["variants"][0]["record_version"] = 999

    bad = rewrite_bundle(tiny_build.path, tmp_path / "v999.rosebundle", edit_index=bump)
    with pytest.raises(BundleError, match="record version 999"):
        open_bundle(bad)


def test_record_the_plan_cannot_read_is_refused(tmp_path, tiny_build):
    """A record without a constant the family's plan reads is not understood: refused when its
    arch is first used, before any load or launch of it."""
    arch = []

    def drop(index):
        point = next(p for p in index["points"] if p["family"] == "rms_norm")
        del point["variants"][0]["constants"]["rows_per_block"]
        arch.append(point["arch"])

    bad = rewrite_bundle(tiny_build.path, tmp_path / "nodecode.rosebundle", edit_index=drop)
    _refused_when_its_arch_is_used(bad, arch[0], "launch plan does not understand the record")


@pytest.mark.parametrize("damage", ["missing", "text"])
def test_a_mid_record_without_its_threshold_is_refused(tmp_path, shipped_build, damage):
    """rms_norm's plan reads `mid_max_bytes` from the mid variant's record (rows of 14-16 KiB:
    DeepSeek-V3's 7168): a record without it, or with text there, is refused when its arch is
    first used, as any record the plan cannot read, never a KeyError or TypeError at launch."""
    arch = []

    def spoil(index):
        point = next(p for p in index["points"]
                     if p["family"] == "rms_norm" and any(v["name"] == "mid" for v in p["variants"]))
        mid = next(v for v in point["variants"] if v["name"] == "mid")
        if damage == "missing":
            del mid["constants"]["mid_max_bytes"]
        else:
            mid["constants"]["mid_max_bytes"] = "64 MiB"
        arch.append(point["arch"])

    bad = rewrite_bundle(shipped_build.path, tmp_path / "mid.rosebundle", edit_index=spoil)
    _refused_when_its_arch_is_used(bad, arch[0], "launch plan does not understand the record")


def test_loader_packs_from_the_record_not_from_the_family(tiny_build):
    """The packer lays parameters out as the record's fields say: moving a field in the record
    moves it in the packed bytes (nothing is recomputed from the family's spec)."""
    import dataclasses
    import struct

    from rose_aot.loader import open_bundle
    from rose_aot.loader.args import ParamPacker

    bundle = open_bundle(tiny_build.path)
    key = next(k for k in bundle.points() if k.startswith("rms_norm") and "fused_residual=false" in k)
    record = bundle.record(key, "sm_90a")
    positions = {a.name: i for i, a in enumerate(record.args)}
    x = record.variant("decode").params[0]
    assert [f.kind for f in x.fields] == ["ptr", "extent", "stride"]
    # the generated pack the loader's hot path uses: atoms (pointer, extent, stride) of x
    atoms = {(0, "ptr", 0): "a[0]", (0, "extent", 0): "a[1]", (0, "stride", 0): "a[2]"}
    packer = ParamPacker(positions, (x,))
    packer.compile(atoms, len(record.args))((0x1000, 7, 2048), ())
    assert struct.unpack_from("<Qiiq", bytes(packer.buffer)) == (0x1000, 7, 0, 2048)

    ptr, extent, stride = x.fields
    moved = dataclasses.replace(x, fields=(ptr, dataclasses.replace(stride, offset=8),
                                           dataclasses.replace(extent, offset=16)))
    packer = ParamPacker(positions, (moved,))
    packer.compile(atoms, len(record.args))((0x1000, 7, 2048), ())
    assert struct.unpack_from("<Qqi", bytes(packer.buffer)) == (0x1000, 2048, 7)


def test_record_json_round_trip_and_cubin_binding(tiny_build):
    from rose_aot.bundle import BundleReader
    from rose_aot.kernels.record import PointRecord

    reader = BundleReader.open(tiny_build.path)
    for point in reader.index["points"]:
        record = PointRecord.from_json(point)
        again = PointRecord.from_json(json.loads(json.dumps(record.to_json())))
        assert again == record
        blocks = {v.name: v.block for v in record.variants}
        for raw, v in zip(point["variants"], record.variants):
            cubin = reader.blob(raw["cubin"])
            v.check_cubin(cubin)
            assert all(r["registers"] and r["registers"] > 0 for r in v.resources.values())
            for other, raw_other in zip(record.variants, point["variants"]):
                if blocks[other.name] != v.block:
                    with pytest.raises(ValueError, match="reqntid"):
                        v.check_cubin(reader.blob(raw_other["cubin"]))


def test_hostile_record_fields_end_in_bundle_errors(tmp_path, tiny_build):
    """Seeded edits of record fields (variants, parameters, arguments, their extents), digests
    recomputed: every one opens or ends in the project's own error, never another exception."""
    import random

    from rose_aot.errors import RoseAotError
    from rose_aot.loader import open_bundle

    values = [None, "x", -1, 0, 10**30, 1.5, [], {}, [1, 2], True, [[1]], [-5, 1, 1],
              ["t", 32], ["t", 32, 1, 4]]
    variant_fields = ["record_version", "name", "entries", "block", "cluster", "smem",
                      "cooperative", "pdl", "params", "constants", "resources", "cubin_sha256"]
    arg_fields = ["name", "kind", "dtype", "shape", "stride", "align", "role", "layout"]
    rnd = random.Random(7)
    refused = 0
    for i in range(150):
        def edit(index):
            point = rnd.choice(index["points"])
            r = rnd.random()
            if r < 0.4:
                rnd.choice(point["variants"])[rnd.choice(variant_fields)] = rnd.choice(values)
            elif r < 0.5:  # the point's parameters
                params = point["params"]
                rnd.choice(params)[rnd.choice(["name", "size", "align", "fields"])] = rnd.choice(values)
            elif r < 0.6:  # the names by which a variant takes them
                names = point["variants"][0]["params"]
                names[rnd.randrange(len(names))] = rnd.choice(values)
            elif r < 0.9:
                arg = rnd.choice(point["args"])
                field = rnd.choice(arg_fields)
                if field in ("shape", "stride") and rnd.random() < 0.5:
                    arg[field][rnd.randrange(len(arg[field]))] = rnd.choice(values)
                else:
                    arg[field] = rnd.choice(values)
            else:
                point[rnd.choice(["args", "workspace", "params", "variants"])] = rnd.choice(values)

        path = rewrite_bundle(tiny_build.path, tmp_path / f"h{i % 2}.rosebundle", edit_index=edit)
        try:
            bundle = open_bundle(path)
            for key in bundle.points():
                bundle.handle(key)
            bundle.check_records()
        except RoseAotError:
            refused += 1
    assert refused > 100  # nearly every edit breaks the record; the rest must still open


def test_wrong_api_inputs_are_clear_errors(tiny_build):
    from rose_aot import torch_ops
    from rose_aot.errors import ArgumentError, KernelNotFoundError
    from rose_aot.loader import open_bundle

    bundle = open_bundle(tiny_build.path)
    with pytest.raises(ArgumentError, match="a point key is a string"):
        bundle.handle(["rms_norm"])
    with pytest.raises(KernelNotFoundError):
        bundle.handle("rms_norm(hidden=3)")
    with pytest.raises(ArgumentError, match="opened bundle"):
        torch_ops.register(str(tiny_build.path))


def test_an_index_reads_each_distinct_parameter_once(tiny_build):
    """open_bundle shares one ParamRecord among equal parameters of every point (an index
    repeats a few dozen hundreds of times), and the packing check meets the same objects."""
    from rose_aot.loader import open_bundle

    bundle = open_bundle(tiny_build.path)
    params = [p for key, arch in bundle._points for v in bundle.record(key, arch).variants
              for p in v.params]
    distinct: dict = {}
    for p in params:
        distinct.setdefault(p, []).append(p)
    assert len(distinct) < len(params)  # the bundle repeats parameters
    for equal in distinct.values():
        assert all(p is equal[0] for p in equal)
    for arg, packing in bundle._packings.items():
        assert packing in distinct and packing is distinct[packing][0]


def test_the_parameter_memo_reads_every_spelling_as_the_reader_without_it():
    """A memo hit is what the conversions give: a parameter spelled differently (an int as a
    float, a bool or a string) is read, or refused, exactly as with no memo, whatever equal
    value was read before it."""
    from rose_aot.kernels.record import ParamRecord
    from rose_aot.kernels.spec import TensorArg, Dim

    good = {"align": 8, "name": "x", "size": 24,
            "fields": [["ptr", "Q", 0, -1, ""], ["extent", "i", 8, 0, "tokens"],
                       ["stride", "q", 16, 0, "x_row_stride"]]}
    spellings = [
        {"size": 24.0}, {"size": True}, {"align": 8.0}, {"align": "8"}, {"name": 1},
        {"fields": [["ptr", "Q", 0.0, -1, ""], *good["fields"][1:]]},
        {"fields": [["ptr", "Q", False, -1.0, ""], *good["fields"][1:]]},
        {"fields": [["ptr", "Q", "0", "-1", ""], *good["fields"][1:]]},
        {"fields": [["ptr", "Q", 0, -1, 0], *good["fields"][1:]]},
        {"fields": [("ptr", "Q", 0, -1, ""), *good["fields"][1:]]},
        {"fields": ["ptr", *good["fields"][1:]]},
    ]

    def read(data, memo):
        try:
            return ParamRecord.from_json(data, memo)
        except (KeyError, TypeError, ValueError) as exc:
            return type(exc)

    memo: dict = {}
    first = read(good, memo)
    assert read(good, memo) is first
    for change in spellings:
        data = {**good, **change}
        assert read(data, memo) == read(data, None), change
    assert read({**good, "size": 24.0}, memo) is TypeError  # refused, not the memo's record
    arg = TensorArg("x", "bfloat16", (Dim("tokens"), 36864), (Dim("x_row_stride", 64, 8), 1))
    assert ParamRecord.of(arg, memo) is first
    assert ParamRecord.of(arg) == first and ParamRecord.of(arg) is not first
