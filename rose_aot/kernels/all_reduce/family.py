"""all_reduce: sum all-reduce over the ranks of one node through NVLink peer memory.

Every rank passes its local input; every rank gets the sum, bitwise identical on every rank and
on every call: each element is summed in fp32 in the fixed rank order 0, 1, ..., world_size - 1
and rounded once to the dtype (the two-shot variant sums each element on one rank and copies the
result, so both variants give the same bits).

Peer-visible memory comes from torch symmetric memory (rose_aot.distributed.SymmetricWorkspace):
one allocation per rank of [flag region FLAG_BYTES | data region], exchanged once. Arguments:
- ``buffer``: this rank's data region, [capacity] elements: two halves, used alternately by
  successive calls (double buffering: a peer may still read the previous call's half);
- ``ptrs``: int64 [2, world_size]: row 0 every rank's data region, row 1 every rank's flag
  region (device addresses valid in this process, from the symmetric-memory handle);
- ``state``: int32 [MAX_BLOCKS], this rank's call counter (the epoch of the last call) once
  per block, so that no block waits for another to advance it: allocated zeroed once, never
  reset;
- ``rank``: this process's rank, a runtime scalar (one bundle point serves every rank).

Barriers between ranks are per block: block b of every rank handles the same elements; it
publishes "my part of call e is staged" with a system-scope release store of e into every
peer's flag slot [phase][my rank][b] and waits with system-scope acquire loads until its own
slots from every peer reach e. The epoch grows by one per call (each block stores it in its
own counter at its end, block 0 also in the counters of blocks the call did not launch), so
flags never need a reset and CUDA-graph replays stay in step.
All ranks must issue the same sequence of calls (sizes included) on one stream each, like any
collective, and have the same SM count (the grid depends on it).

Variants (plain): ``one_shot`` (stage, barrier, every rank reads every peer's staged input and
sums) and ``two_shot`` (stage, barrier, each rank reduces 1/world_size of every block's tile
and writes it back to its staging half, barrier, each rank copies the other ranks' reduced
parts). Fusions (one-shot, one launch, for decode sizes):
- ``fusion = "residual_rms_norm"``: the sum of a [tokens, hidden] input, rounded, then
  r = sum + residual (rounded, written back to ``residual``) and
  out = rmsnorm(r) * (weight + weight_offset): the layer end of a tensor-parallel decoder;
- ``fusion = "moe_combine"``: each rank first combines its own experts' outputs,
  partial[t] = sum over k of weights[t, k] * y[positions[t, k]] (moe_combine's rule: fp32 in
  the order k = 0..top_k-1, positions outside [0, rows) skipped, rounded to the dtype), and the
  partials are all-reduced: tensor-parallel MoE decode (the article's deployment 2). Prefill
  runs moe_combine and the plain all-reduce as two launches.

No NVLink multicast (multimem / NVLS) anywhere: see docs/multicast-and-infiniband.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...archs import Arch
from ...errors import ArgumentError, ConfigError
from ..base import KernelFamily, choice
from ..rowwise import row_split, vector_width
from ..spec import DTYPES, Dim, Launch, ScalarArg, TensorArg, Variant
from . import tuning

__all__ = [
    "AllReduceConfig",
    "AllReduce",
    "MAX_RANKS",
    "MAX_BLOCKS",
    "FLAG_PHASES",
    "FLAG_BYTES",
    "ACCESS_BYTES",
]

_FLOATS = ("bfloat16", "float16", "float32")
MAX_RANKS = 8
# Flag region of every rank: int32 [FLAG_PHASES][MAX_RANKS][MAX_BLOCKS]; grids never exceed
# MAX_BLOCKS blocks.
MAX_BLOCKS = 256
FLAG_PHASES = 2
FLAG_BYTES = 4 * FLAG_PHASES * MAX_RANKS * MAX_BLOCKS
ACCESS_BYTES = 16  # one 128-bit vector per thread and step (NVLink reads gain nothing wider)
MAX_HIDDEN = 16384
# Registers the fused kernel keeps per thread: vectors of the row per thread, for each rank.
FUSED_VECS_PER_THREAD = 2
FUSIONS = ("none", "residual_rms_norm", "moe_combine")
# Config fields each fusion uses besides world_size and dtype; the others keep their defaults
# (make_config drops them), so one point has one key.
FUSION_FIELDS = {
    "none": (),
    "residual_rms_norm": ("hidden", "eps", "weight_offset"),
    "moe_combine": ("hidden", "top_k"),
}
MAX_TOP_K = 32


@dataclass(frozen=True)
class AllReduceConfig:
    world_size: int
    dtype: str = choice(*_FLOATS, default="bfloat16", doc="element dtype (inputs, output)")
    fusion: str = choice(
        *FUSIONS, default="none",
        doc="fused with the sum: none, residual add + RMSNorm after it, or MoE combine before it",
    )
    hidden: int = 0  # row width of the fusions; 0 for the plain all-reduce
    eps: float = 1e-6  # residual_rms_norm only
    weight_offset: float = 0.0  # residual_rms_norm only; 1.0 for (1 + w) weights
    top_k: int = 0  # moe_combine only: experts per token


class AllReduce(KernelFamily):
    name = "all_reduce"
    Config = AllReduceConfig
    device_module = "rose_aot.kernels.all_reduce.device"
    # "n": elements of the plain all-reduce, tokens (rows) of the fused one; "capacity": the
    # elements of the symmetric data region (both halves).
    size_names = ("n", "capacity")
    plan_choices = ("one_shot", "two_shot")
    shape_fields = ("world_size", "hidden")
    # A collective: a launch needs every rank of a group launching too (tests/multigpu);
    # single-process GPU scripts that launch every family must skip it.
    collective = True

    def make_config(self, **values):
        # Fields a fusion does not use mean nothing for it: one canonical key.
        used = FUSION_FIELDS.get(values.get("fusion", "none"), ())
        for fields in FUSION_FIELDS.values():
            for f in fields:
                if f not in used:
                    values.pop(f, None)
        return super().make_config(**values)

    def validate(self, c: AllReduceConfig) -> None:
        if not 2 <= c.world_size <= MAX_RANKS:
            raise ConfigError(
                self.name, "world_size", f"must be 2..{MAX_RANKS} (got {c.world_size})"
            )
        if c.fusion != "none":
            vec = vector_width(c.dtype, ACCESS_BYTES)
            if not 0 < c.hidden <= MAX_HIDDEN or c.hidden % vec:
                raise ConfigError(
                    self.name,
                    "hidden",
                    f"{c.hidden} is not supported; use a multiple of {vec} up to {MAX_HIDDEN}",
                )
        elif c.hidden:
            raise ConfigError(self.name, "hidden", "only with a fusion")
        if c.fusion == "residual_rms_norm" and c.eps <= 0:
            raise ConfigError(self.name, "eps", f"must be > 0 (got {c.eps})")
        if c.fusion == "moe_combine":
            if not 1 <= c.top_k <= MAX_TOP_K:
                raise ConfigError(self.name, "top_k", f"must be 1..{MAX_TOP_K} (got {c.top_k})")
            if c.dtype == "float32":
                raise ConfigError(
                    self.name, "dtype", "moe_combine is bfloat16 or float16 (as the moe_combine family)"
                )
        elif c.top_k:
            raise ConfigError(self.name, "top_k", "only with fusion = 'moe_combine'")

    def vec(self, c: AllReduceConfig) -> int:
        return vector_width(c.dtype, ACCESS_BYTES)

    # --- arguments ------------------------------------------------------------------------------
    def args(self, c: AllReduceConfig, arch: Arch) -> tuple:
        vec = self.vec(c)
        n = Dim("n", divisibility=1 if c.fusion != "none" else vec)
        # Two halves of whole vectors each.
        capacity = Dim("capacity", divisibility=2 * vec)
        W = c.world_size
        shared = (
            TensorArg("buffer", c.dtype, (capacity,), (1,), ACCESS_BYTES, "inout"),
            TensorArg("ptrs", "int64", (2, W), (W, 1), 8, "input"),
            TensorArg("state", "int32", (MAX_BLOCKS,), (1,), 16, "inout"),
            ScalarArg("rank", "int32"),
        )
        if c.fusion == "none":
            return (
                TensorArg("x", c.dtype, (n,), (1,), ACCESS_BYTES, "input"),
                TensorArg("out", c.dtype, (n,), (1,), ACCESS_BYTES, "output"),
                *shared,
            )
        h = c.hidden
        if c.fusion == "moe_combine":
            k = c.top_k
            return (
                TensorArg("y", c.dtype, (Dim("rows"), h), (h, 1), ACCESS_BYTES, "input"),
                TensorArg("positions", "int32", (n, k), (k, 1), 4, "input"),
                TensorArg("weights", "float32", (n, k), (k, 1), 4, "input"),
                TensorArg("out", c.dtype, (n, h), (h, 1), ACCESS_BYTES, "output"),
                *shared,
            )
        return (
            TensorArg("x", c.dtype, (n, h), (h, 1), ACCESS_BYTES, "input"),
            TensorArg("residual", c.dtype, (n, h), (h, 1), ACCESS_BYTES, "inout"),
            TensorArg("weight", c.dtype, (h,), (1,), ACCESS_BYTES, "input"),
            TensorArg("out", c.dtype, (n, h), (h, 1), ACCESS_BYTES, "output"),
            *shared,
        )

    # --- variants -------------------------------------------------------------------------------
    def variants(self, c: AllReduceConfig, arch: Arch) -> tuple[Variant, ...]:
        params = tuple(a.name for a in self.args(c, arch))
        vec = self.vec(c)
        common = {
            "world_size": c.world_size,
            "vec": vec,
            "elem_bytes": DTYPES[c.dtype].bytes,
            "flag_ranks": MAX_RANKS,
            "flag_blocks": MAX_BLOCKS,
            "flag_bytes": FLAG_BYTES,
        }
        # Cooperative: every block of a grid is resident, so no block spins on a peer block
        # that waits for an SM held by a spinning block of its own grid.
        if c.fusion == "none":
            threads = tuning.THREADS
            switch = tuning.two_shot_min_bytes(c.world_size)
            return (
                Variant("one_shot", (threads, 1, 1), 0, params,
                        {**common, "max_blocks": tuning.ONE_SHOT_MAX_BLOCKS,
                         "two_shot_min_bytes": switch}, cooperative=True),
                Variant("two_shot", (threads, 1, 1), 0, params,
                        {**common, "max_blocks": tuning.TWO_SHOT_MAX_BLOCKS,
                         "two_shot_min_bytes": switch}, cooperative=True),
            )
        warps, per_thread = row_split(c.hidden // vec, FUSED_VECS_PER_THREAD)
        smem = 0
        if c.fusion == "residual_rms_norm" and warps > 1:
            smem = 4 * warps  # one fp32 partial sum of squares per warp
        return (
            Variant("one_shot", (32 * warps, 1, 1), smem, params,
                    {**common, "max_blocks": tuning.FUSED_MAX_BLOCKS, "warps_per_row": warps,
                     "vecs_per_thread": per_thread}, cooperative=True),
        )

    # --- plan -----------------------------------------------------------------------------------
    def sample_sizes(self, c: AllReduceConfig) -> list[dict[str, int]]:
        if c.fusion == "none":
            vec = self.vec(c)
            out = []
            for n in (vec, 1024, 1 << 20, 32 << 20):
                out.append({"n": n, "capacity": 2 * n})
            return out
        return [{"n": t, "capacity": 2 * t * c.hidden} for t in (1, 7, 128, 4096)]

    def plan(self, c, variants, sizes, sm_count, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        n, capacity = sizes["n"], sizes["capacity"]
        if n == 0:
            return ()
        vec = variants["one_shot"].constants["vec"]
        if capacity % (2 * vec):
            raise ArgumentError(
                f"{self.name}: buffer has {capacity} elements; it must be two halves of whole "
                f"{ACCESS_BYTES}-byte vectors (a multiple of {2 * vec} elements)"
            )
        if c.fusion == "none" and n % vec:
            raise ArgumentError(
                f"{self.name}: x has {n} elements; the all-reduce moves {ACCESS_BYTES}-byte "
                f"vectors, so use a multiple of {vec} elements (pad the message)"
            )
        elements = n if c.fusion == "none" else n * c.hidden
        if elements > capacity // 2:
            raise ArgumentError(
                f"{self.name}: {elements} elements do not fit one half of the symmetric buffer "
                f"({capacity} elements = two halves of {capacity // 2}); allocate the "
                f"SymmetricWorkspace with max_bytes >= {elements * DTYPES[c.dtype].bytes}"
            )
        if c.fusion != "none":
            # A fused point has one variant; any forced name launches it (the loader plans
            # every name of plan_choices for every point when it opens a bundle).
            v = variants["one_shot"]
            blocks = min(n, v.constants["max_blocks"], sm_count, MAX_BLOCKS)
            return (Launch("one_shot", (blocks, 1, 1)),)
        one = variants["one_shot"]
        name = force
        if name is None:
            nbytes = n * one.constants["elem_bytes"]
            name = "two_shot" if nbytes >= one.constants["two_shot_min_bytes"] else "one_shot"
        v = variants[name]
        vectors = -(-n // v.constants["vec"])
        per_block = v.threads * (v.constants["world_size"] if name == "two_shot" else 1)
        blocks = min(-(-vectors // per_block), v.constants["max_blocks"], sm_count, MAX_BLOCKS)
        return (Launch(name, (max(1, blocks), 1, 1)),)

    def op_suffix(self, c: AllReduceConfig) -> str:
        """Distinguishes the torch operator of each argument list (rose_aot.torch_ops names one
        operator per family and argument list): "", "_residual_rms_norm", "_moe_combine"."""
        return "" if c.fusion == "none" else "_" + c.fusion

    def bytes_needed(self, c: AllReduceConfig, n: int) -> int:
        """Bytes of one half of the data region a call with `n` (elements or tokens) needs."""
        elements = n if c.fusion == "none" else n * c.hidden
        return elements * DTYPES[c.dtype].bytes
