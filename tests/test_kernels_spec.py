"""Plain-Python kernel specs (no compile, no cutlass): point keys, launch plans, parameter ABI.

The launch rule under test (rms_norm/family.py, qk_norm/family.py): a point has a narrow "decode" variant
for small batches and a wider "prefill" variant; the plan switches from decode to prefill once at
a token count that grows with the SM count of the TARGET arch (132 on sm_90a = H100/H200, 148 on
sm_100a = B200), never of the build machine. The exact threshold formula is tuning and is not
pinned here; the switch point is found by search.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import struct

from pathlib import Path

import pytest

from rose_aot.archs import ARCHS, get_arch
from rose_aot.errors import ConfigError
from rose_aot.kernels import FAMILIES, config_digest, config_json, get_family, point_key
from rose_aot.kernels.qk_norm import tuning as qk_tuning
from rose_aot.manifest import load_manifests
from rose_aot.kernels.spec import (
    DTYPES,
    PDL_MAX_THREADS,
    Dim,
    Launch,
    ParamField,
    ScalarArg,
    TensorArg,
    param_fields,
    param_size,
)

SEED = 20261129

# ------------------------------------------------------------------------------ point keys

# A valid base point of each family with the dtype fields set explicitly (make_config derives
# out_dtype / weight_dtype from dtype when they are left out, which would change two fields at
# once). Fields left out take their defaults.
BASE = {
    "rms_norm": dict(
        hidden=4096,
        dtype="bfloat16",
        out_dtype="bfloat16",
        weight_dtype="bfloat16",
        eps=1e-6,
        weight_offset=0.0,
        fused_residual=False,
    ),
    "qk_norm": dict(
        num_q_heads=32,
        num_k_heads=8,
        head_dim=128,
        dtype="bfloat16",
        weight_dtype="bfloat16",
        eps=1e-6,
        weight_offset=0.0,
    ),
}
_MOE = dict(num_experts=128, top_k=8, hidden=2048, expert_start=0, local_experts=64)
BASE["moe_dispatch"] = {**_MOE, "dtype": "bfloat16"}
BASE["moe_combine"] = dict(top_k=8, hidden=2048, dtype="bfloat16")
BASE["act_and_mul"] = dict(d=4096, activation="silu", dtype="bfloat16", out_dtype="bfloat16")
_QUANT = dict(group=128, dtype="bfloat16", scale_layout="row_major", ue8m0=False, eps=1e-10)
BASE["fp8_group_quant"] = {"hidden": 4096, **_QUANT}
BASE["act_and_mul_fp8_quant"] = {"d": 4096, "activation": "silu", **_QUANT}
BASE["moe_dispatch_fp8_quant"] = {**_MOE, **_QUANT}
BASE["block_scaled_quant"] = dict(hidden=4096, format="mxfp8", dtype="bfloat16",
                                 scale_layout="swizzled_128x4")
BASE["nvfp4_quant"] = dict(hidden=4096, dtype="bfloat16", scale_layout="swizzled_128x4")
BASE["fp8_token_quant"] = dict(hidden=4096, dtype="bfloat16", eps=1e-10)
BASE["fp8_tensor_quant"] = dict(hidden=4096, dtype="bfloat16", eps=1e-10)
BASE["all_reduce"] = dict(world_size=2, dtype="bfloat16", fusion="none")
BASE["moe_ep_dispatch"] = dict(world_size=2, num_experts=128, top_k=8, hidden=2048,
                               dtype="bfloat16", expert_alignment=1, scale_group=0)
BASE["moe_ep_combine"] = dict(world_size=2, top_k=8, hidden=2048, dtype="bfloat16")
# More base points, for fields that can only change together with others from the first base
# (moe_dispatch: scale_group is nonzero exactly for float8 tokens).
EXTRA_BASES = {
    "moe_dispatch": [{**_MOE, "dtype": "float8_e4m3fn", "scale_group": 128}],
    "moe_ep_dispatch": [dict(world_size=2, num_experts=128, top_k=8, hidden=2048,
                             dtype="float8_e4m3fn", expert_alignment=1, scale_group=128)],
    # all_reduce: hidden/eps/weight_offset exist only fused with the norm, top_k with combine
    "all_reduce": [
        dict(world_size=2, dtype="bfloat16", fusion="residual_rms_norm", hidden=7168, eps=1e-6),
        dict(world_size=2, dtype="bfloat16", fusion="moe_combine", hidden=7168, top_k=8),
    ],
}
# Preferred other value per field; fields not listed (new ones) get one derived from their
# choices, type and current value by _other_value.
OTHER = {
    "rms_norm": dict(hidden=2048, dtype="float16", out_dtype="float32", weight_dtype="float32",
                     eps=1e-5, weight_offset=1.0, fused_residual=True),
    "qk_norm": dict(num_q_heads=16, num_k_heads=4, head_dim=256, dtype="float16",
                    weight_dtype="float32", eps=1e-5, weight_offset=1.0),
}
# A family without an entry in BASE (a new one) takes its first point in the shipped manifests.
for _manifest in load_manifests([Path(__file__).resolve().parent.parent / "manifests"]):
    for _point in _manifest.points:
        BASE.setdefault(_point.family, config_json(_point.config))
NORMS = ["qk_norm", "rms_norm"]  # the families with eps and weight_offset
FIELD_CASES = [
    (name, f.name)
    for name, fam in sorted(FAMILIES.items())
    if name in BASE
    for f in dataclasses.fields(fam.Config)
]


def _candidates(family_name, field: dataclasses.Field, current):
    if field.name in OTHER.get(family_name, {}):
        yield OTHER[family_name][field.name]
    yield from field.metadata.get("choices", ())
    if isinstance(current, bool):
        yield not current
    elif isinstance(current, int):
        yield from (current * 2, current // 2, current + 8, current + 1)
    elif isinstance(current, float):
        yield from (current * 2, current + 1.0, 1e-5, 0.5)


# Fields that cannot change alone (an all_reduce fusion brings its own fields): their "other
# value" is another base point, differing in this field and the fields it brings.
COUPLED = {"all_reduce": {"fusion"}}


def _other_value(family_name, field_name):
    """(base config, config differing in exactly `field_name`), both through make_config."""
    family = get_family(family_name)
    if field_name in COUPLED.get(family_name, ()):
        bases = [family.make_config(**v) for v in [BASE[family_name], *EXTRA_BASES[family_name]]]
        first = getattr(bases[0], field_name)
        return bases[0], next(b for b in bases if getattr(b, field_name) != first)
    for values in [BASE[family_name], *EXTRA_BASES.get(family_name, [])]:
        base = family.make_config(**values)
        field = next(f for f in dataclasses.fields(base) if f.name == field_name)
        current = getattr(base, field_name)
        for candidate in _candidates(family_name, field, current):
            if candidate == current:
                continue
            try:
                changed = family.make_config(**{**values, field_name: candidate})
            except ConfigError:
                continue
            diff = [
                f.name
                for f in dataclasses.fields(base)
                if getattr(base, f.name) != getattr(changed, f.name)
            ]
            if diff == [field_name]:
                return base, changed
    pytest.fail(f"{family_name}.{field_name}: no valid other value found; add one to OTHER")


def test_base_points_are_valid_and_every_family_is_covered():
    missing = sorted(set(FAMILIES) - set(BASE))
    assert not missing, f"add a base point of {missing} to BASE (or ship a manifest point)"
    for name in BASE:
        for values in [BASE[name], *EXTRA_BASES.get(name, [])]:
            config = get_family(name).make_config(**values)
            for field, value in values.items():
                assert getattr(config, field) == value, (name, field)


@pytest.mark.parametrize("family_name,field", FIELD_CASES)
def test_point_key_changes_when_one_field_changes(family_name, field):
    family = get_family(family_name)
    base, changed = _other_value(family_name, field)
    assert family.key(base) != family.key(changed)
    assert point_key(family_name, base) == family.key(base)
    assert config_digest(family_name, base) != config_digest(family_name, changed)
    # The key names the field, so two bundles' listings can be told apart by eye.
    assert f"{field}=" in family.key(changed)


@pytest.mark.parametrize("family_name", NORMS)
def test_point_key_changes_for_the_nearest_different_float(family_name):
    family = get_family(family_name)
    base = family.make_config(**BASE[family_name])
    eps = math.nextafter(BASE[family_name]["eps"], 1.0)
    near = family.make_config(**{**BASE[family_name], "eps": eps})
    assert family.key(base) != family.key(near)


@pytest.mark.parametrize("family_name", NORMS)
def test_equal_configs_give_one_key(family_name):
    family = get_family(family_name)
    values = BASE[family_name]
    a = family.make_config(**values)
    b = family.make_config(**dict(reversed(list(values.items()))))  # other keyword order
    c = family.Config(**{f.name: getattr(a, f.name) for f in dataclasses.fields(a)})  # directly
    assert a == b == c and hash(a) == hash(b) == hash(c)
    assert family.key(a) == family.key(b) == family.key(c)
    assert config_digest(family_name, a) == config_digest(family_name, c)


@pytest.mark.parametrize("family_name", NORMS)
def test_minus_zero_and_zero_give_one_key(family_name):
    family = get_family(family_name)
    plus = family.make_config(**{**BASE[family_name], "weight_offset": 0.0})
    minus = family.make_config(**{**BASE[family_name], "weight_offset": -0.0})
    assert math.copysign(1.0, minus.weight_offset) == 1.0, "-0.0 must be folded into 0.0"
    assert family.key(plus) == family.key(minus)
    assert "weight_offset=0.0" in family.key(minus) and "-0.0" not in family.key(minus)
    assert config_digest(family_name, plus) == config_digest(family_name, minus)


@pytest.mark.parametrize("family_name", NORMS)
def test_int_and_float_spellings_of_a_float_field_give_one_key(family_name):
    family = get_family(family_name)
    as_float = family.make_config(**{**BASE[family_name], "weight_offset": 1.0})
    as_int = family.make_config(**{**BASE[family_name], "weight_offset": 1})
    assert type(as_int.weight_offset) is float
    assert family.key(as_int) == family.key(as_float)


def test_key_spells_values_canonically_in_field_order():
    family = get_family("rms_norm")
    config = family.make_config(**{**BASE["rms_norm"], "fused_residual": True})
    key = family.key(config)
    assert key.startswith("rms_norm(") and key.endswith(")")
    parts = key[len("rms_norm(") : -1].split(",")
    assert [p.split("=")[0] for p in parts] == [f.name for f in dataclasses.fields(config)]
    for part in ("hidden=4096", "dtype=bfloat16", "eps=1e-06", "weight_offset=0.0",
                 "fused_residual=true"):
        assert part in parts, (part, key)


@pytest.mark.parametrize(
    "family_name,values,field",
    [
        ("rms_norm", {"hidden": 4096, "bogus": 1}, "bogus"),
        ("rms_norm", {"hidden": "4096"}, "hidden"),
        ("rms_norm", {"hidden": 4100}, "hidden"),
        ("rms_norm", {"hidden": 4096, "eps": float("nan")}, "eps"),
        ("qk_norm", {"num_q_heads": 32, "num_k_heads": 8, "head_dim": 96}, "head_dim"),
        ("qk_norm", {"num_q_heads": 32, "head_dim": 128}, "num_k_heads"),
    ],
)
def test_make_config_rejects_with_the_field_named(family_name, values, field):
    with pytest.raises(ConfigError) as info:
        get_family(family_name).make_config(**values)
    assert info.value.field == field and f"'{field}'" in str(info.value)


# ------------------------------------------------------------------------------ launch plans

PLAN_CONFIGS = [
    # decode and prefill only (plain rows of 8-12 and 14-16 KiB have `mid`: RMS_NORM_MID_RANGES)
    ("rms_norm", dict(hidden=4096, fused_residual=True)),
    ("rms_norm", dict(hidden=2048)),
    ("rms_norm", dict(hidden=3840, weight_offset=1.0, fused_residual=True)),  # predicated tail
    ("rms_norm", dict(hidden=16384)),
    ("rms_norm", dict(hidden=1024, dtype="float32")),
    ("qk_norm", dict(num_q_heads=32, num_k_heads=4, head_dim=128)),  # 16 lanes per head
    ("qk_norm", dict(num_q_heads=16, num_k_heads=8, head_dim=256, weight_offset=1.0)),
    ("qk_norm", dict(num_q_heads=1, num_k_heads=1, head_dim=64)),  # 8 lanes per head
    ("qk_norm", dict(num_q_heads=40, num_k_heads=8, head_dim=128, dtype="float32")),
]
PLAN_FAMILIES = sorted({f for f, _ in PLAN_CONFIGS})
PLAN_IDS = [f"{f}-" + "-".join(f"{k}{v}" for k, v in vals.items()) for f, vals in PLAN_CONFIGS]
_rng = random.Random(SEED)
TOKEN_COUNTS = sorted(
    {0, 1, 2, 3, 7, 8, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 4096, 20011}
    | {_rng.randrange(1, 70000) for _ in range(12)}
)
MAX_TOKENS = 1 << 22


@functools.lru_cache(maxsize=None)
def _variants(family, config, arch) -> dict:
    """The variants of (config, arch) by name, as a plan takes them."""
    return {v.name: v for v in family.variants(config, arch)}


def _plan(family, config, arch, sizes, force=None):
    """The plan of (config, arch) for a device with the arch's SM count."""
    return family.plan(config, _variants(family, config, arch), sizes, arch.sm_count, force)


