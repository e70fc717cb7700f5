"""The `rose-aot` command line: help, build (progress, summary, JSON, cache, errors), inspect and
verify. Commands run in-process through click's CliRunner (stdout and stderr kept apart); one
test runs the installed console script itself.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rose_aot.bundle import HEADER_SIZE
from rose_aot.cli import main as cli

TINY = """\
[deployment]
name = "tiny"
archs = ["sm_90a"]

[[kernel]]
family = "rms_norm"
hidden = 1024
"""
TINY_KEY_PREFIX = "rms_norm(hidden=1024,"


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A one-point manifest built once: (manifest, bundle, cache dir, first run's result)."""
    root = tmp_path_factory.mktemp("cli")
    manifest = root / "tiny.toml"
    manifest.write_text(TINY)
    bundle = root / "out" / "tiny.rosebundle"
    cache = root / "cache"
    result = run("build", manifest, "-o", bundle, "--cache-dir", cache, "-j", "1")
    return manifest, bundle, cache, result


# ------------------------------------------------------------------------------ help


def test_console_script_help():
    exe = Path(sys.executable).with_name("rose-aot")
    cmd = [str(exe)] if exe.exists() else [shutil.which("rose-aot") or "rose-aot"]
    proc = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for command in ("build", "inspect", "verify"):
        assert command in proc.stdout
    assert "bundle" in proc.stdout.lower()


def test_group_help_lists_commands():
    result = run("--help")
    assert result.exit_code == 0
    for command in ("build", "inspect", "verify"):
        assert command in result.stdout
    assert "--version" in result.stdout


def test_build_help_explains_every_option():
    result = run("build", "--help")
    assert result.exit_code == 0
    text = result.stdout
    options = ("--output", "--arch", "--jobs", "--cache-dir", "--no-cache", "--json", "--quiet")
    for option in options:
        assert option in text, option
    for words in ("MANIFESTS", "sm_90a", "ROSE_AOT_CACHE_DIR", "ROSE_AOT_JOBS", "JSON", "cache"):
        assert words in text, words


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_inspect_and_verify_help(command):
    result = run(command, "--help")
    assert result.exit_code == 0 and "BUNDLE" in result.stdout and "--json" in result.stdout


# ------------------------------------------------------------------------------ build


def test_build_tiny_manifest_reports_progress_and_summary(tiny):
    manifest, bundle, cache, result = tiny
    assert result.exit_code == 0, result.output
    assert bundle.is_file() and any(cache.rglob("*.rosecache"))
    progress = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == 1
    assert progress[0].startswith("[1/1] compiled " + TINY_KEY_PREFIX) and "@ sm_90a" in progress[0]
    assert progress[0].rstrip().endswith(" s")
    summary = result.stderr.splitlines()[-1]
    assert summary.startswith(f"built {bundle}: 1 points")
    assert "1 compiled" in summary and "0 cached" in summary
    assert result.stdout == ""  # the human summary goes to stderr; stdout stays for --json


def test_second_build_is_all_cached_and_json(tiny, tmp_path):
    manifest, bundle, cache, _ = tiny
    out = tmp_path / "again.rosebundle"
    result = run("build", manifest, "-o", out, "--cache-dir", cache, "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info == {
        **info,
        "bundle": str(out),
        "manifests": ["tiny"],
        "points": 1,
        "items": 1,
        "compiled": 0,
        "cached": 1,
        "bytes": out.stat().st_size,
    }
    assert isinstance(info["seconds"], (int, float))
    assert "[1/1] cached   " + TINY_KEY_PREFIX in result.stderr
    assert out.read_bytes() == bundle.read_bytes()


