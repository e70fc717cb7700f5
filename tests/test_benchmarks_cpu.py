"""The benchmark scripts' CPU-side helpers: option parsing and the plots drawn from the rows the
GPU runs committed under benchmarks/results/ (the timing itself needs the GPU)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _load_benchmarks_common():
    """benchmarks/common.py under its own module name: tests/multigpu has a `common` module
    too, and a plain `import common` here would shadow it for later tests."""
    spec = importlib.util.spec_from_file_location(
        "rose_benchmarks_common", os.path.join(ROOT, "benchmarks", "common.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


common = _load_benchmarks_common()


def test_int_list_parses_counts_and_refuses_the_rest():
    assert common.int_list("1,128, 8192") == [1, 128, 8192]
    for bad in ("", "0,1", "a,2", "-3", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            common.int_list(bad)


def test_shape_order_compares_numbers_as_numbers():
    shapes = ["silu/14336", "gelu_tanh/2048", "silu/2048", "32/8/128", "4/4/128", "7168"]
    assert sorted(shapes, key=common.shape_order) == [
        "4/4/128", "32/8/128", "7168", "gelu_tanh/2048", "silu/2048", "silu/14336"]


@pytest.mark.parametrize("name, suffix", [
    ("act_quant-fp8_tensor_quant-h200.json", ""),
    ("norms-wide-h200.json", "-wide"),
])
def test_plot_families_draws_one_png_per_family_from_committed_rows(tmp_path, name, suffix):
    pytest.importorskip("matplotlib")
    with open(os.path.join(ROOT, "benchmarks", "results", name)) as f:
        rows = json.load(f)["rows"]
    written = common.plot_families(rows, str(tmp_path), suffix)
    families = sorted({r["family"] for r in rows})
    assert [os.path.basename(p) for p in written] == [f"{fam}{suffix}.png" for fam in families]
    for path in written:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_families_without_matplotlib_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    rows = [{"family": "f", "shape": "1", "tokens": 1, "us": {"a": 1.0}}]
    assert common.plot_families(rows, str(tmp_path)) == []
    assert list(tmp_path.iterdir()) == []
    assert "matplotlib not installed" in capsys.readouterr().out


def test_summary_table_of_committed_results():
    """The results page's compact table from a committed run: one row per shape, every column of the
    header filled, the plan's µs and torch.compile speed-up as the JSON has them."""
    path = os.path.join(ROOT, "benchmarks", "results", "act_quant-fp8_token_quant-h200.json")
    with open(path) as f:
        data = json.load(f)
    table = common.summary_table(data["rows"], data["copy_tbs"]).splitlines()
    shapes = {r["shape"] for r in data["rows"]}
    assert len(table) == 2 + len(shapes)
    widths = {line.count("|") for line in table}
    assert len(widths) == 1, table[:2]
    first = min((r for r in data["rows"] if r["tokens"] == 1), key=lambda r: int(r["shape"]))
    ours, peer = first["us"]["rose_aot"], first["us"]["torch_compile"]
    assert f"| {first['shape']} | {ours:.2f} ({peer / ours:.2f}x) |" in table[2]
    assert table[0].endswith("% copy at 8192 / 32768 |")


@pytest.mark.parametrize("family", ["act_and_mul", "fp8_group_quant", "act_and_mul_fp8_quant",
                                    "fp8_token_quant", "fp8_tensor_quant", "block_scaled_quant"])
def test_readme_tables_are_the_committed_results(family):
    """Each activation/quantization table of docs/results-act-quant.md is the one
    act_quant_summary.py prints from the committed JSON of that family's run: a figure changed
    by hand, or a table left from an earlier run when the JSON was replaced, fails here."""
    path = os.path.join(ROOT, "benchmarks", "results", f"act_quant-{family}-h200.json")
    with open(path) as f:
        data = json.load(f)
    with open(os.path.join(ROOT, "docs", "results-act-quant.md")) as f:
        page = f.read()
    rows = common.summary_table(data["rows"], data["copy_tbs"]).splitlines()[2:]
    missing = [row for row in rows if row not in page]
    assert not missing, (f"docs/results-act-quant.md rows not in {os.path.basename(path)}'s "
                         f"table: {missing[:2]}")


