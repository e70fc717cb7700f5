"""qk_norm: per-head RMSNorm of Q and K (Qwen3, Gemma 3), both in ONE launch, in place.

y = (w + weight_offset) * x * rsqrt(mean(x^2) + eps) over each head of head_dim elements,
statistics in fp32. A head is small (64-256 elements), so it lives inside a warp: with 128-bit
accesses a bf16 head of 128 needs 16 lanes, several heads share a warp, and the sum of squares is
a butterfly shuffle over only the lanes of one head, with a round count fixed at compile time.
Each lane group finds its (token, head), picks Q or K and the matching weight, and works in place.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...archs import Arch
from ...errors import ConfigError
from ..base import KernelFamily, choice
from ..rowwise import access_bytes, row_align, vector_width
from ..spec import DTYPES, Dim, Launch, TensorArg, Variant
from . import tuning

__all__ = ["QkNormConfig", "QkNorm"]

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


class QkNorm(KernelFamily):
    name = "qk_norm"
    Config = QkNormConfig
    device_module = "rose_aot.kernels.qk_norm.device"
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

    def _access(self, c: QkNormConfig, arch: Arch) -> tuple[int, int]:
        nbytes = access_bytes(
            arch, *(c.head_dim * DTYPES[d].bits // 8 for d in (c.dtype, c.weight_dtype))
        )
        return nbytes, vector_width(c.dtype, nbytes)

    def args(self, c: QkNormConfig, arch: Arch) -> tuple[TensorArg, ...]:
        tokens = Dim("tokens")
        nbytes, vec = self._access(c, arch)

        def heads(name, n):
            # [tokens, heads, head_dim]; the token stride is free so q and k may be views of a
            # fused qkv buffer; heads and elements are contiguous.
            stride = Dim(f"{name}_token_stride", width=64, divisibility=vec)
            return TensorArg(
                name, c.dtype, (tokens, n, c.head_dim), (stride, c.head_dim, 1),
                row_align(c.dtype, vec, nbytes), "inout",
            )

        w_align = row_align(c.weight_dtype, vec, nbytes)
        return (
            heads("q", c.num_q_heads),
            heads("k", c.num_k_heads),
            TensorArg("q_weight", c.weight_dtype, (c.head_dim,), (1,), w_align),
            TensorArg("k_weight", c.weight_dtype, (c.head_dim,), (1,), w_align),
        )

    def variants(self, c: QkNormConfig, arch: Arch) -> tuple[Variant, ...]:
        _, vec = self._access(c, arch)
        vectors = c.head_dim // vec
        lanes = min(32, vectors)  # lanes per head
        params = tuple(a.name for a in self.args(c, arch))

        def variant(name, warps, pdl=0):
            return Variant(
                name,
                (32 * warps, 1, 1),
                0,
                params,
                {
                    "warps": warps,
                    "vec": vec,
                    "lanes_per_head": lanes,
                    "vecs_per_lane": vectors // lanes,
                    "heads_per_block": 32 * warps // lanes,
                    "decode_max_warps": tuning.decode_max_warps(arch.name),
                },
                pdl=pdl,
            )

        block_warps = tuning.prefill_warps(arch.name, c.prefill_warps)
        # No programmatic dependent launch: the plan takes the prefill variant at every size on
        # the H200, and its griddepcontrol prologue alone (even with the launch attribute off)
        # cost 23% at 32768 tokens (178 vs 144 µs, 2026-11-30: many small blocks).
        return (variant("decode", 1), variant("prefill", block_warps))

    def plan(self, c, variants, sizes, sm_count, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        tokens = sizes["tokens"]
        if tokens == 0:
            return ()
        decode = variants["decode"].constants
        heads = tokens * (c.num_q_heads + c.num_k_heads)
        warps_needed = -(-heads * decode["lanes_per_head"] // 32)
        decode_max = decode["decode_max_warps"]
        if decode_max < 0:  # no measurement for this arch: the seed's rule
            decode_max = sm_count
        name = force or ("decode" if warps_needed < decode_max else "prefill")
        per_block = variants[name].constants["heads_per_block"]
        return (Launch(name, (-(-heads // per_block), 1, 1)),)
