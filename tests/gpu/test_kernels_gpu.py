"""Every point of a CPU-built bundle against its float64 reference, on the GPU.

Run on the GPU machine with the bundle built elsewhere (the production flow):
    ROSE_AOT_TEST_BUNDLE=path/to/bundle.rosebundle python -m pytest tests/gpu -m gpu

Inputs are drawn and the float64 references computed on the GPU (the references are plain torch
and run where their tensors are), once per point and token count for all its variants.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from pdl_stage import pdl_stage  # noqa: E402

from rose_aot import open_bundle  # noqa: E402
from rose_aot.kernels import get_family  # noqa: E402
from rose_aot.kernels.spec import Dim, TensorArg  # noqa: E402

pytestmark = pytest.mark.gpu

TOKENS = (1, 7, 128, 4096, 20011)  # 20011: a large odd count, not a multiple of any block

# Tolerance per output dtype, relative to max(1, |ref|): a few units in the last place of the
# output format (the kernel rounds once from fp32; the reference rounds from float64).
TOLERANCE = {"bfloat16": 2**-7, "float16": 2**-9, "float32": 1e-5}


@pytest.fixture(scope="module")
def bundle(shipped_bundle_path):
    return open_bundle(shipped_bundle_path)


def _points(bundle):
    import torch

    arch = bundle.arch_for_device(torch.cuda.current_device())
    out = []
    for point in bundle.index["points"]:
        # the norms; MoE families have their own suite (test_moe_gpu.py)
        if point["arch"] == arch and point["family"] in ("rms_norm", "qk_norm"):
            out.append((point["family"], point["config"]))
    return out


def _args(handle):
    """The call arguments of a handle on the current device: its record's, in call order."""
    import torch

    return handle.record(torch.cuda.current_device()).args


def _make_inputs(args, tokens, gen):
    """Random inputs per the record's argument spec (contiguous, so aligned for any arch), on
    the device of `gen`."""
    import torch

    tensors = []
    for arg in args:
        assert isinstance(arg, TensorArg)
        shape = [tokens if isinstance(d, Dim) else d for d in arg.shape]
        dtype = getattr(torch, arg.dtype)
        t = torch.randn(shape, generator=gen, dtype=torch.float32, device=gen.device).to(dtype)
        if "weight" in arg.name:
            t = (1.0 + 0.1 * torch.randn(shape, generator=gen, device=gen.device)).to(dtype)
        tensors.append(t)
    return tensors


def _check(name, got, want, dtype):
    import torch

    got64, want64 = got.double(), want.double()
    assert not torch.isnan(got64).any(), f"{name}: NaN in output (unwritten elements?)"
    err = (got64 - want64).abs() / want64.abs().clamp(min=1.0)
    tol = TOLERANCE[dtype]
    if (err > tol).any():
        idx = (err > tol).nonzero()[0].tolist()
        pytest.fail(
            f"{name}: max error {err.max().item():.3g} > {tol:.3g}; first bad index {idx}: "
            f"got {got64[tuple(idx)].item()} want {want64[tuple(idx)].item()}"
        )


def _run_point(bundle, family_name, config_values, tokens, variants, seed):
    """Each of `variants` (None: the plan's choice) on the same inputs, against one reference."""
    import torch

    family = get_family(family_name)
    config = family.make_config(**config_values)
    handle = bundle.kernel(family_name, **config_values)
    args = _args(handle)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    inputs = _make_inputs(args, tokens, gen)
    expect = [t.clone() for t in inputs]
    family.reference(config, *expect)
    for variant in variants:
        dev = [t.clone() for t in inputs]  # in-place arguments start from the inputs each time
        for arg, t in zip(args, dev):
            if arg.role == "output":
                t.fill_(float("nan"))  # pure outputs: poison so an unwritten element fails
        handle(*dev, variant=variant)
        torch.cuda.synchronize()
        for arg, got, want in zip(args, dev, expect):
            if arg.writes:
                _check(f"{family.key(config)} T={tokens} {variant or 'auto'} {arg.name}", got,
                       want, arg.dtype)


@pytest.mark.parametrize("tokens", TOKENS)
def test_every_point_against_reference(bundle, tokens):
    points = _points(bundle)
    assert points, "the bundle has no point for this GPU's arch"
    import torch

    device = torch.cuda.current_device()
    for i, (family_name, config) in enumerate(points):
        record = bundle.kernel(family_name, **config).record(device)
        variants = [None] + [v.name for v in record.variants]
        _run_point(bundle, family_name, config, tokens, variants, seed=1000 * tokens + i)