def test_norm_tables_are_the_committed_results(tmp_path, capsys):
    """docs/results-norms.md's two current tables are the committed runs: the wide table is what
    bench_norms.py's `report` writes from norms-wide-h200.json (and the committed md is that
    output), and every row of the main table is norms-h200.json's, in the page's columns. A figure
    changed by hand, or a table left from an earlier run when the JSON was replaced, fails."""
    bench_norms = _load_benchmark_importing_common("bench_norms")
    results = os.path.join(ROOT, "benchmarks", "results")
    with open(os.path.join(ROOT, "docs", "results-norms.md")) as f:
        page = f.read()
    with open(os.path.join(results, "norms-wide-h200.json")) as f:
        wide = json.load(f)
    bench_norms.report(wide["rows"], wide["copy_tbs"], wide["environment"], str(tmp_path), "-wide")
    capsys.readouterr()
    written = (tmp_path / "norms-wide.md").read_text()
    with open(os.path.join(results, "norms-wide-h200.md")) as f:
        assert f.read() == written
    rows = [line for line in written.splitlines() if line.startswith("| rms_norm")]
    assert len(rows) == len(wide["rows"]) and all(row in page for row in rows)
    with open(os.path.join(results, "norms-h200.json")) as f:
        main = json.load(f)
    for r in main["rows"]:
        us = r["us"]
        ours = us["rose_aot"]
        tbs = r["bytes"] / (ours * 1e-6) / 1e12
        liger = us.get("liger", us.get("liger_per_head"))
        row = (f"| {r['family']} | {r['shape']} | {r['tokens']} | {ours:.2f} | {tbs:.2f} | "
               f"{100 * tbs / main['copy_tbs']:.0f}% | {us['torch_compile']:.2f} | {liger:.2f} | "
               f"{us['torch_eager']:.1f} |")
        assert row in page, row


@pytest.mark.parametrize("content, message", [
    ("[1, 2]", "not a bench_act_quant.py result"),
    ('{"rows": [], "copy_tbs": 4}', "no benchmark rows"),
    ('{"rows": [{"x": 1}], "copy_tbs": 4}', "row 0 lacks family"),
    ('{"rows": [{"family": "f", "shape": "1", "tokens": 8192, "bytes": 1, "us": {"rose_aot": 0}}],'
     ' "copy_tbs": 4}', "rose_aot time must be a positive number"),
    ('{"rows": [{"family": "f", "shape": "1", "tokens": 1, "bytes": 1, "us": {"rose_aot": 1}}],'
     ' "copy_tbs": 0}', "copy bandwidth must be a positive number"),
    ("garbage", "Expecting value"),
])
def test_act_quant_summary_refuses_bad_results_in_one_line(tmp_path, content, message):
    import subprocess

    path = tmp_path / "bad.json"
    path.write_text(content)
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "act_quant_summary.py"),
                          str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.startswith(f"act_quant_summary.py: cannot read {path}: ") and message in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("experiment, a, b", [
    ("nvfp4-factor", "base", "new"),
    ("fp4-one-row", "base2", "onerow"),
])
def test_ab_experiment_tables_are_the_committed_runs(experiment, a, b):
    """The tables of an A/B experiment's page are the ones ab_table.py prints from its runs'
    committed JSON: a figure edited by hand, or a table left from other runs, fails here."""
    import subprocess

    results = os.path.join(ROOT, "benchmarks", "results")
    side = {label: ",".join(os.path.join(results, f"{experiment}-{label}-{i}-h200.json")
                            for i in (1, 2)) for label in (a, b)}
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "ab_table.py"),
                          "--a", f"{a}={side[a]}", "--b", f"{b}={side[b]}", "--forced", "prefill"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    with open(os.path.join(results, f"{experiment}-experiment-h200.md")) as f:
        page = f.read()
    lines = [line for line in run.stdout.splitlines() if line.startswith("| ")]
    assert len(lines) > 40  # 48 plan rows and 8 forced rows, with their headers
    missing = [line for line in lines if line not in page]
    assert not missing, missing[:2]


@pytest.mark.parametrize("args, message", [
    (["--a", "base", "--b", "x=y.json"], "is not LABEL=RUN.json"),
    (["--a", "base=missing.json", "--b", "x=y.json"], "cannot read missing.json"),
    (["--a", "base=README.md", "--b", "x=y.json"], "cannot read"),
    (["--a", "base=/dev/zero", "--b", "x=y.json"], "not a regular file"),  # would never end
])
def test_ab_table_refuses_bad_sides_in_one_line(args, message):
    import subprocess

    args = [a.replace("README.md", os.path.join(ROOT, "README.md")) for a in args]
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "ab_table.py"), *args],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == "" and message in run.stderr
    assert "Traceback" not in run.stderr


def test_ab_table_names_a_row_the_other_side_lacks(tmp_path):
    import subprocess

    row = {"family": "f", "shape": "1", "tokens": 1, "bytes": 8, "us": {"rose_aot": 1.0}}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"rows": [row], "copy_tbs": 4.0}))
    b.write_text(json.dumps({"rows": [{**row, "shape": "2"}], "copy_tbs": 4.0}))
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "ab_table.py"),
                          "--a", f"old={a}", "--b", f"new={b}"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip() == "ab_table.py: rose_aot of f 1 1 is missing from a run of new"


