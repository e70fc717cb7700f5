"""CuTeDSL device code of fp8_tensor_quant (see family.py for the math and the launches)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm

from ...archs import Arch
from ..device_utils import (SharedMemory, load_acquire_gpu, pdl_prologue, quotient,
                            quotient_factors)
from ..fp8_token_quant.device import segment_max
from ..spec import Variant
from .family import DECODE_PARTIALS as PARTIALS
from .family import FP8_MAX

__all__ = ["host_function"]


def _bits(value: Float32) -> Int32:
    return Int32(llvm.inline_asm(Int32.mlir_type, [value.ir_value()], "mov.b32 $0, $1;", "=r,f",
                                 has_side_effects=False, is_align_stack=False,
                                 asm_dialect=llvm.AsmDialect.AD_ATT))


def _float(bits: Int32) -> Float32:
    return Float32(llvm.inline_asm(Float32.mlir_type, [bits.ir_value()], "mov.b32 $0, $1;",
                                   "=f,r", has_side_effects=False, is_align_stack=False,
                                   asm_dialect=llvm.AsmDialect.AD_ATT))


def host_function(config, variant: Variant, arch: Arch):
    """Launcher: x, q, scale, words (workspace), grid, stream."""
    phase = variant.constants["phase"]
    vec = variant.constants["vec"]
    V = config.hidden // vec
    eps = float(config.eps)
    threads = variant.threads
    block = list(variant.block)
    smem_bytes = variant.smem
    cooperative = variant.cooperative
    pdl = variant.pdl
    UNROLL = variant.constants["unroll"]

    @cute.jit
    def absmax_of(tXrX) -> Float32:
        tYrY = tXrX.load().to(Float32)
        amax = Float32(0.0)
        for j in cutlass.range_constexpr(vec * UNROLL):
            amax = cute.arch.fmax(amax, cute.math.absf(tYrY[j]))
        return amax

    @cute.jit
    def block_absmax(mX, sWarp, first, step):
        """The block's max |x| over vectors first, first + step, ... (every thread gets it)."""
        tXrX = cute.make_rmem_tensor((vec, UNROLL), mX.element_type)
        amax = Float32(0.0)
        total = mX.shape[0] * V
        for base in cutlass.range(first, total, step * UNROLL):
            move_vectors(mX, tXrX, base, step, total, False, True)
            amax = cute.arch.fmax(amax, absmax_of(tXrX))
        return segment_max(amax, sWarp, threads)

    @cute.jit
    def publish_scale(amax, mScale, mWords):
        """Fold the block's absmax into words[1]; the last block counted in (words[2]) writes
        the scale and zeroes both words. Call from one thread per block."""
        blocks = cute.arch.grid_dim()[0] * cute.arch.grid_dim()[1] * cute.arch.grid_dim()[2]
        cute.arch.atomic_max(mWords.iterator + 1, _bits(amax), scope="gpu")
        # release: this block's max is in before it counts; acquire (last block): all are in.
        arrived = cute.arch.atomic_add(mWords.iterator + 2, Int32(1), sem="acq_rel", scope="gpu")
        if arrived == blocks - 1:
            total = _float(cute.arch.atomic_exch(mWords.iterator + 1, Int32(0), sem="acq_rel",
                                                 scope="gpu"))
            cute.arch.atomic_exch(mWords.iterator + 2, Int32(0), scope="gpu")
            mScale[0] = cute.arch.fmax(total, Float32(eps)) / Float32(FP8_MAX)

    @cute.jit
    def grid_absmax(amax, mWords, sWarp):
        """The max of every block's `amax` (each thread passes its block's), in every thread:
        the decode variant's only grid-wide step. Each block's leader stores its max in its own
        slot, words[PARTIALS + block] (the float's bits), and arrives at a barrier on words[0]
        (device_utils.grid_barrier's phase protocol) with release, so the slot is written
        before it counts; it spins with acquire loads until the phase flips. Then the block's
        threads read every block's slot and reduce them. No block waits on another's scale
        computation, nothing needs a reset (each launch writes every slot it reads), and only
        the leaders touch memory before the barrier: the data stays in registers, so no thread
        needs a fence."""
        blocks = cute.arch.grid_dim()[0] * cute.arch.grid_dim()[1] * cute.arch.grid_dim()[2]
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if tidx == 0:
            mWords[PARTIALS + bidx] = _bits(amax)
            old = cute.arch.atomic_add(mWords.iterator, Int32(1), sem="release", scope="gpu")
            phase = (old >> 31) & 1
            if (old & 0x7FFFFFFF) + 1 == blocks:
                cute.arch.atomic_add(mWords.iterator, Int32(0x7FFFFFFF) - blocks + 1,
                                     sem="acq_rel", scope="gpu")
            current = load_acquire_gpu(mWords.iterator)
            while ((current >> 31) & 1) == phase:
                current = load_acquire_gpu(mWords.iterator)
        cute.arch.sync_threads()
        total = Float32(0.0)
        for i in cutlass.range(tidx, blocks, threads):
            total = cute.arch.fmax(total, _float(load_acquire_gpu(mWords.iterator + PARTIALS + i)))
        return segment_max(total, sWarp, threads)

    @cute.jit
    def move_vectors(mT, tR, base, step, total, reverse: cutlass.Constexpr,
                     load: cutlass.Constexpr):
        """load: tR[:, k] = vector base + k * step of mT (of the last-first order if `reverse`),
        vectors past the end read as 0; else the same vectors of mT = tR[:, k]. All UNROLL
        loads are issued before any is used: one 16-byte load in flight per thread left the
        grid-stride loops at about half the bandwidth."""
        for k in cutlass.range_constexpr(UNROLL):
            u = base + k * step
            if u < total:
                if const_expr(reverse):
                    u = total - 1 - u
                gT = cute.zipped_divide(mT[u // V, None], (vec,))
                if const_expr(load):
                    cute.autovec_copy(gT[(None, u % V)], tR[None, k])
                else:
                    cute.autovec_copy(tR[None, k], gT[(None, u % V)])
            else:
                if const_expr(load):
                    tR[None, k].fill(0)

    @cute.jit
    def store_quantized(tXrX, mQ, divisor, recip, base, step, total,
                        reverse: cutlass.Constexpr):
        """Quantize the vectors that move_vectors(..., base, step, total, reverse, True) loaded."""
        tYrY = cute.make_rmem_tensor((vec, UNROLL), Float32)
        tYrY.store(tXrX.load().to(Float32))
        for j in cutlass.range_constexpr(vec * UNROLL):
            tYrY[j] = quotient(tYrY[j], divisor, recip)
        tQrQ = cute.make_rmem_tensor((vec, UNROLL), mQ.element_type)
        tQrQ.store(tYrY.load().to(mQ.element_type))
        move_vectors(mQ, tQrQ, base, step, total, reverse, False)

    @cute.jit
    def quantize(mX, mQ, scale, first, step, reverse: cutlass.Constexpr):
        tXrX = cute.make_rmem_tensor((vec, UNROLL), mX.element_type)
        divisor, recip = quotient_factors(scale)
        total = mX.shape[0] * V
        for base in cutlass.range(first, total, step * UNROLL):
            move_vectors(mX, tXrX, base, step, total, reverse, True)
            store_quantized(tXrX, mQ, divisor, recip, base, step, total, reverse)

    @cute.jit
    def one_launch(mX, mQ, mScale, mWords, first, step):
        """The single and decode variants: absmax, scale and quantized x in one launch; the
        decode grid joins its blocks' maxima in grid_absmax. The plan's sizes (at most UNROLL
        vectors per thread) stay in registers from the load to the store, so x is read once;
        a forced launch on a larger tensor loops and reads it twice (L2 at most)."""
        tidx, _, _ = cute.arch.thread_idx()
        alloc = SharedMemory(smem_bytes, f"fp8_tensor_quant {variant.name}")
        sWarp = alloc.tensor(Float32, threads // 32, byte_alignment=4)
        total = mX.shape[0] * V
        if total <= step * UNROLL:
            tXrX = cute.make_rmem_tensor((vec, UNROLL), mX.element_type)
            move_vectors(mX, tXrX, first, step, total, False, True)
            amax = segment_max(absmax_of(tXrX), sWarp, threads)
            if const_expr(phase == "decode"):
                amax = grid_absmax(amax, mWords, sWarp)
            scale = cute.arch.fmax(amax, Float32(eps)) / Float32(FP8_MAX)
            write_scale(mScale, scale, tidx)
            divisor, recip = quotient_factors(scale)
            store_quantized(tXrX, mQ, divisor, recip, first, step, total, False)
        else:
            amax = block_absmax(mX, sWarp, first, step)
            if const_expr(phase == "decode"):
                amax = grid_absmax(amax, mWords, sWarp)
            scale = cute.arch.fmax(amax, Float32(eps)) / Float32(FP8_MAX)
            write_scale(mScale, scale, tidx)
            quantize(mX, mQ, scale, first, step, False)

    @cute.jit
    def write_scale(mScale, scale, tidx):
        """One thread of the launch writes the scale (every thread holds it)."""
        if const_expr(phase == "single"):
            if tidx == 0:
                mScale[0] = scale
        else:
            bidx, _, _ = cute.arch.block_idx()
            if bidx == 0 and tidx == 0:
                mScale[0] = scale

    @cute.kernel
    def fp8_tensor_quant_kernel(mX: cute.Tensor, mQ: cute.Tensor, mScale: cute.Tensor,
                                mWords: cute.Tensor):
        # mX: [tokens, hidden]; mQ: [tokens, hidden] e4m3; mScale: [1] fp32;
        # mWords: int32 workspace: [0] decode's barrier, [1] prefill's absmax bits, [2]
        # prefill's blocks counted in, [PARTIALS + b] decode block b's absmax bits
        pdl_prologue(pdl)  # the single-block variant only (the others record pdl = 0)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        first = bidx * threads + tidx
        step = cute.arch.grid_dim()[0] * threads
        if const_expr(phase == "single"):
            # One block holds the whole tensor: every thread has the absmax after the block
            # reduction, so the scale stays in registers (no atomics, no barrier, no workspace).
            one_launch(mX, mQ, mScale, mWords, tidx, threads)
        elif const_expr(phase == "decode"):
            one_launch(mX, mQ, mScale, mWords, first, step)
        else:
            if const_expr(phase == "absmax"):
                alloc = SharedMemory(smem_bytes, f"fp8_tensor_quant {variant.name}")
                sWarp = alloc.tensor(Float32, threads // 32, byte_alignment=4)
                amax = block_absmax(mX, sWarp, first, step)
                if tidx == 0:
                    publish_scale(amax, mScale, mWords)
            else:
                # The prefill quant pass walks last-first: the absmax pass just read the tensor
                # first-last, so its tail is still in L2.
                quantize(mX, mQ, mScale[0], first, step, True)

    @cute.jit
    def launch(mX: cute.Tensor, mQ: cute.Tensor, mScale: cute.Tensor, mWords: cute.Tensor,
               grid_x: Int32, grid_y: Int32, grid_z: Int32, stream: cuda.CUstream):
        fp8_tensor_quant_kernel(mX, mQ, mScale, mWords).launch(
            grid=[grid_x, grid_y, grid_z], block=block, smem=smem_bytes, stream=stream,
            cooperative=cooperative,
        )

    return launch
