"""qk_norm: per-head RMSNorm of Q and K (Qwen3, Gemma 3), both in ONE launch, in place.

y = (w + weight_offset) * x * rsqrt(mean(x^2) + eps) over each head of head_dim elements,
statistics in fp32. A head is small (64-256 elements), so it lives inside a warp: with 128-bit
accesses a bf16 head of 128 needs 16 lanes, several heads share a warp, and the sum of squares is
a butterfly shuffle over only the lanes of one head, with a round count fixed at compile time.
Each lane group finds its (token, head), picks Q or K and the matching weight, and works in place.
Small launches use programmatic dependent launch: up to 6144 threads the next kernel launches at
the top of this one (`pdl`), to 65536 after its stores (`pdl_late`); both are the prefill block
(tuning.py).
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
    plan_choices = ("decode", "prefill", "pdl", "pdl_late")
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

        def variant(name, warps, pdl=0, **extra):
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
                    **extra,
                },
                pdl=pdl,
            )

        block_warps = tuning.prefill_warps(arch.name, c.prefill_warps)
        # The prefill block has no programmatic dependent launch: its griddepcontrol prologue
        # alone (even with the launch attribute off) cost 23% at 32768 tokens (178 vs 144 µs,
        # 2026-11-30: many small blocks). Its small launches take one of two twins with PDL
        # (tuning.py): `pdl` lets the next kernel launch at its top, `pdl_late` after its stores.
        return (
            variant("decode", 1),
            variant("prefill", block_warps),
            variant("pdl", block_warps, pdl=tuning.PDL_EARLY_MAX_THREADS),
            variant("pdl_late", block_warps, pdl=tuning.PDL_LATE_MAX_THREADS, pdl_late=1),
        )

    def sample_sizes(self, c: QkNormConfig) -> list[dict[str, int]]:
        # the base sizes, and 64 / 256 tokens: pdl_late's range for 36+ heads per token
        return [{"tokens": t} for t in (1, 7, 64, 256, 1024, 65536)]

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
        if force is None and name == "prefill":
            # the prefill block's PDL twins, each to its limit (tuning.py); a bundle built
            # before them has neither
            threads = -(-heads // variants["prefill"].constants["heads_per_block"]) * (
                variants["prefill"].block[0])
            for twin in ("pdl", "pdl_late"):
                if twin in variants and threads <= variants[twin].pdl:
                    name = twin
                    break
        elif name not in variants:
            name = "prefill"  # a twin forced where the bundle lacks it: the variant it replaces
        per_block = variants[name].constants["heads_per_block"]
        return (Launch(name, (-(-heads // per_block), 1, 1)),)
