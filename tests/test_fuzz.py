"""Fuzz suite (hypothesis, seeded): every hostile input ends in a RoseAotError or a valid result.

Targets: bundle bytes; the index JSON with its digests recomputed (what someone who can write
the file can do); manifests; config.json for `manifest from-config`; shard files for merge (API
and CLI, with and without -o). Properties checked on each case: no exception other than the
project's own (the CLI: exit 0/1/2 and never a traceback or an internal error), no hang (a
per-case alarm), and no file written outside the given output path.

Bounded for CI: derandomized (fixed seed), FUZZ_EXAMPLES cases per target by default, the whole
file in well under a minute on 2 cores. ROSE_AOT_FUZZ_EXAMPLES=N runs N per target.
"""

from __future__ import annotations

import copy
import contextlib
import hashlib
import json
import os
import shutil
import signal
import struct
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fixtures_tiny import TINY_TOML  # noqa: E402
from rose_aot import settings as rose_settings  # noqa: E402
from rose_aot.builder.build import BuildPlan  # noqa: E402
from rose_aot.builder.shard import merge_shards  # noqa: E402
from rose_aot.bundle import BundleReader  # noqa: E402
from rose_aot.bundle.format import HEADER_SIZE, _canonical_json  # noqa: E402
from rose_aot.check import check_bundle  # noqa: E402
from rose_aot.cli import main as cli  # noqa: E402
from rose_aot.errors import RoseAotError  # noqa: E402
from rose_aot.loader import open_bundle  # noqa: E402
from rose_aot.manifest import parse_manifest  # noqa: E402
from rose_aot.manifest.diff import diff_paths  # noqa: E402
from rose_aot.manifest.from_config import manifest_from_config  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HF = REPO / "tests" / "data" / "hf_configs"
CASE_SECONDS = 10  # one case taking longer is a hang

# Cases per target (CI default); the README quotes these.
FUZZ_EXAMPLES = {
    "bundle_bytes": 300,
    "index_json": 150,
    "manifest": 300,
    "config_json": 200,
    "shard_merge": 60,
    "shard_merge_cli": 30,
}


def fuzz(target: str):
    return settings(
        max_examples=rose_settings.fuzz_examples(FUZZ_EXAMPLES[target]),
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )


@contextlib.contextmanager
def time_limit(seconds: int = CASE_SECONDS):
    def alarm(signum, frame):
        raise AssertionError(f"hang: one case ran for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def snapshot(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if not p.is_dir()}


def allowed_or_own_error(fn, *args, **kwargs):
    """Run fn: a RoseAotError is an accepted outcome; any other exception fails the case."""
    with time_limit():
        try:
            result = fn(*args, **kwargs)
        except RoseAotError as exc:
            _event(f"{fn.__name__}: {type(exc).__name__}")
            return None
    _event(f"{fn.__name__}: valid")
    return result


def _event(text: str) -> None:  # outcome counts for --hypothesis-show-statistics
    if hypothesis.currently_in_test_context():
        hypothesis.event(text)


def cli_ok(*args) -> None:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args,
        repr(result.exception),
    )
    assert "Traceback" not in result.output and "internal error" not in result.output, (
        args,
        result.output,
    )


# ------------------------------------------------------------------------------ JSON mutation
STRINGS = st.sampled_from(
    ["", "../../ESCAPED", "/abs/ESCAPED", "a\nb", "x\0y", "rms_norm", "qk_norm", "sm_90a",
     "sm_100a", "bfloat16", "prefill", "x" * 5000, "\u2028", "NaN", "1e999"]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, -1, 1, 2**63, 10**30])
    | st.builds(lambda: 10**4400)  # more digits than int() parses by default
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | STRINGS
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def _nodes(obj, path=()):
    yield path, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _nodes(v, path + (i,))