# Variants that are another's block with programmatic dependent launch, stages of its range:
# rms_norm's decode_late (test_rms_norm_decode_launches_past_2048_threads_trigger_*), qk_norm's
# pdl and pdl_late (test_qk_norm_small_launches_take_the_prefill_blocks_pdl_twins).
PDL_TWIN_OF = {"decode_late": "decode", "pdl": "prefill", "pdl_late": "prefill"}


def _variant(family, config, arch, tokens) -> str:
    """The variant planned at `tokens`, a PDL twin counted as the variant whose block it is."""
    (launch,) = _plan(family, config, arch, {"tokens": tokens})
    return PDL_TWIN_OF.get(launch.variant, launch.variant)


def _switch_point(family, config, arch) -> int | None:
    """The smallest token count planned as prefill (1: always prefill; None: decode up to
    MAX_TOKENS). Checks there is one switch: every smaller count is decode and a spread of
    larger ones prefill."""
    if _variant(family, config, arch, MAX_TOKENS) == "decode":
        switch = None
    else:
        lo, hi = 1, MAX_TOKENS  # the answer lies in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if _variant(family, config, arch, mid) == "prefill":
                hi = mid
            else:
                lo = mid + 1
        switch = lo
    end = MAX_TOKENS + 1 if switch is None else switch
    below = [*range(1, min(end, 3000)), *range(max(3000, end - 2000), min(end, MAX_TOKENS + 1), 7)]
    for tokens in below:
        assert _variant(family, config, arch, tokens) == "decode", (arch.name, tokens, switch)
    if switch is not None:
        for tokens in sorted({switch, switch + 1, 2 * switch, 3 * switch + 7, *TOKEN_COUNTS[1:]}):
            if tokens >= switch:
                assert _variant(family, config, arch, tokens) == "prefill", (arch.name, tokens)
    return switch


