"""Float64 references of the gated activations (torch, CPU). No cutlass."""

from __future__ import annotations

import math

__all__ = ["activation64", "act_and_mul64", "reference"]


def activation64(a, activation: str):
    """act(a) in float64 with the textbook formulas (torch's own definitions)."""
    import torch

    a = a.double()
    if activation == "silu":
        return a * torch.sigmoid(a)
    if activation == "gelu":
        return 0.5 * a * (1.0 + torch.erf(a / math.sqrt(2.0)))
    if activation == "gelu_tanh":
        u = math.sqrt(2.0 / math.pi) * (a + 0.044715 * a.pow(3))
        return 0.5 * a * (1.0 + torch.tanh(u))
    raise ValueError(f"unknown activation {activation!r}")


def act_and_mul64(x, d: int, activation: str):
    """act(x[:, :d]) * x[:, d:2d] in float64 (unrounded)."""
    return activation64(x[..., :d], activation) * x[..., d : 2 * d].double()


def reference(config, x, out) -> None:
    """out = act(x[:, :d]) * x[:, d:], from float64."""
    out.copy_(act_and_mul64(x, config.d, config.activation).to(out.dtype))