def _get(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def mutate_json(data, doc, rounds: int = 3):
    """Apply 1..rounds random edits to a JSON document in place (drawn through `data`)."""
    for _ in range(data.draw(st.integers(1, rounds))):
        nodes = [p for p, _ in _nodes(doc) if p]
        if not nodes:
            return
        path = data.draw(st.sampled_from(nodes))
        parent, key = _get(doc, path[:-1]), path[-1]
        op = data.draw(st.sampled_from(["replace", "delete", "tweak", "copy", "add"]))
        value = parent[key]
        if op == "replace":
            parent[key] = data.draw(JSON_VALUES)
        elif op == "delete":
            del parent[key]
        elif op == "tweak":
            if isinstance(value, bool):
                parent[key] = not value
            elif isinstance(value, int):
                parent[key] = value + data.draw(st.sampled_from([-1, 1, 2**31, -(2**40), 10**20]))
            elif isinstance(value, str):
                parent[key] = value + data.draw(STRINGS)
            elif isinstance(value, list) and value:
                parent[key] = value + value[:1]
            else:
                parent[key] = data.draw(JSON_VALUES)
        elif op == "copy":
            other = data.draw(st.sampled_from(nodes))
            if other[: len(path)] != path:
                parent[key] = copy.deepcopy(_get(doc, other))  # (ints of any length)
        elif op == "add" and isinstance(value, dict):
            value[data.draw(st.text(max_size=8))] = data.draw(JSON_VALUES)


@contextlib.contextmanager
def any_int_digits():
    """Let the test write integers of any length (the code under test reads them with Python's
    default limit, so a 4,400-digit integer in a file must be refused there)."""
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(old)


def forge(data: bytes, index: dict) -> bytes:
    """The bundle-format file `data` with its index replaced by `index` and the header digest
    recomputed, blobs untouched."""
    magic, version, flags, size, _ = struct.unpack_from("<8sIIQ32s", data)
    with any_int_digits():
        body = _canonical_json(index)
    header = struct.pack("<8sIIQ32s", magic, version, flags, len(body), hashlib.sha256(body).digest())
    return header + body + data[HEADER_SIZE + size :]


def index_of(data: bytes) -> dict:
    size = struct.unpack_from("<Q", data, 16)[0]
    return json.loads(data[HEADER_SIZE : HEADER_SIZE + size])


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def tiny_shard(tiny_build, work):
    out = work / "tiny.shard-1-of-1.roseshard"
    result = CliRunner().invoke(
        cli,
        ["build", str(tiny_build.manifest), "--shard", "1/1", "-o", str(out),
         "--cache-dir", str(tiny_build.cache_dir), "-q"],
    )
    assert result.exit_code == 0, result.output
    return out


# ------------------------------------------------------------------------------ bundle bytes
def _read_everything(path_or_bytes, manifest=None):
    if isinstance(path_or_bytes, bytes):
        reader = BundleReader.from_bytes(path_or_bytes)
        reader.verify()
        for name in reader.blob_names():
            reader.blob(name)
        return reader
    bundle = open_bundle(path_or_bytes)
    bundle.describe()
    bundle.reader.verify()
    bundle.check_artifacts(threads=2)  # every load's CPU side: what reaches the driver
    for key in bundle.points():
        family = key.split("(")[0]
        try:
            bundle.kernel(family)
        except RoseAotError:
            pass
    if manifest is not None:
        check_bundle(bundle, [manifest])
    return bundle


@fuzz("bundle_bytes")
@given(data=st.data())
def test_fuzz_bundle_bytes(tiny_build, data):
    original = tiny_build.data
    blob = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "splice"]))
        if not blob:
            break
        at = data.draw(st.integers(0, len(blob) - 1))
        if op == "flip":
            blob[at] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set":
            blob[at] = data.draw(st.integers(0, 255))
        elif op == "truncate":
            del blob[at:]
        elif op == "insert":
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del blob[at : at + data.draw(st.integers(1, 64))]
        else:
            src = data.draw(st.integers(0, len(original) - 1))
            n = data.draw(st.integers(1, 256))
            blob[at : at + n] = original[src : src + n]
    allowed_or_own_error(_read_everything, bytes(blob))


