"""`rose-aot check` and rose_aot.check_bundle: passing with a line per manifest, failing with the
exact list of missing (point, arch) pairs, archs from the manifests or --arch, the minimum-driver
table, clear errors (exit 2) for bad inputs, and no cutlass behind the Python check."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fixtures_tiny import TINY_TOML, rewrite_bundle
from rose_aot import CoverageError, CoverageReport, check_bundle, open_bundle
from rose_aot.builder.build import ArtifactCache, build_bundle
from rose_aot.bundle import BundleReader
from rose_aot.check import (
    DEFAULT_MIN_DRIVER,
    Missing,
    driver_requirement,
    parse_driver_version,
)
from rose_aot.cli import main as cli
from rose_aot.errors import BundleError, ManifestError
from rose_aot.kernels import get_family
from rose_aot.manifest import load_manifest

from conftest import REPO


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def key(family, **values):
    fam = get_family(family)
    return fam.key(fam.make_config(**values))


RMS_F = key("rms_norm", hidden=1024, fused_residual=False)
RMS_T = key("rms_norm", hidden=1024, fused_residual=True)
QK = key("qk_norm", num_q_heads=8, num_k_heads=2, head_dim=64)
RMS_2048 = key("rms_norm", hidden=2048)

SUBSET = """\
[deployment]
name = "subset"
archs = ["sm_100a"]

[[kernel]]
family = "qk_norm"
num_q_heads = 8
num_k_heads = 2
head_dim = 64
"""

BIGGER = """\
[deployment]
name = "bigger"
archs = ["sm_90a", "sm_100a"]

[[kernel]]
family = "rms_norm"
hidden = 1024
fused_residual = [false, true]