def test_the_ptx_fallback_loads_and_matches_the_cubins(bundle, shipped_bundle_path):
    """open_bundle(use_ptx=True): the driver JIT-compiles the bundle's PTX into modules (the
    reported fallback for drivers that refuse the cubins); the kernels run, match the float64
    reference, and give the cubins' bits (the same PTX, compiled by the driver's ptxas)."""
    import torch

    ptx_bundle = open_bundle(shipped_bundle_path, use_ptx=True)
    family_name, config = next(p for p in _points(bundle) if p[0] == "rms_norm")
    _run_point(ptx_bundle, family_name, config, 7, [None], seed=77)
    handles = [b.kernel(family_name, **config) for b in (bundle, ptx_bundle)]
    gen = torch.Generator(device="cuda").manual_seed(78)
    inputs = _make_inputs(_args(handles[0]), 7, gen)
    outputs = []
    for handle in handles:
        dev = [t.clone() for t in inputs]
        handle(*dev)
        torch.cuda.synchronize()
        outputs.append(dev)
    for got, want in zip(*outputs):
        assert torch.equal(got, want)
    loaded = [k for k in ptx_bundle._device_kernels]
    assert loaded and all(k[1] == handles[1].key for k in loaded)  # only what ran was JIT-ed


def test_qk_norm_on_views_of_a_fused_qkv_buffer(bundle):
    """q and k as strided views of one [T, (Hq + 2 Hk) * D] projection output, in place."""
    import torch

    for family_name, config in _points(bundle):
        if family_name != "qk_norm":
            continue
        family = get_family(family_name)
        c = family.make_config(**config)
        T, hq, hk, d = 300, c.num_q_heads, c.num_k_heads, c.head_dim
        dtype = getattr(torch, c.dtype)
        qkv = torch.randn(T, (hq + 2 * hk) * d, dtype=torch.float32).to(dtype)
        q = qkv[:, : hq * d].view(T, hq, d)
        k = qkv[:, hq * d : (hq + hk) * d].view(T, hk, d)
        wq = (1 + 0.1 * torch.randn(d)).to(dtype)
        wk = (1 + 0.1 * torch.randn(d)).to(dtype)
        expect_q, expect_k = q.clone(), k.clone()
        family.reference(c, expect_q, expect_k, wq, wk)
        qkv_dev = qkv.cuda()
        v_before = qkv_dev[:, (hq + hk) * d :].clone()
        qd = qkv_dev[:, : hq * d].view(T, hq, d)
        kd = qkv_dev[:, hq * d : (hq + hk) * d].view(T, hk, d)
        bundle.kernel(family_name, **config)(qd, kd, wq.cuda(), wk.cuda())
        torch.cuda.synchronize()
        _check("q view", qd.cpu(), expect_q, c.dtype)
        _check("k view", kd.cpu(), expect_k, c.dtype)
        assert torch.equal(qkv_dev[:, (hq + hk) * d :], v_before), "v was modified"


# Tokens of the chain below: rms_norm 512 over 8 rows per token (4 rows to a block) triggers
# early to 8 tokens (2048 threads), late to 256 (65536); qk_norm 32/4/128 (36 heads per token, 8
# to a block) early to 10 tokens (6144 threads), late to 113 (65536); none beyond.
NORM_CHAIN_TOKENS = (1, 24, 64, 200, 300)


def test_norm_chains_wait_for_their_predecessor_at_every_pdl_stage(bundle):
    """rms_norm (hidden 512) writes a poisoned buffer that qk_norm (32/4/128) normalizes in
    place at once, and a second rms_norm reads qk_norm's output: launched with the PDL
    attribute, each kernel starts before its predecessor ends, early or after its stores, and
    must wait (griddepcontrol.wait) before it reads; an early read would see NaN or the
    previous values and change the outputs. Each chain must equal the same calls with a device
    synchronization between them."""
    import torch

    device = torch.cuda.current_device()
    norm = bundle.kernel("rms_norm", hidden=512, eps=1e-6)
    qk = bundle.kernel("qk_norm", num_q_heads=32, num_k_heads=4, head_dim=128, eps=1e-6)
    gen = torch.Generator(device="cuda").manual_seed(9)
    w = (1 + 0.1 * torch.randn(512, generator=gen, device="cuda")).bfloat16()
    qw, kw = ((1 + 0.1 * torch.randn(128, generator=gen, device="cuda")).bfloat16()
              for _ in range(2))
    stages = set()
    for tokens in NORM_CHAIN_TOKENS:
        x = torch.randn(tokens * 8, 512, generator=gen, device="cuda").bfloat16()
        k0 = torch.randn(tokens, 4, 128, generator=gen, device="cuda").bfloat16()
        mid = torch.empty(tokens * 8, 512, dtype=torch.bfloat16, device="cuda")
        q = mid.view(tokens, 32, 128)  # the first norm's output is qk_norm's q
        k = torch.empty_like(k0)
        out = torch.empty_like(mid)

        def chain(sync):
            k.copy_(k0)
            mid.fill_(float("nan"))
            out.fill_(float("nan"))
            for call in (lambda: norm(x, w, mid), lambda: qk(q, k, qw, kw),
                         lambda: norm(mid, w, out)):
                call()
                if sync:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            return mid.clone(), k.clone(), out.clone()

        stages.add((pdl_stage(norm, (x, w, mid), device), pdl_stage(qk, (q, k, qw, kw), device)))
        want = chain(sync=True)
        assert not any(t.isnan().any() for t in want), tokens
        for _ in range(20):
            for name, got, exp in zip(("q", "k", "out"), chain(sync=False), want):
                assert torch.equal(got, exp), f"T={tokens}: {name} differs in a PDL chain"
    # every stage of both kernels ran
    assert {s for s, _ in stages} == {"early", "late", None}, stages
    assert {s for _, s in stages} == {"early", "late", None}, stages