# ------------------------------------------------------------------------------ index JSON
@fuzz("index_json")
@given(data=st.data())
def test_fuzz_index_with_recomputed_digests(tiny_build, work, data):
    original = tiny_build.data
    index = index_of(original)
    # Mostly the caller's part of the index; sometimes the blobs table too.
    if data.draw(st.integers(0, 4)) == 0:
        mutate_json(data, index)
    else:
        blobs = index.pop("blobs")
        mutate_json(data, index)
        index["blobs"] = blobs
    try:
        forged = forge(original, index)
    except (ValueError, RecursionError):
        return  # not canonical JSON (e.g. an int the encoder refuses): no such file exists
    folder = Path(tempfile.mkdtemp(dir=work))
    path = folder / "forged.rosebundle"
    path.write_bytes(forged)
    before = snapshot(folder)
    allowed_or_own_error(_read_everything, path, tiny_build.manifest)
    allowed_or_own_error(diff_paths, path, tiny_build.path)
    with time_limit():
        cli_ok("verify", path)
        cli_ok("inspect", "--json", path)
        cli_ok("diff", path, tiny_build.manifest)
        cli_ok("check", "--bundle", path, tiny_build.manifest)
    assert snapshot(folder) == before
    shutil.rmtree(folder)


# ------------------------------------------------------------------------------ manifests
FIELD_NAMES = st.sampled_from(
    ["hidden", "dtype", "eps", "fused_residual", "num_q_heads", "num_k_heads", "head_dim",
     "weight_offset", "out_dtype", "prefill_warps", "bogus", "family"]
)
TOML_VALUES = st.sampled_from(
    ["1024", "0", "-1", "1e-320", "1e999", "nan", "inf", "true", '"bfloat16"', '"float8_e4m3fn"',
     "[1024, 2048]", "[]", "[[1]]", "{a = 1}", '"\\n[[kernel]]"', "99999999999999999999999",
     "1_000", "0x10", "[" + ", ".join(str(256 * i) for i in range(1, 200)) + "]", '""', "1.5"]
)


VALID_ENTRIES = [
    'family = "rms_norm"\nhidden = 1024',
    'family = "rms_norm"\nhidden = [1024, 4096]\nfused_residual = [false, true]',
    'family = "qk_norm"\nnum_q_heads = 8\nnum_k_heads = 2\nhead_dim = 64',
]


@st.composite
def manifests(draw):
    lines = []
    if draw(st.booleans()):
        lines.append("[deployment]")
        name = draw(st.sampled_from(['"ok"', '"../x"', '""', "1", '"a b"', '"x" * 3']))
        lines.append(f"name = {name}")
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(
                ['archs = ["sm_90a"]', 'archs = ["sm_75"]', "archs = []", 'archs = "sm_90a"',
                 'archs = ["sm_90a", "sm_90a"]'])))
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.integers(0, 2)):  # mostly a valid entry, then hostile fields on top
            lines.append("[[kernel]]")
            lines.append(draw(st.sampled_from(VALID_ENTRIES)))
            used = set()
        else:
            lines.append(draw(st.sampled_from(["[[kernel]]", "[kernel]"])))
            lines.append(draw(st.sampled_from(
                ['family = "rms_norm"', 'family = "qk_norm"', 'family = "moe_dispatch"',
                 'family = "nope"', "family = 1", ""])))
            used = {"family"}
        for _ in range(draw(st.integers(0, 2))):
            field = draw(FIELD_NAMES)
            if field not in used and "hidden" not in field:
                used.add(field)
                lines.append(f"{field} = {draw(TOML_VALUES)}")
    text = "\n".join(lines) + "\n"
    if draw(st.integers(0, 9)) == 0:  # raw damage on top
        raw = bytearray(text.encode())
        if raw:
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        return bytes(raw)
    return text.encode()


