"""all_reduce: sum all-reduce over NVLink peer memory (one-shot, two-shot), optionally fused
with the residual add and RMSNorm of a tensor-parallel decoder layer."""

from .family import AllReduce, AllReduceConfig

__all__ = ["AllReduce", "AllReduceConfig"]
