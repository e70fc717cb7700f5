"""act_and_mul family: SiLU / GELU (erf, tanh) gated activations."""

from .family import ACTIVATIONS, ActAndMul, ActAndMulConfig

__all__ = ["ActAndMul", "ActAndMulConfig", "ACTIVATIONS"]