[[kernel]]
family = "rms_norm"
hidden = 2048
"""


@pytest.fixture(scope="module")
def hopper_only(tiny_build, tmp_path_factory):
    """The tiny manifest built for sm_90a only (from the warm cache: no compile)."""
    out = tmp_path_factory.mktemp("hopper") / "hopper.rosebundle"
    summary = build_bundle(
        [load_manifest(tiny_build.manifest)],
        out,
        archs=("sm_90a",),
        cache=ArtifactCache(tiny_build.cache_dir),
    )
    assert summary.compiled == 0
    return out


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------ passing
def test_check_passes_with_a_line_per_manifest(tiny_build, tmp_path):
    subset = write(tmp_path / "subset.toml", SUBSET)
    result = run("check", "--bundle", tiny_build.path, tiny_build.manifest, subset)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        f"ok    tiny: 3 points x 2 archs (sm_90a, sm_100a) covered by {tiny_build.path}"
    )
    assert lines[1] == f"ok    subset: 1 points x 1 archs (sm_100a) covered by {tiny_build.path}"
    assert lines[2] == (
        f"ok    driver: stated minimum {DEFAULT_MIN_DRIVER} loads the cubins "
        "(they need sm_90a 525.60.13, sm_100a 570.26)"
    )
    assert len(lines) == 3


def test_check_a_folder_of_manifests(tiny_build, tmp_path):
    folder = tmp_path / "manifests"
    folder.mkdir()
    write(folder / "tiny.toml", TINY_TOML)
    write(folder / "subset.toml", SUBSET)
    result = run("check", "--bundle", tiny_build.path, folder)
    assert result.exit_code == 0, result.output
    assert [line.split()[1] for line in result.output.splitlines()] == [
        "subset:",
        "tiny:",
        "driver:",
    ]


# ------------------------------------------------------------------------------ failing
def test_check_fails_with_the_exact_missing_list(tiny_build, tmp_path):
    bigger = write(tmp_path / "bigger.toml", BIGGER)
    result = run("check", "--bundle", tiny_build.path, tiny_build.manifest, bigger)
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("ok    tiny: ")
    assert lines[1:4] == [
        f"FAIL  bigger: 2 of 6 (point, arch) pairs missing from {tiny_build.path}:",
        f"        {RMS_2048} @ sm_90a",
        f"        {RMS_2048} @ sm_100a",
    ]
    assert lines[4].startswith("ok    driver:")

    report = check_bundle(tiny_build.path, [tiny_build.manifest, bigger])
    assert not report.ok
    assert report.missing == [
        Missing("bigger", RMS_2048, "sm_90a"),
        Missing("bigger", RMS_2048, "sm_100a"),
    ]
    assert [c.ok for c in report.manifests] == [True, False]


def test_missing_arch_is_listed_point_by_point(tiny_build, hopper_only):
    result = run("check", "--bundle", hopper_only, tiny_build.manifest)
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[:4] == [
        f"FAIL  tiny: 3 of 6 (point, arch) pairs missing from {hopper_only}:",
        f"        {RMS_F} @ sm_100a",
        f"        {RMS_T} @ sm_100a",
        f"        {QK} @ sm_100a",
    ]
    # The driver verdict covers the archs the bundle has.
    assert result.output.splitlines()[4] == (
        f"ok    driver: stated minimum {DEFAULT_MIN_DRIVER} loads the cubins "
        "(they need sm_90a 525.60.13)"
    )


def test_arch_option_overrides_the_manifests_archs(tiny_build, hopper_only):
    result = run("check", "--bundle", hopper_only, tiny_build.manifest, "--arch", "sm_90a")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("ok    tiny: 3 points x 1 archs (sm_90a)")
    result = run("check", "--bundle", tiny_build.path, tiny_build.manifest, "--arch", "sm_100a")
    assert result.exit_code == 0, result.output
    result = run("check", "--bundle", hopper_only, tiny_build.manifest, "--arch", "sm_100a")
    assert result.exit_code == 1 and "3 of 3 (point, arch) pairs missing" in result.output


def test_json_report(tiny_build, tmp_path):
    bigger = write(tmp_path / "bigger.toml", BIGGER)
    result = run("check", "--bundle", tiny_build.path, bigger, "--json")
    assert result.exit_code == 1
    out = json.loads(result.output)
    assert out["ok"] is False and out["bundle"] == str(tiny_build.path)
    assert out["missing"] == [
        {"manifest": "bigger", "key": RMS_2048, "arch": "sm_90a"},
        {"manifest": "bigger", "key": RMS_2048, "arch": "sm_100a"},
    ]
    (m,) = out["manifests"]
    assert (m["name"], m["points"], m["archs"], m["ok"]) == (
        "bigger",
        3,
        ["sm_90a", "sm_100a"],
        False,
    )
    assert out["driver"]["ok"] is True and out["driver"]["min_driver"] == DEFAULT_MIN_DRIVER
    assert out["driver"]["required"] == {
        "cubin": {"sm_90a": "525.60.13", "sm_100a": "570.26"},
        "ptx": "575.51.03",
        "cuda_flavour": "cu12",
        "ptx_isa": "8.8",
        "unknown": [],
    }


# ------------------------------------------------------------------------------ drivers
def test_driver_table_for_the_pinned_toolchain(tiny_build):
    toolchain = BundleReader.open(tiny_build.path).index["toolchain"]
    assert toolchain["cuda_flavour"] == "cu12" and toolchain["ptx_isa"] == "8.8"
    req = driver_requirement(toolchain, ["sm_90a", "sm_100a"])
    assert req.cubin == {"sm_90a": "525.60.13", "sm_100a": "570.26"}
    assert req.ptx == "575.51.03" and req.unknown == ()
    cu13 = {
        **toolchain,
        "cuda_flavour": "cu13",
        "ptx_isa": "9.0",
        "cubin_elf_abi": {"sm_90a": 8, "sm_100a": 8},
    }
    req = driver_requirement(cu13, ["sm_90a"])
    assert req.cubin == {"sm_90a": "580.65.06"} and req.ptx == "580.65.06"
    odd = {**toolchain, "ptx_isa": "9.4", "cubin_elf_abi": {"sm_90a": 9}}
    req = driver_requirement(odd, ["sm_90a"])
    assert req.cubin == {"sm_90a": None} and req.ptx is None
    assert req.unknown == ("PTX ISA 9.4", "sm_90a cubin ELF ABI 9")


def test_parse_driver_version():
    assert parse_driver_version("575.51.03") == (575, 51, 3)
    assert parse_driver_version("575") == (575, 0, 0)
    assert parse_driver_version("575.0") < parse_driver_version("575.51.03")
    for bad in ("", "abc", "575.51.03.1", "v575"):
        with pytest.raises(ValueError, match="not a driver version"):
            parse_driver_version(bad)


def test_min_driver_below_what_the_cubins_need_fails(tiny_build):
    result = run(
        "check", "--bundle", tiny_build.path, tiny_build.manifest, "--min-driver", "560.28.03"
    )
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("ok    tiny:")
    assert lines[1] == (
        "FAIL  driver: the sm_100a cubins (cu12 toolchain, ELF ABI 8) need driver >= 570.26, "
        "newer than the stated minimum 560.28.03; build with an older toolchain or raise the "
        "minimum"
    )
    assert lines[2] == (
        "note  the PTX fallback (use_ptx=True; PTX ISA 8.8) needs driver >= 575.51.03; drivers "
        "between 560.28.03 and it load only the cubins"
    )
    # Hopper alone loads on that driver; the PTX note stays a note.
    result = run(
        "check",
        "--bundle",
        tiny_build.path,
        tiny_build.manifest,
        "--min-driver",
        "560.28.03",
        "--arch",
        "sm_90a",
    )
    assert result.exit_code == 0, result.output
    assert (
        run(
            "check", "--bundle", tiny_build.path, tiny_build.manifest, "--min-driver", "570.26"
        ).exit_code
        == 0
    )


def test_a_newer_toolchain_than_the_stated_driver_fails(tiny_build, tmp_path):
    def cu13(index):
        index["toolchain"].update(cuda_flavour="cu13", ptx_isa="9.0")

    newer = rewrite_bundle(tiny_build.path, tmp_path / "cu13.rosebundle", edit_index=cu13)
    report = check_bundle(newer, tiny_build.manifest)
    assert not report.ok and report.missing == []
    assert report.driver.cubin == {"sm_90a": "580.65.06", "sm_100a": "580.65.06"}
    assert len(report.driver_problems) == 2
    assert all("need driver >= 580.65.06" in p for p in report.driver_problems)
    assert check_bundle(newer, tiny_build.manifest, min_driver="580.65.06").ok


def test_an_unknown_toolchain_fails_rather_than_guessing(tiny_build, tmp_path):
    def odd(index):
        index["toolchain"]["cubin_elf_abi"]["sm_90a"] = 42

    unknown = rewrite_bundle(tiny_build.path, tmp_path / "odd.rosebundle", edit_index=odd)
    result = run("check", "--bundle", unknown, tiny_build.manifest)
    assert result.exit_code == 1
    assert (
        "FAIL  driver: cannot tell which driver loads the sm_90a cubins of this toolchain "
        "(sm_90a cubin ELF ABI 42); add it to the tables in rose_aot/check.py"
    ) in result.output.splitlines()


# ------------------------------------------------------------------------------ Python API
def test_python_api_takes_paths_readers_bundles_and_manifests(tiny_build, tmp_path):
    manifest = load_manifest(tiny_build.manifest)
    for bundle in (
        tiny_build.path,
        str(tiny_build.path),
        BundleReader.open(tiny_build.path),
        open_bundle(tiny_build.path),
    ):
        for manifests in (manifest, [manifest], tiny_build.manifest, [str(tiny_build.manifest)]):
            report = check_bundle(bundle, manifests)
            assert isinstance(report, CoverageReport) and report.ok
            report.raise_if_failed()


def test_raise_if_failed_names_every_missing_pair(tiny_build, hopper_only):
    report = check_bundle(hopper_only, tiny_build.manifest)
    with pytest.raises(CoverageError) as info:
        report.raise_if_failed()
    assert str(info.value).splitlines() == [
        f"the bundle {hopper_only} lacks 3 (point, arch) pair(s):",
        f"  tiny: {RMS_F} @ sm_100a",
        f"  tiny: {RMS_T} @ sm_100a",
        f"  tiny: {QK} @ sm_100a",
        "add them to the manifests and rebuild the bundle",
    ]
    assert info.value.report is report
    copy = pickle.loads(pickle.dumps(info.value))
    assert str(copy) == str(info.value) and copy.report.missing == report.missing


def test_the_check_imports_no_cutlass(tiny_build):
    code = (
        "import sys\n"
        "import rose_aot\n"
        f"report = rose_aot.check_bundle({str(tiny_build.path)!r}, {str(tiny_build.manifest)!r})\n"
        "report.raise_if_failed()\n"
        "bad = sorted(m for m in sys.modules if m == 'cutlass' or m.startswith('cutlass.'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# ------------------------------------------------------------------------------ errors: exit 2
def test_a_bundle_where_a_manifest_is_expected(tiny_build):
    result = run("check", "--bundle", tiny_build.path, tiny_build.path)
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        f"Error: {tiny_build.path}: is a rose-aot bundle, not a manifest; pass the manifest "
        ".toml files here (a bundle goes to --bundle, or to `rose-aot inspect`)"
    )
    with pytest.raises(ManifestError, match="is a rose-aot bundle, not a manifest"):
        check_bundle(tiny_build.path, tiny_build.path)


def test_a_manifest_where_the_bundle_is_expected(tiny_build):
    result = run("check", "--bundle", tiny_build.manifest, tiny_build.manifest)
    assert result.exit_code == 2
    assert f"Error: {tiny_build.manifest}: not a rose-aot bundle" in result.output


@pytest.mark.parametrize(
    "args, says",
    [
        (["--bundle", "{tmp}/none.rosebundle", "{manifest}"], "no such bundle file"),
        (["--bundle", "{bundle}", "{tmp}/none.toml"], "no such file"),
        (["--bundle", "{bundle}", "{manifest}", "--arch", "sm_75"], "unknown arch 'sm_75'"),
        (["--bundle", "{shard}", "{manifest}"], "must be merged first"),
        (["--bundle", "{bundle}", "{manifest}", "--min-driver", "abc"], "not a driver version"),
        (["{manifest}"], "Missing option '--bundle'"),
        (["--bundle", "{bundle}"], "Missing argument 'MANIFESTS...'"),
    ],
    ids=[
        "no-bundle",
        "no-manifest",
        "bad-arch",
        "shard",
        "bad-driver",
        "no-bundle-option",
        "no-manifests",
    ],
)
def test_bad_inputs_exit_two(tiny_build, tmp_path, args, says):
    shard = tmp_path / "s.roseshard"
    if "{shard}" in args:
        assert (
            run(
                "build",
                tiny_build.manifest,
                "--shard",
                "1/1",
                "-o",
                shard,
                "--cache-dir",
                tiny_build.cache_dir,
                "-q",
            ).exit_code
            == 0
        )
    values = {
        "tmp": tmp_path,
        "manifest": tiny_build.manifest,
        "bundle": tiny_build.path,
        "shard": shard,
    }
    result = run("check", *[a.format(**values) for a in args])
    assert result.exit_code == 2, result.output
    assert says in result.output


def test_a_malformed_index_is_an_error_not_a_crash(tiny_build, tmp_path):
    odd_toolchain = rewrite_bundle(
        tiny_build.path,
        tmp_path / "tc.rosebundle",
        edit_index=lambda ix: ix.update(toolchain=["not", "a", "table"]),
    )
    with pytest.raises(BundleError, match='"toolchain" must be an object'):
        check_bundle(odd_toolchain, tiny_build.manifest)
    bad_points = rewrite_bundle(
        tiny_build.path, tmp_path / "pts.rosebundle", edit_index=lambda ix: ix.update(points=7)
    )
    result = run("check", "--bundle", bad_points, tiny_build.manifest)
    assert result.exit_code == 2 and '"points" must be an array' in result.output


def test_import_rose_aot_leaves_the_manifest_reader_until_check_bundle_is_named():
    """A serving process's `import rose_aot` does not import rose_aot.check and the manifest
    reader (TOML); naming check_bundle or CoverageReport imports them."""
    import subprocess
    import sys

    code = (
        "import sys, rose_aot\n"
        "before = sorted(m for m in ('rose_aot.check', 'rose_aot.manifest', 'tomllib')"
        " if m in sys.modules)\n"
        "from rose_aot import check_bundle, CoverageReport\n"
        "import rose_aot.check as c\n"
        "assert check_bundle is c.check_bundle and CoverageReport is c.CoverageReport\n"
        "assert 'check_bundle' in dir(rose_aot) and 'open_bundle' in dir(rose_aot)\n"
        "try:\n"
        "    rose_aot.no_such_name\n"
        "except AttributeError as exc:\n"
        "    print(before, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] module 'rose_aot' has no attribute 'no_such_name'"
