"""fp8_tensor_quant: dynamic per-tensor FP8 (e4m3) quantization.

x [tokens, hidden] (bf16/fp16, rows may be strided) -> q [tokens, hidden] float8_e4m3fn and
scale [1] fp32 for the whole tensor:

    absmax = max |x| over every element (NaN elements ignored)
    scale  = fp32(max(absmax, fp32(eps)) / 448)
    q      = e4m3(fp32(x / scale))   nearest even, saturated to +-448

(fp8_group_quant's definition and non-finite policy with one group: a single inf makes the
scale inf, its code NaN and every finite code +-0.)

The absmax must be complete before any element is quantized (the seed's rule):
- single (a tensor of at most SINGLE_MAX_VECS vectors per thread of one 1024-thread block:
  16384 elements at 8 per vector, e.g. one token up to hidden 16384): ONE block reduces
  the whole tensor, keeps the scale in registers, writes it and quantizes; no atomics, no
  barrier, no workspace; programmatic dependent launch. Measured need: the cooperative decode
  launch took 5.0-5.7 µs at one token on the H200, the chain of global atomics and the grid
  barrier dominating, against 1.6 µs for torch.compile.
- single_small: the same kernel in a SINGLE_SMALL_THREADS-thread block, for tensors of at most
  SINGLE_MAX_VECS vectors per thread of it (4096 elements: one token up to hidden 4096). One
  token of 2048 took 0.93 µs in a 256-thread block, 1.07 in 512 and 1.57 in 1024 (one of 4096:
  0.99, 1.10, 1.63; H200, 2026-11-30, each block size built into its own bundle and forced in
  one device call, `bench_act_quant.py --family fp8_tensor_quant --no-peers`,
  benchmarks/results/act_quant-shape-sweep-2048-h200.md): a block sized to the tensor reduces
  over 8 warps instead of 32, and most of a 1024-thread block had nothing to load.
- single_wide: the 1024-thread block with SINGLE_WIDE_MAX_VECS 16-byte vectors per thread
  (32768 elements: 16 tokens of 2048, 2 of 14336), above single. Forced on the H200 against
  decode at those sizes (2026-12-01, one call, benchmarks/results/fp8-tensor-single-wide-
  experiment-h200.md): 2.39-2.69 µs against 3.47-3.88; at the sizes single holds it was slower
  than single (one token of 7168: 2.29 vs 1.67 µs: four predicated loads per thread where one
  or two are live), hence a variant of its own.
- decode (tensors of at most DECODE_MAX_ELEMENTS): ONE cooperative launch of up to
  DECODE_BLOCKS_PER_SM blocks per SM. Each thread loads its vectors (up to DECODE_MAX_VECS
  16-byte vectors, kept in registers), the block reduces their max, and the block's leader
  stores it in the block's workspace slot, arrives at a grid barrier with release and spins on
  it with acquire loads; once every block has arrived, each block reads every slot and reduces
  them, computes the scale, block 0 writes ``scale``, and every thread quantizes the vectors
  in its registers: x is read once. A tensor larger than the grid holds (forced, or up to
  DECODE_MAX_ELEMENTS) is read twice, the second time mostly from L2. Nothing needs a reset:
  every launch writes each slot it reads, and the barrier word resets itself.
- prefill: the same reduction as one kernel (``prefill_absmax``, the last block writes the
  scale and zeroes the words), then ``prefill_quant`` reads the scale and quantizes.
All kernels walk the tensor as tokens * (hidden / vec) vectors, grid-stride (any grid is
correct), GRID_STRIDE_UNROLL vectors per thread and step, all loaded before any is used.
``prefill_quant`` walks the vectors last-first: ``prefill_absmax`` has just read them
first-last, so the most recent ones (up to L2's size) are read again from L2. Both passes read
the tensor, so per-tensor quantization moves 5 bytes per bf16 element where the others move
3: at most 60% of the copy bandwidth once the tensor is larger than L2.

Workspace (loader-owned, zero-initialised): int32 [DECODE_PARTIALS + DECODE_MAX_BLOCKS]:
[0] decode's grid barrier word (phase bit + arrivals, device_utils.grid_barrier's protocol;
resets itself), [1] prefill's absmax bits and [2] its blocks counted in (back to zero after
every launch), [DECODE_PARTIALS + b] decode block b's max (written before it is read, by
every launch). One point's launches on one stream never overlap, so the words are never
shared by two launches in flight.

The plan: single_small, then single, up to SINGLE_MAX_VECS per thread of their block, then
single_wide up to SINGLE_WIDE_MAX_VECS, then decode up to DECODE_MAX_ELEMENTS, the two prefill
kernels above. SINGLE_MAX_VECS from the measurements above: forced single took 2.90 µs for
one token of 14336 (1.75 vectors per thread; prefill 4.44) but 5.03 µs for 16 tokens of 2048
(4 per thread; prefill 4.57).

decode, measured (H200, 2026-12-01, every variant forced in one run, `ACT_QUANT_TOKENS=1,16,
64,128,256,512,1024,2048,4096,8192 bash benchmarks/run_gpu.sh act_quant:fp8_tensor_quant`,
benchmarks/results/fp8-tensor-decode-sweep-h200.md): faster than the prefill pair (then at 4
blocks per SM; at 2, below, the pair is 3-5% faster at some points between the registers'
capacity and 2**24, 1024 x 7168: 10.27 vs 10.78 µs, and 3-15% slower at 2**24) at every
width and token count from 16 tokens up to 2**24 elements, 1.04-1.7x (hidden 2048: 4.56 vs 5.21
µs at 16 tokens, 5.95 vs 9.78 at 1024, 18.72 vs 20.58 at 8192; hidden 14336: 5.86 vs 9.56 at
128), slower at five of the six larger tensors measured (4096 x 7168: 42.07 vs 39.11; the
exception 8192 x 14336, 146.44 vs 150.47). The seed's form of it (the last block to count in
computed the scale, then a grid barrier with a fence in every thread, one block per SM, x read
twice) lost to the pair everywhere, by 1.2-1.9x (act_quant-fp8_tensor_quant-h200.md of
2026-11-30).

Above 2**24 elements the plan keeps the two prefill kernels (the seed's rule: a grid barrier
for what one resident grid holds, separate kernels for prefill), although a measured variant
of decode whose second pass walks last-first (L2) beat or tied them at every larger size, up
to 32768 x 14336 (4096 x 8192: 41.7 vs 43.0 µs; 32768 x 14336: 558 vs 559; one H200 call,
benchmarks/results/fp8-tensor-large-experiment-h200.md): a cooperative grid holds two blocks
on every SM for the whole pass, which other streams' kernels would wait behind. In the same
call PREFILL_BLOCKS_PER_SM 2 instead of the seed's 4 made the pair 2-5.5% faster at 2**26
elements and more (32768 x 14336: 559 vs 591 µs), within 2.6% either way between 2**24 and
2**26.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...archs import Arch
from ..base import KernelFamily, choice
from ..fp8_group_quant.family import FP8_MAX
from ..fp8_token_quant.family import row_args, row_vec, validate_rows
from ..spec import PDL_MAX_THREADS, Launch, TensorArg, Variant

__all__ = ["Fp8TensorQuantConfig", "Fp8TensorQuant", "FP8_MAX", "BLOCK_THREADS",
           "SINGLE_THREADS", "SINGLE_SMALL_THREADS", "SINGLE_MAX_VECS", "SINGLE_WIDE_MAX_VECS",
           "DECODE_MAX_VECS", "DECODE_BLOCKS_PER_SM", "DECODE_MAX_ELEMENTS", "DECODE_PARTIALS",
           "DECODE_MAX_BLOCKS", "PREFILL_BLOCKS_PER_SM", "GRID_STRIDE_UNROLL"]

MAX_HIDDEN = 65536
BLOCK_THREADS = 512
SINGLE_THREADS = 1024  # the single-block variant's block
SINGLE_SMALL_THREADS = 256  # single_small's block (measured: see above)
SINGLE_MAX_VECS = 2  # vectors per thread up to which one block quantizes the whole tensor
SINGLE_WIDE_MAX_VECS = 4  # single_wide's (the 1024-thread block), in 16-byte vectors
DECODE_MAX_VECS = 4  # 16-byte vectors per thread the cooperative decode launch keeps in registers
# Blocks per SM of the cooperative decode launch: 2 x 512 threads, 32 warps per SM (one block
# per SM left 16 warps to hide the loads' latency). The build refuses a kernel that needs more
# than 64 registers per thread, which would not fit two blocks (builder/compile.check_variant).
DECODE_BLOCKS_PER_SM = 2
# The plan's switch from the cooperative launch to the two prefill kernels: tensors of at most
# 2**24 elements (32 MB of bf16) take the one launch. Measured (see the module docstring): it
# won at every size from 16 tokens up to 8192 tokens of 2048 and 1024 of 14336 (2**24 and
# 0.875 * 2**24), and lost at five of the six larger ones (4096 x 7168: 42.07 vs 39.11 µs;
# 8192 x 4096: 46.84 vs 42.74): beyond the registers it reads x twice, first-last both times,
# and the second read misses L2 where the pair's last-first one hits it.
DECODE_MAX_ELEMENTS = 1 << 24
# The decode launch's blocks each have a workspace slot for their max, from word
# DECODE_PARTIALS on; the plan launches at most DECODE_MAX_BLOCKS (1024 = 2 per SM of 512 SMs).
DECODE_PARTIALS = 8
DECODE_MAX_BLOCKS = 1024
PREFILL_BLOCKS_PER_SM = 2  # grid cap of the grid-stride prefill kernels (measured: see above)
# Vectors each thread loads before it uses any, per grid-stride step (the single block: all of
# its at most SINGLE_MAX_VECS): with one 16-byte load in flight per thread the grid-stride
# loops ran at about half the copy bandwidth.
GRID_STRIDE_UNROLL = 4


@dataclass(frozen=True)
class Fp8TensorQuantConfig:
    hidden: int
    dtype: str = choice("bfloat16", "float16", default="bfloat16", doc="input dtype")
    eps: float = 1e-10  # lower bound of the absmax (an all-zero tensor)


class Fp8TensorQuant(KernelFamily):
    name = "fp8_tensor_quant"
    Config = Fp8TensorQuantConfig
    plan_choices = ("single_small", "single", "single_wide", "decode", "prefill")
    device_module = "rose_aot.kernels.fp8_tensor_quant.device"
    shape_fields = ("hidden",)

    def _vec(self, c: Fp8TensorQuantConfig, arch: Arch) -> int:
        return row_vec(c, arch)

    def validate(self, c: Fp8TensorQuantConfig) -> None:
        validate_rows(self.name, c, MAX_HIDDEN)

    def args(self, c: Fp8TensorQuantConfig, arch: Arch) -> tuple[TensorArg, ...]:
        """x [tokens, hidden], q [tokens, hidden] e4m3, scale [1] fp32."""
        return (*row_args(c, arch), TensorArg("scale", "float32", (1,), (1,), 4, role="output"))

    def workspace(self, c: Fp8TensorQuantConfig, arch: Arch) -> tuple[TensorArg, ...]:
        return (TensorArg("words", "int32", (DECODE_PARTIALS + DECODE_MAX_BLOCKS,), (1,), 16,
                          "workspace"),)

    def variants(self, c: Fp8TensorQuantConfig, arch: Arch) -> tuple[Variant, ...]:
        params = tuple(a.name for a in self.kernel_args(c, arch))
        block = (BLOCK_THREADS, 1, 1)
        smem = 4 * BLOCK_THREADS // 32  # one fp32 per warp for the block max (no max: none)
        vec = self._vec(c, arch)
        # The decode variant keeps DECODE_MAX_VECS 16-byte vectors per thread in registers:
        # half as many of sm_100a's 32-byte ones (four took 78 registers, too many for two
        # blocks per SM).
        common = {"vec": vec, "single_max_vecs": SINGLE_MAX_VECS,
                  "decode_max_elements": DECODE_MAX_ELEMENTS,
                  "decode_max_blocks": DECODE_MAX_BLOCKS,
                  "decode_max_vecs": max(1, DECODE_MAX_VECS * 8 // vec),
                  "prefill_blocks_per_sm": PREFILL_BLOCKS_PER_SM, "unroll": GRID_STRIDE_UNROLL}
        single = {**common, "phase": "single", "unroll": SINGLE_MAX_VECS}
        wide_vecs = max(1, SINGLE_WIDE_MAX_VECS * 8 // vec)  # 16-byte vectors, as decode's
        single_wide = {**single, "single_max_vecs": wide_vecs, "unroll": wide_vecs}
        return (
            Variant("single_small", (SINGLE_SMALL_THREADS, 1, 1), 4 * SINGLE_SMALL_THREADS // 32,
                    params, single, pdl=PDL_MAX_THREADS),
            Variant("single", (SINGLE_THREADS, 1, 1), 4 * SINGLE_THREADS // 32, params, single,
                    pdl=PDL_MAX_THREADS),
            Variant("single_wide", (SINGLE_THREADS, 1, 1), 4 * SINGLE_THREADS // 32, params,
                    single_wide, pdl=PDL_MAX_THREADS),
            Variant("decode", block, smem, params,
                    {**common, "phase": "decode", "blocks_per_sm": DECODE_BLOCKS_PER_SM,
                     "unroll": common["decode_max_vecs"]},
                    cooperative=True),
            Variant("prefill_absmax", block, smem, params, {**common, "phase": "absmax"}),
            Variant("prefill_quant", block, 0, params, {**common, "phase": "quant"}),
        )

    def plan(self, c, variants, sizes, sm_count, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        tokens = sizes["tokens"]
        if tokens == 0:
            return ()
        decode_v = variants["decode"]
        k = decode_v.constants
        units = tokens * (c.hidden // k["vec"])  # vectors of the tensor
        threads = decode_v.threads
        # the smallest one-block variant that holds the tensor
        for single in ("single_small", "single", "single_wide"):
            if force == single or (force is None and
                                   units <= variants[single].threads *
                                   variants[single].constants["single_max_vecs"]):
                return (Launch(single, (1, 1, 1)),)
        blocks = -(-units // threads)
        if force == "decode" or (force is None and
                                 tokens * c.hidden <= k["decode_max_elements"]):
            # Cooperative: every block resident, so at most blocks_per_sm blocks per SM (the
            # build checks that the compiled kernel fits that many).
            cap = min(sm_count * k["blocks_per_sm"], k["decode_max_blocks"])
            return (Launch("decode", (max(1, min(cap, blocks)), 1, 1)),)
        cap = sm_count * variants["prefill_absmax"].constants["prefill_blocks_per_sm"]
        return (
            Launch("prefill_absmax", (min(cap, -(-units // variants["prefill_absmax"].threads)), 1, 1)),
            Launch("prefill_quant", (min(cap, -(-units // variants["prefill_quant"].threads)), 1, 1)),
        )
