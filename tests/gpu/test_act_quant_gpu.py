"""act_and_mul, fp8_group_quant, act_and_mul_fp8_quant, block_scaled_quant and nvfp4_quant from a
CPU-built bundle against
float64 references, on the GPU (tolerances: tests/gpu/act_quant_cases.py).
On an H200 the block-scaled formats run their sm_90a build (software e2m1 rounding); the
sm_100a build's native conversion is compiled and PTX-checked on the CPU only.

Build the bundle on a CPU machine with these points, e.g.
    rose-aot build tests/manifests/act-quant-cases.toml -o build/act-quant.rosebundle
then on the GPU machine:
    ROSE_AOT_TEST_BUNDLE=build/act-quant.rosebundle python -m pytest tests/gpu/test_act_quant_gpu.py -m gpu
Every point of the bundle in these families for the GPU's arch runs at each token count with
the plan's choice and with each variant forced; inputs are strided views; outputs poisoned.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from act_quant_cases import (  # noqa: E402
    compare, make_case, nvfp4_factor_rows, nvfp4_quotient_codes, poison,
)
from pdl_stage import pdl_stage  # noqa: E402

from rose_aot import open_bundle  # noqa: E402
from rose_aot.kernels import get_family  # noqa: E402

pytestmark = pytest.mark.gpu

TOKENS = (1, 7, 128, 4096, 20011)
FAMILIES = ("act_and_mul", "fp8_group_quant", "act_and_mul_fp8_quant", "block_scaled_quant",
            "nvfp4_quant")


@pytest.fixture(scope="module")
def bundle(shipped_bundle_path):
    return open_bundle(shipped_bundle_path)


def _points(bundle):
    import torch

    arch = bundle.arch_for_device(torch.cuda.current_device())
    return [(p["family"], p["config"]) for p in bundle.index["points"]
            if p["arch"] == arch and p["family"] in FAMILIES]


@pytest.mark.parametrize("tokens", TOKENS)
def test_every_point_against_reference(bundle, tokens):
    import torch

    points = _points(bundle)
    assert points, "the bundle has no activation/quantization point for this GPU's arch"
    for i, (family_name, values) in enumerate(points):
        family = get_family(family_name)
        config = family.make_config(**values)
        handle = bundle.kernel(family_name, **values)
        args, want, views = make_case(family_name, config, tokens, seed=1000 * tokens + i)
        for variant in (None, *family.plan_choices):
            poison(family_name, views)
            handle(*args, variant=variant)
            torch.cuda.synchronize()
            compare(family_name, config, want, views,
                    f"{family.key(config)} T={tokens} {variant or 'auto'}")


def test_decode_shape_past_65535_row_blocks(bundle):
    """A decode shape with its chunks in grid x (act_and_mul) puts the rows in grid y, then in
    z once y's 65535 runs out (chunked_rows.chunk_grid); its blocks read their row back from
    y and z (device_utils.chunk_coords). The narrowest such point of each family, decode
    forced, at more rows than y holds."""
    import torch

    from rose_aot.kernels.chunked_rows import MAX_GRID_Y

    tokens = MAX_GRID_Y + 77
    arch = bundle.arch_for_device(torch.cuda.current_device())
    narrowest = {}
    for p in bundle.index["points"]:
        decode = {v["name"]: v for v in p["variants"]}.get("decode")
        # a row of one chunk (d 768: 96 vectors) is a whole-row block, rows in grid x
        if (p["arch"] != arch or p["family"] not in FAMILIES or decode is None
                or not decode["constants"].get("chunks_in_x")
                or decode["constants"]["col_blocks"] == 1):
            continue
        width = p["config"].get("d", p["config"].get("hidden"))
        if p["family"] not in narrowest or width < narrowest[p["family"]][0]:
            narrowest[p["family"]] = (width, p["config"])
    assert "act_and_mul" in narrowest, "the bundle has no act_and_mul point for this GPU's arch"
    for i, (family_name, (_, values)) in enumerate(sorted(narrowest.items())):
        family = get_family(family_name)
        config = family.make_config(**values)
        handle = bundle.kernel(family_name, **values)
        args, want, views = make_case(family_name, config, tokens, seed=77 + i)
        (launch,) = handle.plan(*args, variant="decode")
        assert launch.grid[2] == 2, launch  # the rows reach grid z
        poison(family_name, views)
        handle(*args, variant="decode")
        torch.cuda.synchronize()
        compare(family_name, config, want, views, f"{family.key(config)} T={tokens} decode")
        del args, want, views
        torch.cuda.empty_cache()


def test_fp8_non_finite_inputs_follow_the_documented_policy(bundle):
    """NaN ignored by the absmax and quantized to NaN; inf: scale inf, code NaN, others +-0."""
    import torch

    points = [(f, v) for f, v in _points(bundle) if f == "fp8_group_quant"]
    assert points
    for family_name, values in points:
        family = get_family(family_name)
        c = family.make_config(**values)
        args, _, views = make_case(family_name, c, 4, seed=5)
        x = args[0]
        x[0, 3] = float("nan")
        x[1, 5] = float("inf")
        x[3, 7] = float("-inf")
        want_q = torch.empty(4, c.hidden, dtype=torch.float8_e4m3fn)
        want_s = torch.empty(4, c.hidden // c.group)
        family.reference(c, x.cpu().contiguous(), want_q, want_s)
        bundle.kernel(family_name, **values)(*args)
        torch.cuda.synchronize()
        compare(family_name, c, {"q": want_q, "scales": want_s}, views, f"{family.key(c)} non-finite")


def _every_value_rows(dtype, width: int, shuffle: bool):
    """Every finite value of `dtype` (bit patterns in order, so a group spans neighbouring
    magnitudes; or shuffled, so groups mix them), zero-padded to whole rows of `width`."""
    import torch

    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    v = bits.view(getattr(torch, dtype)).float()
    v = v[torch.isfinite(v)]
    if shuffle:
        v = v[torch.randperm(len(v), generator=torch.Generator().manual_seed(7))]
    rows = -(-len(v) // width)
    x = torch.zeros(rows * width)
    x[: len(v)] = v
    return x.reshape(rows, width).to(getattr(torch, dtype))


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_every_input_value_quantizes_bit_exactly(bundle, shuffle):
    """Every finite bf16/fp16 value through every FP8-group and block-scaled point: exercises the
    kernels' quotient (a reciprocal and a correction step instead of a division) and the sm_90a
    e2m1 rounding on subnormal, tie and saturating inputs, against the float64 reference."""
    import torch

    points = [(f, v) for f, v in _points(bundle)
              if f in ("fp8_group_quant", "block_scaled_quant", "nvfp4_quant")]
    assert points
    for family_name, values in points:
        family = get_family(family_name)
        c = family.make_config(**values)
        x = _every_value_rows(c.dtype, c.hidden, shuffle)
        tokens = x.shape[0]
        _, _, views = make_case(family_name, c, tokens, seed=3)
        inputs = [x]
        if family_name == "nvfp4_quant":
            inputs.append(torch.tensor([1.0]))  # x * g = x: quotients over the whole range
        if family_name == "fp8_group_quant":
            want = {"q": torch.empty(tokens, c.hidden, dtype=torch.float8_e4m3fn),
                    "scales": torch.empty(tokens, c.hidden // c.group)}
            family.reference(c, x, want["q"], want["scales"])
        else:
            q, s = views["q"], views["scales"]
            want = {"q": torch.empty(q.shape, dtype=torch.uint8),
                    "scales": s.view(torch.uint8).cpu().clone()}
            family.reference(c, *inputs, want["q"].view(q.dtype), want["scales"].view(s.dtype))
        want = {k: v.cuda() for k, v in want.items()}
        family_args = [t.cuda() for t in inputs]
        bundle.kernel(family_name, **values)(*family_args, *[views[k] for k in ("q", "scales")])
        torch.cuda.synchronize()
        order = "shuffled" if shuffle else "ordered"
        compare(family_name, c, want, views, f"{family.key(c)} every value ({order})")


def test_nvfp4_multiplies_each_block_by_its_factor(bundle):
    """Every nvfp4_quant point, each variant, on rows built so that x * fp32(g / scale) (the
    definition) and a quotient per element round to different e2m1 codes: bit-exact against
    the reference, and the rows do tell the two apart."""
    import torch

    points = [v for f, v in _points(bundle) if f == "nvfp4_quant"]
    assert points
    family = get_family("nvfp4_quant")
    for values in points:
        c = family.make_config(**values)
        x = nvfp4_factor_rows(c.hidden, c.dtype)
        tokens = x.shape[0]
        _, _, views = make_case("nvfp4_quant", c, tokens, seed=5)
        g = torch.tensor([1.0])
        q, s = views["q"], views["scales"]
        want = {"q": torch.empty(q.shape, dtype=torch.uint8),
                "scales": s.view(torch.uint8).cpu().clone()}
        family.reference(c, x, g, want["q"].view(q.dtype), want["scales"].view(s.dtype))
        codes = torch.stack([want["q"] & 0xF, want["q"] >> 4], dim=-1).reshape(tokens, c.hidden)
        assert (codes != nvfp4_quotient_codes(x)).sum() >= 40
        want = {k: v.cuda() for k, v in want.items()}
        handle = bundle.kernel("nvfp4_quant", **values)
        for variant in (None, *family.plan_choices):
            poison("nvfp4_quant", views)
            handle(x.cuda(), g.cuda(), q, s, variant=variant)
            torch.cuda.synchronize()
            compare("nvfp4_quant", c, want, views,
                    f"{family.key(c)} factor rows {variant or 'auto'}")


# Tokens of a 4096-wide bf16 row (512 threads of 8 elements in the decode shapes): the early PDL
# stage (1 and 16 tokens: at most 8192 threads), the late one (17 and 128 tokens: at most
# 65536), none (129 tokens: act_and_mul's bulk, the quantizers' decode without the attribute).
CHAIN_TOKENS = (1, 16, 17, 128, 129)


def _snapshot(views):
    import torch

    return {k: (v.view(torch.uint8) if v.element_size() == 1 else v).clone()
            for k, v in views.items() if v is not None}  # no padding view: None


def test_chains_wait_for_their_predecessor_at_every_pdl_stage(bundle):
    """act_and_mul writes a poisoned intermediate that the next kernel reads at once: a second
    act_and_mul and every quantizer of a 4096-wide bf16 row. Launched with the PDL attribute,
    the next kernel starts before act_and_mul ends, early or after its stores, and must wait
    (griddepcontrol.wait) before it reads: an early read would see NaN and change its output."""
    import torch

    device = torch.cuda.current_device()
    arch = bundle.arch_for_device(device)
    producer = bundle.kernel("act_and_mul", d=4096, activation="silu", dtype="bfloat16",
                             out_dtype="bfloat16")
    consumers = [(p["family"], p["config"]) for p in bundle.index["points"]
                 if p["arch"] == arch and p["family"] in FAMILIES
                 and p["config"].get("d", p["config"].get("hidden")) == 4096
                 and p["config"].get("dtype", "bfloat16") == "bfloat16"]
    assert len({f for f, _ in consumers}) >= 4, consumers
    gen = torch.Generator(device="cuda").manual_seed(5)
    stages = set()
    for i, (family_name, values) in enumerate(consumers):
        family = get_family(family_name)
        config = family.make_config(**values)
        handle = bundle.kernel(family_name, **values)
        for tokens in CHAIN_TOKENS:
            x = torch.randn(tokens, 8192, generator=gen, device="cuda").to(torch.bfloat16)
            # the intermediate: act_and_mul's output, a strided view of a row of 8192 whose
            # second half is the next act_and_mul's `up` input
            buf = torch.randn(tokens, 8192, generator=gen, device="cuda").to(torch.bfloat16)
            mid = buf[:, :4096]
            args, _, views = make_case(family_name, config, tokens, seed=i)
            args = (buf if family_name == "act_and_mul" else mid, *args[1:])
            stages.add((pdl_stage(producer, (x, mid), device),
                        pdl_stage(handle, args, device)))

            producer(x, mid)
            torch.cuda.synchronize()
            assert not mid.isnan().any()
            handle(*args)
            torch.cuda.synchronize()
            want = _snapshot(views)  # the padding views keep their NaN poison: equal_nan
            for _ in range(20):
                mid.fill_(float("nan"))
                poison(family_name, views)
                producer(x, mid)
                handle(*args)
                torch.cuda.synchronize()
                got = _snapshot(views)
                for k in want:
                    torch.testing.assert_close(
                        got[k], want[k], rtol=0, atol=0, equal_nan=True,
                        msg=lambda m, k=k: f"{family.key(config)} T={tokens}: {k} differs in a "
                                           f"PDL chain: {m}")
    # every stage of the consumer ran, after producers of every stage
    assert {s for _, s in stages} == {"early", "late", None}, stages
    assert {p for p, _ in stages} == {"early", "late", None}, stages


def test_launch_is_captured_by_cuda_graphs(bundle):
    import torch

    family_name, values = next(p for p in _points(bundle) if p[0] == "act_and_mul_fp8_quant")
    family = get_family(family_name)
    c = family.make_config(**values)
    handle = bundle.kernel(family_name, **values)
    args, want, views = make_case(family_name, c, 300, seed=11)
    handle(*args)  # module load and warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        handle(*args)
    poison(family_name, views)
    graph.replay()
    torch.cuda.synchronize()
    compare(family_name, c, want, views, "graph replay")


def test_loader_imported_no_cutlass():
    assert not [m for m in sys.modules if m == "cutlass" or m.startswith("cutlass.")]