def _later(a: int | None, b: int | None) -> bool:
    """Switch point a comes strictly later than b (None = never)."""
    return a != b and (a is None or (b is not None and a > b))


@pytest.mark.parametrize("arch_name", sorted(ARCHS))
@pytest.mark.parametrize("family_name,values", PLAN_CONFIGS, ids=PLAN_IDS)
def test_plan_switches_once_from_decode_to_prefill(family_name, values, arch_name):
    family = get_family(family_name)
    config = family.make_config(**values)
    arch = get_arch(arch_name)
    assert {v.name for v in family.variants(config, arch)} - set(PDL_TWIN_OF) == {"decode",
                                                                                "prefill"}
    switch = _switch_point(family, config, arch)
    # More SMs on the target never end the decode range earlier.
    previous = 1
    for sm_count in (16, 66, 132, 148, 264, 1024):
        moved = _switch_point(family, config, dataclasses.replace(arch, sm_count=sm_count))
        assert not _later(previous, moved), (sm_count, previous, moved)
        previous = moved
    assert switch == _switch_point(family, config, arch)  # a pure function of its inputs


# (config values, the first token count planned as prefill on sm_90a; None: decode throughout)
RMS_NORM_SWITCHES = [
    # rows of 8 warps: 32 MiB moved from 2048 tokens of 4096 (plain: 16 KiB per token)
    (dict(hidden=4096, fused_residual=True), 1024),  # 32 KiB per token
    (dict(hidden=3584, fused_residual=True), 1171),  # 7 warps, 28 KiB: 32 MiB from 1170.3
    (dict(hidden=2048, fused_residual=True), 2048),  # 4 warps: one row per prefill block too
    # plain rows of 3-8 KiB leave decode at the grid rule's end instead: the next test
    # 1-2 warps: the decode and prefill blocks hold 4 or 2 rows (4 warps); 32 MiB from 8192
    # tokens of 1024 (4 KiB per token), 16384 of 512, 8192 of 512 with the residual
    (dict(hidden=1024), 8192),
    (dict(hidden=512), 16384),
    (dict(hidden=512, fused_residual=True), 8192),
    # 10 and 12 warps fused: 40 and 48 KiB per token (the grid rule alone switched at 423 and
    # 353; the plain rows of 8-12 warps have `mid`: RMS_NORM_MID_RANGES)
    (dict(hidden=5120, fused_residual=True), 820),
    (dict(hidden=6144, fused_residual=True), 683),
    # 17 and 32 warps: the grid rule alone (132 SMs x 32 warps / warps per row)
    (dict(hidden=8704), 249),
    (dict(hidden=16384), 133),
]


@pytest.mark.parametrize("values,switch", RMS_NORM_SWITCHES,
                         ids=["-".join(f"{k}{v}" for k, v in vals.items())
                              for vals, _ in RMS_NORM_SWITCHES])
def test_rms_norm_takes_the_hinted_block_from_32_mib_per_call(values, switch):
    """Rows of 1-12 warps stay on the decode variant below PREFILL_MIN_BYTES (32 MiB) moved per
    call, counted from the config's dtypes and residual; then the prefill variant, the same
    block with cache hints (one row of 4-12 warps; 4 rows of one warp, 2 of two)."""
    family = get_family("rms_norm")
    config = family.make_config(**values)
    arch = get_arch("sm_90a")
    assert _switch_point(family, config, arch) == switch
    variants = _variants(family, config, arch)
    decode = variants["decode"].constants
    if switch is not None and decode["warps_per_row"] <= decode["decode_row_warps"] == 12:
        assert variants["prefill"].block == variants["decode"].block
        assert variants["prefill"].constants["rows_per_block"] == decode["rows_per_block"]
        moved = switch * family.bytes_per_token(config)
        assert moved >= 32 << 20 > (switch - 1) * family.bytes_per_token(config)


