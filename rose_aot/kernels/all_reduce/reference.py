"""Float64 torch references of all_reduce (tests only), plus the kernel's exact summation for
bitwise checks."""

from __future__ import annotations

__all__ = ["reference", "ordered_sum"]


def ordered_sum(inputs):
    """What the kernel computes for each element: fp32 sum in rank order 0..W-1, rounded once
    to the dtype. `inputs`: a sequence of same-shaped tensors, one per rank."""
    acc = inputs[0].float()
    for x in inputs[1:]:
        acc = acc + x.float()
    return acc.to(inputs[0].dtype)


def reference(c, inputs, *tensors) -> None:
    """Performs the kernel's writes on CPU tensors, given every rank's input (a sequence).

    Plain: ``reference(c, inputs, out)``: out = sum (float64, rounded once).
    residual_rms_norm: ``reference(c, inputs, residual, weight, out)``: the sum rounded to the
    dtype, r = sum + residual rounded (written to residual), out = rmsnorm(r) * (w + offset).
    moe_combine: ``reference(c, inputs, out)`` with inputs[r] = (y, positions, weights) of rank
    r: each rank's combine (moe_combine's reference: float64, rounded to the dtype, as the
    kernel stages it), summed over the ranks in float64 and rounded once.
    """
    import torch

    if c.fusion == "moe_combine":
        from ..moe_combine.reference import reference as combine

        (out,) = tensors
        partials = []
        for y, positions, weights in inputs:
            partial = torch.empty(out.shape, dtype=out.dtype)
            combine(c, y, positions, weights, partial)  # reads c.top_k only
            partials.append(partial.double())
        out.copy_(torch.stack(partials).sum(dim=0).to(out.dtype))
        return
    total = torch.stack([x.double() for x in inputs]).sum(dim=0)
    if c.fusion == "none":
        (out,) = tensors
        out.copy_(total.to(out.dtype))
        return
    residual, weight, out = tensors
    summed = total.to(residual.dtype).double()
    r = (summed + residual.double()).to(residual.dtype)
    residual.copy_(r)
    xs = r.double()
    rstd = torch.rsqrt(xs.pow(2).mean(dim=-1, keepdim=True) + c.eps)
    out.copy_((xs * rstd * (weight.double() + c.weight_offset)).to(out.dtype))
