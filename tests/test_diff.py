"""`rose-aot diff`: hand-made manifest pairs (added, removed, changed, archs), mixed inputs
(manifest vs bundle, folders), bundle pairs whose artifacts changed (kernel source, toolchain,
artifact bytes), the exit codes 0 / 1 / 2 and clear errors for bad inputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures_tiny import TINY_TOML, rewrite_bundle
from rose_aot.bundle import HEADER_SIZE
from rose_aot.cli import main as cli
from rose_aot.errors import ManifestError
from rose_aot.kernels import FAMILIES, config_json, get_family
from rose_aot.manifest.diff import diff_paths


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def diff_json(a, b) -> tuple[int, dict]:
    result = run("diff", a, b, "--json")
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.output)


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def key(family, **values):
    fam = get_family(family)
    return fam.key(fam.make_config(**values))


def config(family, **values):
    fam = get_family(family)
    return config_json(fam.make_config(**values))


A = """\
[deployment]
name = "a"
archs = ["sm_90a", "sm_100a"]

[[kernel]]
family = "rms_norm"
hidden = 4096
eps = 1e-6
fused_residual = [false, true]

[[kernel]]
family = "rms_norm"
hidden = 1024

[[kernel]]
family = "qk_norm"
num_q_heads = 32
num_k_heads = 8
head_dim = 128

[[kernel]]
family = "qk_norm"
num_q_heads = 16
num_k_heads = 8
head_dim = 256
"""

# eps changes for both hidden=4096 points; hidden=1024 is gone; hidden=2048 is new; the first
# qk_norm shape changes its dtype; the second one is only built for sm_90a now; a new qk shape.
B = """\
[deployment]
name = "b"
archs = ["sm_90a", "sm_100a"]

[[kernel]]
family = "rms_norm"
hidden = 4096
eps = 1e-5
fused_residual = [false, true]

[[kernel]]
family = "rms_norm"
hidden = 2048

[[kernel]]
family = "qk_norm"
num_q_heads = 32
num_k_heads = 8
head_dim = 128
dtype = "float16"
"""

B_SM90 = """\
[deployment]
name = "b-hopper"
archs = ["sm_90a"]

[[kernel]]
family = "qk_norm"
num_q_heads = 16
num_k_heads = 8
head_dim = 256

