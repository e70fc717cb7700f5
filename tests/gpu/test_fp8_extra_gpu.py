"""fp8_token_quant and fp8_tensor_quant from a CPU-built bundle against their float64
references on the GPU: bit-exact codes and scales (tests/fp8_extra_cases.py).

Build the bundle on a CPU machine, e.g.
    rose-aot build tests/manifests/fp8-extra-cases.toml -o build/fp8-extra.rosebundle
then on the GPU machine:
    ROSE_AOT_TEST_BUNDLE=build/fp8-extra.rosebundle python -m pytest tests/gpu/test_fp8_extra_gpu.py -m gpu
Every point of the bundle in these families for the GPU's arch runs at each token count with
the plan's choice and with each plan forced (per-tensor: the cooperative decode launch and the
two prefill kernels); inputs are strided views; outputs poisoned before every launch.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fp8_extra_cases import compare, make_case, poison  # noqa: E402

from rose_aot import open_bundle  # noqa: E402
from rose_aot.kernels import get_family  # noqa: E402

pytestmark = pytest.mark.gpu

TOKENS = (1, 3, 7, 128, 4096, 20011)
FAMILIES = ("fp8_token_quant", "fp8_tensor_quant")


@pytest.fixture(scope="module")
def bundle(shipped_bundle_path):
    return open_bundle(shipped_bundle_path)


def _points(bundle, families=FAMILIES):
    import torch

    arch = bundle.arch_for_device(torch.cuda.current_device())
    return [(p["family"], p["config"]) for p in bundle.index["points"]
            if p["arch"] == arch and p["family"] in families]


@pytest.mark.parametrize("tokens", TOKENS)
def test_every_point_against_reference(bundle, tokens):
    import torch

    points = _points(bundle)
    assert {f for f, _ in points} == set(FAMILIES), "the bundle lacks a family of this suite"
    for i, (family_name, values) in enumerate(points):
        family = get_family(family_name)
        config = family.make_config(**values)
        handle = bundle.kernel(family_name, **values)
        args, want, views = make_case(family_name, config, tokens, seed=1000 * tokens + i)
        for variant in (None, *family.plan_choices):  # per-tensor: single at any size too
            poison(views)
            handle(*args, variant=variant)
            torch.cuda.synchronize()
            compare(want, views, f"{family.key(config)} T={tokens} {variant or 'auto'}")


def test_per_tensor_repeated_launches_reuse_the_workspace(bundle):
    """The workspace words must be back at zero after every launch: alternate the variants on
    inputs scaled down from launch to launch, so a max left in the workspace would show as a
    wrong scale."""
    import torch

    for family_name, values in _points(bundle, ("fp8_tensor_quant",)):
        family = get_family(family_name)
        c = family.make_config(**values)
        handle = bundle.kernel(family_name, **values)
        for step, (tokens, variant) in enumerate([(300, "decode"), (300, "prefill"),
                                                  (5, "decode"), (1, "single"),
                                                  (5000, "prefill"), (2, "single_small"),
                                                  (2, "decode"), (3, "single"),
                                                  (1, "single_small"), (1, "prefill"),
                                                  (9, "single_wide"), (9, "decode")]):
            args, want, views = make_case(family_name, c, tokens, seed=77 + step)
            args[0].mul_(0.5 ** step)
            family.reference(c, args[0].cpu().contiguous(), want["q"], want["scales"])
            handle(*args, variant=variant)
            torch.cuda.synchronize()
            compare(want, views, f"{family.key(c)} step {step} {variant}")


def test_non_finite_inputs_follow_the_documented_policy(bundle):
    import torch

    for family_name, values in _points(bundle):
        family = get_family(family_name)
        c = family.make_config(**values)
        args, want, views = make_case(family_name, c, 4, seed=5)
        x = args[0]
        x[0, 3] = float("nan")
        x[1, 5] = float("inf")
        family.reference(c, x.cpu().contiguous(), want["q"], want["scales"])
        for variant in family.plan_choices:
            poison(views)
            bundle.kernel(family_name, **values)(*args, variant=variant)
            torch.cuda.synchronize()
            compare(want, views, f"{family.key(c)} non-finite {variant}")


@pytest.mark.parametrize("tokens", [1, 300])
def test_cooperative_launch_replays_in_a_cuda_graph(bundle, tokens):
    import torch

    family_name, values = _points(bundle, ("fp8_tensor_quant",))[0]
    family = get_family(family_name)
    c = family.make_config(**values)
    handle = bundle.kernel(family_name, **values)
    args, want, views = make_case(family_name, c, tokens, seed=11)
    handle(*args, variant="decode")  # module load and warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        handle(*args, variant="decode")
    for replay in range(3):  # the barrier word and the max words must reset between replays
        args[0].mul_(0.25)
        family.reference(c, args[0].cpu().contiguous(), want["q"], want["scales"])
        poison(views)
        graph.replay()
        torch.cuda.synchronize()
        compare(want, views, f"graph replay {replay} T={tokens}")


def test_loader_imported_no_cutlass():
    assert not [m for m in sys.modules if m == "cutlass" or m.startswith("cutlass.")]
