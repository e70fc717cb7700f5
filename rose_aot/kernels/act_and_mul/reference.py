"""Float64 references of the gated activations (torch, CPU). No cutlass."""

from __future__ import annotations

import math

__all__ = ["activation64", "act_and_mul64", "reference"]


def activation64(a, activation: str):
    """act(a) in float64, in forms without cancellation: silu = a sigmoid(a); gelu_tanh =
    a sigmoid(2u), which equals 0.5 a (1 + tanh(u)) but does not round 1 + tanh(u) to 0 for
    a << 0 (torch's float64 gelu(approximate="tanh") returns 0 below a ~ -7); gelu = 0.5 a
    erfc(-a / sqrt 2), likewise for 1 + erf."""
    import torch

    a = a.double()
    if activation == "silu":
        return a * torch.sigmoid(a)
    if activation == "gelu":
        return 0.5 * a * torch.special.erfc(-a / math.sqrt(2.0))
    if activation == "gelu_tanh":
        u = math.sqrt(2.0 / math.pi) * (a + 0.044715 * a.pow(3))
        return a * torch.sigmoid(2.0 * u)
    raise ValueError(f"unknown activation {activation!r}")


def act_and_mul64(x, d: int, activation: str):
    """act(x[:, :d]) * x[:, d:2d] in float64 (unrounded)."""
    return activation64(x[..., :d], activation) * x[..., d : 2 * d].double()


def reference(config, x, out) -> None:
    """out = act(x[:, :d]) * x[:, d:], from float64."""
    out.copy_(act_and_mul64(x, config.d, config.activation).to(out.dtype))