[[kernel]]
family = "qk_norm"
num_q_heads = 32
num_k_heads = 4
head_dim = 128
"""

BOTH = ["sm_90a", "sm_100a"]


# ------------------------------------------------------------------------------ shape fields
def test_every_family_declares_shape_fields_that_are_config_fields():
    assert get_family("rms_norm").shape_fields == ("hidden",)
    assert get_family("qk_norm").shape_fields == ("num_q_heads", "num_k_heads", "head_dim")
    for family in FAMILIES.values():
        if family.shape_fields is not None:
            names = {f for f in family.Config.__dataclass_fields__}
            assert set(family.shape_fields) <= names, family.name


# ------------------------------------------------------------------------------ manifests
def test_hand_made_pair_added_removed_changed_archs(tmp_path):
    a = write(tmp_path / "a.toml", A)
    bdir = tmp_path / "b"
    bdir.mkdir()
    write(bdir / "b.toml", B)
    write(bdir / "b-hopper.toml", B_SM90)
    code, out = diff_json(a, bdir)
    assert code == 1 and out["same"] is False
    assert out["a"] == {"path": str(a), "kind": "manifest"}
    assert out["b"] == {"path": str(bdir), "kind": "manifests"}
    assert out["counts"] == {
        "added": 2,
        "removed": 1,
        "changed": 3,
        "archs_changed": 1,
        "artifacts_changed": 0,
    }
    assert list(out["families"]) == ["qk_norm", "rms_norm"]
    rms, qk = out["families"]["rms_norm"], out["families"]["qk_norm"]

    assert rms["added"] == [
        {
            "key": key("rms_norm", hidden=2048),
            "config": config("rms_norm", hidden=2048),
            "archs": BOTH,
        }
    ]
    assert rms["removed"] == [
        {
            "key": key("rms_norm", hidden=1024),
            "config": config("rms_norm", hidden=1024),
            "archs": BOTH,
        }
    ]
    # Paired plain with plain and fused with fused: the fewest differing fields win.
    assert rms["changed"] == [
        {
            "from": key("rms_norm", hidden=4096, eps=1e-6, fused_residual=fused),
            "to": key("rms_norm", hidden=4096, eps=1e-5, fused_residual=fused),
            "shape": {"hidden": 4096},
            "fields": {"eps": [1e-6, 1e-5]},
            "archs": [BOTH, BOTH],
        }
        for fused in (False, True)
    ]
    assert rms["archs_changed"] == [] and rms["artifacts_changed"] == []

    assert qk["changed"] == [
        {
            "from": key("qk_norm", num_q_heads=32, num_k_heads=8, head_dim=128),
            "to": key("qk_norm", num_q_heads=32, num_k_heads=8, head_dim=128, dtype="float16"),
            "shape": {"num_q_heads": 32, "num_k_heads": 8, "head_dim": 128},
            "fields": {"dtype": ["bfloat16", "float16"], "weight_dtype": ["bfloat16", "float16"]},
            "archs": [BOTH, BOTH],
        }
    ]
    # Another shape is not a change: it is added.
    assert qk["added"] == [
        {
            "key": key("qk_norm", num_q_heads=32, num_k_heads=4, head_dim=128),
            "config": config("qk_norm", num_q_heads=32, num_k_heads=4, head_dim=128),
            "archs": ["sm_90a"],
        }
    ]
    assert qk["removed"] == []
    assert qk["archs_changed"] == [
        {
            "key": key("qk_norm", num_q_heads=16, num_k_heads=8, head_dim=256),
            "added": [],
            "removed": ["sm_100a"],
        }
    ]
    assert out["toolchain"] == {} and out["sources"] == {}


def test_human_table_groups_by_family(tmp_path):
    a = write(tmp_path / "a.toml", A)
    b = write(tmp_path / "b.toml", B)
    result = run("diff", a, b)
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0] == f"--- {a} (manifest)" and lines[1] == f"+++ {b} (manifest)"
    assert lines[3].split() == ["family", "change", "archs", "point"]
    rows = [line.split()[:2] for line in lines[4:] if line and not line.startswith(" ")]
    families = [r[0] for r in rows if r[0] in ("rms_norm", "qk_norm")]
    assert families == sorted(families)  # grouped, families in name order
    assert ["rms_norm", "changed"] in rows and ["rms_norm", "added"] in rows
    assert ["rms_norm", "removed"] in rows and ["qk_norm", "changed"] in rows
    assert any(line.strip() == "-> eps 1e-06 -> 1e-05" for line in lines)
    assert "sm_90a,sm_100a" in result.output  # archs in arch order, not string order
    assert lines[-1] == "differs: 1 added, 2 removed, 3 changed"


def test_same_points_exit_zero_whatever_the_names_and_order(tmp_path):
    a = write(tmp_path / "a.toml", A)
    shuffled = "\n".join(
        ["[deployment]", 'name = "other"', 'archs = ["sm_100a", "sm_90a"]', ""]
        + [block for block in reversed(A.split("\n\n")[1:])]
    )
    b = write(tmp_path / "b.toml", shuffled)
    result = run("diff", a, b)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "same kernel points"
    assert diff_paths(a, b).same


# ------------------------------------------------------------------------------ mixed inputs
def test_bundle_versus_its_own_manifest_is_the_same(tiny_build):
    for a, b in [
        (tiny_build.path, tiny_build.manifest),
        (tiny_build.manifest, tiny_build.path),
        (tiny_build.path, tiny_build.path),
    ]:
        result = run("diff", a, b)
        assert result.exit_code == 0, result.output
    code, out = diff_json(tiny_build.path, tiny_build.manifest)
    assert code == 0 and out["a"]["kind"] == "bundle" and out["b"]["kind"] == "manifest"


def test_bundle_versus_a_changed_manifest(tiny_build, tmp_path):
    changed = write(
        tmp_path / "next.toml",
        TINY_TOML.replace('archs = ["sm_90a", "sm_100a"]', 'archs = ["sm_90a"]').replace(
            "head_dim = 64", "head_dim = 64\neps = 1e-5"
        )
        + '\n[[kernel]]\nfamily = "rms_norm"\nhidden = 8192\n',
    )
    code, out = diff_json(tiny_build.path, changed)
    assert code == 1
    assert out["counts"] == {
        "added": 1,
        "removed": 0,
        "changed": 1,
        "archs_changed": 2,
        "artifacts_changed": 0,
    }
    qk = out["families"]["qk_norm"]["changed"][0]
    assert qk["fields"] == {"eps": [1e-6, 1e-5]}
    assert qk["archs"] == [BOTH, ["sm_90a"]]
    assert {c["key"] for c in out["families"]["rms_norm"]["archs_changed"]} == {
        key("rms_norm", hidden=1024, fused_residual=f) for f in (False, True)
    }
    assert all(
        c["removed"] == ["sm_100a"] and c["added"] == []
        for c in out["families"]["rms_norm"]["archs_changed"]
    )
    assert out["families"]["rms_norm"]["added"][0]["key"] == key("rms_norm", hidden=8192)
    # A manifest has no artifacts: no artifact comparison, no toolchain section.
    assert out["toolchain"] == {} and out["sources"] == {}


# ------------------------------------------------------------------------------ bundle pairs
def test_bundles_whose_kernel_source_changed(tiny_build, tmp_path):
    other = rewrite_bundle(
        tiny_build.path,
        tmp_path / "src.rosebundle",
        edit_index=lambda ix: ix["families"]["qk_norm"].update(source_digest="f" * 64),
    )
    code, out = diff_json(tiny_build.path, other)
    assert code == 1
    assert out["sources"] == {
        "qk_norm": [BundleIndex(tiny_build.path)["families"]["qk_norm"]["source_digest"], "f" * 64]
    }
    assert out["counts"]["artifacts_changed"] == 2 and out["counts"]["added"] == 0
    changes = out["families"]["qk_norm"]["artifacts_changed"]
    assert [(c["arch"], c["reasons"], c["artifacts_identical"]) for c in changes] == [
        ("sm_90a", ["kernel source"], True),
        ("sm_100a", ["kernel source"], True),
    ]
    assert "rms_norm" not in out["families"]
    text = run("diff", tiny_build.path, other).output
    assert "rebuilt" in text and "-> kernel source (artifacts identical)" in text
    assert "kernel sources:\n  qk_norm:" in text


def test_bundles_whose_toolchain_changed(tiny_build, tmp_path):
    def edit(index):
        index["toolchain"]["packages"]["nvidia-cutlass-dsl"] = "9.9.9"

    other = rewrite_bundle(tiny_build.path, tmp_path / "tc.rosebundle", edit_index=edit)
    code, out = diff_json(tiny_build.path, other)
    assert code == 1
    before = BundleIndex(tiny_build.path)["toolchain"]["packages"]["nvidia-cutlass-dsl"]
    assert out["toolchain"] == {"packages.nvidia-cutlass-dsl": [before, "9.9.9"]}
    assert out["counts"]["artifacts_changed"] == 6  # every (point, arch)
    for fam in out["families"].values():
        assert all(c["reasons"] == ["toolchain"] for c in fam["artifacts_changed"])


def test_bundles_whose_artifact_bytes_changed(tiny_build, tmp_path):
    index = BundleIndex(tiny_build.path)
    point = next(p for p in index["points"] if p["family"] == "rms_norm" and p["arch"] == "sm_100a")
    ptx_blob = point["variants"][-1]["ptx"]

    def edit(blobs):
        blobs[ptx_blob] = blobs[ptx_blob] + b"\n// rebuilt\n"

    other = rewrite_bundle(tiny_build.path, tmp_path / "bytes.rosebundle", edit_blobs=edit)
    code, out = diff_json(tiny_build.path, other)
    assert code == 1
    assert out["counts"] == {
        "added": 0,
        "removed": 0,
        "changed": 0,
        "archs_changed": 0,
        "artifacts_changed": 1,
    }
    (change,) = out["families"]["rms_norm"]["artifacts_changed"]
    assert change == {
        "key": point["key"],
        "arch": "sm_100a",
        "reasons": ["artifact sha256"],
        "variants_changed": [point["variants"][-1]["name"]],
        "artifacts_identical": False,
    }


def BundleIndex(path) -> dict:
    from rose_aot.bundle import BundleReader

    return BundleReader.open(path).index


# ------------------------------------------------------------------------------ errors: exit 2
@pytest.mark.parametrize(
    "make, says",
    [
        (lambda d: d / "missing.toml", "no such file"),
        (lambda d: write(d / "bad.toml", "[[kernel]]\nfamily = 'nope'\n"), "unknown kernel family"),
        (lambda d: write(d / "not-toml.toml", "= = ="), "invalid TOML"),
        (lambda d: (d / "bin.dat").write_bytes(b"\x00\xff" * 64) and d / "bin.dat", "binary file"),
        (lambda d: (d / "empty-dir").mkdir() or d / "empty-dir", "has no *.toml manifests"),
    ],
    ids=["missing", "invalid-manifest", "not-toml", "binary", "empty-folder"],
)
def test_bad_inputs_exit_two_with_a_clear_error(tiny_build, tmp_path, make, says):
    bad = make(tmp_path)
    for args in [(bad, tiny_build.manifest), (tiny_build.path, bad)]:
        result = run("diff", *args)
        assert result.exit_code == 2, result.output
        assert result.output.startswith("Error: ") and str(bad) in result.output
        assert says in result.output


def test_unreadable_file_exits_two(tiny_build, tmp_path, monkeypatch):
    locked = write(tmp_path / "locked.toml", A)
    if os.geteuid() == 0:
        # root reads any file whatever its mode: make this one fail the way a locked one does.
        real = Path.read_bytes

        def read_bytes(self):
            if self == locked:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self)

        monkeypatch.setattr(Path, "read_bytes", read_bytes)
    locked.chmod(0)
    try:
        result = run("diff", locked, tiny_build.manifest)
    finally:
        locked.chmod(0o644)
    assert result.exit_code == 2, result.output
    assert f"Error: {locked}: cannot read the file: permission denied" in result.output


def test_damaged_bundle_and_shard_exit_two(tiny_build, tmp_path):
    damaged = tmp_path / "damaged.rosebundle"
    data = bytearray(tiny_build.data)
    data[HEADER_SIZE + 10] ^= 1  # in the index (diff reads no artifact)
    damaged.write_bytes(bytes(data))
    result = run("diff", damaged, tiny_build.manifest)
    assert result.exit_code == 2 and "damaged bundle" in result.output
    shard = tmp_path / "s.roseshard"
    assert (
        run(
            "build",
            tiny_build.manifest,
            "--shard",
            "1/2",
            "-o",
            shard,
            "--cache-dir",
            tiny_build.cache_dir,
            "-q",
        ).exit_code
        == 0
    )
    result = run("diff", shard, tiny_build.path)
    assert result.exit_code == 2 and "merge shards first" in result.output


def test_usage_errors_exit_two(tiny_build):
    assert run("diff", tiny_build.manifest).exit_code == 2


def test_python_api_raises_rose_aot_errors(tmp_path):
    with pytest.raises(ManifestError, match="no such file"):
        diff_paths(tmp_path / "x.toml", tmp_path / "y.toml")