def test_act_quant_summary_refuses_a_device_and_a_folder():
    """A device (/dev/zero would be read forever) and a folder end in one line each."""
    import subprocess

    for path, message in (("/dev/zero", "not a regular file"), (ROOT, "Is a directory")):
        run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks",
                                                           "act_quant_summary.py"), path],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 1 and run.stdout == "", path
        assert run.stderr.startswith(f"act_quant_summary.py: cannot read {path}: ")
        assert message in run.stderr and "Traceback" not in run.stderr


def test_warmup_cpu_side_names_a_bundle_that_does_not_open(tmp_path):
    """A damaged bundle among the models: one line naming it and the loader's own error, exit
    1, no traceback of the script."""
    import subprocess

    (tmp_path / "broken.rosebundle").write_bytes(b"not a bundle")
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "warmup.py"), "cpu-side",
                          str(tmp_path)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "ROSE_WARMUP_REPEATS": "1"})
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"warmup.py: opening {tmp_path / 'broken.rosebundle'} failed: ")
    assert "rose_aot.errors" in last and "Traceback" not in run.stderr


@pytest.mark.parametrize("args, code, message", [
    (["build-side", "--help"], 0, "usage: warmup.py build-side"),
    (["build-side", "--hlep", "x.toml"], 2, "the following arguments are required"),
    (["build-side", "models"], 2, "the following arguments are required: manifests"),
    (["gpu-side", "models", "extra"], 2, "unrecognized arguments: extra"),
    (["sideways", "models"], 2, "invalid choice: 'sideways'"),
])
def test_warmup_arguments_are_checked_before_anything_is_made(tmp_path, args, code, message):
    """Its help asked for (`build-side --help`, which once built into a folder named '--help'
    and timed the DSL import) or a malformed command line: the usage or one error line,
    nothing written, nothing run."""
    import subprocess

    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "warmup.py"), *args],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == code and message in run.stdout + run.stderr, run.stderr
    assert "Traceback" not in run.stderr and list(tmp_path.iterdir()) == []


def test_warmup_gpu_side_names_a_missing_build_report_before_measuring(tmp_path):
    """The JIT column needs each bundle's build report: one missing ends the GPU side in one
    line naming it, before any process is measured (and, on a CPU machine, before the GPU
    check)."""
    import subprocess

    (tmp_path / "dsl-import.json").write_text('{"dsl_import_ms": 400}')
    (tmp_path / "a.rosebundle").write_bytes(b"")
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "warmup.py"),
                          "gpu-side", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"warmup.py: {tmp_path / 'a.rosebundle'}: no readable build report")
    assert "warmup.py build-side" in last


@pytest.mark.parametrize("extra, code, message", [
    (["hidden"], 2, "a config field is FIELD=VALUE, got 'hidden'"),
    (["hidden=7168"], 1, "ncu_point.py needs a CUDA GPU"),
    (["hidden=7168", "--launches", "0"], 2, "a positive integer, got '0'"),
])
def test_ncu_point_refuses_in_one_line(extra, code, message):
    import subprocess

    import torch

    if torch.cuda.is_available() and code == 1:
        pytest.skip("a GPU is present")
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "ncu_point.py"),
                          "no.rosebundle", "nvfp4_quant", "8192", *extra],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == code and message in run.stderr and "Traceback" not in run.stderr


def _load_benchmark(name: str):
    """A script of benchmarks/ as a module (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(
        f"rose_benchmarks_{name}", os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_sass_count():
    return _load_benchmark("sass_count")


def _load_benchmark_importing_common(name: str):
    """A benchmark script that puts benchmarks/ on sys.path and imports `common`: loaded with
    its own `common`, then sys.path and sys.modules["common"] restored, so that neither this
    script sees another suite's `common` nor later tests (tests/multigpu's) see benchmarks'."""
    saved_path, saved = sys.path[:], sys.modules.pop("common", None)
    try:
        return _load_benchmark(name)
    finally:
        sys.path[:] = saved_path
        sys.modules.pop("common", None)
        if saved is not None:
            sys.modules["common"] = saved


def test_sass_main_path_ends_at_the_last_unconditional_exit():
    """PREEXIT and predicated EXITs do not end the main path; the slow-path subroutine and the
    padding after the last EXIT are not counted."""
    sass = _load_sass_count()
    listing = "\n".join([
        "        /*0000*/                   LDC R1, c[0x0][0x28] ;",
        "        /*0010*/                   PREEXIT ;",
        "        /*0020*/              @P0 EXIT ;",
        "        /*0030*/                   FMUL R0, R1, R2 ;",
        "        /*0040*/                   EXIT ;",
        "        /*0050*/                   BRA `(.L_x_0) ;",
        "        /*0060*/                   MUFU.RCP R3, R0 ;",
        "        /*0070*/                   RET.REL.NODEC R2 `(kernel) ;",
    ])
    path, loops = sass.main_path(listing)
    assert [sass.opcode(t) for t in path] == ["LDC", "PREEXIT", "EXIT", "FMUL", "EXIT"]
    assert not loops  # the branch to itself after the last EXIT is padding
    with pytest.raises(ValueError, match="no unconditional EXIT"):
        sass.main_path(listing.replace("EXIT ;", "NOP ;"))
    # a branch back inside the main path: a loop, whose static length is not per element
    looping = listing.replace("        /*0030*/", ".L_x_1:\n        /*0030*/").replace(
        "FMUL R0, R1, R2 ;", "BRA `(.L_x_1) ;")
    path, loops = sass.main_path(looping)
    assert loops and len(path) == 5


