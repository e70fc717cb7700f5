"""qk_norm: per-head RMSNorm of Q and K (Qwen3, Gemma 3), both in ONE launch, in place.

y = (w + weight_offset) * x * rsqrt(mean(x^2) + eps) over each head of head_dim elements,
statistics in fp32. A head is small (64-256 elements), so it lives inside a warp: with 128-bit
accesses a bf16 head of 128 needs 16 lanes, several heads share a warp, and the sum of squares is
a butterfly shuffle over only the lanes of one head, with a round count fixed at compile time.
Each lane group finds its (token, head), picks Q or K and the matching weight, and works in place.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..archs import Arch
from ..errors import ConfigError
from .base import KernelFamily, choice
from .spec import DTYPES, Dim, Launch, TensorArg, Variant
from .tuning import prefill_warps, qk_norm_decode_max_warps

__all__ = ["QkNormConfig", "QkNorm", "head_split"]

_FLOATS = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class QkNormConfig:
    num_q_heads: int
    num_k_heads: int
    head_dim: int = choice(64, 128, 256)
    dtype: str = choice(*_FLOATS, default="bfloat16")
    weight_dtype: str = choice(*_FLOATS, default="bfloat16", doc="weight dtype (default: dtype)")
    eps: float = 1e-6
    weight_offset: float = 0.0  # 1.0 for Gemma-style (1 + w) weights
    prefill_warps: int = choice(
        0, 4, 8, 16, 32, default=0, doc="warps per prefill block; 0 = measured default (tuning.py)"
    )


def head_split(head_dim: int, dtype: str) -> tuple[int, int]:
    """(lanes per head, 128-bit vectors per lane)."""
    vectors = head_dim // (16 // DTYPES[dtype][0])
    lanes = min(32, vectors)
    return lanes, vectors // lanes


class QkNorm(KernelFamily):
    name = "qk_norm"
    Config = QkNormConfig
    device_module = "rose_aot.kernels.qk_norm_device"
    shape_fields = ("num_q_heads", "num_k_heads", "head_dim")

    def make_config(self, **values):
        values.setdefault("weight_dtype", values.get("dtype", "bfloat16"))
        return super().make_config(**values)

    def validate(self, c: QkNormConfig) -> None:
        for name in ("num_q_heads", "num_k_heads"):
            value = getattr(c, name)
            if not 1 <= value <= 1024:
                raise ConfigError(self.name, name, f"must be between 1 and 1024 (got {value})")
        if c.eps <= 0:
            raise ConfigError(self.name, "eps", f"must be > 0 (got {c.eps})")

    def args(self, c: QkNormConfig) -> tuple[TensorArg, ...]:
        tokens = Dim("tokens")
        vec = 16 // DTYPES[c.dtype][0]

        def heads(name, n):
            # [tokens, heads, head_dim]; the token stride is free so q and k may be views of a
            # fused qkv buffer; heads and elements are contiguous.
            stride = Dim(f"{name}_token_stride", width=64, divisibility=vec)
            return TensorArg(
                name, c.dtype, (tokens, n, c.head_dim), (stride, c.head_dim, 1), 16, True
            )

        return (
            heads("q", c.num_q_heads),
            heads("k", c.num_k_heads),
            TensorArg("q_weight", c.weight_dtype, (c.head_dim,), (1,), 16),
            TensorArg("k_weight", c.weight_dtype, (c.head_dim,), (1,), 16),
        )

    def variants(self, c: QkNormConfig, arch: Arch) -> tuple[Variant, ...]:
        lanes, per_lane = head_split(c.head_dim, c.dtype)
        params = tuple(a.name for a in self.args(c))

        def variant(name, warps):
            return Variant(
                name,
                (32 * warps, 1, 1),
                0,
                params,
                {"warps": warps, "lanes_per_head": lanes, "vecs_per_lane": per_lane},
            )

        block_warps = prefill_warps(self.name, arch.name, c.prefill_warps)
        return (variant("decode", 1), variant("prefill", block_warps))

    def heads_per_block(self, c: QkNormConfig, variant: Variant) -> int:
        return variant.threads // variant.constants["lanes_per_head"]

    def plan(self, c, arch, sizes, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        tokens = sizes["tokens"]
        if tokens == 0:
            return ()
        variants = {v.name: v for v in self.variants(c, arch)}
        lanes, _ = head_split(c.head_dim, c.dtype)
        heads = tokens * (c.num_q_heads + c.num_k_heads)
        warps_needed = -(-heads * lanes // 32)
        decode_max = qk_norm_decode_max_warps(arch.name, arch.sm_count)
        name = force or ("decode" if warps_needed < decode_max else "prefill")
        v = variants[name]
        per_block = self.heads_per_block(c, v)
        return (Launch(name, (-(-heads // per_block), 1, 1), v.block, v.smem),)

    def reference(self, c: QkNormConfig, q, k, q_weight, k_weight) -> None:
        import torch

        for x, w in ((q, q_weight), (k, k_weight)):
            xs = x.double()
            rstd = torch.rsqrt(xs.pow(2).mean(dim=-1, keepdim=True) + c.eps)
            x.copy_((xs * rstd * (w.double() + c.weight_offset)).to(x.dtype))
