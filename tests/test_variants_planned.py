"""Every variant a shipped point compiles is one its plan launches on some device.

A serving process verifies and loads every variant of its bundle at preload (docs/results-serving.md),
so a variant the plan never picks costs each replica start a cubin for nothing. Plain Python:
the families' variants and plans, no compile.
"""

from __future__ import annotations

import pytest

from fixtures_build import MANIFEST_DIR
from rose_aot.archs import get_arch
from rose_aot.kernels import get_family
from rose_aot.manifest import load_manifests

# SM counts of the devices each arch's plans may meet (H20, H100 PCIe, H100/H200 SXM; B200, B300).
SM_COUNTS = {"sm_90a": (78, 114, 132), "sm_100a": (148, 160)}
TOKENS = sorted({*range(1, 513), *(int(1.05**i) for i in range(128, 290))})  # to ~1.3M

# Variants still compiled although no plan picks them, each kept for measurements (forced):
# qk_norm's one-warp blocks on the H200 (4-warp blocks measured faster at 1 token:
# qk_norm/tuning.py; the seed's rule, sm_100a, uses them); moe_combine's split_wide and
# split_block_late at top_k >= 6 where split's grid stays within its block limit (top-8 at hidden
# 2048: moe_combine/tuning.py; split_wide is for top-2/4); the per-tensor FP8 one-block variant
# too small for hidden 7168. A new variant that no plan picks fails here.
FORCED_ONLY = {
    ("qk_norm", "decode"),
    ("moe_combine", "split_wide"),
    ("moe_combine", "split_block_late"),
    ("fp8_tensor_quant", "single_small"),
}


def _shipped():
    seen = {}
    for manifest in load_manifests([MANIFEST_DIR]):
        for point in manifest.points:
            for arch in manifest.archs:
                seen.setdefault((point.key, arch), (point.family, point.config))
    return [(family, config, arch) for (_, arch), (family, config) in sorted(seen.items())]


def _planned(family, config, arch) -> set[str]:
    """The variants the unforced plan launches at some token count on some SM count."""
    variants = {v.name: v for v in family.variants(config, arch)}
    used = set()
    for sm_count in SM_COUNTS[arch.name]:
        for tokens in TOKENS:
            sizes = {"tokens": tokens}
            if hasattr(family, "max_rows"):  # moe_dispatch: out holds every routed copy
                sizes["rows"] = family.max_rows(config, tokens)
            used.update(launch.variant
                        for launch in family.plan(config, variants, sizes, sm_count))
    return used


# the families sized by tokens alone, or by tokens and moe_dispatch's rows
SHIPPED = [s for s in _shipped()
           if get_family(s[0]).size_names in (("tokens",), ("tokens", "rows"))]


def test_the_shipped_points_cover_the_token_planned_families():
    # collectives (all_reduce, moe_ep_*) size by other names and compile one variant per form
    assert {family for family, _, _ in SHIPPED} >= {
        "act_and_mul", "act_and_mul_fp8_quant", "fp8_group_quant", "rms_norm", "qk_norm",
        "moe_dispatch", "moe_combine"}


@pytest.mark.parametrize("family,config,arch", SHIPPED,
                         ids=[f"{get_family(f).key(c)}-{a}" for f, c, a in SHIPPED])
def test_every_compiled_variant_is_planned_somewhere(family, config, arch):
    fam, a = get_family(family), get_arch(arch)
    compiled = {v.name for v in fam.variants(config, a)}
    unplanned = compiled - _planned(fam, config, a)
    assert {(family, v) for v in unplanned} <= FORCED_ONLY, (
        f"{fam.key(config)} on {arch} compiles {sorted(unplanned)}, which its plan picks at no "
        f"token count on {SM_COUNTS[arch]} SMs: drop the variant, or plan it"
    )