def test_sass_pipe_of_an_opcode():
    sass = _load_sass_count()
    assert [sass.pipe(op) for op in ("LOP3", "SHF", "HMNMX2", "PRMT", "F2FP")] == ["alu"] * 5
    assert [sass.pipe(op) for op in ("FFMA", "IMAD", "HFMA2", "HADD2")] == ["fma"] * 4
    assert [sass.pipe(op) for op in ("LDG", "STG", "SHFL", "MUFU", "BRA", "S2R")] == ["other"] * 6
    assert not sass.ALU_OPCODES & sass.FMA_OPCODES


def test_sass_count_of_a_compiled_point():
    """A real compile and disassembly (nvdisasm from the nvidia-cuda-nvdisasm wheel, which CI
    installs): MXFP8 converts with F2FP, loads and stores its rows, and the prefill shape's
    thread handles 4x the elements of the decode shape's for fewer instructions per element."""
    pytest.importorskip("cutlass")
    sass = _load_sass_count()
    if sass.find_nvdisasm() is None:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    rows = {r["variant"]: r for r in sass.count_point(
        "block_scaled_quant", {"hidden": 2048, "format": "mxfp8"}, "sm_90a")}
    assert set(rows) == {"decode", "prefill", "mid"}
    for r in rows.values():
        assert r["instructions"] == sum(r["opcodes"].values()) > 50 and not r["loops"]
        assert {"LDG", "STG", "F2FP"} <= set(r["opcodes"]) and r["registers"] > 0
        # every instruction in exactly one pipe; F2FP (the e4m3 conversion) on the alu pipe,
        # the fp32 scaling on the fma pipe, loads and stores elsewhere
        assert sum(r["pipes"].values()) == r["instructions"]
        assert r["pipes"]["alu"] >= r["opcodes"]["F2FP"]
        assert r["pipes"]["fma"] >= r["opcodes"]["FMUL"] > 0
        assert r["pipes"]["other"] >= r["opcodes"]["LDG"] + r["opcodes"]["STG"]
    assert rows["prefill"]["elements_per_thread"] == 4 * rows["decode"]["elements_per_thread"]
    assert rows["prefill"]["per_element"] < rows["decode"]["per_element"]


@pytest.mark.parametrize("values, variant, loads", [
    ({"hidden": 512}, "decode", 4),  # x and w: 2 vectors each
    ({"hidden": 512, "fused_residual": True}, "decode", 6),  # and the residual
    ({"hidden": 4096}, "prefill", 4),  # the first read of x (its second read follows the sum)
    ({"hidden": 8192}, "mid", 4),
])
def test_rms_norm_weight_first_variants_issue_every_load_before_the_sum(tmp_path, values,
                                                                         variant, loads):
    """The variants that load the weight first (rms_norm/tuning.py, WEIGHT_FIRST) issue the
    weight's loads with x's, before the row's sum (its first shuffle), in the compiled SASS.
    Loaded after x in the source, ptxas issued them once x had arrived: after the sum for 512's
    decode, 4096's prefill and 8192's mid, so these counted 2 loads here (4 of 6 fused)."""
    pytest.importorskip("cutlass")
    sass = _load_sass_count()
    if sass.find_nvdisasm() is None:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    sass.count_point("rms_norm", values, "sm_90a", dump=tmp_path)
    listing = (tmp_path / f"rms_norm-{variant}-sm_90a.sass").read_text()
    opcodes = [sass.opcode(text) for text in sass.main_path(listing)[0]]
    first_sum = opcodes.index("SHFL")
    assert opcodes[:first_sum].count("LDG") == loads
    assert opcodes.count("LDG") == loads + 2 * (variant == "prefill")


@pytest.mark.parametrize("extra, code, message", [
    (["hidden7168"], 2, "a config field is FIELD=VALUE, got 'hidden7168'"),
    (["hidden=7168", "--dump", "FILE"], 1, "is not a folder"),
    (["hidden=7"], 1, "'hidden': 7 is not supported"),
    (["hidden=7168", "--arch", "sm_99"], 1, "unknown arch 'sm_99'"),
])
def test_sass_count_refuses_in_one_line(tmp_path, extra, code, message):
    import subprocess

    pytest.importorskip("cutlass")
    afile = tmp_path / "a-file"
    afile.write_text("")
    extra = [str(afile) if e == "FILE" else e for e in extra]
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "sass_count.py"),
                          "nvfp4_quant", *extra], capture_output=True, text=True, timeout=120)
    assert run.returncode == code and message in run.stderr and "Traceback" not in run.stderr
    assert afile.read_text() == ""  # nothing written through a bad --dump


