"""CuTeDSL device code of act_and_mul (see family.py for the math and the work split)."""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from ...archs import Arch
from ..device_utils import chunk_coords, pdl_epilogue, pdl_prologue, pure_asm
from ..spec import Variant

__all__ = ["host_function", "activate", "load_chunk", "store_chunk"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_NEG_SQRT1_2 = -math.sqrt(0.5)
_NEG_HALF_LOG2_E = -0.5 / math.log(2.0)


def _rcp_approx(d):
    """1 / d for d in [1, 2] (elementwise on a TensorSSA): one MUFU.RCP, relative error below
    2^-22. cute.math.rcp lowers to the IEEE rcp.rn.f32 (a refinement and a slow-path check per
    element), which the 1-ulp bf16/fp16 tolerance does not need; no subnormal is involved."""
    out = cute.make_rmem_tensor(d.shape, Float32)
    out.store(d)
    for i in range(cute.size(out)):  # traced, so unrolled
        out[i] = Float32(pure_asm(Float32.mlir_type, [out[i]], "rcp.approx.ftz.f32 $0, $1;", "=f,f"))
    return out.load()


@cute.jit
def activate(a, activation: cutlass.Constexpr):
    """act(a) in fp32 for a TensorSSA `a`, accurate to the last bf16/fp16 bit down to underflow.

    silu and gelu_tanh are a * sigmoid(k) (k = a, resp. 2 sqrt(2/pi) (a + 0.044715 a^3), as
    0.5 (1 + tanh(u)) == sigmoid(2u)). sigmoid(k) = 1 / (1 + e) for k >= 0 and e / (1 + e) for
    k < 0, with e = exp(-|k|) = h * h, h = exp(-|k| / 2): h stays a normal fp32 number where e
    underflows, so the tail a * e / (1 + e) is formed as (a h) (h / (1 + e)) and loses nothing
    to ex2.approx's flush of subnormal results. gelu is 0.5 a erfc(-a / sqrt 2) (no
    cancellation for a << 0; libdevice erfcf)."""
    if const_expr(activation == "gelu"):
        y = 0.5 * a * cute.math.erfc(a * _NEG_SQRT1_2, fastmath=False)
    else:
        if const_expr(activation == "silu"):
            k = a
        else:
            k = (2.0 * _SQRT_2_OVER_PI) * (a + 0.044715 * (a * a * a))
        h = cute.math.exp2(cute.math.absf(k) * _NEG_HALF_LOG2_E, fastmath=True)
        r = _rcp_approx(1.0 + h * h)
        y = cute.where(k >= 0.0, a * r, (a * h) * (h * r))
    return y


@cute.jit
def load_chunk(gRow: cute.Tensor, rDst: cute.Tensor, first, row_threads: cutlass.Constexpr,
               per_thread: cutlass.Constexpr, limit, exact: cutlass.Constexpr, valid):
    """rDst[:, i] = gRow[:, first + i * row_threads] (vectors), predicated unless `exact`."""
    for i in cutlass.range_constexpr(per_thread):
        idx = first + i * row_threads
        if const_expr(exact):
            if valid:
                cute.autovec_copy(gRow[(None, idx)], rDst[None, i])
        else:
            if valid and idx < limit:
                cute.autovec_copy(gRow[(None, idx)], rDst[None, i])


@cute.jit
def store_chunk(rSrc: cute.Tensor, gRow: cute.Tensor, first, row_threads: cutlass.Constexpr,
                per_thread: cutlass.Constexpr, limit, exact: cutlass.Constexpr, valid):
    for i in cutlass.range_constexpr(per_thread):
        idx = first + i * row_threads
        if const_expr(exact):
            if valid:
                cute.autovec_copy(rSrc[None, i], gRow[(None, idx)])
        else:
            if valid and idx < limit:
                cute.autovec_copy(rSrc[None, i], gRow[(None, idx)])


def host_function(config, variant: Variant, arch: Arch):
    """The `@cute.jit` launcher of one variant: x, out, grid, stream."""
    k = variant.constants
    vec = k["vec"]
    row_threads = k["row_threads"]
    per_thread = k["vecs_per_thread"]
    rows = k["rows_per_block"]
    exact = k["exact"]
    chunk = row_threads * per_thread  # vectors per block column
    vectors = config.d // vec
    activation = config.activation
    block = list(variant.block)
    smem_bytes = variant.smem
    pdl = variant.pdl
    late = bool(k.get("pdl_late", 0))  # the `mid` variant (chunked_rows.decode_variants)

    @cute.kernel
    def act_and_mul_kernel(mX: cute.Tensor, mO: cute.Tensor):
        # mX: [tokens, 2d], mO: [tokens, d]; both with a dynamic row stride
        pdl_prologue(pdl, late)
        tidx, _, _ = cute.arch.thread_idx()
        row_block, col = chunk_coords(k["col_blocks"], k["chunks_in_x"])
        row = row_block * rows + tidx // row_threads
        first = col * chunk + tidx % row_threads
        valid = row < mX.shape[0]

        gX = cute.zipped_divide(mX[row, None], (vec,))  # ((vec), (2 * vectors))
        tArA = cute.make_rmem_tensor((vec, per_thread), mX.element_type)
        tBrB = cute.make_rmem_tensor((vec, per_thread), mX.element_type)
        tArA.fill(0)
        tBrB.fill(0)
        load_chunk(gX, tArA, first, row_threads, per_thread, vectors, exact, valid)
        load_chunk(gX, tBrB, first + vectors, row_threads, per_thread, 2 * vectors, exact, valid)
        a = tArA.load().to(Float32)
        y = activate(a, activation) * tBrB.load().to(Float32)
        tOrO = cute.make_rmem_tensor((vec, per_thread), mO.element_type)
        tOrO.store(y.to(mO.element_type))
        gO = cute.zipped_divide(mO[row, None], (vec,))
        store_chunk(tOrO, gO, first, row_threads, per_thread, vectors, exact, valid)
        pdl_epilogue(pdl, late)

    @cute.jit
    def launch(
        mX: cute.Tensor,
        mO: cute.Tensor,
        grid_x: Int32,
        grid_y: Int32,
        grid_z: Int32,
        stream: cuda.CUstream,
    ):
        act_and_mul_kernel(mX, mO).launch(
            grid=[grid_x, grid_y, grid_z], block=block, smem=smem_bytes, stream=stream
        )

    return launch
