"""Device-side helpers shared by the CuTeDSL kernels. Imports cutlass: builder and tests only."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm

from .chunked_rows import MAX_GRID_Y

__all__ = [
    "CUTLASS_DTYPES",
    "cutlass_dtype",
    "SharedMemory",
    "pdl_prologue",
    "pdl_epilogue",
    "chunk_coords",
    "butterfly_sum",
    "grid_barrier",
    "block_exclusive_sum",
    "quotient_factors",
    "quotient",
    "pure_asm",
    "load_vector_hinted",
]

CUTLASS_DTYPES = {
    "bfloat16": cutlass.BFloat16,
    "float16": cutlass.Float16,
    "float32": cutlass.Float32,
    "float8_e4m3fn": cutlass.Float8E4M3FN,
    "float8_e5m2": cutlass.Float8E5M2,
    "uint8": cutlass.Uint8,
    # Stored as bytes by the kernels that write them (block_scaled_quant): one E8M0 scale per
    # byte; two e2m1 values per byte.
    "float8_e8m0fnu": cutlass.Uint8,
    "float4_e2m1fn_x2": cutlass.Uint8,
    "int32": cutlass.Int32,
    "int64": cutlass.Int64,
}


def cutlass_dtype(name: str):
    return CUTLASS_DTYPES[name]


class SharedMemory:
    """Dynamic shared memory of one kernel, checked against the variant's recorded size.

    The launch passes the record's `smem` bytes; a kernel that allocates more would read and
    write past its allocation. Every allocation goes through here, is laid out the way
    SmemAllocator lays it out (sequential, aligned), and fails the compile when the total
    exceeds the record. Create it inside the kernel body (it emits the allocator), and only ONE
    per kernel: a second SmemAllocator in the same kernel, even in the other branch of a dynamic
    `if`, starts where the first one ended (seen in the PTX, nvidia-cutlass-dsl 4.8.1), so its
    tensors lie past the recorded size while this per-instance check passes. An H200 run of such
    a kernel ended in an illegal memory access (2026-11-30).
    """

    def __init__(self, budget: int, what: str):
        self.allocator = cutlass.memory.SmemAllocator()
        self.budget = budget
        self.used = 0
        self.what = what

    def tensor(self, dtype, shape, byte_alignment: int = 16):
        count = 1
        for extent in shape if isinstance(shape, tuple) else (shape,):
            count *= extent
        self.used = -(-self.used // byte_alignment) * byte_alignment + count * dtype.width // 8
        if self.used > self.budget:
            raise ValueError(
                f"{self.what}: the kernel allocates {self.used} bytes of shared memory but its "
                f"variant records {self.budget}; fix the variant's smem in the family module"
            )
        return self.allocator.allocate_tensor(
            dtype, cute.make_layout(shape), byte_alignment=byte_alignment
        )


def pdl_prologue(enabled: bool, late: bool = False) -> None:
    """Programmatic dependent launch, at the top of a kernel whose variant records `pdl`: let
    the next kernel in the stream start launching now (its blocks wait in their own prologue),
    then wait until the previous grid has finished and its writes are visible. Every input may
    come from the previous kernel, so nothing global is read before the wait. With `late` (the
    chunked-row families' `mid` variant, chunked_rows.decode_variants), only the wait: the next
    kernel launches from pdl_epilogue, after this one's stores. Without the launch attribute
    the instructions are no-ops. Call during tracing (emits nothing if disabled)."""
    if enabled:
        if not late:
            cute.arch.griddepcontrol_launch_dependents()
        cute.arch.griddepcontrol_wait()


def pdl_epilogue(enabled: bool, late: bool) -> None:
    """The late trigger of pdl_prologue(enabled, late=True): after the kernel's last store, let
    the next kernel launch. Call during tracing, at the end of the kernel."""
    if enabled and late:
        cute.arch.griddepcontrol_launch_dependents()


def chunk_coords(col_blocks: int, chunks_in_x: bool):
    """(row block, chunk) of this block in a chunked-row launch: the inverse of
    chunked_rows.chunk_grid for the variant's constants. Call during tracing."""
    bidx, bidy, bidz = cute.arch.block_idx()
    if not chunks_in_x or col_blocks == 1:
        # bidy, not a literal 0, for whole-row blocks: a constant changed ptxas's schedule of
        # act_and_mul's prefill shape (its second loads sank below the math, 9% slower)
        return bidx, bidy
    return bidz * MAX_GRID_Y + bidy, bidx


@cute.jit
def butterfly_sum(value: Float32, lanes: cutlass.Constexpr) -> Float32:
    """Sum over groups of `lanes` consecutive lanes (a power of two <= 32); every lane of a group
    gets the group's total. Only log2(lanes) shuffle rounds, so sub-warp groups stay independent."""
    offset = lanes // 2
    for _ in cutlass.range_constexpr(lanes.bit_length() - 1):
        value = value + cute.arch.shuffle_sync_bfly(value, offset=offset)
        offset = offset // 2
    return value


def load_acquire_gpu(word: cute.Pointer) -> Int32:
    """ld.acquire.gpu of a global int32: a plain load for spinning (an atomic would queue behind
    every other spinning block at the L2 atomic unit), ordered before the reads that follow."""
    return Int32(
        llvm.inline_asm(
            Int32.mlir_type,
            [word.toint().ir_value()],
            "ld.acquire.gpu.global.b32 $0, [$1];",
            "=r,l",
            has_side_effects=True,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@cute.jit
def grid_barrier(word: cute.Pointer):
    """Grid-wide barrier of a cooperative launch, on one zero-initialised global int32.

    Bit 31 is a phase, bits 0-30 count arrivals. Each block's leader adds 1 with release
    semantics; the value it gets back carries the phase of this barrier (it cannot flip before
    this block has arrived). The last arrival adds 2**31 - blocks, which clears the count and
    flips the phase in one atomic, so the word is ready for the next barrier and the next launch
    (CUDA-graph replays included) without any reset. Waiters spin with acquire loads until the
    phase flips (plain acquire loads). Every thread of every block must call it.
    """
    blocks = cute.arch.grid_dim()[0] * cute.arch.grid_dim()[1] * cute.arch.grid_dim()[2]
    cute.arch.fence_acq_rel_gpu()
    cute.arch.sync_threads()
    tidx, tidy, tidz = cute.arch.thread_idx()
    if tidx == 0 and tidy == 0 and tidz == 0:
        old = cute.arch.atomic_add(word, Int32(1), sem="release", scope="gpu")
        phase = (old >> 31) & 1
        if (old & 0x7FFFFFFF) + 1 == blocks:
            cute.arch.atomic_add(word, Int32(0x7FFFFFFF) - blocks + 1, sem="acq_rel", scope="gpu")
        current = load_acquire_gpu(word)
        while ((current >> 31) & 1) == phase:
            current = load_acquire_gpu(word)
    cute.arch.sync_threads()
    cute.arch.fence_acq_rel_gpu()


@cute.jit
def block_exclusive_sum(value: Int32, sWarp: cute.Tensor, threads: cutlass.Constexpr):
    """(exclusive prefix of `value` over the block's threads in index order, block total).

    sWarp: shared int32 scratch of threads // 32 entries. Contains two block barriers.
    """
    tidx, _, _ = cute.arch.thread_idx()
    lane = tidx % 32
    warp = tidx // 32
    inclusive = value
    offset = 1
    for _ in cutlass.range_constexpr(5):
        up = cute.arch.shuffle_sync_up(inclusive, offset)
        if lane >= offset:
            inclusive = inclusive + up
        offset = offset * 2
    if lane == 31:
        sWarp[warp] = inclusive
    cute.arch.sync_threads()
    before = Int32(0)
    total = Int32(0)
    for w in cutlass.range_constexpr(threads // 32):
        if w < warp:
            before = before + sWarp[w]
        total = total + sWarp[w]
    cute.arch.sync_threads()
    return before + inclusive - value, total


# --- system- and GPU-scope release/acquire on raw global addresses (multi-GPU flags) -----------
# Peer memory (NVLink, torch symmetric memory) is reached through int64 addresses from a pointer
# table, so these take the address as an Int64 rather than a cute.Pointer. System scope orders
# the accesses for every observer, peer GPUs included; GPU scope only for this device's threads.


def _flag_store(address, value: Int32, scope: str) -> None:
    llvm.inline_asm(
        None,
        [cutlass.Int64(address).ir_value(), Int32(value).ir_value()],
        f"st.release.{scope}.global.b32 [$0], $1;",
        "l,r,~{memory}",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


def _flag_load(address, scope: str) -> Int32:
    return Int32(
        llvm.inline_asm(
            Int32.mlir_type,
            [cutlass.Int64(address).ir_value()],
            f"ld.acquire.{scope}.global.b32 $0, [$1];",
            "=r,l,~{memory}",
            has_side_effects=True,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


def store_release_sys(address, value: Int32) -> None:
    """st.release.sys of an int32 at a global address (Int64): every write this thread (and,
    after a block barrier, its block) made before is visible to whoever acquires the value,
    on any GPU."""
    _flag_store(address, value, "sys")


def load_acquire_sys(address) -> Int32:
    """ld.acquire.sys of an int32 at a global address (Int64): reads after it see everything
    the releasing writer (on any GPU) published before its release store."""
    return _flag_load(address, "sys")


def store_release_gpu(address, value: Int32) -> None:
    """st.release.gpu of an int32 at a global address (Int64): ordering for this GPU only."""
    _flag_store(address, value, "gpu")


def load_acquire_gpu_at(address) -> Int32:
    """ld.acquire.gpu of an int32 at a global address (Int64)."""
    return _flag_load(address, "gpu")


def trap() -> None:
    """Abort the kernel (the launch fails with an illegal-instruction error): for argument
    values the host could not check, where continuing would touch memory out of bounds."""
    llvm.inline_asm(
        None, [], "trap;", "~{memory}", has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


def pure_asm(result_type, operands, text: str, constraints: str):
    """Inline PTX without side effects: `result_type` from `operands` ($1.. in `text`)."""
    return llvm.inline_asm(
        result_type,
        [o.ir_value() for o in operands],
        text,
        constraints,
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


def l2_policy(priority: str) -> Int64:
    """An L2 cache policy (createpolicy.fractional, every line) for `.L2::cache_hint` accesses:
    "evict_last" or "evict_first". Made on the device, so the encoding is the arch's own."""
    text = f"createpolicy.fractional.L2::{priority}.b64 $0, 1.0;"
    return Int64(pure_asm(Int64.mlir_type, [], text, "=l"))


@cute.jit
def load_vector_hinted(src: cute.Tensor, dst: cute.Tensor, access_bits: cutlass.Constexpr,
                       last_use: cutlass.Constexpr):
    """Copy one vector from global memory (`src`) to registers (`dst`) with eviction hints in
    L1 and L2: evict_last on a first read, evict_first on the last read of data read twice
    (`last_use`). The policy of torch.compile's reductions (Triton eviction_policy); on the
    H200 it made rms_norm 3-4% faster at 32768 tokens than unhinted loads, and evict_first on
    a single read was 5% slower (benchmarks/results/norm-cache-hints-experiment-h200.md).
    Accesses are at most `access_bits` wide (the family's access width); a wider vector (an
    fp32 weight beside bf16 rows) is split."""
    priority = "evict_first" if last_use else "evict_last"
    l1 = (cute.nvgpu.CacheEvictionPriority.EVICT_FIRST if last_use
          else cute.nvgpu.CacheEvictionPriority.EVICT_LAST)
    width = src.element_type.width
    bits = min(access_bits, cute.size(src) * width)
    atom = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), src.element_type,
                               num_bits_per_copy=bits, l1c_evict_priority=l1)
    part = bits // width
    cute.copy(atom, cute.logical_divide(src, (part,)), cute.logical_divide(dst, (part,)),
              cache_policy=l2_policy(priority))


# PTX of `quotient_factors` and `quotient` ($0 the result), module constants so that the CPU
# suite runs exactly this text through an interpreter (tests/test_quant_arithmetic_cpu.py).
DIVISOR_PTX = "{\n.reg .pred p;\nsetp.eq.f32 p, $1, 0f7F800000;\nselp.f32 $0, 0f00000000, $1, p;\n}"
QUOTIENT_PTX = (
    "{\n.reg .f32 q, e, n;\n"
    "mul.rn.f32 q, $1, $3;\n"
    "neg.f32 n, $1;\n"
    "fma.rn.f32 e, $2, q, n;\n"
    "neg.f32 e, e;\n"
    "fma.rn.f32 $0, e, $3, q;\n}"
)


def quotient_factors(scale: Float32) -> tuple[Float32, Float32]:
    """(divisor, reciprocal) of a positive scale (or +inf) for `quotient`, once per scale.

    The reciprocal is fp32(1 / scale) rounded to nearest (div.rn; 1 / inf = 0). The divisor is
    the scale, or 0 for +inf: then `quotient` gives x * 0 = +-0 for a finite x, with x's sign,
    and NaN for +-inf, which is x / inf."""
    recip = Float32(1.0) / scale
    return Float32(pure_asm(Float32.mlir_type, [scale], DIVISOR_PTX, "=f,f")), recip


def quotient(x: Float32, divisor: Float32, recip: Float32) -> Float32:
    """fp32(x / scale), rounded to nearest, in three fp32 operations (a division is about ten
    and a slow-path check): q0 = x * r, e = scale * q0 - x (exact, fma), q = q0 - e * r.

    With r the correctly rounded reciprocal this is Markstein's correction: q is the correctly
    rounded quotient whenever the residual e does not underflow. The kernels' scales are at
    least 1e-20 / 448, so e underflows only for |x| < 2^-100, where the quotient is below 2^-24
    and quantizes to the same signed zero in e4m3 and e2m1 either way. e is formed as
    scale * q0 - x, not x - scale * q0, so that x = -0 gives -0 (the other sign of e would
    round -0 + +0 to +0). Checked against float64 division for every bf16 and fp16 value and
    every power of two of the scale range, and near every e4m3 midpoint
    (tests/test_quant_arithmetic_cpu.py); the GPU suites check the kernels bit for bit."""
    return Float32(pure_asm(Float32.mlir_type, [x, divisor, recip], QUOTIENT_PTX,
                                  "=f,f,f,f"))