def _load_merge_probe():
    return _load_benchmark("merge_probe")


def test_merge_probe_joins_modules_under_one_header_and_normalizes_only_numbering():
    probe = _load_merge_probe()
    head = "//\n.version 8.8\n.target sm_90a\n.address_size 64\n"
    one = probe.merged([head + "\n.visible .entry a() { ret; }\n",
                        head + "\n.visible .entry b() { ret; }\n"])
    assert one.count(".version") == 1 and one.index("entry a") < one.index("entry b")
    # what a module numbers per module is normalized; anything else is kept
    assert probe._normalized("@!P0 BRA  `(.L_x_12)") == "@!P0 BRA `(.L_x)"
    assert (probe._normalized("CALL.REL.NOINC `($__internal_3_$__cuda_sm3x_div_rn)")
            == "CALL.REL.NOINC `($__internal_$__cuda_sm3x_div_rn)")
    assert probe._normalized("RET.REL.NODEC R14 `(m2v1__kernel_x)") == "RET.REL.NODEC R14 `(kernel_x)"
    assert probe._normalized("FFMA R1, R2, R3, R4") != probe._normalized("FFMA R1, R2, R3, R5")


@pytest.mark.parametrize("args, message", [
    (["--ptxas", "/no/such/ptxas", "b.rosebundle"], "no ptxas; pip install nvidia-cuda-nvcc-cu12"),
    (["--ptxas", "README.md", "README.md"], "not a rose-aot bundle"),  # any file as ptxas
    (["--write", "README.md", "b.rosebundle"], "cannot use --write"),  # a file, not a folder
])
def test_merge_probe_refuses_in_one_line(args, message):
    import subprocess

    probe = _load_merge_probe()
    if "README.md" in args and probe.find_nvdisasm() is None:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    args = [os.path.join(ROOT, a) if a.startswith("README") else a for a in args]
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "merge_probe.py"),
                          *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and message in run.stderr and "Traceback" not in run.stderr


def test_bench_act_quant_family_option_takes_all_or_names_joined_by_commas(monkeypatch):
    # The script puts benchmarks/ first on sys.path and imports `common`: both are undone after
    # the test, so tests/multigpu's own `common` module is not shadowed for later tests.
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "common", common)
    bench = _load_benchmark("bench_act_quant")
    assert bench._families("all") == "all"
    assert bench._families("fp8_group_quant,act_and_mul").split(",") == [
        "fp8_group_quant", "act_and_mul"]
    for bad in ("", "fp8_group", "act_and_mul,", "all,act_and_mul", "act_and_mul,,fp8_group_quant"):
        with pytest.raises(argparse.ArgumentTypeError, match="joined by commas"):
            bench._families(bad)
    assert bench._label("exp4-2048") == "exp4-2048"
    for bad in ("", "../x", "a/b", ".hidden", "a b"):
        with pytest.raises(argparse.ArgumentTypeError, match="names act_quant-LABEL"):
            bench._label(bad)


@pytest.mark.parametrize("args, message", [
    (["--label", "../x"], "moe_fp8-LABEL"),
    (["--label", ".hidden"], "moe_fp8-LABEL"),
    (["--hidden", "1234"], "no shape of width [1234]"),
    (["--tokens", "0"], "positive integers"),
])
def test_bench_dispatch_fp8_refuses_bad_options_before_any_gpu_work(args, message):
    """Exit 2 with one line from argparse, before torch touches a GPU (this machine has none):
    a label with a folder in it would write outside the output folder."""
    import subprocess

    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_dispatch_fp8.py"),
                          "no-such.rosebundle", *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("args, message", [
    (["--family", "act_and_mul", "--widths", "1234"], "no act_and_mul point of d [1234] (it has ["),
    (["--family", "block_scaled_quant", "--widths", "999"],
     "no block_scaled_quant point of hidden [999]"),
    (["--label", "a/b"], "names act_quant-LABEL"),
])
def test_bench_act_quant_refuses_points_the_bundle_lacks_before_any_gpu_work(
        args, message, shipped_bundle_path):
    """A width the bundle has no point for is refused with the widths it has (exit 2, one
    argparse line), before torch looks for a GPU: not a KeyError minutes into a GPU run."""
    import subprocess

    script = os.path.join(ROOT, "benchmarks", "bench_act_quant.py")
    for bundle in (str(shipped_bundle_path), "no-such.rosebundle"):
        run = subprocess.run([sys.executable, script, bundle, *args], capture_output=True,
                             text=True, timeout=120)
        want = message if bundle != "no-such.rosebundle" or "LABEL" in message else "no such bundle"
        assert run.returncode == 2 and want in run.stderr and "Traceback" not in run.stderr, (
            run.stderr[-500:])


