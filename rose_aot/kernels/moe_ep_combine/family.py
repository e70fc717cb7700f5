"""moe_ep_combine: the return path of moe_ep_dispatch (expert-parallel MoE over NVLink).

Each rank sends every expert-output row it computed back to the rank the token came from, then
sums its own tokens' rows: out[t] = sum over k of weights[t, k] * y_k(t), in fp32 in the fixed
order k = 0..top_k-1 (moe_combine's rule), rounded once. The result is bitwise identical from
call to call and, for the same rows, to moe_combine on one GPU. One cooperative launch:

1. return: this rank tells every sender it has entered the step (done flag: progress only, it
   keeps senders from running two steps ahead); then a warp per received row copies y[row]
   (row from the dispatch's ``recv_pos``) into the sender's return region at the slot the row
   arrived in, and releases that slot's flag (system scope) with the step's epoch;
2. sum: a block per token waits (acquire, system scope) for the flags of its copies
   (``send_slots`` from the dispatch: destination * slots + slot) and sums them with the
   router weights; copies with -1 (invalid expert) contribute nothing;
3. waits for every peer's done flag before leaving.

Every dispatch must be followed by its combine (same ranks, same stream) before the next
dispatch: the dispatch raises the epoch, the combine uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...archs import Arch
from ...errors import ArgumentError, ConfigError
from ..base import KernelFamily, choice
from ..moe_ep_dispatch import tuning
from ..moe_ep_dispatch.protocol import ACCESS_BYTES, MAX_BLOCKS, MAX_RANKS, SLOT_ALIGN, STATE_WORDS
from ..rowwise import vector_width
from ..spec import Dim, Launch, ScalarArg, TensorArg, Variant

__all__ = ["MoeEpCombineConfig", "MoeEpCombine"]


@dataclass(frozen=True)
class MoeEpCombineConfig:
    world_size: int
    top_k: int
    hidden: int
    dtype: str = choice("bfloat16", "float16", default="bfloat16")


class MoeEpCombine(KernelFamily):
    name = "moe_ep_combine"
    Config = MoeEpCombineConfig
    device_module = "rose_aot.kernels.moe_ep_combine.device"
    size_names = ("tokens", "slots")
    plan_choices = ("one_launch",)
    shape_fields = ("world_size", "top_k", "hidden")
    collective = True

    def validate(self, c: MoeEpCombineConfig) -> None:
        if not 2 <= c.world_size <= MAX_RANKS:
            raise ConfigError(self.name, "world_size", f"must be 2..{MAX_RANKS} (got {c.world_size})")
        if not 1 <= c.top_k <= 32:
            raise ConfigError(self.name, "top_k", f"must be 1..32 (got {c.top_k})")
        vec = vector_width(c.dtype, ACCESS_BYTES)
        if not 0 < c.hidden <= 16384 or c.hidden % vec:
            raise ConfigError(
                self.name, "hidden", f"{c.hidden} is not supported; use a multiple of {vec} up to 16384"
            )

    def args(self, c: MoeEpCombineConfig, arch: Arch) -> tuple:
        tokens, rows = Dim("tokens"), Dim("rows")
        W, h, k = c.world_size, c.hidden, c.top_k
        slots = Dim("slots", divisibility=W * SLOT_ALIGN)
        return (
            TensorArg("y", c.dtype, (rows, h), (h, 1), ACCESS_BYTES),
            TensorArg("send_slots", "int32", (tokens, k), (k, 1), 4),
            TensorArg("weights", "float32", (tokens, k), (k, 1), 4),
            TensorArg("out", c.dtype, (tokens, h), (h, 1), ACCESS_BYTES, "output"),
            TensorArg("recv_pos", "int32", (slots,), (1,), 16),
            TensorArg("ptrs", "int64", (W,), (1,), 8),
            TensorArg("state", "int32", (STATE_WORDS,), (1,), 16),
            ScalarArg("rank", "int32"),
        )

    def variants(self, c: MoeEpCombineConfig, arch: Arch) -> tuple[Variant, ...]:
        params = tuple(a.name for a in self.args(c, arch))
        constants = {"vec": vector_width(c.dtype, ACCESS_BYTES), "world_size": c.world_size,
                     "copies_per_warp": tuning.COPIES_PER_WARP}
        return (Variant("one_launch", (tuning.BLOCK_THREADS, 1, 1), 0, params, constants,
                        cooperative=True),)

    def sample_sizes(self, c: MoeEpCombineConfig) -> list[dict[str, int]]:
        from ..moe_ep_dispatch.protocol import slots_for

        cap = slots_for(4096, c.top_k)
        return [{"tokens": t, "slots": c.world_size * cap} for t in (0, 1, 7, 128, 4096)]

    def plan(self, c, variants, sizes, sm_count, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        tokens, slots = sizes["tokens"], sizes["slots"]
        v = variants["one_launch"]
        W = v.constants["world_size"]
        if slots <= 0 or slots % (W * SLOT_ALIGN):
            raise ArgumentError(
                f"{self.name}: recv_pos has {slots} entries; it must be world_size ({W}) x a "
                f"positive multiple of {SLOT_ALIGN} slots (take it from EpWorkspace)"
            )
        if tokens * c.top_k > slots // W:
            raise ArgumentError(
                f"{self.name}: {tokens} tokens x top_k {c.top_k} exceed the {slots // W} slots "
                f"per sender of the workspace"
            )
        warps = v.threads // 32
        # Returned rows (about tokens x top_k) a warp each, then a block per token.
        blocks = max(tokens, -(-tokens * c.top_k // (warps * v.constants["copies_per_warp"])))
        return (Launch("one_launch", (max(1, min(blocks, sm_count, MAX_BLOCKS)), 1, 1)),)
