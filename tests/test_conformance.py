"""One conformance suite for every registered kernel family: a family is tested by being
registered (rose_aot/kernels/__init__.py) and having a point in a manifest.

Here (CPU): key stability, every config field in the point key and the cache key, the record
checked against the PTX and the cubin for each arch, the plan launching only recorded variants
with valid grids from the record alone, the family folder complete. Reference vs kernel on the
GPU at edge sizes is per family in tests/gpu/ (it needs family-specific inputs).
"""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest

from rose_aot.archs import ARCHS
from rose_aot.kernels import FAMILIES, config_json, get_family

REPO_MANIFESTS = ("manifests", "tests/manifests")


@cache
def _examples() -> dict[str, list]:
    """Every point of the shipped and test manifests, by family."""
    from fixtures_build import REPO

    from rose_aot.manifest import load_manifests

    out: dict[str, list] = {name: [] for name in FAMILIES}
    for manifest in load_manifests([REPO / d for d in REPO_MANIFESTS]):
        for point in manifest.points:
            if point.config not in out[point.family]:
                out[point.family].append(point.config)
    return out


def _example(family: str):
    examples = _examples()[family]
    assert examples, f"{family} has no point in {REPO_MANIFESTS}: add one so it is tested"
    return examples[0]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_key_is_stable_and_round_trips(family):
    fam = get_family(family)
    for config in _examples()[family]:
        again = fam.make_config(**config_json(config))
        assert again == config
        assert fam.key(again) == fam.key(config)
        assert fam.key(config).startswith(f"{family}(")


def _variations(fam, config):
    """(field, other config) for every field: the first candidate value make_config accepts."""
    from rose_aot.errors import ConfigError

    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        choices = f.metadata.get("choices") or ()
        if isinstance(value, bool):
            candidates = [not value]
        elif isinstance(value, int):
            candidates = [c for c in choices if c != value] + [value * 2, value + 8, value // 2,
                                                               value + 1, 1, 4, 128]
        elif isinstance(value, float):
            candidates = [value * 2, value / 2, 1.0, 1e-5]
        else:
            candidates = [c for c in choices if c != value]
        # Vary the field alone, else alone among the required fields (dependent defaults, e.g.
        # moe_dispatch's local_experts, then follow it).
        required = {
            g.name: getattr(config, g.name)
            for g in dataclasses.fields(config)
            if g.default is dataclasses.MISSING
        }
        tries = [
            {**base, f.name: c} for c in candidates for base in (config_json(config), required)
        ]
        for values in tries:
            try:
                other = fam.make_config(**values)
            except ConfigError:
                continue
            if getattr(other, f.name) != value:
                yield f.name, other
                break


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_config_field_changes_the_point_key_and_the_cache_key(family):
    from rose_aot.builder.build import BuildPlan, WorkItem

    fam = get_family(family)
    plan = BuildPlan((), (), {"packages": {}, "cuda_flavour": "cu12"}, {family: "digest"})
    fields = {f.name for f in dataclasses.fields(fam.Config)}
    varied = set()
    _example(family)
    for config in _examples()[family]:
        base_key = fam.key(config)
        base_cache = plan.cache_key(WorkItem(family, config, "sm_90a"))
        assert plan.cache_key(WorkItem(family, config, "sm_100a")) != base_cache
        for name, other in _variations(fam, config):
            varied.add(name)
            assert fam.key(other) != base_key, f"{family}.{name} is not in the point key"
            assert plan.cache_key(WorkItem(family, other, "sm_90a")) != base_cache, name
    assert varied == fields, f"fields never varied (add a manifest point): {fields - varied}"


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_record_matches_ptx_and_cubin_and_the_plan_reads_only_the_record(family, arch):
    """compile_point checks the record against the PTX and the cubin; here the record is also
    checked from outside: its JSON round-trips, its cubins bind to it, and the plan launches
    only recorded variants, with grids >= 1, cooperative grids within what is resident at once,
    for any device SM count (the loader passes the real device's)."""
    import hashlib

    from rose_aot.builder.compile import compile_point, resident_blocks
    from rose_aot.kernels.record import PointRecord

    fam = get_family(family)
    config = _example(family)
    compiled = compile_point(family, config, arch)
    record = compiled.record
    assert PointRecord.from_json(record.to_json()) == record
    assert [v.name for v in record.variants] == [v.name for v in fam.variants(config, ARCHS[arch])]
    for v in record.variants:
        ptx, cubin = compiled.artifacts[v.name]
        assert hashlib.sha256(cubin).hexdigest() == v.cubin_sha256
        assert hashlib.sha256(ptx.encode()).hexdigest() == v.ptx_sha256
        v.check_cubin(cubin)
        assert v.entries and all(e in ptx for e in v.entries)
    for sm_count in (78, 114, 132, 148):  # H20, H100 PCIe, H100/H200 SXM, B200
        for sizes in fam.sample_sizes(config):
            launches = fam.plan(config, record.by_name, sizes, sm_count)
            assert launches
            for launch in launches:
                v = record.variant(launch.variant)
                assert min(launch.grid) >= 1
                if v.cooperative:
                    # every block resident: one per SM, or the blocks_per_sm the build checked
                    # the compiled kernel fits (registers, threads, shared memory)
                    per_sm = v.constants.get("blocks_per_sm", 1)
                    assert launch.grid[0] * launch.grid[1] * launch.grid[2] <= sm_count * per_sm
                    for entry in v.entries:
                        used = v.resources[entry]
                        assert resident_blocks(v.threads, used["registers"],
                                               used["static_smem"] + v.smem) >= per_sm


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_folder_is_complete(family):
    """A family is one folder: family (config + plan), device code, float64 reference and
    manifest derivation, found by convention."""
    import importlib.util

    fam = get_family(family)
    package = type(fam).__module__.rsplit(".", 1)[0]
    assert package == f"rose_aot.kernels.{family}"
    for module in ("family", "device", "reference", "derive"):
        assert importlib.util.find_spec(f"{package}.{module}") is not None, f"{package}.{module}"
    assert fam.device_module == f"{package}.device"