@pytest.mark.parametrize("args, message", [
    (["base"], "write LABEL=BUNDLE"),
    (["=x.rosebundle"], "write LABEL=BUNDLE"),
    (["a=no-such.rosebundle"], "no such bundle file"),
    (["a=SHIPPED", "a=SHIPPED"], "labels repeat"),
    (["a=SHIPPED", "--rounds", "0"], "--rounds must be at least 1"),
    (["a=SHIPPED", "--force", "decode,small"],
     "--force takes rms_norm's variants, decode, decode_late, mid and prefill "
     "(got ['decode', 'small'])"),
    (["a=SHIPPED", "--hidden", "1234", "--fused", "1"],
     "no rms_norm point of (hidden, fused_residual) (1234, True); it has ["),
    (["a=README.md"], "not a readable bundle"),
])
def test_ab_norms_refuses_bad_bundles_before_any_gpu_work(args, message, shipped_bundle_path):
    """Exit 2 with one argparse line, before torch looks for a GPU (this machine has none)."""
    import subprocess

    args = [a.replace("SHIPPED", str(shipped_bundle_path)).replace(
        "README.md", os.path.join(ROOT, "README.md")) for a in args]
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "ab_norms.py"), *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr, (
        run.stderr[-500:])


def test_ab_norms_forces_every_plan_choice_of_rms_norm():
    """ab_norms.py's --force list is rms_norm's plan choices, so a new variant is forceable."""
    from rose_aot.kernels import get_family

    ab_norms = _load_benchmark_importing_common("ab_norms")
    assert ab_norms.FORCEABLE == get_family("rms_norm").plan_choices


@pytest.mark.parametrize("script, args, message", [
    ("ab_combine.py", ["base"], "write LABEL=BUNDLE"),
    ("ab_combine.py", ["a=no-such.rosebundle"], "no such bundle file"),
    ("ab_combine.py", ["a=SHIPPED", "a=SHIPPED"], "labels repeat"),
    ("ab_combine.py", ["a=SHIPPED", "--rounds", "0"], "--rounds must be at least 1"),
    ("ab_combine.py", ["a=SHIPPED", "--force", "split,fast"],
     "--force takes moe_combine's variants decode, prefill, split, split_wide, split_block, "
     "split_block_late (got fast)"),
    ("ab_combine.py", ["a=SHIPPED", "--top-k", "3", "--hidden", "2048"],
     "no bf16 moe_combine point of (top_k, hidden) (3, 2048); it has ["),
    ("ab_combine.py", ["a=SHIPPED", "--tokens", "x"],
     "is not a comma-separated list of positive integers"),
    ("ab_combine.py", ["a=README.md"], "not a readable bundle"),
    ("ab_qk_norm.py", ["base"], "write LABEL=BUNDLE"),
    ("ab_qk_norm.py", ["a=SHIPPED", "a=SHIPPED"], "labels repeat"),
    ("ab_qk_norm.py", ["a=SHIPPED", "--rounds", "0"], "--rounds must be at least 1"),
    ("ab_qk_norm.py", ["a=SHIPPED", "--heads", "32/4"], "'32/4': write Q/K/D"),
    ("ab_qk_norm.py", ["a=SHIPPED", "--heads", "32/0/128"], "heads and head dim must be positive"),
    ("ab_qk_norm.py", ["a=SHIPPED", "--heads", "3/1/128"],
     "no qk_norm point of (num_q_heads, num_k_heads, head_dim) (3, 1, 128); it has ["),
    ("ab_qk_norm.py", ["a=SHIPPED", "--force", "b:pdl"], "no bundle labelled 'b'"),
    ("ab_qk_norm.py", ["a=SHIPPED", "--force", "a:"], "name a variant"),
    ("ab_qk_norm.py", ["a=SHIPPED", "--heads", "32/4/128", "--force", "fast"],
     "qk_norm 32/4/128 has no variant fast; it has ['decode', 'pdl', 'pdl_late', 'prefill']"),
    ("ab_qk_norm.py", ["a=SHIPPED", "--tokens", "0"],
     "is not a comma-separated list of positive integers"),
    ("ab_qk_norm.py", ["a=README.md"], "not a readable bundle"),
])
def test_ab_scripts_refuse_bad_input_before_any_gpu_work(script, args, message,
                                                         shipped_bundle_path):
    """Exit 2 with one argparse line, before torch looks for a GPU (this machine has none)."""
    import subprocess

    args = [a.replace("SHIPPED", str(shipped_bundle_path)).replace(
        "README.md", os.path.join(ROOT, "README.md")) for a in args]
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr, (
        run.stderr[-500:])