@pytest.mark.parametrize("values,warps", [
    (dict(hidden=1536), 3),
    (dict(hidden=2048), 4),
    (dict(hidden=2048, out_dtype="float32"), 4),  # the row read counts, not the output
    (dict(hidden=2560), 5),
    (dict(hidden=3072), 6),
    (dict(hidden=3584), 7),
], ids=lambda v: "-".join(f"{k}{x}" for k, x in v.items()) if isinstance(v, dict) else str(v))
def test_rms_norm_plain_rows_of_3_to_8_kib_take_prefill_past_the_grid_rule(values, warps):
    """Plain rows of 3 KiB up to 8 KiB (rms_norm/tuning.py, PLAIN_GRID_RULE_ROW_BYTES) leave
    decode where its grid exceeds 32 warps per SM, long before 32 MiB moved (2048: 1057 tokens,
    8 MiB, where the 32 MiB rule waited for 4096); their decode and prefill records say so
    (prefill_min_bytes 0), and a record of a bundle built before (32 MiB) plans as built."""
    family = get_family("rms_norm")
    config = family.make_config(**values)
    arch = get_arch("sm_90a")
    variants = _variants(family, config, arch)
    assert variants["decode"].constants["warps_per_row"] == warps
    assert {v.constants["prefill_min_bytes"] for v in variants.values()} == {0}
    switch = arch.sm_count * variants["decode"].constants["decode_warps_per_sm"] // warps + 1
    assert _switch_point(family, config, arch) == switch
    assert switch * family.bytes_per_token(config) < 32 << 20
    old = {n: dataclasses.replace(v, constants={**v.constants, "prefill_min_bytes": 32 << 20})
           for n, v in variants.items()}
    for tokens in (switch, ((32 << 20) - 1) // family.bytes_per_token(config)):
        (launch,) = family.plan(config, old, {"tokens": tokens}, arch.sm_count)
        assert launch.variant == "decode", tokens


@pytest.mark.parametrize("values", [dict(hidden=1024), dict(hidden=1536, fused_residual=True),
                                    dict(hidden=3584, fused_residual=True),
                                    dict(hidden=512, dtype="float32")])
def test_rms_norm_other_narrow_rows_keep_the_32_mib_rule(values):
    """Rows below 3 KiB and the fused rows keep 32 MiB (rms_norm/tuning.py: past the grid rule
    the prefill variant was level with decode there, hidden 1024 within 2%, the fused rows of
    1536-2048 within 3.5% either way)."""
    family = get_family("rms_norm")
    config = family.make_config(**values)
    variants = _variants(family, config, get_arch("sm_90a"))
    assert {v.constants["prefill_min_bytes"] for v in variants.values()} == {32 << 20}


@pytest.mark.parametrize("values,rows", [
    (dict(hidden=128), 4),  # half of each warp predicated off
    (dict(hidden=256), 4),
    (dict(hidden=512), 4),
    (dict(hidden=512, fused_residual=True), 4),
    (dict(hidden=1024), 2),
    (dict(hidden=512, dtype="float32"), 2),  # 2 warps of 16-byte vectors
    (dict(hidden=1536), 1),  # 3 warps: one row, as every wider row
    (dict(hidden=2048), 1),
], ids=lambda v: "-".join(f"{k}{x}" for k, x in v.items()) if isinstance(v, dict) else str(v))
def test_rms_norm_rows_of_one_or_two_warps_share_a_4_warp_decode_block(values, rows):
    """Rows of 1-2 warps decode in the prefill block's shape, several rows to a 4-warp block,
    without its cache hints and keeping x in registers (rms_norm/tuning.py: one-row blocks of
    one or two warps made a grid the SMs take in too slowly: plain 512 x 4096 3.77 -> 2.79 µs).
    A config's prefill_warps leaves decode's block alone."""
    family = get_family("rms_norm")
    arch = get_arch("sm_90a")
    for prefill_warps in (0, 16):
        variants = _variants(family, family.make_config(**values, prefill_warps=prefill_warps),
                             arch)
        decode = variants["decode"]
        assert decode.constants["rows_per_block"] == rows
        assert decode.block == (32 * decode.constants["warps_per_row"] * rows, 1, 1)
        assert (decode.constants["cache_hints"], decode.constants["reload_x"]) == (0, 0)
    # and the plan launches one block per `rows` tokens (decode or its late twin: 1001 tokens,
    # inside every row's grid rule)
    config = family.make_config(**values)
    (launch,) = _plan(family, config, arch, {"tokens": 1001})
    assert PDL_TWIN_OF.get(launch.variant, launch.variant) == "decode"
    assert launch.grid == (-(-1001 // rows), 1, 1)


@pytest.mark.parametrize("values, decode_first, prefill_first, mid", [
    ({"hidden": 128}, 0, 0, None),  # 256-byte rows (half a warp on sm_90a)
    ({"hidden": 256}, 0, 0, None),
    ({"hidden": 256, "fused_residual": True}, 0, 0, None),
    ({"hidden": 512}, 1, 1, None),  # 1 KiB rows: one warp
    ({"hidden": 512, "fused_residual": True}, 1, 1, None),
    ({"hidden": 512, "dtype": "float32"}, 0, 1, None),  # 2 KiB rows of fp32: two warps
    ({"hidden": 1024}, 0, 1, None),
    ({"hidden": 4096}, 0, 1, (1, 1)),
    ({"hidden": 4096, "fused_residual": True}, 0, 1, None),
    ({"hidden": 6144}, 0, 1, (1, 1)),
    ({"hidden": 8192}, 0, 1, (1, 1)),
    ({"hidden": 8192, "fused_residual": True}, 0, 1, (0, 0)),
])
def test_rms_norm_variants_that_load_the_weight_first(values, decode_first, prefill_first, mid):
    """Where the weight's load is issued with x's (rms_norm/tuning.py, WEIGHT_FIRST): the decode
    variant of rows of one warp of at least 1 KiB (WEIGHT_FIRST_ROW_BYTES), the prefill variant
    of rows of at least 1 KiB, and the plain `mid`, which also forms x * w before the row's sum;
    the fused `mid` and every other variant load it after x, as before."""
    family = get_family("rms_norm")
    config = family.make_config(**values)
    for arch in ("sm_90a", "sm_100a"):  # 16- and 32-byte vectors: the rule counts the row's bytes
        variants = _variants(family, config, get_arch(arch))
        first = {name: (v.constants["weight_first"], v.constants["scale_before_sum"])
                 for name, v in variants.items()}
        assert first["decode"] == (decode_first, 0), arch
        assert first["prefill"] == (prefill_first, 0), arch
        assert first.get("mid") == mid, arch


def test_rms_norm_records_of_one_row_decode_blocks_still_plan_decode_throughout():
    """A bundle built before decode shared the 4-warp block (one row per decode block, 4 rows
    per prefill block) is planned as it was then, decode at every size: its blocks differ, so
    the 32 MiB rule, which swaps the same block's hints, does not apply."""
    family = get_family("rms_norm")
    config = family.make_config(hidden=512)
    arch = get_arch("sm_90a")
    # such a bundle had no PDL for these rows: no decode_late, and decode without the attribute
    variants = {n: v for n, v in _variants(family, config, arch).items() if n != "decode_late"}
    old = variants["decode"]
    variants["decode"] = dataclasses.replace(
        old, block=(32, 1, 1), constants={**old.constants, "rows_per_block": 1}, pdl=0)
    for tokens in (1, 528, 16384, MAX_TOKENS):
        (launch,) = family.plan(config, variants, {"tokens": tokens}, arch.sm_count)
        assert (launch.variant, launch.grid) == ("decode", (tokens, 1, 1))


# Rows of 14-16 KiB and plain rows of 8-12 KiB: (config values, the last decode token count,
# the first prefill one), `mid` in between, on sm_90a (132 SMs).
RMS_NORM_MID_RANGES = [
    # plain 8, 10 and 12 warps: decode to 528, 422 and 352 tokens (132 x 32 / warps); 64 MiB
    # from 4096 tokens of 4096 (16 KiB per token), 3276.8 of 5120, 2730.7 of 6144
    (dict(hidden=4096), 528, 4096),
    (dict(hidden=5120), 422, 3277),
    (dict(hidden=6144), 352, 2731),
    (dict(hidden=2048, dtype="float32"), 528, 4096),  # 8 KiB rows of fp32: 8 warps
    # 14 warps: the grid rule ends decode at 132 x 32 / 14 = 301.7 tokens; 64 MiB from 2340.6
    # tokens of 7168 (28 KiB per token), 1170.3 with the residual (56 KiB)
    (dict(hidden=7168), 301, 2341),
    (dict(hidden=7168, fused_residual=True), 301, 1171),
    # 16 warps: decode to 264 tokens; 64 MiB from 2048 tokens (32 KiB), 1024 fused (64 KiB)
    (dict(hidden=8192), 264, 2048),
    (dict(hidden=8192, fused_residual=True), 264, 1024),
    # the rule counts bytes, not the hidden size: float32 rows of 3584 are 14 KiB, 14 warps of
    # 16-byte vectors, and move 28 KiB per token, as bfloat16 rows of 7168
    (dict(hidden=3584, dtype="float32"), 301, 2341),
    # a float16 row of 7680 (15 KiB): 15 warps, decode to 281 tokens; 64 MiB from 2184.5
    (dict(hidden=7680, dtype="float16"), 281, 2185),
]


@pytest.mark.parametrize("values,last_decode,first_prefill", RMS_NORM_MID_RANGES,
                         ids=["-".join(f"{k}{v}" for k, v in vals.items())
                              for vals, _, _ in RMS_NORM_MID_RANGES])
def test_rms_norm_wide_rows_take_mid_between_decode_and_64_mib(values, last_decode,
                                                               first_prefill):
    """Rows of 14-16 KiB and plain rows of 8-12 KiB: decode while the grid has at most 32 warps
    per SM, then `mid` while the call moves less than MID_MAX_BYTES (64 MiB), then prefill
    (rms_norm/tuning.py). The 14-16 KiB rows' mid is one 16-warp row per block, at least 4
    blocks per SM; the 8-12 KiB rows' is decode's block with the weight loaded first and x * w
    formed before the sum; neither has PDL, cache hints or a second read of x."""
    family = get_family("rms_norm")
    config = family.make_config(**values)
    arch = get_arch("sm_90a")
    variants = _variants(family, config, arch)
    row_bytes = config.hidden * (4 if config.dtype == "float32" else 2)
    # rows under 13 KiB also have decode_late (test_rms_norm_decode_launches_past_2048_threads_*)
    assert list(variants) == (["decode", "mid", "prefill"] if row_bytes >= 13 << 10
                              else ["decode", "decode_late", "mid", "prefill"])
    mid = variants["mid"]
    assert mid.pdl == 0
    assert (mid.constants["reload_x"], mid.constants["cache_hints"]) == (0, 0)
    if 14 << 10 <= row_bytes <= 16 << 10:
        assert mid.block == (512, 1, 1) and mid.constants["min_blocks"] == 4
    else:
        assert 8 << 10 <= row_bytes <= 12 << 10 and not config.fused_residual
        assert mid.block == variants["decode"].block and mid.constants["min_blocks"] == 0
        assert (mid.constants["weight_first"], mid.constants["scale_before_sum"]) == (1, 1)
        assert mid.constants["warps_per_row"] == variants["decode"].constants["warps_per_row"]
    per_token = family.bytes_per_token(config)
    assert first_prefill * per_token >= 64 << 20 > (first_prefill - 1) * per_token
    for tokens in (1, 2, 128, last_decode - 1, last_decode):
        assert _variant(family, config, arch, tokens) == "decode", tokens
    for tokens in (last_decode + 1, last_decode + 2, 512, 1000, first_prefill - 1):
        if last_decode < tokens < first_prefill:
            assert _variant(family, config, arch, tokens) == "mid", tokens
    for tokens in (first_prefill, first_prefill + 1, 4096, 20011, MAX_TOKENS):
        assert _variant(family, config, arch, tokens) == "prefill", tokens
    # Forced, each variant launches itself, one row per block (a variant the point lacks,
    # decode_late of the 14-16 KiB rows, the decode variant).
    for force in family.plan_choices:
        (launch,) = _plan(family, config, arch, {"tokens": 777}, force)
        assert launch.variant == (force if force in variants else "decode")
        assert launch.grid == (777, 1, 1)


@pytest.mark.parametrize("values, switch", [(dict(hidden=4096), 2048), (dict(hidden=6144), 1366)])
def test_rms_norm_records_without_the_8_to_12_kib_mid_plan_as_built(values, switch):
    """A bundle built before the plain rows of 8-12 KiB had `mid` (its records hold decode and
    prefill only) is planned as then: decode below 32 MiB moved per call, prefill from there,
    never a variant it lacks."""
    family = get_family("rms_norm")
    config = family.make_config(**values)
    arch = get_arch("sm_90a")
    variants = _variants(family, config, arch)
    built_before = {name: v for name, v in variants.items() if name in ("decode", "prefill")}
    for tokens in (1, 353, 529, 1024, switch - 1, switch, 4096, 20011):
        (launch,) = family.plan(config, built_before, {"tokens": tokens}, arch.sm_count)
        assert launch.variant == ("decode" if tokens < switch else "prefill"), tokens
    # the same records with mid take it from the grid rule's switch (RMS_NORM_MID_RANGES)
    (launch,) = family.plan(config, variants, {"tokens": 1024}, arch.sm_count)
    assert launch.variant == "mid"


# (config values, whether its rows trigger late at every size: rows of at least 13 KiB)
RMS_NORM_LATE_PDL = [
    (dict(hidden=128), False),  # 4 rows of half a warp to a block
    (dict(hidden=512), False),  # 4 rows of one warp
    (dict(hidden=1024), False),  # 2 rows of two warps
    (dict(hidden=1536, fused_residual=True), False),  # one row of 3 warps
    (dict(hidden=2048), False),  # 4 warps, 4 KiB
    (dict(hidden=3584), False),  # 7 warps
    (dict(hidden=4096, fused_residual=True), False),
    (dict(hidden=6144), False),  # 12 warps, 12 KiB
    (dict(hidden=7168), True),  # 14 warps, 14 KiB
    (dict(hidden=8192, fused_residual=True), True),
    (dict(hidden=4096, dtype="float32"), True),  # 16 warps, 16 KiB
]


@pytest.mark.parametrize("values, late_only", RMS_NORM_LATE_PDL)
def test_rms_norm_decode_launches_past_2048_threads_trigger_the_next_kernel_late(values,
                                                                                late_only):
    """Decode launches use PDL (rms_norm/tuning.py, DECODE_LATE_PDL_MAX_THREADS), rows of 1-3
    warps (blocks of up to 4 rows) too: up to PDL_MAX_THREADS (2048) threads `decode`, which
    lets the next kernel launch at its top; past that, to 65536 threads, `decode_late`, the
    same block and constants with the next kernel launched after the stores; beyond, decode
    without the attribute. Rows of 13 KiB and more have no decode_late: their decode triggers
    late at every size."""
    family = get_family("rms_norm")
    config = family.make_config(**values)
    arch = get_arch("sm_90a")
    variants = _variants(family, config, arch)
    decode = variants["decode"]
    if late_only:
        assert "decode_late" not in variants
        assert decode.pdl == 65536 and decode.constants["pdl_late"] == 1
    else:
        late = variants["decode_late"]
        assert decode.pdl == PDL_MAX_THREADS and "pdl_late" not in decode.constants
        assert late.pdl == 65536 and late.constants == {**decode.constants, "pdl_late": 1}
        assert (late.block, late.smem, late.params) == (decode.block, decode.smem, decode.params)
    assert variants["prefill"].pdl == 0 and "pdl_late" not in variants["prefill"].constants
    rows, block = decode.constants["rows_per_block"], decode.block[0]
    stages = []
    for tokens in range(1, 4200):
        (launch,) = _plan(family, config, arch, {"tokens": tokens})
        if launch.variant not in ("decode", "decode_late"):
            continue  # past the decode range (mid, prefill: the tests above)
        threads = -(-tokens // rows) * block
        late_stage = not late_only and PDL_MAX_THREADS < threads <= 65536
        assert launch.variant == ("decode_late" if late_stage else "decode"), tokens
        if not stages or stages[-1] != launch.variant:
            stages.append(launch.variant)
    # each stage is reached, in order (6144: decode to 5 tokens, decode_late to 170, decode to
    # the grid rule's 352; 512: decode to 64, decode_late to 2048, decode to 16383)
    assert stages == (["decode"] if late_only else ["decode", "decode_late", "decode"])
    # forced, decode_late launches itself where the point has it, else the decode variant
    (launch,) = _plan(family, config, arch, {"tokens": 64}, "decode_late")
    assert launch.variant == ("decode" if late_only else "decode_late")


@pytest.mark.parametrize("values", [
    dict(num_q_heads=32, num_k_heads=4, head_dim=128),  # 8 heads per 4-warp block
    dict(num_q_heads=64, num_k_heads=4, head_dim=128),
    dict(num_q_heads=8, num_k_heads=4, head_dim=256, dtype="float32"),  # a warp per head
    dict(num_q_heads=1, num_k_heads=1, head_dim=64),  # 16 heads per block
])
def test_qk_norm_small_launches_take_the_prefill_blocks_pdl_twins(values):
    """On the H200 qk_norm launches the prefill block at every size (tuning.py); its launches
    of up to 6144 threads take `pdl` (the next kernel launched at its top), to 65536 `pdl_late`
    (after its stores), beyond prefill, which has no griddepcontrol. The twins are prefill's
    block, constants and parameters; forced, each launches itself."""
    family = get_family("qk_norm")
    config = family.make_config(**values)
    arch = get_arch("sm_90a")
    variants = _variants(family, config, arch)
    prefill, early, late = variants["prefill"], variants["pdl"], variants["pdl_late"]
    assert (prefill.pdl, variants["decode"].pdl) == (0, 0)
    assert early.pdl == qk_tuning.PDL_EARLY_MAX_THREADS == 6144
    assert late.pdl == qk_tuning.PDL_LATE_MAX_THREADS == 65536
    assert early.constants == prefill.constants
    assert late.constants == {**prefill.constants, "pdl_late": 1}
    for twin in (early, late):
        assert (twin.block, twin.smem, twin.params) == (prefill.block, prefill.smem, prefill.params)
    per_block = prefill.constants["heads_per_block"]
    heads_per_token = config.num_q_heads + config.num_k_heads
    stages = []
    for tokens in [*range(1, 3000), *range(3000, 20000, 7)]:
        (launch,) = _plan(family, config, arch, {"tokens": tokens})
        blocks = -(-tokens * heads_per_token // per_block)
        threads = blocks * prefill.block[0]
        want = "pdl" if threads <= 6144 else "pdl_late" if threads <= 65536 else "prefill"
        assert (launch.variant, launch.grid) == (want, (blocks, 1, 1)), tokens
        if not stages or stages[-1] != want:
            stages.append(want)
    assert stages == ["pdl", "pdl_late", "prefill"]
    for name in family.plan_choices:
        (launch,) = _plan(family, config, arch, {"tokens": 4}, name)
        assert launch.variant == name


def test_qk_norm_records_without_pdl_twins_plan_prefill_as_built():
    """A bundle built before the twins (decode and prefill only) plans prefill at every size on
    the H200, and a twin forced there launches prefill, the variant it would replace."""
    family = get_family("qk_norm")
    config = family.make_config(num_q_heads=32, num_k_heads=4, head_dim=128)
    arch = get_arch("sm_90a")
    built_before = {n: v for n, v in _variants(family, config, arch).items()
                    if n in ("decode", "prefill")}
    for tokens in (1, 16, 64, 1024):
        for force in (None, "pdl", "pdl_late", "prefill"):
            (launch,) = family.plan(config, built_before, {"tokens": tokens}, arch.sm_count,
                                    force)
            assert launch.variant == "prefill", (tokens, force)
    (launch,) = family.plan(config, built_before, {"tokens": 1}, arch.sm_count, "decode")
    assert launch.variant == "decode"


@pytest.mark.parametrize("values", [dict(hidden=2048), dict(hidden=4096, fused_residual=True),
                                    dict(hidden=512), dict(hidden=1536, fused_residual=True)])
def test_rms_norm_records_without_decode_late_plan_decode_as_built(values):
    """A bundle built before decode_late (records of decode, with the trigger at the top to 2048
    threads for rows of 4+ warps and, before narrow rows had PDL, without the attribute for
    rows of 1-3 warps; and prefill) plans decode throughout its decode range, never a variant
    it lacks."""
    family = get_family("rms_norm")
    config = family.make_config(**values)
    arch = get_arch("sm_90a")
    variants = {n: v for n, v in _variants(family, config, arch).items() if n != "decode_late"}
    if variants["decode"].constants["warps_per_row"] < 4:
        variants["decode"] = dataclasses.replace(variants["decode"], pdl=0)
    for tokens in (1, 16, 17, 64, 256, 257, 512):
        (launch,) = family.plan(config, variants, {"tokens": tokens}, arch.sm_count)
        assert launch.variant == "decode", tokens


@pytest.mark.parametrize("values", [dict(hidden=2048), dict(hidden=3840), dict(hidden=3584),
                                    dict(hidden=6144, fused_residual=True),
                                    dict(hidden=4096, fused_residual=True),
                                    dict(hidden=6656), dict(hidden=8704), dict(hidden=16384),
                                    dict(hidden=7168, dtype="float32")])
def test_rms_norm_other_rows_have_no_mid_and_force_it_as_decode(values):
    """Rows outside 14-16 KiB and plain 8-12 KiB compile no `mid` (not measured there; 3840
    is 15 warps of one vector; the fused 8-12 KiB rows were not measured with one): the plan
    never names it, and forcing it (tests and benchmarks force every plan choice) launches the
    decode variant it would replace."""
    family = get_family("rms_norm")
    config = family.make_config(**values)
    arch = get_arch("sm_90a")
    assert set(_variants(family, config, arch)) - {"decode_late"} == {"decode", "prefill"}
    for tokens in (1, 300, 700, 1500, 3000, 20011):
        assert _variant(family, config, arch, tokens) in ("decode", "prefill")
        assert _plan(family, config, arch, {"tokens": tokens}, "mid") == _plan(
            family, config, arch, {"tokens": tokens}, "decode")


@pytest.mark.parametrize("family_name", PLAN_FAMILIES)
def test_target_arch_decides_between_decode_and_prefill(family_name):
    """Some point of each family plans the same token count differently for sm_90a (132 SMs)
    and sm_100a (148 SMs): the choice comes from the TARGET, whatever machine builds or plans."""
    h100, b200 = get_arch("sm_90a"), get_arch("sm_100a")
    assert (h100.sm_count, b200.sm_count) == (132, 148)
    shown = []
    for name, values in PLAN_CONFIGS:
        if name != family_name:
            continue
        family = get_family(name)
        config = family.make_config(**values)
        s90, s100 = _switch_point(family, config, h100), _switch_point(family, config, b200)
        if s90 == s100:
            continue
        # A token count between the two thresholds.
        low, high = sorted([s90, s100], key=lambda s: MAX_TOKENS + 1 if s is None else s)
        tokens = low if high is None else (low + high) // 2
        assert low <= tokens and (high is None or tokens < high)
        want_90 = "decode" if _later(s90, s100) else "prefill"
        want_100 = "prefill" if want_90 == "decode" else "decode"
        assert _variant(family, config, h100, tokens) == want_90, (values, tokens, s90, s100)
        assert _variant(family, config, b200, tokens) == want_100, (values, tokens, s90, s100)
        shown.append((values, tokens))
    assert shown, f"no {family_name} point plans differently on sm_90a and sm_100a"


@pytest.mark.parametrize("family_name", PLAN_FAMILIES)
def test_sm_count_of_the_target_moves_the_switch(family_name):
    """For some point and arch of each family the decode range grows with the target's SM count
    (the seed rule: decode while the work is about one wave of the target's SMs)."""
    moved = []
    for name, values in PLAN_CONFIGS:
        if name != family_name:
            continue
        family = get_family(name)
        config = family.make_config(**values)
        for arch_name in sorted(ARCHS):
            arch = get_arch(arch_name)
            few = _switch_point(family, config, dataclasses.replace(arch, sm_count=132))
            many = _switch_point(family, config, dataclasses.replace(arch, sm_count=148))
            if _later(many, few):
                moved.append((values, arch_name, few, many))
    assert moved, f"no {family_name} point whose decode/prefill choice depends on the SM count"


@pytest.mark.parametrize("arch_name", sorted(ARCHS))
@pytest.mark.parametrize("family_name,values", PLAN_CONFIGS, ids=PLAN_IDS)
def test_grid_covers_every_unit_exactly_once(family_name, values, arch_name):
    family = get_family(family_name)
    config = family.make_config(**values)
    arch = get_arch(arch_name)
    variants = {v.name: v for v in family.variants(config, arch)}
    checked = 0
    for force in [None, *variants]:
        for tokens in TOKEN_COUNTS:
            if tokens == 0:
                continue
            (launch,) = family.plan(config, variants, {"tokens": tokens}, arch.sm_count, force)
            v = variants[launch.variant]
            if family_name == "rms_norm":  # a block normalizes rows_per_block whole rows
                units, per_block = tokens, v.constants["rows_per_block"]
            else:  # a block normalizes threads / lanes_per_head heads over (token, Q|K head)
                units = tokens * (config.num_q_heads + config.num_k_heads)
                per_block = v.threads // v.constants["lanes_per_head"]
            gx, gy, gz = launch.grid
            assert (gy, gz) == (1, 1) and gx >= 1
            assert gx * per_block >= units, f"tokens={tokens}: {gx} x {per_block} < {units}"
            assert (gx - 1) * per_block < units, f"tokens={tokens}: a whole block idles"
            # Block, shared memory and launch attributes come from the variant, not the plan.
            assert launch == Launch(launch.variant, launch.grid, 0)
            assert v.cooperative is False and v.cluster == (1, 1, 1)
            checked += 1
    assert checked == (1 + len(variants)) * (len(TOKEN_COUNTS) - 1)


@pytest.mark.parametrize("arch_name", sorted(ARCHS))
@pytest.mark.parametrize("family_name,values", PLAN_CONFIGS, ids=PLAN_IDS)
def test_variants_are_consistent_with_their_work_split(family_name, values, arch_name):
    family = get_family(family_name)
    config = family.make_config(**values)
    arch = get_arch(arch_name)
    variants = family.variants(config, arch)
    assert "prefill" in {v.name for v in variants}
    assert len({v.name for v in variants}) == len(variants)
    elem_bytes = 4 if config.dtype == "float32" else 2
    row = config.head_dim if family_name == "qk_norm" else config.hidden
    # The arch's widest access (16 B on sm_90a, 32 B on sm_100a) where every row allows it.
    rows_bytes = [row * DTYPES[getattr(config, f)].bytes
                  for f in ("dtype", "out_dtype", "weight_dtype") if hasattr(config, f)]
    wide = arch.max_access_bytes
    access = wide if all(b % wide == 0 for b in rows_bytes) else 16
    for v in variants:
        assert v.block[1:] == (1, 1) and v.threads % 32 == 0 and 32 <= v.threads <= 1024
        assert v.params == tuple(a.name for a in family.args(config, arch))
        assert v.constants["vec"] * elem_bytes == access, (arch_name, v.name, v.constants)
        if family_name == "qk_norm":
            lanes = v.constants["lanes_per_head"]
            assert lanes & (lanes - 1) == 0 and 32 % lanes == 0  # a head never spans warps
            assert v.threads % lanes == 0
            assert lanes * v.constants["vecs_per_lane"] * access == config.head_dim * elem_bytes
        else:
            warps = v.constants["warps_per_row"]
            assert v.threads == 32 * warps * v.constants["rows_per_block"]
            # Every vector of the row has a thread (predicated where the row is short).
            assert 32 * warps * v.constants["vecs_per_thread"] * access >= config.hidden * elem_bytes


@pytest.mark.parametrize("family_name,values", PLAN_CONFIGS, ids=PLAN_IDS)
def test_force_picks_the_named_variant(family_name, values):
    family = get_family(family_name)
    config = family.make_config(**values)
    checked = 0
    for arch_name in sorted(ARCHS):
        arch = get_arch(arch_name)
        for v in family.variants(config, arch):
            for tokens in (1, 5, 100, 100_000):
                (launch,) = _plan(family, config, arch, {"tokens": tokens}, force=v.name)
                assert launch.variant == v.name, (arch_name, tokens)
                checked += 1
    assert checked >= 8


@pytest.mark.parametrize("family_name,values", PLAN_CONFIGS, ids=PLAN_IDS)
def test_zero_tokens_launch_nothing(family_name, values):
    family = get_family(family_name)
    config = family.make_config(**values)
    for arch_name in sorted(ARCHS):
        arch = get_arch(arch_name)
        for force in [None, *(v.name for v in family.variants(config, arch))]:
            assert _plan(family, config, arch, {"tokens": 0}, force) == ()


def test_plans_never_touch_a_device(monkeypatch):
    # The plan is plain Python of the target arch: it must work where torch sees no GPU.
    import torch

    def refuse(*args, **kwargs):
        raise AssertionError("a launch plan queried the device")

    for name in ("get_device_properties", "get_device_capability", "device_count",
                 "current_device", "is_available"):
        monkeypatch.setattr(torch.cuda, name, refuse)
    for family_name, values in PLAN_CONFIGS:
        family = get_family(family_name)
        config = family.make_config(**values)
        for arch_name in ARCHS:
            (launch,) = _plan(family, config, get_arch(arch_name), {"tokens": 77})
            assert launch.grid[0] >= 1


# ------------------------------------------------------------------------------ parameter ABI

T = Dim("tokens")
H = Dim("hidden")
S64 = Dim("row_stride", width=64, divisibility=8)
S32 = Dim("col_stride", width=32)
N64 = Dim("n", width=64)

ABI_CASES = [
    # (arg, expected fields as (kind, fmt, offset, mode, dim), expected size)
    pytest.param(
        TensorArg("x", "bfloat16", (T, 64), (S64, 1)),
        [
            ("ptr", "Q", 0, -1, ""),
            ("extent", "i", 8, 0, "tokens"),
            ("stride", "q", 16, 0, "row_stride"),
        ],
        24,
        id="ptr-i32-pad-i64",
    ),
    pytest.param(
        TensorArg("w", "bfloat16", (128,), (1,)), [("ptr", "Q", 0, -1, "")], 8, id="static"
    ),
    pytest.param(
        TensorArg("w", "float32", (4, 128), (128, 1)), [("ptr", "Q", 0, -1, "")], 8, id="static-2d"
    ),
    pytest.param(
        TensorArg("v", "float32", (T,), (1,)),
        [("ptr", "Q", 0, -1, ""), ("extent", "i", 8, 0, "tokens")],
        16,
        id="1d-dynamic",
    ),
    pytest.param(
        TensorArg("v", "int64", (N64,), (1,)),
        [("ptr", "Q", 0, -1, ""), ("extent", "q", 8, 0, "n")],
        16,
        id="1d-dynamic-i64",
    ),
    pytest.param(
        TensorArg("x", "bfloat16", (T, H), (S64, 1)),
        [
            ("ptr", "Q", 0, -1, ""),
            ("extent", "i", 8, 0, "tokens"),
            ("extent", "i", 12, 1, "hidden"),
            ("stride", "q", 16, 0, "row_stride"),
        ],
        24,
        id="ptr-i32-i32-i64",
    ),
    pytest.param(
        TensorArg("x", "bfloat16", (T, 4), (S64, S32)),
        [
            ("ptr", "Q", 0, -1, ""),
            ("extent", "i", 8, 0, "tokens"),
            ("stride", "q", 16, 0, "row_stride"),
            ("stride", "i", 24, 1, "col_stride"),
        ],
        32,
        id="tail-rounded-to-8",
    ),
    pytest.param(
        TensorArg("q", "bfloat16", (T, 32, 128), (S64, 128, 1)),
        [
            ("ptr", "Q", 0, -1, ""),
            ("extent", "i", 8, 0, "tokens"),
            ("stride", "q", 16, 0, "row_stride"),
        ],
        24,
        id="qk-3d",
    ),
    pytest.param(
        # The same Dim used twice is two fields (the DSL does not merge uses).
        TensorArg("sq", "float32", (T, T), (T, 1)),
        [
            ("ptr", "Q", 0, -1, ""),
            ("extent", "i", 8, 0, "tokens"),
            ("extent", "i", 12, 1, "tokens"),
            ("stride", "i", 16, 0, "tokens"),
        ],
        24,
        id="repeated-dim",
    ),
    pytest.param(ScalarArg("n", "int32"), [("scalar", "i", 0, -1, "")], 4, id="scalar-i32"),
    pytest.param(ScalarArg("n", "int64"), [("scalar", "q", 0, -1, "")], 8, id="scalar-i64"),
    pytest.param(ScalarArg("x", "float32"), [("scalar", "f", 0, -1, "")], 4, id="scalar-f32"),
    pytest.param(ScalarArg("x", "float64"), [("scalar", "d", 0, -1, "")], 8, id="scalar-f64"),
]


@pytest.mark.parametrize("arg,fields,size", ABI_CASES)
def test_param_fields_and_size(arg, fields, size):
    got = param_fields(arg)
    assert [(f.kind, f.fmt, f.offset, f.mode, f.dim) for f in got] == fields
    assert param_size(arg) == size
    # Natural C alignment, no overlap, inside the parameter.
    end = 0
    for f in got:
        width = struct.calcsize(f.fmt)
        assert f.offset % width == 0 and f.offset >= end
        end = f.offset + width
    assert end <= size and (isinstance(arg, ScalarArg) or size % 8 == 0)
    for f in got:
        assert ParamField.from_json(f.to_json()) == f


@pytest.mark.parametrize("family_name,values", PLAN_CONFIGS, ids=PLAN_IDS)
def test_shipped_family_args_have_the_measured_sizes(family_name, values):
    # Row tensors {ptr, i32 tokens, i64 stride} = 24 bytes; weights are fully static = 8 bytes.
    family = get_family(family_name)
    config = family.make_config(**values)
    for arch_name in sorted(ARCHS):
        sizes = {a.name: param_size(a) for a in family.args(config, get_arch(arch_name))}
        for name, size in sizes.items():
            assert size == (8 if "weight" in name else 24), (arch_name, name, size)


ACCESS_CASES = [
    # (family, config values, {arch: (row pointer alignment, row stride divisibility)})
    ("rms_norm", dict(hidden=4096), {"sm_90a": (16, 8), "sm_100a": (32, 16)}),
    ("rms_norm", dict(hidden=1024, dtype="float32"), {"sm_90a": (16, 4), "sm_100a": (32, 8)}),
    # 2064-byte rows: 32-byte accesses would straddle rows, so sm_100a stays at 16 bytes.
    ("rms_norm", dict(hidden=1032), {"sm_90a": (16, 8), "sm_100a": (16, 8)}),
    # A float32 weight makes 8192-byte weight rows, a bfloat16 output 4096: both allow 32 B.
    ("rms_norm", dict(hidden=2048, dtype="bfloat16", weight_dtype="float32"),
     {"sm_90a": (16, 8), "sm_100a": (32, 16)}),
    ("qk_norm", dict(num_q_heads=32, num_k_heads=8, head_dim=128),
     {"sm_90a": (16, 8), "sm_100a": (32, 16)}),
    ("qk_norm", dict(num_q_heads=8, num_k_heads=8, head_dim=64, dtype="float32"),
     {"sm_90a": (16, 4), "sm_100a": (32, 8)}),
]


@pytest.mark.parametrize("family_name,values,want", ACCESS_CASES,
                         ids=[f"{f}-{'-'.join(f'{k}{v}' for k, v in vals.items())}"
                              for f, vals, _ in ACCESS_CASES])
def test_row_alignment_and_stride_divisibility_follow_the_arch_access_width(
    family_name, values, want
):
    """sm_100a accesses 32 bytes where every row of the point is a multiple of 32 bytes, so its
    row tensors need 32-byte pointers and strides in whole 32-byte vectors; sm_90a stays at
    16 bytes. The spec is per arch: a bundle's two archs check arguments differently."""
    family = get_family(family_name)
    config = family.make_config(**values)
    for arch_name, (align, divisibility) in want.items():
        arch = get_arch(arch_name)
        args = family.args(config, arch)
        rows = [a for a in args if isinstance(a.stride[0], Dim)]
        assert rows, "every row tensor of a norm has a dynamic row stride"
        for a in rows:
            assert a.align == align, (arch_name, a.name, a.align)
            assert a.stride[0].divisibility == divisibility, (arch_name, a.name, a.stride[0])
        vec = {v.constants["vec"] for v in family.variants(config, arch)}
        assert vec == {divisibility}, (arch_name, vec)
        for w in (a for a in args if "weight" in a.name):
            assert w.align == min(align, divisibility * DTYPES[w.dtype].bytes), (arch_name, w)


def test_roles_and_what_they_write():
    roles = {r: TensorArg("t", "int32", (4,), (1,), 4, r) for r in ("input", "output", "inout",
                                                                    "workspace")}
    assert {r: a.writes for r, a in roles.items()} == {
        "input": False, "output": True, "inout": True, "workspace": True
    }
    assert ScalarArg("n", "int32").writes is False
    for family_name, values in PLAN_CONFIGS:
        family = get_family(family_name)
        config = family.make_config(**values)
        got = {a.name: a.role for a in family.args(config, get_arch("sm_90a"))}
        if family_name == "qk_norm":  # in place
            assert got == {"q": "inout", "k": "inout", "q_weight": "input", "k_weight": "input"}
        elif config.fused_residual:
            assert got == {"x": "input", "residual": "inout", "weight": "input", "out": "output"}
        else:
            assert got == {"x": "input", "weight": "input", "out": "output"}


def test_dtypes_are_torch_dtypes_of_the_stated_width():
    import torch

    for name, d in DTYPES.items():
        assert d.name == name
        t = getattr(torch, name)
        assert torch.empty(0, dtype=t).element_size() * 8 == d.bits == 8 * d.bytes, name


def test_spec_rejects_malformed_arguments():
    with pytest.raises(ValueError, match="width"):
        Dim("x", width=16)
    with pytest.raises(ValueError, match="ranks"):
        TensorArg("x", "bfloat16", (T, 4), (1,))
    with pytest.raises(ValueError, match="dtype"):
        TensorArg("x", "bfloat17", (4,), (1,))
    with pytest.raises(ValueError, match="scalar dtype"):
        ScalarArg("x", "bfloat16")
    with pytest.raises(ValueError, match="role"):
        TensorArg("x", "bfloat16", (4,), (1,), role="scratch")