def test_quiet_build_prints_no_progress(tiny, tmp_path):
    manifest, _, cache, _ = tiny
    result = run("build", manifest, "-o", tmp_path / "q.rosebundle", "--cache-dir", cache, "-q")
    assert result.exit_code == 0, result.output
    assert not [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert "1 cached" in result.stderr


BAD_MANIFESTS = [
    pytest.param(
        TINY.replace("hidden = 1024", "hidden = 1001"),
        ["kernel #1 (rms_norm)", "'hidden'", "1001"],
        id="bad-value",
    ),
    pytest.param(
        TINY.replace("hidden = 1024", "hidden = 1024\nbogus = 3"),
        ["kernel #1 (rms_norm)", "'bogus'"],
        id="unknown-field",
    ),
    pytest.param(
        TINY.replace('archs = ["sm_90a"]', 'archs = ["sm_75"]'), ["deployment", "'archs'", "sm_75"],
        id="bad-arch",
    ),
    pytest.param(TINY.replace("family", "famly"), ["kernel #1", "'family'"], id="no-family"),
    pytest.param("[deployment\n", ["invalid TOML"], id="toml-syntax"),
]


@pytest.mark.parametrize("text,fragments", BAD_MANIFESTS)
def test_bad_manifest_exits_2_naming_file_entry_field_and_writes_nothing(tmp_path, text, fragments):
    manifest = tmp_path / "bad.toml"
    manifest.write_text(text)
    out = tmp_path / "out" / "bad.rosebundle"
    result = run("build", manifest, "-o", out, "--cache-dir", tmp_path / "cache", "--json")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ") and str(manifest) in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    assert result.stdout == ""
    assert not out.exists() and not (tmp_path / "out").exists()
    assert not (tmp_path / "cache").exists()


def test_bundle_passed_as_manifest_is_a_clear_error(tiny, tmp_path):
    _, bundle, _, _ = tiny
    out = tmp_path / "x.rosebundle"
    result = run("build", bundle, "-o", out, "--cache-dir", tmp_path / "cache")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ") and str(bundle) in result.stderr
    assert re.search(r"not a (TOML )?manifest", result.stderr), result.stderr
    assert "Traceback" not in result.output and not out.exists()


def test_missing_manifest_is_a_clear_error(tmp_path):
    result = run("build", tmp_path / "nope.toml", "-o", tmp_path / "x.rosebundle")
    assert result.exit_code == 2 and "no such file" in result.stderr


# ------------------------------------------------------------------------------ inspect / verify


def test_inspect_lists_points_archs_toolchain_manifests(tiny):
    manifest, bundle, _, _ = tiny
    result = run("inspect", bundle)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert f"bundle     {bundle}" in text
    assert "archs      sm_90a" in text
    assert "nvidia-cutlass-dsl 4.8.1" in text and "flavour cu12" in text and "PTX ISA" in text
    assert "manifest   tiny (1 points, sha256 " in text
    assert "points     1 (point, arch) pairs" in text
    assert TINY_KEY_PREFIX in text and "prefill block" in text


def test_inspect_json(tiny):
    manifest, bundle, _, _ = tiny
    result = run("inspect", "--json", bundle)
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["path"] == str(bundle) and info["bytes"] == bundle.stat().st_size
    assert info["archs"] == ["sm_90a"] and info["format_version"] == 1
    assert info["toolchain"]["cuda_flavour"] == "cu12"
    assert info["toolchain"]["packages"]["nvidia-cutlass-dsl"] == "4.8.1"
    assert set(info["toolchain"]["cubin_elf_abi"]) == {"sm_90a"}
    (m,) = info["manifests"]
    assert m["name"] == "tiny" and len(m["digest"]) == 64 and len(m["points"]) == 1
    (p,) = info["points"]
    assert p["key"].startswith(TINY_KEY_PREFIX) and p["arch"] == "sm_90a"
    assert p["key"] == m["points"][0]
    assert {v["name"] for v in p["variants"]} >= {"prefill"}
    for v in p["variants"]:
        assert v["cubin_bytes"] > 0 and v["ptx_bytes"] > 0 and v["entries"]


@pytest.mark.parametrize("as_json", [False, True])
def test_verify_intact_and_damaged(tiny, tmp_path, as_json):
    _, bundle, _, _ = tiny
    flags = ["--json"] if as_json else []
    ok = run("verify", *flags, bundle)
    assert ok.exit_code == 0, ok.output
    if as_json:
        info = json.loads(ok.stdout)
        assert info["ok"] is True and info["bundle"] == str(bundle) and info["artifacts"] >= 2
    else:
        assert ok.stdout.startswith(f"OK: {bundle} (") and "artifacts verified" in ok.stdout

    damaged = tmp_path / "damaged.rosebundle"
    data = bytearray(bundle.read_bytes())
    region = HEADER_SIZE + int.from_bytes(data[16:24], "little")  # the blobs' frames
    data[(region + len(data)) // 2] ^= 0x10
    damaged.write_bytes(bytes(data))
    bad = run("verify", *flags, damaged)
    assert bad.exit_code == 1
    if as_json:
        info = json.loads(bad.stdout)
        assert info["ok"] is False and info["bundle"] == str(damaged)
        assert "damaged bundle" in info["error"]
    else:
        assert bad.stderr.startswith("Error: ") and "damaged bundle" in bad.stderr
    # inspect reads the index only: a damaged blob is verify's to find, a damaged index fails
    # both
    assert run("inspect", damaged).exit_code == 0
    data = bytearray(bundle.read_bytes())
    data[HEADER_SIZE + 10] ^= 0x10
    damaged.write_bytes(bytes(data))
    assert run("inspect", damaged).exit_code == 2
    assert run("verify", *flags, damaged).exit_code == 1


def test_verify_missing_file(tmp_path):
    result = run("verify", "--json", tmp_path / "nope.rosebundle")
    assert result.exit_code == 1
    info = json.loads(result.stdout)
    assert info["ok"] is False and "no such bundle file" in info["error"]


@pytest.mark.parametrize("built", [True, False])
def test_version_names_the_loader_hot_path(monkeypatch, built):
    from rose_aot.loader import driver

    if not built:
        monkeypatch.setattr(driver, "native", lambda: None)
    elif driver.native() is None:
        pytest.skip("rose_aot.loader._native is not built")
    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("rose-aot, version ")
    want = "loader hot path: C" if built else "loader hot path: Python (rose_aot.loader._native"
    assert want in result.stdout


@pytest.mark.parametrize("built", [True, False])
def test_version_names_the_index_and_cubin_reader(monkeypatch, built):
    from rose_aot.bundle import cubin

    if not built:
        monkeypatch.setattr(cubin, "_fastread", None)
    elif cubin._fastread is None:
        pytest.skip("rose_aot.bundle._fastread is not built")
    result = run("--version")
    assert result.exit_code == 0
    want = ("index and cubin reader: C (rose_aot.bundle._fastread)" if built
            else "index and cubin reader: Python (rose_aot.bundle._fastread is not built")
    assert want in result.stdout
