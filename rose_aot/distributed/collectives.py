"""Collective calls on a symmetric workspace, launched from a bundle's all_reduce points.

    bundle = open_bundle("serving.rosebundle")
    ar = AllReduce(bundle, torch.bfloat16, max_bytes=8 << 20)      # collective: every rank
    ar(x)                              # in place; or ar(x, out)
    norm = FusedAllReduceRmsNorm(bundle, hidden=7168, eps=1e-6, max_tokens=128)
    norm(x, residual, weight, out)     # residual += sum(x) (rounded); out = rmsnorm(residual)
    combine = FusedMoeCombineAllReduce(bundle, torch.bfloat16, hidden=7168, top_k=8)
    combine(y, positions, weights, out)  # out = sum over ranks of this rank's MoE combine

Calls only launch (no host sync, no allocation), so they can be captured in CUDA graphs; call
once before capturing (loads the kernels and resolves the plan). Every rank must make the same
calls, with the same sizes, in the same order, each on one stream.
"""

from __future__ import annotations

from .workspace import DistributedError, SymmetricWorkspace, workspace_for

__all__ = ["AllReduce", "FusedAllReduceRmsNorm", "FusedMoeCombineAllReduce"]


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


class AllReduce:
    """Sum all-reduce of 1-D-able tensors of one dtype over a process group."""

    def __init__(self, bundle, dtype, *, group=None, max_bytes: int = 1 << 20,
                 workspace: SymmetricWorkspace | None = None):
        self.workspace = workspace or workspace_for(group, max_bytes)
        if self.workspace.max_bytes < max_bytes:
            raise DistributedError(
                f"the workspace holds {self.workspace.max_bytes} bytes per call; {max_bytes} asked"
            )
        self.dtype = dtype
        self.handle = bundle.kernel(
            "all_reduce", world_size=self.workspace.world_size, dtype=_dtype_name(dtype)
        )
        self._tail = self.workspace.args(dtype)

    def __call__(self, x, out=None, *, variant: str | None = None):
        """out = sum over ranks of x (out defaults to x: in place). `variant` forces
        "one_shot" or "two_shot" (tests, benchmarks)."""
        out = x if out is None else out
        self.handle(x.view(-1), out.view(-1), *self._tail, variant=variant)
        return out


class FusedAllReduceRmsNorm:
    """residual = sum over ranks of x + residual; out = rmsnorm(residual) * (weight + offset),
    in one launch (one-shot), for [tokens, hidden] activations."""

    def __init__(self, bundle, dtype, *, hidden: int, eps: float = 1e-6,
                 weight_offset: float = 0.0, group=None, max_tokens: int = 128,
                 workspace: SymmetricWorkspace | None = None):
        import torch

        nbytes = max_tokens * hidden * torch.empty((), dtype=dtype).element_size()
        self.workspace = workspace or workspace_for(group, nbytes)
        if self.workspace.max_bytes < nbytes:
            raise DistributedError(
                f"the workspace holds {self.workspace.max_bytes} bytes per call; "
                f"{max_tokens} tokens x {hidden} need {nbytes}"
            )
        config = {"world_size": self.workspace.world_size, "dtype": _dtype_name(dtype),
                  "fusion": "residual_rms_norm", "hidden": hidden, "eps": eps}
        if weight_offset:
            config["weight_offset"] = weight_offset
        self.handle = bundle.kernel("all_reduce", **config)
        self._tail = self.workspace.args(dtype)

    def __call__(self, x, residual, weight, out):
        self.handle(x, residual, weight, out, *self._tail)
        return out


class FusedMoeCombineAllReduce:
    """out = sum over ranks of each rank's MoE combine (weights[t, k] * y[positions[t, k]] over
    its own experts; other ranks' experts have position -1), in one launch (one-shot): the
    decode step of tensor-parallel MoE. For prefill sizes use moe_combine + AllReduce."""

    def __init__(self, bundle, dtype, *, hidden: int, top_k: int, group=None,
                 max_tokens: int = 128, workspace: SymmetricWorkspace | None = None):
        import torch

        nbytes = max_tokens * hidden * torch.empty((), dtype=dtype).element_size()
        self.workspace = workspace or workspace_for(group, nbytes)
        if self.workspace.max_bytes < nbytes:
            raise DistributedError(
                f"the workspace holds {self.workspace.max_bytes} bytes per call; "
                f"{max_tokens} tokens x {hidden} need {nbytes}"
            )
        self.handle = bundle.kernel(
            "all_reduce", world_size=self.workspace.world_size, dtype=_dtype_name(dtype),
            fusion="moe_combine", hidden=hidden, top_k=top_k,
        )
        self._tail = self.workspace.args(dtype)

    def __call__(self, y, positions, weights, out):
        self.handle(y, positions, weights, out, *self._tail)
        return out
