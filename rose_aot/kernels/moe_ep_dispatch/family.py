"""moe_ep_dispatch: expert-parallel (data-parallel) MoE dispatch over NVLink.

Every rank holds its own tokens (data-parallel attention) and num_experts / world_size experts:
rank r owns the global experts [r * L, (r + 1) * L), L = local experts. One cooperative launch
per rank (every rank launches it, like a collective):

1. route: each (token, k) copy goes to the owner of its expert; the sender counts copies per
   expert (shared-memory counters, then one global atomic per block and expert), then a grid
   barrier; its slots in a destination are grouped by expert, so the destination can place
   every row without atomics of its own;
2. send: the sender publishes its per-expert counts to each destination (release flag, system
   scope), then a warp per copy writes the row (and its fp8 scales) straight into the
   destination's receive region for this sender and releases that slot's flag with the epoch;
3. receive: each block waits for every sender's counts (acquire, system scope), lays out the
   expert-grouped output exactly as moe_dispatch does (each local expert contiguous, padded to
   ``expert_alignment`` rows, zeroed padding, ``expert_offsets``), then a warp per received
   row polls its slot flag and copies it into place. Within an expert, rows come sender by
   sender, each sender's in its slot order.

Outputs: ``out`` / ``out_scales`` / ``expert_offsets`` as moe_dispatch (this rank's experts:
the grouped GEMM's input), ``send_slots`` [tokens, top_k] (destination * slots + slot of each
copy, -1 for an invalid expert id: the combine reads it), and in the workspace ``recv_pos``
(the row of ``out`` of each received slot). An expert id outside [0, num_experts) is skipped.

The peer-visible region and the state come from rose_aot.distributed.ep.EpWorkspace (layout:
protocol.py); ``ptrs`` holds every rank's region address, ``rank`` is a runtime scalar. NVLink
multicast is never used.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...archs import Arch
from ...errors import ArgumentError, ConfigError
from ..base import KernelFamily, choice
from ..rowwise import vector_width
from ..spec import DTYPES, Dim, Launch, ScalarArg, TensorArg, Variant
from . import tuning
from .protocol import ACCESS_BYTES, MAX_BLOCKS, MAX_RANKS, SLOT_ALIGN, STATE_WORDS

__all__ = ["MoeEpDispatchConfig", "MoeEpDispatch", "shared_bytes"]

_TOKEN_DTYPES = ("bfloat16", "float16", "float8_e4m3fn")
MAX_EXPERTS = 1024


def _arr(n: int) -> int:
    return -(-4 * n // 16) * 16


def shared_bytes(num_experts: int, local_experts: int, warps: int) -> int:
    """Dynamic shared memory: per-expert block counts, block bases and slot starts (sender),
    received counts, their prefix and each (sender, expert)'s row delta (receiver), the
    expert offsets, then one int32 per warp for the block scan. Allocated in this order by the
    device code through SharedMemory, which checks the total."""
    E, L = num_experts, local_experts
    return 5 * _arr(E) + _arr(E + 1) + _arr(L + 1) + 4 * warps


@dataclass(frozen=True)
class MoeEpDispatchConfig:
    world_size: int
    num_experts: int
    top_k: int
    hidden: int
    dtype: str = choice(*_TOKEN_DTYPES, default="bfloat16")
    expert_alignment: int = choice(1, 16, 32, 64, 128, 256, default=1)
    scale_group: int = 0  # float8 only: elements per fp32 scale of x_scales


class MoeEpDispatch(KernelFamily):
    name = "moe_ep_dispatch"
    Config = MoeEpDispatchConfig
    device_module = "rose_aot.kernels.moe_ep_dispatch.device"
    # tokens: this rank's; rows: of out; slots: of recv_pos (world_size x slots per sender)
    size_names = ("tokens", "rows", "slots")
    plan_choices = ("one_launch",)
    shape_fields = ("world_size", "num_experts", "top_k", "hidden")
    collective = True  # every rank of the group must launch it (tests/multigpu)

    def make_config(self, **values):
        if values.get("dtype") == "float8_e4m3fn":
            values.setdefault("scale_group", 128)
        return super().make_config(**values)

    def validate(self, c: MoeEpDispatchConfig) -> None:
        if not 2 <= c.world_size <= MAX_RANKS:
            raise ConfigError(self.name, "world_size", f"must be 2..{MAX_RANKS} (got {c.world_size})")
        if not c.world_size <= c.num_experts <= MAX_EXPERTS or c.num_experts % c.world_size:
            raise ConfigError(
                self.name, "num_experts",
                f"must be a multiple of world_size ({c.world_size}) up to {MAX_EXPERTS} "
                f"(got {c.num_experts})",
            )
        if not 1 <= c.top_k <= min(32, c.num_experts):
            raise ConfigError(self.name, "top_k", f"must be 1..min(32, num_experts) (got {c.top_k})")
        vec = vector_width(c.dtype, ACCESS_BYTES)
        if not 0 < c.hidden <= 16384 or c.hidden % max(vec, 8):
            raise ConfigError(
                self.name, "hidden",
                f"{c.hidden} is not supported; use a multiple of {max(vec, 8)} up to 16384",
            )
        if c.dtype == "float8_e4m3fn":
            if c.scale_group <= 0 or c.hidden % c.scale_group or c.scale_group % 4:
                raise ConfigError(
                    self.name, "scale_group", "float8 needs a scale_group dividing hidden (e.g. 128)"
                )
        elif c.scale_group != 0:
            raise ConfigError(self.name, "scale_group", "only float8 tokens carry scales; use 0")

    # --- helpers shared with the workspace and the tests ----------------------------------------
    def local_experts(self, c: MoeEpDispatchConfig) -> int:
        return c.num_experts // c.world_size

    def groups(self, c: MoeEpDispatchConfig) -> int:
        return c.hidden // c.scale_group if c.scale_group else 0

    def max_rows(self, c: MoeEpDispatchConfig, slots_per_sender: int) -> int:
        """Rows `out` needs: every slot of every sender (all copies of every rank may come
        here) plus the padding of every local expert."""
        return c.world_size * slots_per_sender + self.local_experts(c) * (c.expert_alignment - 1)

    # --- arguments --------------------------------------------------------------------------------
    def args(self, c: MoeEpDispatchConfig, arch: Arch) -> tuple:
        tokens, rows = Dim("tokens"), Dim("rows")
        W, h, k = c.world_size, c.hidden, c.top_k
        slots = Dim("slots", divisibility=W * SLOT_ALIGN)
        args = [
            TensorArg("x", c.dtype, (tokens, h), (h, 1), ACCESS_BYTES),
            TensorArg("topk_ids", "int32", (tokens, k), (k, 1), 4),
        ]
        g = self.groups(c)
        if g:
            args.append(TensorArg("x_scales", "float32", (tokens, g), (g, 1), 16, layout="row_major"))
        args.append(TensorArg("out", c.dtype, (rows, h), (h, 1), ACCESS_BYTES, "output"))
        if g:
            args.append(
                TensorArg("out_scales", "float32", (rows, g), (g, 1), 16, "output", "row_major")
            )
        args += [
            TensorArg("expert_offsets", "int32", (self.local_experts(c) + 1,), (1,), 4, "output"),
            TensorArg("send_slots", "int32", (tokens, k), (k, 1), 4, "output"),
            # --- the EpWorkspace's tensors (rose_aot.distributed.ep) ---
            TensorArg("recv_pos", "int32", (slots,), (1,), 16, "inout"),
            TensorArg("ptrs", "int64", (W,), (1,), 8, "input"),
            TensorArg("state", "int32", (STATE_WORDS,), (1,), 16, "inout"),
            TensorArg("counters", "int32", (2 * c.num_experts,), (1,), 16, "inout"),
            ScalarArg("rank", "int32"),
        ]
        return tuple(args)

    def variants(self, c: MoeEpDispatchConfig, arch: Arch) -> tuple[Variant, ...]:
        params = tuple(a.name for a in self.args(c, arch))
        threads = tuning.BLOCK_THREADS
        smem = shared_bytes(c.num_experts, self.local_experts(c), threads // 32)
        constants = {
            "vec": vector_width(c.dtype, ACCESS_BYTES),
            "world_size": c.world_size,
            "local_experts": self.local_experts(c),
            "groups": self.groups(c),
            "elem_bytes": DTYPES[c.dtype].bytes,
            "copies_per_warp": tuning.COPIES_PER_WARP,
        }
        # Cooperative: the grid barrier, and blocks spinning on peers' flags need every block
        # of both ranks' grids resident.
        return (Variant("one_launch", (threads, 1, 1), smem, params, constants, cooperative=True),)

    def op_suffix(self, c: MoeEpDispatchConfig) -> str:
        return "_scaled" if c.scale_group else ""

    # --- plan -------------------------------------------------------------------------------------
    def sample_sizes(self, c: MoeEpDispatchConfig) -> list[dict[str, int]]:
        from .protocol import slots_for

        cap = slots_for(4096, c.top_k)
        return [{"tokens": t, "rows": self.max_rows(c, cap), "slots": c.world_size * cap}
                for t in (0, 1, 7, 128, 4096)]

    def plan(self, c, variants, sizes, sm_count, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        tokens, rows, slots = sizes["tokens"], sizes["rows"], sizes["slots"]
        v = variants["one_launch"]
        W = v.constants["world_size"]
        if slots <= 0 or slots % (W * SLOT_ALIGN):
            raise ArgumentError(
                f"{self.name}: recv_pos has {slots} entries; it must be world_size ({W}) x a "
                f"positive multiple of {SLOT_ALIGN} slots (take it from EpWorkspace)"
            )
        cap = slots // W
        if tokens * c.top_k > cap:
            raise ArgumentError(
                f"{self.name}: {tokens} tokens x top_k {c.top_k} = {tokens * c.top_k} copies do "
                f"not fit the {cap} slots per sender of the workspace; create the EpWorkspace "
                f"with max_tokens >= {tokens}"
            )
        need = self.max_rows(c, cap)
        if rows < need:
            raise ArgumentError(
                f"{self.name}: out has {rows} rows but {W} senders x {cap} slots with "
                f"{self.local_experts(c)} experts padded to {c.expert_alignment} need {need}; "
                f"allocate out with max_rows(config, slots per sender) rows"
            )
        # Every rank launches even with no tokens: its peers wait for its counts.
        warps = v.threads // 32
        per_warp = v.constants["copies_per_warp"]
        blocks = -(-tokens * c.top_k // (warps * per_warp))
        return (Launch("one_launch", (max(1, min(blocks, sm_count, MAX_BLOCKS)), 1, 1)),)