def test_launch_is_captured_by_cuda_graphs(bundle):
    import torch

    family_name, config = next(p for p in _points(bundle) if p[0] == "rms_norm")
    family = get_family(family_name)
    c = family.make_config(**config)
    handle = bundle.kernel(family_name, **config)
    args = _args(handle)
    gen = torch.Generator(device="cuda").manual_seed(7)
    host = _make_inputs(args, 64, gen)
    dev = [t.clone() for t in host]
    expect = [t.clone() for t in host]
    family.reference(c, *expect)
    out = dev[-1]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        handle(*[t.clone() for t in dev])  # warm up (module load) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    inputs = [t.clone() for t in dev]
    with torch.cuda.graph(graph):
        handle(*inputs)
    for t, h in zip(inputs, host):
        t.copy_(h)
    inputs[-1].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _check("graph replay out", inputs[-1], expect[-1], args[-1].dtype)
    del out


@pytest.mark.parametrize("family_name", ["rms_norm", "qk_norm"])
def test_repeated_call_takes_the_generated_hot_path(bundle, family_name):
    """After a point's first call of a size, the generated hot path (checks + launcher) takes
    the call, and writes bitwise what the checked path (generic pack) writes for the variant
    the plan chose, on a second stream as on the first."""
    import torch

    _, config = next(p for p in _points(bundle) if p[0] == family_name)
    handle = bundle.kernel(family_name, **config)
    args = _args(handle)
    gen = torch.Generator(device="cuda").manual_seed(11)
    host = _make_inputs(args, 33, gen)
    handle(*[t.clone() for t in host])  # first call: full checks, resolves the launcher
    (launch,) = handle.plan(*host)
    checked = [t.clone() for t in host]
    handle(*checked, variant=launch.variant)  # forced: the checked path's generic pack
    for stream in (torch.cuda.current_stream(), torch.cuda.Stream()):
        fast = [t.clone() for t in host]
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            assert handle._fast_launch(tuple(fast)) is True
        torch.cuda.synchronize()
        for arg, got, want in zip(args, fast, checked):
            if arg.writes:
                assert torch.equal(got, want), (family_name, arg.name)


def test_param_layout_matches_driver(bundle):
    """The parameter sizes the loader packs (the bundle's record, as the handle launches from
    it) agree with what the driver reads from the loaded cubin (cuFuncGetParamInfo)."""
    import torch

    from rose_aot.loader import driver
    from rose_aot.loader.args import ParamPacker

    device = torch.cuda.current_device()
    arch = bundle.arch_for_device(device)
    checked = 0
    for point in bundle.index["points"]:
        if point["arch"] != arch:
            continue
        record = bundle.kernel(point["family"], **point["config"]).record(device)
        assert record == bundle.record(point["key"], arch)
        positions = {a.name: i for i, a in enumerate((*record.args, *record.workspace))}
        for v in record.variants:
            kernels = bundle.device_kernels(device, point["key"], v.name)
            assert len(kernels) == len(v.entries), (point["key"], v.name)
            packer = ParamPacker(positions, v.params)
            for entry, kernel in zip(v.entries, kernels):
                info = driver.function_param_info(kernel, entry)
                sizes = [s for _, s in info]
                assert sizes == [p.size for p in v.params] == packer.sizes, (point["key"], entry)
                assert sum(sizes) <= v.resources[entry]["param_bytes"], (point["key"], entry)
                checked += 1
    assert checked > 0


def test_loader_imported_no_cutlass():
    assert not [m for m in sys.modules if m == "cutlass" or m.startswith("cutlass.")]