def test_ab_act_quant_refuses_bundles_without_the_experiments_points(shipped_bundle_path):
    import subprocess

    script = os.path.join(ROOT, "benchmarks", "ab_act_quant.py")
    for args, message in (([f"a={shipped_bundle_path}"], "no point "),
                          (["a"], "write LABEL=BUNDLE"),
                          ([f"a={os.path.join(ROOT, 'README.md')}"], "not a readable bundle")):
        run = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr, (
            run.stderr[-500:])


def test_preload_probe_breakdown_times_functions_the_loader_has():
    """Each phase of preload_probe.py's breakdown names a function of rose_aot that open and
    preload call (a rename would otherwise surface only in a device call)."""
    import importlib

    probe = _load_benchmark("preload_probe")
    assert "breakdown" in probe.WAYS
    names = [name for name, _, _ in probe.PHASES]
    assert len(set(names)) == len(names)
    for name, module, attribute in probe.PHASES:
        owner = importlib.import_module(module)
        for part in attribute.split("."):
            owner = getattr(owner, part)
        assert callable(owner), name


def test_merge_probe_write_keeps_the_cubins_and_names_every_entry(tmp_path):
    probe = _load_merge_probe()
    probe.keep(tmp_path / "m", [(b"\x7fELF one", ["k_a"]), (b"\x7fELF two", ["k_b", "k_c"])],
               b"\x7fELF whole", ["m0v0__k_a", "m1v0__k_b", "m1v0__k_c"])
    load = json.loads((tmp_path / "m" / "load.json").read_text())
    assert load == {"variants": [["variant-000.cubin", ["k_a"]],
                                 ["variant-001.cubin", ["k_b", "k_c"]]],
                    "merged": ["merged.cubin", ["m0v0__k_a", "m1v0__k_b", "m1v0__k_c"]]}
    assert (tmp_path / "m" / "variant-001.cubin").read_bytes() == b"\x7fELF two"
    assert (tmp_path / "m" / "merged.cubin").read_bytes() == b"\x7fELF whole"


@pytest.mark.parametrize("args, message", [
    (["no-such-folder"], "no */load.json under no-such-folder"),
    (["benchmarks", "--repeats", "0"], "--repeats must be at least 1"),
])
def test_merged_load_probe_refuses_in_one_line(args, message):
    import subprocess

    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "merged_load_probe.py"),
                          *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 1 and message in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("script, first", [("preload_probe.py", "no-such.rosebundle"),
                                           ("merged_load_probe.py", "no-such-folder")])
def test_probes_refuse_an_out_they_cannot_write_before_any_run(script, first, tmp_path):
    """--out is checked right after the arguments are read, so a folder, or a file in a missing
    folder, ends in one argparse line (exit 2), not in a traceback after the measurements."""
    import subprocess

    for out in (tmp_path, tmp_path / "missing" / "rows.json"):
        run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), first,
                              "--out", str(out)], capture_output=True, text=True, timeout=60,
                             cwd=tmp_path)
        assert run.returncode == 2, run.stderr
        assert f"--out {str(out)!r} is not a file that can be written" in run.stderr
        assert "Traceback" not in run.stderr


def test_write_rows_writes_the_payload_and_prints_json_only_when_asked(tmp_path, capsys):
    rows = [{"way": "module", "ms": 1.5}]
    out = tmp_path / "rows.json"
    assert common.write_rows(rows, str(out), {"bundle": "b.rosebundle"}, False) is False
    assert json.loads(out.read_text()) == {"bundle": "b.rosebundle", "rows": rows}
    assert capsys.readouterr().out == ""
    assert common.write_rows(rows, None, {}, True) is True
    assert json.loads(capsys.readouterr().out) == rows


def test_preload_probe_cpu_breakdown_times_open_and_verification_without_a_gpu(shipped_bundle_path):
    """The CPU way of preload_probe.py runs end to end on the build machine: cold processes,
    no torch, every phase but the driver's measured."""
    import subprocess

    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "preload_probe.py"),
                          str(shipped_bundle_path), "--ways", "cpu_breakdown", "--repeats", "1",
                          "--json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    (row,) = json.loads(run.stdout)
    from rose_aot import open_bundle

    assert row["variants"] == len(open_bundle(shipped_bundle_path)._variants("sm_90a")) > 0
    phases = row["phases"]
    for name in ("index_json", "records_and_plans", "cubin_sha256", "cubin_check"):
        assert phases[name] > 0, name
    assert phases["cuModuleLoadData"] == phases["cuModuleGetFunction"] == 0  # no driver
    assert "capability_ms" not in row and row["open_ms"] > 0 and row["load_ms"] > 0


