"""The bundle's kernels as torch operators on the GPU: opcheck on every family, a small MoE
layer compiled with torch.compile(fullgraph=True) equal to eager, and the same layer captured
in a CUDA graph and replayed 1000 times (Qwen3-30B-A3B points of the shipped manifests)."""

from __future__ import annotations

import pytest

from rose_aot import open_bundle, torch_ops

pytestmark = pytest.mark.gpu

H, E, K, QH, KH, D = 2048, 128, 8, 32, 4, 128


@pytest.fixture(scope="module")
def layer(shipped_bundle_path):
    bundle = open_bundle(shipped_bundle_path)
    torch_ops.register(bundle)
    return {
        "norm": bundle.kernel("rms_norm", hidden=H, eps=1e-6),
        "fused": bundle.kernel("rms_norm", hidden=H, eps=1e-6, fused_residual=True),
        "qk": bundle.kernel("qk_norm", num_q_heads=QH, num_k_heads=KH, head_dim=D, eps=1e-6),
        "dispatch": bundle.kernel("moe_dispatch", num_experts=E, top_k=K, hidden=H),
        "combine": bundle.kernel("moe_combine", top_k=K, hidden=H),
    }


def _inputs(tokens, seed=0):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(tokens, H, device=dev, dtype=bf, generator=gen)
    res = torch.randn(tokens, H, device=dev, dtype=bf, generator=gen)
    w = torch.rand(H, device=dev, dtype=bf, generator=gen) + 0.5
    qkv = torch.randn(tokens, (QH + 2 * KH) * D, device=dev, dtype=bf, generator=gen)
    qw = torch.rand(D, device=dev, dtype=bf, generator=gen) + 0.5
    ids = torch.argsort(torch.rand(tokens, E, device=dev, generator=gen), dim=1)[:, :K].int()
    topw = torch.softmax(torch.randn(tokens, K, device=dev, generator=gen), dim=1)
    expert_w = torch.randn(H, device=dev, dtype=bf, generator=gen)
    return x, res, w, qkv, qw, ids, topw, expert_w


def _model(layer, call):
    """norm -> qk_norm -> dispatch -> stand-in expert GEMM -> combine -> fused add + norm."""
    import torch

    def forward(x, res, w, qkv, qw, ids, topw, expert_w):
        tokens = x.shape[0]
        h = torch.empty_like(x)
        call(layer["norm"], x, w, h)
        q = qkv[:, : QH * D].view(tokens, QH, D)
        k = qkv[:, QH * D : (QH + KH) * D].view(tokens, KH, D)
        call(layer["qk"], q, k, qw, qw)
        rows = tokens * K
        routed = torch.empty(rows, H, dtype=x.dtype, device=x.device)
        offsets = torch.empty(E + 1, dtype=torch.int32, device=x.device)
        positions = torch.empty(tokens, K, dtype=torch.int32, device=x.device)
        call(layer["dispatch"], h + q.reshape(tokens, -1)[:, :H], ids, routed, offsets, positions)
        y = routed * expert_w  # stands in for the grouped GEMM
        moe = torch.empty_like(x)
        call(layer["combine"], y, positions, topw, moe)
        out = torch.empty_like(x)
        res2 = res.clone()
        call(layer["fused"], moe, res2, w, out)
        return out, res2, qkv

    return forward


def _direct(handle, *args):
    handle(*args)


@pytest.mark.parametrize("tokens", [1, 7, 256])
def test_opcheck_every_family(layer, tokens):
    import torch

    x, res, w, qkv, qw, ids, topw, _ = _inputs(tokens)
    q = qkv[:, : QH * D].view(tokens, QH, D).clone()
    k = qkv[:, QH * D : (QH + KH) * D].view(tokens, KH, D).clone()
    routed = torch.empty(tokens * K, H, dtype=x.dtype, device="cuda")
    offsets = torch.empty(E + 1, dtype=torch.int32, device="cuda")
    positions = torch.empty(tokens, K, dtype=torch.int32, device="cuda")
    cases = [
        ("norm", (x, w, torch.empty_like(x))),
        ("fused", (x, res.clone(), w, torch.empty_like(x))),
        ("qk", (q, k, qw, qw)),
        ("combine", (routed.normal_(), positions.random_(0, tokens * K), topw, torch.empty_like(x))),
    ]
    if tokens == 1:  # one token to K distinct experts: rows are deterministic, so eager and
        cases.append(("dispatch", (x, ids, routed, offsets, positions)))  # traced runs compare
    for name, args in cases:
        handle = layer[name]
        op = getattr(torch.ops.rose_aot, torch_ops.op_name(handle)).default
        result = torch.library.opcheck(op, (*args, handle.key))
        assert set(result.values()) == {"SUCCESS"}, (name, result)


@pytest.mark.parametrize("tokens", [1, 64])
def test_compiled_model_has_no_graph_break_and_matches_eager(layer, tokens):
    import torch

    inputs = _inputs(tokens, seed=1)
    eager = _model(layer, _direct)(*[t.clone() for t in inputs])
    torch._dynamo.reset()
    compiled = torch.compile(_model(layer, torch_ops.call), fullgraph=True)
    got = compiled(*[t.clone() for t in inputs])
    for a, b in zip(got, eager):
        assert torch.equal(a, b)


def test_cuda_graph_of_the_model_replays_1000_times(layer):
    import torch

    tokens = 16
    static = [t.clone() for t in _inputs(tokens, seed=2)]
    forward = _model(layer, torch_ops.call)
    expect = _model(layer, _direct)(*[t.clone() for t in static])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up: workspaces are allocated outside the capture
        forward(*[t.clone() for t in static])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = forward(*static)
    fresh = _inputs(tokens, seed=2)
    for _ in range(1000):
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, expect):
        assert torch.equal(a, b)