@fuzz("manifest")
@given(text=manifests())
def test_fuzz_manifests(work, text):
    manifest = allowed_or_own_error(parse_manifest, text, work / "fuzz.toml")
    if manifest is not None:
        assert manifest.points and manifest.archs


def test_fuzz_manifest_mutations_of_the_tiny_manifest(work):
    # Every single-byte deletion of the tiny manifest (deterministic, cheap): own error or valid.
    data = TINY_TOML.encode()
    for at in range(len(data)):
        allowed_or_own_error(parse_manifest, data[:at] + data[at + 1 :], work / "t.toml")


# ------------------------------------------------------------------------------ config.json
CONFIGS = sorted(p.name for p in HF.iterdir() if (p / "config.json").is_file())


@fuzz("config_json")
@given(data=st.data(), model=st.sampled_from(CONFIGS))
def test_fuzz_config_json(work, data, model):
    doc = json.loads((HF / model / "config.json").read_text())
    mutate_json(data, doc)
    with any_int_digits():
        text = json.dumps(doc)
    if data.draw(st.integers(0, 9)) == 0:
        text = data.draw(st.sampled_from(
            ["[" * 50_000, '{"a": ' * 3000 + "1" + "}" * 3000, "1" * 5000, "\ufeff{}", "null"]
        ))
    folder = Path(tempfile.mkdtemp(dir=work))
    (folder / "config.json").write_text(text)
    before = snapshot(folder)
    derived = allowed_or_own_error(manifest_from_config, folder)
    if derived is not None:
        toml = derived.to_toml()
        again = parse_manifest(toml.encode(), folder / "m.toml")  # what it writes loads ...
        assert [p.key for p in again.points] == [p.key for p in derived.manifest().points]
    assert snapshot(folder) == before
    shutil.rmtree(folder)


# ------------------------------------------------------------------------------ shards
NAMES = st.sampled_from(["../../ESCAPED", "/tmp/ESCAPED", "a/../../ESCAPED", "..", "ok-name", ""])


def _hostile_shard(data, tiny_shard: Path, folder: Path) -> Path:
    original = tiny_shard.read_bytes()
    index = index_of(original)
    blobs = index.pop("blobs")
    if data.draw(st.booleans()):
        mutate_json(data, index)
    index["blobs"] = blobs
    renamed = data.draw(st.booleans())
    if renamed:  # the manifest name decides merge's default output
        with contextlib.suppress(Exception):
            index["plan"]["manifests"][0]["name"] = data.draw(NAMES)
    if renamed or data.draw(st.booleans()):  # make the plan digest agree with the edited plan
        with contextlib.suppress(Exception):
            index["plan_digest"] = BuildPlan.from_json(index["plan"]).digest
    path = folder / "hostile.roseshard"
    try:
        path.write_bytes(forge(original, index))
    except (ValueError, RecursionError):
        path.write_bytes(original)
    return path


@fuzz("shard_merge")
@given(data=st.data())
def test_fuzz_merge_api(tiny_shard, work, data):
    folder = Path(tempfile.mkdtemp(dir=work))
    shard = _hostile_shard(data, tiny_shard, folder)
    out = folder / "out" / "merged.rosebundle"
    before = snapshot(folder)
    allowed_or_own_error(merge_shards, [shard], out)
    assert snapshot(folder) - before <= {out}, snapshot(folder) - before
    shutil.rmtree(folder)


@fuzz("shard_merge_cli")
@given(data=st.data())
def test_fuzz_merge_cli_without_output(tiny_shard, work, data):
    folder = Path(tempfile.mkdtemp(dir=work))
    shard = _hostile_shard(data, tiny_shard, folder)
    cwd = folder / "a" / "b"
    cwd.mkdir(parents=True)
    before = snapshot(work)
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with time_limit():
            cli_ok("merge", shard)
    finally:
        os.chdir(old)
    new = snapshot(work) - before
    assert all(p.parent == cwd / "build" for p in new), new
    shutil.rmtree(folder)