@pytest.mark.parametrize("side, message", [
    ("nowhere:b.rosebundle", "is not TREE:BUNDLE"),
    (".", "is not TREE:BUNDLE"),
    (".:no-such.rosebundle", "is not TREE:BUNDLE"),
])
def test_warmup_ab_refuses_a_side_it_cannot_run_before_any_process(side, message, tmp_path):
    import subprocess

    bundle = tmp_path / "b.rosebundle"
    bundle.write_bytes(b"")
    good = f"{ROOT}:{bundle}"
    for args in (["--a", side, "--b", good], ["--a", good, "--b", side]):
        run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "warmup_ab.py"),
                              *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "warmup_ab.py"),
                          "--a", good, "--b", good, "--repeats", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--repeats must be >= 1" in run.stderr
    for threads in ("0", "-1", "two", ""):
        run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "warmup_ab.py"),
                              "--a", good, "--b", good, "--b-threads", threads],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "is not a positive number of threads" in run.stderr
    for out in (tmp_path, tmp_path / "missing" / "runs.json"):  # refused before any process
        run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "warmup_ab.py"),
                              "--a", good, "--b", good, "--out", str(out)],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "is not a file that can be written" in run.stderr
        assert "Traceback" not in run.stderr


def test_warmup_ab_times_the_cpu_side_of_two_trees_without_a_gpu(shipped_bundle_path, tmp_path):
    """--cpu ARCH: alternating cold processes of each tree, each importing its own rose_aot
    (from the tree it names), opening the bundle and verifying ARCH's records and artifacts;
    a table of medians and every run as JSON. A typo in the arch ends in one line."""
    import shutil
    import subprocess

    other = tmp_path / "tree"
    shutil.copytree(os.path.join(ROOT, "rose_aot"), other / "rose_aot",
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = os.path.join(ROOT, "benchmarks", "warmup_ab.py")
    out = tmp_path / "runs.json"
    run = subprocess.run([sys.executable, script, "--cpu", "sm_90a", "--a",
                          f"{ROOT}:{shipped_bundle_path}", "--b", f"{other}:{shipped_bundle_path}",
                          "--repeats", "1", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith(("| a |", "| b |"))]
    assert [r.split("|")[2].strip() for r in rows] == [os.path.abspath(ROOT), str(other)]
    runs = json.loads(out.read_text())
    assert runs["cpu_side_of"] == "sm_90a"
    for side in ("a", "b"):
        (row,) = runs["runs"][side]
        assert row["open_verify_ms"] > 0 and row["preload_ms"] > 0 and row["kernels"] > 0
    run = subprocess.run([sys.executable, script, "--cpu", "sm_90", "--a",
                          f"{ROOT}:{shipped_bundle_path}", "--b", f"{other}:{shipped_bundle_path}",
                          "--repeats", "1"], capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "version a failed" in run.stderr and "no arch 'sm_90'" in run.stderr
    run = subprocess.run([sys.executable, script, "--cpu", "", "--a",
                          f"{ROOT}:{shipped_bundle_path}", "--b", f"{other}:{shipped_bundle_path}"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--cpu needs an arch" in run.stderr


def test_warmup_byte_compiles_the_package_the_probes_import(tmp_path):
    """warmup.py measures the import a serving image pays, from .pyc files: byte_compile
    writes them for a tree's rose_aot, and says so when there is none to compile."""
    import importlib.util
    import sys as _sys

    spec = importlib.util.spec_from_file_location("warmup_bc", os.path.join(ROOT, "benchmarks",
                                                                             "warmup.py"))
    warmup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(warmup)
    package = tmp_path / "rose_aot"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "sub.py").write_text("import os\n")
    said = warmup.byte_compile(str(tmp_path))
    assert said == f"byte-compiled: {package}"
    tag = _sys.implementation.cache_tag
    prefix = _sys.pycache_prefix
    if prefix is None:
        assert (package / "__pycache__" / f"sub.{tag}.pyc").is_file()
    missing = warmup.byte_compile(str(tmp_path / "nowhere"))
    assert missing.startswith("byte-compiled: NOT ") and "no such package" in missing


@pytest.mark.parametrize("argv, message", [
    (["--bytes-per-element", "0"], "--bytes-per-element must be positive"),
    (["--widths", "4096,x"], "is not a comma-separated list of positive integers"),
    ([], "needs a CUDA device"),
])
def test_copy_sizes_refuses_bad_options_and_a_machine_without_a_gpu(argv, message):
    """copy_sizes.py: a bad option is one argparse line (exit 2) and, on this CPU machine, a
    good one says that it needs a GPU (exit 1) instead of a traceback."""
    import subprocess

    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "copy_sizes.py"), *argv],
                         capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == (1 if not argv else 2) and message in run.stderr
    assert "Traceback" not in run.stderr
