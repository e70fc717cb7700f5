"""Arguments laid out as a record says, for the loader's CPU tests (tests/test_loader_cpu.py,
tests/test_loader_native.py): the generated checks, the C checks and both packers run on them."""

from __future__ import annotations

import torch

from rose_aot.kernels.spec import Dim


def sample_arguments(args):
    """CPU tensors (and scalars) laid out as `args` say: every dynamic extent 3, every dynamic
    stride the contiguous one rounded up to its divisibility; None if the spec needs a layout
    this simple rule cannot give (then another test covers it)."""
    from rose_aot.kernels.spec import ScalarArg as _Scalar

    dims: dict[str, int] = {}
    out = []
    for a in args:
        if isinstance(a, _Scalar):
            out.append(0.5 if a.dtype.startswith("float") else 1)
            continue
        shape = [dims.setdefault(d.name, 3) if isinstance(d, Dim) else d for d in a.shape]
        strides = [0] * len(shape)
        acc = 1
        for m in reversed(range(len(shape))):
            want = a.stride[m]
            if isinstance(want, Dim):
                value = dims.setdefault(want.name, -(-acc // want.divisibility) * want.divisibility)
            else:
                value = want
            strides[m] = value
            acc = value * shape[m]
        dtype = getattr(torch, a.dtype) if a.dtype not in ("float4_e2m1fn_x2",) else torch.uint8
        if dtype is torch.uint8 and a.dtype != "uint8":
            return None
        size = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
        storage = torch.zeros(size + 64, dtype=dtype)
        offset = (-storage.data_ptr() % a.align) // storage.element_size()
        if (storage.data_ptr() + offset * storage.element_size()) % a.align:
            return None
        out.append(storage.as_strided(shape, strides, offset))
    return out



def shipped_samples(bundle):
    """(key, arch, record, arguments) for every point and arch of `bundle` whose record this
    simple layout rule can serve."""
    for key in bundle.points():
        for arch in bundle.archs:
            try:
                record = bundle.record(key, arch)
            except KeyError:
                continue
            values = sample_arguments(record.args)
            if values is not None:
                yield key, arch, record, values
