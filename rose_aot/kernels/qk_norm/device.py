"""CuTeDSL device code of qk_norm (see qk_norm.py for the algorithm and launch plan)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from ...archs import Arch
from ..device_utils import butterfly_sum, cutlass_dtype, pdl_epilogue, pdl_prologue
from ..spec import Variant
from .family import QkNormConfig

__all__ = ["host_function"]


def host_function(config: QkNormConfig, variant: Variant, arch: Arch):
    """The `@cute.jit` launcher of one variant: q, k, q_weight, k_weight, grid, stream."""
    lanes = variant.constants["lanes_per_head"]
    per_lane = variant.constants["vecs_per_lane"]
    vec = variant.constants["vec"]
    num_q = config.num_q_heads
    heads_per_token = config.num_q_heads + config.num_k_heads
    heads_per_block = variant.constants["heads_per_block"]
    eps = config.eps
    offset = config.weight_offset
    inv_dim = 1.0 / config.head_dim
    dtype = cutlass_dtype(config.dtype)
    wdtype = cutlass_dtype(config.weight_dtype)
    block = list(variant.block)
    pdl = variant.pdl
    late = bool(variant.constants.get("pdl_late", 0))  # pdl_late: the next kernel after the stores

    @cute.kernel
    def qk_norm_kernel(mQ: cute.Tensor, mK: cute.Tensor, mQW: cute.Tensor, mKW: cute.Tensor):
        # mQ: [tokens, q_heads, head_dim], mK: [tokens, k_heads, head_dim]; weights [head_dim]
        pdl_prologue(pdl, late)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        g = bidx * heads_per_block + tidx // lanes  # global head index over (token, q|k head)
        lane = tidx % lanes
        token = g // heads_per_token
        head = g % heads_per_token
        valid = token < mQ.shape[0]
        is_q = head < num_q

        # Every lane of a warp reaches the shuffles below: out-of-range and Q/K choices only
        # predicate the loads and stores, so the warp never diverges around shfl.sync.
        tXrX = cute.make_rmem_tensor((vec, per_lane), dtype)
        tXrX.fill(0)
        tWrW = cute.make_rmem_tensor((vec, per_lane), wdtype)
        tWrW.fill(0)
        gQ = cute.zipped_divide(mQ[token, head, None], (vec,))  # ((vec), (head_dim / vec))
        gK = cute.zipped_divide(mK[token, head - num_q, None], (vec,))
        gQW = cute.zipped_divide(mQW, (vec,))
        gKW = cute.zipped_divide(mKW, (vec,))
        for i in cutlass.range_constexpr(per_lane):
            idx = lane + i * lanes
            if valid and is_q:
                cute.autovec_copy(gQ[(None, idx)], tXrX[None, i])
                cute.autovec_copy(gQW[(None, idx)], tWrW[None, i])
            if valid and not is_q:
                cute.autovec_copy(gK[(None, idx)], tXrX[None, i])
                cute.autovec_copy(gKW[(None, idx)], tWrW[None, i])

        x = tXrX.load().to(Float32)
        ss = butterfly_sum((x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), 0), lanes)
        rstd = cute.math.rsqrt(ss * inv_dim + eps, fastmath=False)
        tXrX.store((x * rstd * (tWrW.load().to(Float32) + offset)).to(dtype))

        for i in cutlass.range_constexpr(per_lane):
            idx = lane + i * lanes
            if valid and is_q:
                cute.autovec_copy(tXrX[None, i], gQ[(None, idx)])
            if valid and not is_q:
                cute.autovec_copy(tXrX[None, i], gK[(None, idx)])
        pdl_epilogue(pdl, late)

    @cute.jit
    def launch(
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mQW: cute.Tensor,
        mKW: cute.Tensor,
        grid_x: Int32,
        grid_y: Int32,
        grid_z: Int32,
        stream: cuda.CUstream,
    ):
        qk_norm_kernel(mQ, mK, mQW, mKW).launch(
            grid=[grid_x, grid_y, grid_z], block=block, stream=stream
        )

    return launch
