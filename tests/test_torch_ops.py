"""torch operators over a bundle's points (CPU part: schemas, registration, fake tracing).

The CUDA implementation runs in tests/gpu/test_torch_ops_gpu.py (opcheck, torch.compile
fullgraph, CUDA-graph replays)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def ops_bundle(tiny_build):
    from rose_aot import torch_ops
    from rose_aot.loader import open_bundle

    bundle = open_bundle(tiny_build.path)
    torch_ops.register(bundle)
    return bundle


def test_schemas_declare_written_arguments(ops_bundle):
    from rose_aot import torch_ops

    plain = ops_bundle.kernel("rms_norm", hidden=1024)
    fused = ops_bundle.kernel("rms_norm", hidden=1024, fused_residual=True)
    qk = ops_bundle.kernel("qk_norm", num_q_heads=8, num_k_heads=2, head_dim=64)
    assert torch_ops.schema(plain) == (
        "rms_norm(Tensor x, Tensor weight, Tensor(a!) out, str point) -> ()"
    )
    assert torch_ops.schema(fused) == (
        "rms_norm_residual(Tensor x, Tensor(a!) residual, Tensor weight, Tensor(b!) out, "
        "str point) -> ()"
    )
    assert torch_ops.schema(qk) == (
        "qk_norm(Tensor(a!) q, Tensor(b!) k, Tensor q_weight, Tensor k_weight, str point) -> ()"
    )
    op = torch.ops.rose_aot.rms_norm_residual.default
    assert [a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments] == [
        False, True, False, True, False
    ]


def test_register_is_idempotent(ops_bundle):
    from rose_aot import torch_ops

    ops = torch_ops.register(ops_bundle)
    assert ops.names == ["qk_norm", "rms_norm", "rms_norm_residual"]


def test_fake_tracing_checks_shapes_and_records_one_op(ops_bundle):
    from torch.fx.experimental.proxy_tensor import make_fx

    from rose_aot import torch_ops
    from rose_aot.errors import ArgumentError

    handle = ops_bundle.kernel("rms_norm", hidden=1024)

    def f(x, w, out):
        torch_ops.call(handle, x, w, out)
        return out * 2

    x = torch.randn(5, 1024, dtype=torch.bfloat16)
    w = torch.randn(1024, dtype=torch.bfloat16)
    graph = make_fx(f, tracing_mode="fake")(x, w, torch.empty_like(x))
    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert targets.count("rose_aot.rms_norm.default") == 1

    with pytest.raises(ArgumentError, match="out"):
        make_fx(f, tracing_mode="fake")(x, w, torch.empty(5, 512, dtype=torch.bfloat16))
    with pytest.raises(ArgumentError, match="dtype"):
        make_fx(f, tracing_mode="fake")(x.float(), w, torch.empty_like(x))


def test_unknown_point_is_a_clear_error(ops_bundle):
    from rose_aot.errors import KernelNotFoundError

    x = torch.randn(2, 1024, dtype=torch.bfloat16, device="meta")
    with pytest.raises(KernelNotFoundError, match="no registered bundle"):
        torch.ops.rose_aot.rms_norm(x, x[0], x, "rms_norm(hidden=3)")
