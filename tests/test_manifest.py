"""Manifest parsing and validation: shipped manifests, expansion, defaults, and every bad input
raising one ManifestError that names the file, the entry and the field."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import pytest

from rose_aot.archs import ARCHS, DEFAULT_ARCHS
from rose_aot.errors import ManifestError
from rose_aot.kernels import get_family
from rose_aot.manifest import (
    MAX_POINTS_PER_ENTRY,
    Manifest,
    Point,
    find_manifests,
    load_manifest,
    load_manifests,
)

MANIFEST_DIR = Path(__file__).resolve().parents[1] / "manifests"

RMS_2048 = '[[kernel]]\nfamily = "rms_norm"\nhidden = 2048\n'


def write(tmp_path: Path, text: str, name: str = "m.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def rms(**values) -> Point:
    return Point("rms_norm", get_family("rms_norm").make_config(**values))


def qk(**values) -> Point:
    return Point("qk_norm", get_family("qk_norm").make_config(**values))


# --- shipped manifests --------------------------------------------------------------------------
def dispatch(**values) -> Point:
    return Point("moe_dispatch", get_family("moe_dispatch").make_config(**values))


def combine(**values) -> Point:
    return Point("moe_combine", get_family("moe_combine").make_config(**values))


def point(family: str, **values) -> Point:
    return Point(family, get_family(family).make_config(**values))


def moe(experts: int, top_k: int, hidden: int) -> list[Point]:
    return [
        dispatch(num_experts=experts, top_k=top_k, hidden=hidden),
        combine(top_k=top_k, hidden=hidden),
    ]


SHIPPED = {
    "qwen3-235b-a22b": [
        rms(hidden=4096, eps=1e-6, fused_residual=False),
        rms(hidden=4096, eps=1e-6, fused_residual=True),
        qk(num_q_heads=64, num_k_heads=4, head_dim=128, eps=1e-6),
        *moe(128, 8, 4096),
        point("act_and_mul", d=1536),
    ],
    "qwen3-30b-a3b": [
        rms(hidden=2048, eps=1e-6, fused_residual=False),
        rms(hidden=2048, eps=1e-6, fused_residual=True),
        qk(num_q_heads=32, num_k_heads=4, head_dim=128, eps=1e-6),
        *moe(128, 8, 2048),
        point("act_and_mul", d=768),
    ],
    "qwen3-8b": [
        rms(hidden=4096, eps=1e-6, fused_residual=False),
        rms(hidden=4096, eps=1e-6, fused_residual=True),
        qk(num_q_heads=32, num_k_heads=8, head_dim=128, eps=1e-6),
        point("act_and_mul", d=12288),
    ],
    "llama-3.1-8b": [
        rms(hidden=4096, eps=1e-5, fused_residual=False),
        rms(hidden=4096, eps=1e-5, fused_residual=True),
        point("act_and_mul", d=14336),
    ],
    "gemma-3-12b": [
        rms(hidden=3840, eps=1e-6, weight_offset=1.0, fused_residual=False),
        rms(hidden=3840, eps=1e-6, weight_offset=1.0, fused_residual=True),
        qk(num_q_heads=16, num_k_heads=8, head_dim=256, eps=1e-6, weight_offset=1.0),
        point("act_and_mul", d=15360, activation='gelu_tanh'),
    ],
    "mistral-7b": [
        rms(hidden=4096, eps=1e-5, fused_residual=False),
        rms(hidden=4096, eps=1e-5, fused_residual=True),
        point("act_and_mul", d=14336),
    ],
    "mixtral-8x7b": [
        rms(hidden=4096, eps=1e-5, fused_residual=False),
        rms(hidden=4096, eps=1e-5, fused_residual=True),
        *moe(8, 2, 4096),
        point("act_and_mul", d=14336),
    ],
    "deepseek-v3": [
        rms(hidden=7168, eps=1e-6, fused_residual=False),
        rms(hidden=7168, eps=1e-6, fused_residual=True),
        rms(hidden=1536, eps=1e-6),  # q_a_layernorm (MLA query latent)
        rms(hidden=512, eps=1e-6),  # kv_a_layernorm (MLA key/value latent)
        *[
            dispatch(num_experts=256, top_k=8, hidden=7168),
            dispatch(
                num_experts=256, top_k=8, hidden=7168, dtype="float8_e4m3fn", scale_group=128
            ),
            *[
                point("moe_dispatch_fp8_quant", num_experts=256, top_k=8, hidden=7168,
                      scale_layout="col_major_tma", ue8m0=ue8m0)
                for ue8m0 in (False, True)
            ],
            combine(top_k=8, hidden=7168),
        ],
        point("act_and_mul", d=18432),
        point("act_and_mul", d=2048),
        point("fp8_group_quant", hidden=7168, scale_layout='col_major_tma'),
        point("fp8_group_quant", hidden=7168, scale_layout='col_major_tma', ue8m0=True),
        point("act_and_mul_fp8_quant", d=18432, scale_layout='col_major_tma'),
        point("act_and_mul_fp8_quant", d=18432, scale_layout='col_major_tma', ue8m0=True),
        point("act_and_mul_fp8_quant", d=2048, scale_layout='col_major_tma'),
        point("act_and_mul_fp8_quant", d=2048, scale_layout='col_major_tma', ue8m0=True),
    ],
    "gpt-oss-20b": [
        rms(hidden=2880, eps=1e-5, fused_residual=False),
        rms(hidden=2880, eps=1e-5, fused_residual=True),
        *moe(32, 4, 2880),
        point("block_scaled_quant", hidden=2880),
    ],
    "gpt-oss-120b": [
        rms(hidden=2880, eps=1e-5, fused_residual=False),
        rms(hidden=2880, eps=1e-5, fused_residual=True),
        *moe(128, 4, 2880),
        point("block_scaled_quant", hidden=2880),
    ],
}


def test_shipped_manifests_are_exactly_the_expected_ones():
    assert [p.stem for p in find_manifests(MANIFEST_DIR)] == sorted(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_manifest_loads(name):
    path = MANIFEST_DIR / f"{name}.toml"
    m = load_manifest(path)
    assert m.name == name
    assert m.path == str(path)
    assert m.archs == ("sm_90a", "sm_100a")
    assert m.description
    assert m.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert m.points == tuple(SHIPPED[name])
    # bf16 activations; only DeepSeek-V3's fp8 checkpoint also dispatches float8 tokens
    assert all(
        p.config.dtype == "bfloat16" or (name, p.family) == ("deepseek-v3", "moe_dispatch")
        for p in m.points
    )
    # The file names its source model, so the numbers can be checked against config.json.
    assert "config.json" in path.read_text(encoding="utf-8")


def test_load_manifests_directory_returns_all_shipped_in_name_order():
    manifests = load_manifests([MANIFEST_DIR])
    assert [m.name for m in manifests] == sorted(SHIPPED)
    assert sum(len(m.points) for m in manifests) == sum(len(p) for p in SHIPPED.values()) == 58


# --- expansion, dedup, defaults -----------------------------------------------------------------
def test_list_fields_expand_to_cartesian_product_in_field_order(tmp_path):
    path = write(
        tmp_path,
        '[[kernel]]\nfamily = "rms_norm"\nhidden = [1024, 2048, 4096]\n'
        "eps = 1e-5\nfused_residual = [false, true]\n",
    )
    points = load_manifest(path).points
    expected = [
        rms(hidden=h, eps=1e-5, fused_residual=f) for h in (1024, 2048, 4096) for f in (False, True)
    ]
    assert list(points) == expected
    assert len({p.key for p in points}) == 6


def test_points_are_deduplicated_within_a_file_keeping_file_order(tmp_path):
    path = write(
        tmp_path,
        '[[kernel]]\nfamily = "rms_norm"\nhidden = [2048, 1024, 2048]\n'
        '[[kernel]]\nfamily = "qk_norm"\nnum_q_heads = 32\nnum_k_heads = 4\nhead_dim = 128\n'
        # Same point as the first one, spelled with defaults written out.
        '[[kernel]]\nfamily = "rms_norm"\nhidden = 2048\ndtype = "bfloat16"\n'
        "fused_residual = false\n",
    )
    points = load_manifest(path).points
    assert points == (
        rms(hidden=2048),
        rms(hidden=1024),
        qk(num_q_heads=32, num_k_heads=4, head_dim=128),
    )


def test_point_key_is_the_family_key():
    point = qk(num_q_heads=32, num_k_heads=4, head_dim=128)
    assert point.key == get_family("qk_norm").key(point.config)
    assert point.key.startswith("qk_norm(")


def test_defaults_name_is_file_stem_and_archs_default(tmp_path):
    path = write(tmp_path, RMS_2048, name="my-model.toml")
    m = load_manifest(path)
    assert isinstance(m, Manifest)
    assert m.name == "my-model"
    assert m.description == ""
    assert m.archs == tuple(DEFAULT_ARCHS)
    assert m.points == (rms(hidden=2048),)


def test_deployment_values_are_taken(tmp_path):
    path = write(
        tmp_path,
        '[deployment]\nname = "other"\ndescription = "d"\narchs = ["sm_100a", "sm_90a"]\n'
        + RMS_2048,
    )
    m = load_manifest(path)
    assert (m.name, m.description, m.archs) == ("other", "d", ("sm_100a", "sm_90a"))
    assert set(m.archs) <= set(ARCHS)


def test_digest_is_sha256_of_the_file_bytes(tmp_path):
    text = "# comment\n" + RMS_2048
    path = write(tmp_path, text)
    digest = load_manifest(path).digest
    assert digest == hashlib.sha256(text.encode()).hexdigest()
    # A change that does not change the points still changes the digest.
    path.write_text(text + "\n# another comment\n", encoding="utf-8")
    assert load_manifest(path).digest != digest


def test_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + RMS_2048.encode())
    assert load_manifest(path).points == (rms(hidden=2048),)


def test_int_is_accepted_for_float_field(tmp_path):
    path = write(tmp_path, RMS_2048 + "weight_offset = 1\n")
    (point,) = load_manifest(path).points
    assert point.config.weight_offset == 1.0
    assert isinstance(point.config.weight_offset, float)


# --- bad manifests ------------------------------------------------------------------------------
K1_RMS = "kernel #1 (rms_norm)"
K2_QK = "kernel #2 (qk_norm)"
QK_ENTRY = '[[kernel]]\nfamily = "qk_norm"\nnum_q_heads = 32\nnum_k_heads = 4\n'

# (id, manifest text, entry, field, fragments the message must contain)
BAD_MANIFESTS = [
    ("toml-syntax", RMS_2048 + "eps = \n", None, None, ["invalid TOML", "line 4"]),
    ("toml-duplicate-key", RMS_2048 + "hidden = 4096\n", None, None, ["invalid TOML"]),
    (
        "unknown-family",
        '[[kernel]]\nfamily = "rms_nrom"\nhidden = 2048\n',
        "kernel #1 (rms_nrom)",
        "family",
        ["'rms_nrom'", "unknown kernel family", "rms_norm", "qk_norm"],
    ),
    ("missing-family", "[[kernel]]\nhidden = 2048\n", "kernel #1", "family", ["family = "]),
    (
        "family-not-string",
        '[[kernel]]\nfamily = ["rms_norm", "qk_norm"]\nhidden = 2048\n',
        "kernel #1",
        "family",
        ["must be a string", "one [[kernel]] entry per family"],
    ),
    (
        "unknown-field",
        RMS_2048 + "hiden_size = 2048\n",
        K1_RMS,
        "hiden_size",
        ["unknown field", "hidden", "fused_residual"],
    ),
    (
        "missing-required-field",
        RMS_2048 + QK_ENTRY,
        K2_QK,
        "head_dim",
        ["missing", "set head_dim in this [[kernel]] entry"],
    ),
    ("string-for-int", RMS_2048.replace("2048", '"2048"'), K1_RMS, "hidden", ["expected int"]),
    ("bool-for-int", RMS_2048.replace("2048", "true"), K1_RMS, "hidden", ["expected int"]),
    ("float-for-int", RMS_2048.replace("2048", "2048.0"), K1_RMS, "hidden", ["expected int"]),
    (
        "float-for-bool",
        RMS_2048 + "fused_residual = 1.0\n",
        K1_RMS,
        "fused_residual",
        ["expected bool"],
    ),
    ("string-for-float", RMS_2048 + 'eps = "1e-6"\n', K1_RMS, "eps", ["expected float"]),
    ("nan-float", RMS_2048 + "eps = nan\n", K1_RMS, "eps", ["finite"]),
    (
        "unsupported-head-dim",
        RMS_2048 + QK_ENTRY + "head_dim = 96\n",
        K2_QK,
        "head_dim",
        ["96", "64", "128", "256"],
    ),
    (
        "unsupported-dtype",
        RMS_2048 + 'dtype = "int8"\n',
        K1_RMS,
        "dtype",
        ["'int8'", "bfloat16", "float16", "float32"],
    ),
    (
        "unsupported-hidden",
        RMS_2048.replace("2048", "2047"),
        K1_RMS,
        "hidden",
        ["2047", "multiple of"],
    ),
    (
        "bad-value-inside-list",
        RMS_2048 + QK_ENTRY + "head_dim = [64, 96]\n",
        K2_QK,
        "head_dim",
        ["96", "in the point with head_dim = 96"],
    ),
    (
        "cross-field-names-the-point",
        RMS_2048 + 'dtype = "float32"\nout_dtype = "bfloat16"\nfused_residual = [false, true]\n',
        K1_RMS,
        "out_dtype",
        ["fused_residual", "in the point with fused_residual = true"],
    ),
    ("empty-list", RMS_2048 + "fused_residual = []\n", K1_RMS, "fused_residual", ["empty list"]),
    (
        "list-of-lists",
        RMS_2048 + "fused_residual = [[false], [true]]\n",
        K1_RMS,
        "fused_residual",
        ["list of lists"],
    ),
    (
        "nested-table",
        RMS_2048 + "[kernel.extra]\nx = 1\n",
        K1_RMS,
        "extra",
        ["table"],
    ),
    ("inline-table", RMS_2048 + "eps = { value = 1e-6 }\n", K1_RMS, "eps", ["table"]),
    ("date", RMS_2048 + "eps = 1979-05-27\n", K1_RMS, "eps", ["1979-05-27 is a date"]),
    (
        "too-many-points",
        '[[kernel]]\nfamily = "rms_norm"\n'
        f"hidden = [{', '.join(str(8 * (i + 1)) for i in range(MAX_POINTS_PER_ENTRY // 2 + 1))}]\n"
        "fused_residual = [false, true]\n",
        K1_RMS,
        None,
        [str(MAX_POINTS_PER_ENTRY + 2), "shorten the lists"],
    ),
    (
        "unknown-arch",
        '[deployment]\narchs = ["sm_90a", "sm_80"]\n' + RMS_2048,
        "deployment",
        "archs",
        ["'sm_80'", "sm_90a", "sm_100a"],
    ),
    (
        "duplicate-arch",
        '[deployment]\narchs = ["sm_90a", "sm_100a", "sm_90a"]\n' + RMS_2048,
        "deployment",
        "archs",
        ["'sm_90a'", "more than once"],
    ),
    ("empty-archs", "[deployment]\narchs = []\n" + RMS_2048, "deployment", "archs", ["empty"]),
    (
        "archs-not-list",
        '[deployment]\narchs = "sm_90a"\n' + RMS_2048,
        "deployment",
        "archs",
        ["list of arch names"],
    ),
    (
        "arch-not-string",
        "[deployment]\narchs = [90]\n" + RMS_2048,
        "deployment",
        "archs",
        ["arch name string"],
    ),
    (
        "unknown-deployment-key",
        '[deployment]\nmodel = "x"\n' + RMS_2048,
        "deployment",
        "model",
        ["unknown key", "name", "description", "archs"],
    ),
    (
        "bad-name",
        '[deployment]\nname = "my model/v2"\n' + RMS_2048,
        "deployment",
        "name",
        ["not a usable name"],
    ),
    ("name-not-string", "[deployment]\nname = 3\n" + RMS_2048, "deployment", "name", ["string"]),
    (
        "description-not-string",
        "[deployment]\ndescription = 3\n" + RMS_2048,
        "deployment",
        "description",
        ["string"],
    ),
    ("deployment-not-table", "deployment = 3\n" + RMS_2048, "deployment", None, ["table"]),
    ("no-kernel", '[deployment]\nname = "x"\n', None, None, ["no [[kernel]]"]),
    ("empty-kernel-array", "kernel = []\n", None, None, ["no [[kernel]]"]),
    ("kernel-single-table", '[kernel]\nfamily = "rms_norm"\n', None, None, ["[[kernel]]"]),
    ("unknown-top-level-key", RMS_2048 + "[model]\nx = 1\n", None, None, ["'model'"]),
    ("empty-file", "", None, None, ["no [[kernel]]"]),
]


@pytest.mark.parametrize(
    "text, entry, field, fragments",
    [case[1:] for case in BAD_MANIFESTS],
    ids=[case[0] for case in BAD_MANIFESTS],
)
def test_bad_manifest_raises_one_error_naming_file_entry_field(
    tmp_path, text, entry, field, fragments
):
    path = write(tmp_path, text)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    err = info.value
    message = str(err)
    assert err.path == str(path)
    assert message.startswith(f"{path}: ")
    assert err.entry == entry
    assert err.field == field
    if entry is not None:
        assert f": {entry}: " in message
    if field is not None:
        assert f"field '{field}'" in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_bad_values_in_the_third_entry_name_the_third_entry(tmp_path):
    path = write(tmp_path, RMS_2048 * 2 + QK_ENTRY + "head_dim = 96\n")
    with pytest.raises(ManifestError, match=r"kernel #3 \(qk_norm\): field 'head_dim'"):
        load_manifest(path)


# --- files that are not manifests ---------------------------------------------------------------
def _missing(tmp_path):
    return tmp_path / "absent.toml"


def _directory(tmp_path):
    path = tmp_path / "dir.toml"
    path.mkdir()
    return path


def _binary_garbage(tmp_path):
    path = tmp_path / "bundle.toml"
    # A zstd frame header followed by bytes that are not text.
    path.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(range(256)) * 4)
    return path


def _non_utf8(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes("# café\n".encode("latin-1") + RMS_2048.encode())
    return path


def _utf8_not_toml(tmp_path):
    return write(tmp_path, '{"kernel": [{"family": "rms_norm"}]}\n', name="json.toml")


BAD_FILES = [
    (_missing, "no such file"),
    (_directory, "is a directory"),
    (_binary_garbage, "binary file"),
    (_non_utf8, "not UTF-8"),
    (_utf8_not_toml, "invalid TOML"),
]


@pytest.mark.parametrize(
    "make, fragment", BAD_FILES, ids=[make.__name__.lstrip("_") for make, _ in BAD_FILES]
)
def test_bad_file_raises_clear_manifest_error(tmp_path, make, fragment):
    path = make(tmp_path)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert info.value.path == str(path)
    assert str(info.value).startswith(f"{path}: ")
    assert fragment in str(info.value)


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize(
    "text",
    [case[1] for case in BAD_MANIFESTS[:3]] + [RMS_2048 + QK_ENTRY + "head_dim = 96\n"],
)
def test_loading_writes_nothing(tmp_path, text):
    path = write(tmp_path, text)
    write(tmp_path, RMS_2048, name="good.toml")
    before = _tree(tmp_path)
    assert len(before) == 2
    with pytest.raises(ManifestError):
        load_manifests([tmp_path])
    load_manifest(tmp_path / "good.toml")
    assert _tree(tmp_path) == before
    assert path.read_text(encoding="utf-8") == text


def test_manifest_error_pickles():
    path = "m.toml"
    err = ManifestError(path, "bad", entry="kernel #1 (rms_norm)", field="hidden")
    clone = pickle.loads(pickle.dumps(err))
    assert (str(clone), clone.path, clone.entry, clone.field) == (
        str(err),
        path,
        "kernel #1 (rms_norm)",
        "hidden",
    )


# --- directories and several manifests ----------------------------------------------------------
def test_find_manifests_sorted_toml_only(tmp_path):
    for name in ("b.toml", "a.toml", "notes.txt", ".hidden.toml"):
        write(tmp_path, RMS_2048, name=name)
    (tmp_path / "sub.toml").mkdir()
    assert find_manifests(tmp_path) == [tmp_path / "a.toml", tmp_path / "b.toml"]


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda tmp: tmp, "has no *.toml manifests"),
        (lambda tmp: tmp / "absent", "no such directory"),
        (lambda tmp: write(tmp, RMS_2048), "is not a directory"),
    ],
    ids=["empty", "missing", "file"],
)
def test_find_manifests_errors(tmp_path, make, fragment):
    path = make(tmp_path)
    with pytest.raises(ManifestError) as info:
        find_manifests(path)
    assert info.value.path == str(path)
    assert fragment in str(info.value)


def test_load_manifests_mixes_files_and_directories(tmp_path):
    a = write(tmp_path, RMS_2048, name="a.toml")
    sub = tmp_path / "more"
    sub.mkdir()
    write(sub, RMS_2048, name="b.toml")
    write(sub, RMS_2048, name="c.toml")
    manifests = load_manifests([a, sub])
    assert [m.name for m in manifests] == ["a", "b", "c"]
    # One file reached twice is loaded once; a single path is accepted as is.
    assert [m.name for m in load_manifests([sub, sub / "b.toml"])] == ["b", "c"]
    assert [m.name for m in load_manifests(str(a))] == ["a"]


def test_load_manifests_rejects_duplicate_names(tmp_path):
    write(tmp_path, RMS_2048, name="qwen.toml")
    other = write(tmp_path, '[deployment]\nname = "qwen"\n' + RMS_2048, name="z.toml")
    with pytest.raises(ManifestError) as info:
        load_manifests([tmp_path])
    err = info.value
    assert err.path == str(other)
    assert (err.entry, err.field) == ("deployment", "name")
    assert str(tmp_path / "qwen.toml") in str(err)


def test_load_manifests_needs_at_least_one_path():
    with pytest.raises(ManifestError, match="at least one manifest"):
        load_manifests([])


def test_load_manifests_reports_the_bad_file(tmp_path):
    write(tmp_path, RMS_2048, name="a.toml")
    bad = write(tmp_path, RMS_2048 + 'dtype = "int8"\n', name="b.toml")
    with pytest.raises(ManifestError) as info:
        load_manifests([tmp_path])
    assert info.value.path == str(bad)
    assert info.value.field == "dtype"
