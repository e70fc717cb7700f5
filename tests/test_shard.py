"""Sharded builds and merge: a deterministic 1/N of the items per shard, merged bundles
byte-identical to an unsharded build for N = 1, 2, 3, clear failures for every bad set of shards,
and the build report next to every output.

Real builds: the tiny manifest's session build (fixtures_tiny.py) fills the cache the shard
builds here reuse; one test compiles a shard from an empty cache.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from click.testing import CliRunner

from fixtures_tiny import TINY_JOBS, rewrite_bundle
from rose_aot.builder.build import ArtifactCache, BuildPlan
from rose_aot.builder.report import REPORT_KIND, build_report, report_path
from rose_aot.builder.shard import (
    SHARD_KIND,
    build_shard,
    merge_shards,
    parse_shard_spec,
    read_shard,
)
from rose_aot.bundle import BundleReader
from rose_aot.cli import main as cli
from rose_aot.errors import BundleError, ShardError
from rose_aot.manifest import load_manifest


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def shard_files(tiny, tmp_path, count, *, manifest=None, tag="s"):
    """Build every shard of `count` through the CLI (from the warm cache); return their paths."""
    paths = []
    for index in range(1, count + 1):
        out = tmp_path / f"{tag}-{index}-of-{count}.roseshard"
        result = run(
            "build",
            manifest or tiny.manifest,
            "--shard",
            f"{index}/{count}",
            "-o",
            out,
            "--cache-dir",
            tiny.cache_dir,
            "-q",
        )
        assert result.exit_code == 0, result.output
        paths.append(out)
    return paths


# ------------------------------------------------------------------------------ the partition
def test_shard_spec_parsing():
    assert parse_shard_spec("1/1") == (1, 1)
    assert parse_shard_spec(" 2 / 3 ") == (2, 3)
    for bad, says in [
        ("3/2", "outside 1..2"),
        ("0/2", "outside 1..2"),
        ("1/0", "between 1 and"),
        ("a/b", "write I/N"),
        ("2", "write I/N"),
        ("-1/2", "write I/N"),
    ]:
        with pytest.raises(ValueError, match=says):
            parse_shard_spec(bad)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
def test_shards_partition_the_plan_deterministically(tiny_build, count):
    plan = BuildPlan.from_manifests([load_manifest(tiny_build.manifest)])
    assert len(plan.items) == 6
    shards = [plan.shard_items(i, count) for i in range(1, count + 1)]
    flat = [item for shard in shards for item in shard]
    assert sorted(flat, key=plan.items.index) == list(plan.items)  # every item exactly once
    assert len(set(flat)) == len(flat)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1  # balanced
    assert shards[0] == plan.items[::count]  # round robin over the sorted items
    again = BuildPlan.from_manifests([load_manifest(tiny_build.manifest)])
    assert again.digest == plan.digest
    assert [again.shard_items(i, count) for i in range(1, count + 1)] == shards


# ------------------------------------------------------------------------------ byte identity
@pytest.mark.parametrize("count", [1, 2, 3])
def test_merged_shards_are_byte_identical_to_the_unsharded_build(tiny_build, tmp_path, count):
    paths = shard_files(tiny_build, tmp_path, count)
    for index, path in enumerate(paths, start=1):
        shard = read_shard(path)
        assert (shard.index, shard.count) == (index, count)
        assert BundleReader.open(path).index["kind"] == SHARD_KIND
        assert report_path(path).is_file()
    out = tmp_path / "merged.rosebundle"
    # Any order of the shard files gives the same bundle.
    result = run("merge", *reversed(paths), "-o", out)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == tiny_build.data
    report = json.loads(report_path(out).read_text())
    assert report["kind"] == REPORT_KIND
    assert report["sha256"] == hashlib.sha256(tiny_build.data).hexdigest()
    assert report["totals"]["items"] == 6


def test_a_shard_compiled_from_an_empty_cache_merges_identically(tiny_build, tmp_path):
    manifest = load_manifest(tiny_build.manifest)
    plan = BuildPlan.from_manifests([manifest])
    fresh = build_shard(
        [manifest],
        tmp_path / "fresh-2.roseshard",
        2,
        3,
        jobs=TINY_JOBS,
        cache=ArtifactCache(tmp_path / "empty-cache"),
    )
    assert [r.item for r in fresh.items] == list(plan.shard_items(2, 3))
    assert (fresh.compiled, fresh.cached) == (2, 0)
    assert all(r.seconds > 0 for r in fresh.items)
    others = shard_files(tiny_build, tmp_path, 3)
    summary = merge_shards([others[0], fresh.output, others[2]], tmp_path / "m.rosebundle")
    assert summary.output.read_bytes() == tiny_build.data
    assert summary.compiled == 2 and summary.cached == 4  # as the shards recorded it


# ------------------------------------------------------------------------------ bad shard sets
def _merge_fails(tmp_path, paths, *says):
    out = tmp_path / "never.rosebundle"
    result = run("merge", *paths, "-o", out)
    assert result.exit_code == 2, result.output
    assert "Error:" in result.output
    for text in says:
        assert text in result.output, result.output
    assert not out.exists() and not report_path(out).exists()  # nothing written on failure
    return result.output


def test_merge_fails_on_a_missing_shard(tiny_build, tmp_path):
    s1, s2, s3 = shard_files(tiny_build, tmp_path, 3)
    _merge_fails(tmp_path, [s1, s3], "missing shard(s) 2/3")
    _merge_fails(tmp_path, [s2], "missing shard(s) 1/3, 3/3")


def test_merge_fails_on_a_duplicate_shard(tiny_build, tmp_path):
    s1, s2, s3 = shard_files(tiny_build, tmp_path, 3)
    copy = tmp_path / "copy-of-2.roseshard"
    shutil.copy(s2, copy)
    _merge_fails(tmp_path, [s1, s2, copy, s3], "shard 2/3 is given twice", str(copy))


def test_merge_fails_on_shards_of_different_counts(tiny_build, tmp_path):
    (a1, _, a3) = shard_files(tiny_build, tmp_path, 3, tag="a")
    (_, b2) = shard_files(tiny_build, tmp_path, 2, tag="b")
    _merge_fails(tmp_path, [a1, b2, a3], "a build of 2 shards", "one of 3")


def test_merge_fails_on_shards_of_different_manifests(tiny_build, tmp_path):
    other = tmp_path / "tiny.toml"
    other.write_text(tiny_build.manifest.read_text().replace("hidden = 1024", "hidden = 2048"))
    (a1, _) = shard_files(tiny_build, tmp_path, 2, tag="a")
    plan_b = BuildPlan.from_manifests([load_manifest(other)])
    # Shard 2 of the other manifests; its items are never compiled: only the plan is compared.
    b2 = tmp_path / "b-2.roseshard"
    rewrite_bundle(
        a1,
        b2,
        edit_index=lambda ix: ix.update(
            shard={"index": 2, "count": 2},
            plan=plan_b.to_json(),
            plan_digest=plan_b.digest,
            results=[],
        ),
        edit_blobs=lambda blobs: blobs.clear(),
    )
    _merge_fails(tmp_path, [a1, b2], "other manifest contents or archs (tiny)")


def _with_plan(src, dst, change):
    """A copy of shard `src` whose plan `change` edits (digest kept consistent)."""

    def edit(index):
        plan = BuildPlan.from_json(index["plan"])
        data = plan.to_json()
        change(data)
        index["plan"] = data
        index["plan_digest"] = BuildPlan.from_json(data).digest

    return rewrite_bundle(src, dst, edit_index=edit)


def test_merge_fails_on_shards_from_another_toolchain(tiny_build, tmp_path):
    s1, s2 = shard_files(tiny_build, tmp_path, 2)
    other = _with_plan(
        s2,
        tmp_path / "other-2.roseshard",
        lambda plan: plan["toolchain"]["packages"].update({"nvidia-cutlass-dsl": "9.9.9"}),
    )
    _merge_fails(tmp_path, [s1, other], "another toolchain (nvidia-cutlass-dsl 9.9.9 vs")


def test_merge_fails_on_shards_from_other_kernel_sources(tiny_build, tmp_path):
    s1, s2 = shard_files(tiny_build, tmp_path, 2)
    other = _with_plan(
        s2,
        tmp_path / "other-2.roseshard",
        lambda plan: plan["source_digests"].update({"qk_norm": "0" * 64}),
    )
    _merge_fails(tmp_path, [s1, other], "other kernel sources (families qk_norm)")


def test_merge_fails_when_all_shards_come_from_other_sources_than_this_checkout(
    tiny_build, tmp_path
):
    paths = shard_files(tiny_build, tmp_path, 2)
    moved = [
        _with_plan(
            p,
            tmp_path / f"old-{i}.roseshard",
            lambda plan: plan["source_digests"].update({"rms_norm": "0" * 64}),
        )
        for i, p in enumerate(paths)
    ]
    _merge_fails(tmp_path, moved, "other rms_norm kernel sources than this checkout")


def test_merge_fails_on_a_shard_holding_another_shards_items(tiny_build, tmp_path):
    s1, s2 = shard_files(tiny_build, tmp_path, 2)
    swapped = rewrite_bundle(
        s1,
        tmp_path / "swapped.roseshard",
        edit_index=lambda ix: ix["shard"].update(index=2),
    )
    _merge_fails(tmp_path, [s1, swapped], "does not hold exactly its items")


def test_merge_rejects_inputs_that_are_not_shards(tiny_build, tmp_path):
    s1, s2 = shard_files(tiny_build, tmp_path, 2)
    _merge_fails(tmp_path, [s1, tiny_build.path], "is a finished bundle, not a build shard")
    _merge_fails(tmp_path, [tiny_build.manifest], "not a rose-aot bundle")
    _merge_fails(tmp_path, [tmp_path / "nope.roseshard"], "no such bundle file")
    garbage = tmp_path / "garbage.roseshard"
    garbage.write_bytes(b"\x00\x01" * 100)
    _merge_fails(tmp_path, [garbage], "not a rose-aot bundle")
    truncated = tmp_path / "truncated.roseshard"
    truncated.write_bytes(s1.read_bytes()[:-10])
    _merge_fails(tmp_path, [truncated, s2], "truncated")
    damaged = rewrite_bundle(
        s1, tmp_path / "damaged.roseshard", edit_index=lambda ix: ix.pop("plan_digest")
    )
    _merge_fails(tmp_path, [damaged, s2], "damaged or unreadable build shard", "plan_digest")


def test_merge_rejects_a_shard_whose_records_do_not_match_its_artifacts(tiny_build, tmp_path):
    """A shard carries each item's kernel record; reading it checks every artifact against its
    record (sha256, and the cubin's entries, block and parameters), so a record that names
    other artifacts never reaches a merged bundle."""
    s1, s2 = shard_files(tiny_build, tmp_path, 2)

    def other_block(ix):
        variant = ix["results"][0]["record"]["variants"][0]
        variant["block"] = [variant["block"][0] * 2, 1, 1]

    def swap_cubins(blobs):
        cubins = sorted(n for n in blobs if n.endswith(".cubin"))
        blobs[cubins[0]], blobs[cubins[1]] = blobs[cubins[1]], blobs[cubins[0]]

    cases = {
        "sha": dict(edit_index=lambda ix: ix["results"][0]["record"]["variants"][0].update(
            cubin_sha256="0" * 64)),
        "block": dict(edit_index=other_block),
        "swapped": dict(edit_blobs=swap_cubins),
    }
    for name, edits in cases.items():
        bad = rewrite_bundle(s1, tmp_path / f"bad-{name}.roseshard", **edits)
        _merge_fails(tmp_path, [bad, s2], "damaged or unreadable build shard", str(bad))
        with pytest.raises(ShardError):
            read_shard(bad)


def test_read_shard_errors_are_rose_aot_errors(tiny_build, tmp_path):
    with pytest.raises(ShardError, match="finished bundle"):
        read_shard(tiny_build.path)
    with pytest.raises(BundleError, match="no such bundle file"):
        read_shard(tmp_path / "missing.roseshard")
    with pytest.raises(ShardError, match="no shards given"):
        merge_shards([], tmp_path / "x.rosebundle")


def test_build_rejects_a_bad_shard_spec(tiny_build):
    for spec, says in [("3/2", "outside 1..2"), ("0/1", "outside 1..1"), ("x", "write I/N")]:
        result = run(
            "build", tiny_build.manifest, "--shard", spec, "--cache-dir", tiny_build.cache_dir
        )
        assert result.exit_code == 2, result.output
        assert "Invalid value for '--shard'" in result.output and says in result.output


def test_default_shard_output_name(tiny_build, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run(
        "build", tiny_build.manifest, "--shard", "2/3", "--cache-dir", tiny_build.cache_dir, "-q"
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "build" / "tiny.shard-2-of-3.roseshard").is_file()
    assert (tmp_path / "build" / "tiny.shard-2-of-3.roseshard.report.json").is_file()


# ------------------------------------------------------------------------------ build report
def test_build_report_lists_every_item(tiny_build):
    report = build_report(tiny_build.summary)
    assert report["kind"] == REPORT_KIND
    assert report["output_kind"] == "rose-aot kernel bundle" and report["shard"] is None
    assert report["bytes"] == len(tiny_build.data)
    reader = BundleReader.open(tiny_build.path)
    assert [(i["key"], i["arch"]) for i in report["items"]] == [
        (p["key"], p["arch"]) for p in reader.index["points"]
    ]
    for item in report["items"]:
        assert item["cached"] is False and item["seconds"] > 0
        assert item["family"] in ("rms_norm", "qk_norm")
        point = next(
            p
            for p in reader.index["points"]
            if (p["key"], p["arch"]) == (item["key"], item["arch"])
        )
        assert [v["name"] for v in item["variants"]] == [v["name"] for v in point["variants"]]
        for v, rec in zip(item["variants"], point["variants"], strict=True):
            assert v["cubin_bytes"] == reader.blob_info(rec["cubin"])["raw_size"]
            assert v["ptx_bytes"] == reader.blob_info(rec["ptx"])["raw_size"]
            assert v["stored_bytes"] == (
                reader.blob_info(rec["cubin"])["size"] + reader.blob_info(rec["ptx"])["size"]
            )
            assert v["compile_seconds"] > 0
        assert item["cubin_bytes"] == sum(v["cubin_bytes"] for v in item["variants"])
    totals = report["totals"]
    assert (totals["points"], totals["items"], totals["compiled"], totals["cached"]) == (3, 6, 6, 0)
    assert totals["stored_bytes"] == sum(i["stored_bytes"] for i in report["items"])


def test_cli_build_writes_the_report_next_to_the_bundle(tiny_build, tmp_path):
    out = tmp_path / "again.rosebundle"
    result = run(
        "build", tiny_build.manifest, "-o", out, "--cache-dir", tiny_build.cache_dir, "-q", "--json"
    )
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["report"] == str(tmp_path / "again.rosebundle.report.json")
    report = json.loads((tmp_path / "again.rosebundle.report.json").read_text())
    assert report["output"] == str(out) and report["totals"]["cached"] == 6
    assert all(i["cached"] and i["seconds"] == 0 for i in report["items"])
    assert out.read_bytes() == tiny_build.data
    custom = tmp_path / "reports" / "r.json"
    result = run(
        "build",
        tiny_build.manifest,
        "-o",
        out,
        "--cache-dir",
        tiny_build.cache_dir,
        "-q",
        "--report",
        custom,
    )
    assert result.exit_code == 0 and json.loads(custom.read_text())["kind"] == REPORT_KIND
