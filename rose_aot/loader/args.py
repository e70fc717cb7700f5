"""Argument checks and parameter packing for launches from a bundle (no cutlass, no DSL).

The checks run before anything reaches the driver: a wrong dtype, shape, device, stride or
alignment is an ArgumentError that quotes the numbers, never a kernel reading out of bounds.
"""

from __future__ import annotations

import ctypes
import struct

from ..errors import ArgumentError
from ..kernels.record import ParamRecord
from ..kernels.spec import Arg, Dim, ScalarArg, TensorArg

__all__ = ["ArgBinder", "ParamPacker"]

_INT_LIMITS = {32: 2**31 - 1, 64: 2**63 - 1}
# Scalar dtype -> (Python types accepted, inclusive range or None)
_SCALAR_RULES = {
    "int32": ((int,), (-(2**31), 2**31 - 1)),
    "uint32": ((int,), (0, 2**32 - 1)),
    "int64": ((int,), (-(2**63), 2**63 - 1)),
    "float32": ((float, int), None),
    "float64": ((float, int), None),
}


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


class ArgBinder:
    """Checks call arguments against an argument spec and collects the dynamic values."""

    def __init__(self, owner: str, args: tuple[Arg, ...]):
        self.owner = owner
        self.args = args
        import torch

        self._tensor_type = torch.Tensor
        self._dtypes = {a.name: _torch_dtype(a.dtype) for a in args if isinstance(a, TensorArg)}

        # Hot-path checks: per argument (dtype, rank, static extents, contiguous-only, dynamic
        # extents, dynamic strides, alignment). Anything unusual falls back to `bind`, which
        # either accepts it or raises the detailed error.
        self._fast = []
        first_use: dict[str, tuple[int, int, str]] = {}
        for i, a in enumerate(args):
            if isinstance(a, ScalarArg):
                types, bounds = _SCALAR_RULES[a.dtype]
                self._fast.append((None, types, bounds, None, None, None, None))
                continue
            static_shape = tuple(a.shape) if not any(isinstance(d, Dim) for d in a.shape) else None
            contiguous = static_shape is not None and tuple(a.stride) == _contiguous(static_shape)
            extents = []  # (mode, expected int) or (mode, (arg, mode) of the first use)
            for m, d in enumerate(a.shape):
                if isinstance(d, Dim):
                    src = first_use.setdefault(d.name, (i, m, "shape"))
                    extents.append((m, None if src == (i, m, "shape") else src))
                else:
                    extents.append((m, d))
            strides = []  # (mode, int) static, or (mode, -divisibility) dynamic
            for m, st in enumerate(a.stride):
                strides.append((m, -st.divisibility if isinstance(st, Dim) else st))
            self._fast.append(
                (self._dtypes[a.name], len(a.shape), static_shape, contiguous, extents, strides,
                 a.align)
            )

    def fast_bind(self, values: tuple):
        """(shapes, strides, values, device) of well-formed arguments, else None. `values`
        holds each tensor's data pointer and each scalar's value."""
        fast = self._fast
        tensor_type = self._tensor_type
        if len(values) != len(fast):
            return None
        shapes, strides, ptrs = [], [], []
        device = -2
        for t, (dtype, rank, static_shape, contiguous, extents, stride_spec, align) in zip(
            values, fast
        ):
            if dtype is None:  # a scalar: rank holds the accepted types, static_shape the range
                if type(t) not in rank or (
                    static_shape is not None and not static_shape[0] <= t <= static_shape[1]
                ):
                    return None
                shapes.append(None)
                strides.append(None)
                ptrs.append(t)
                continue
            if type(t) is not tensor_type or t.dtype is not dtype:
                return None
            dev = t.get_device()
            if dev != device:
                if device != -2 or dev < 0:
                    return None
                device = dev
            shape = t.shape
            if contiguous:
                if shape != static_shape or not t.is_contiguous():
                    return None
                stride = None
            else:
                if len(shape) != rank:
                    return None
                stride = t.stride()
                for m, want in extents:
                    if want is None:
                        continue
                    got = shape[m]
                    if want.__class__ is int:
                        if got != want:
                            return None
                    elif got != (shape if want[0] == len(shapes) else shapes[want[0]])[want[1]]:
                        return None
                for m, want in stride_spec:
                    if want >= 0:
                        if stride[m] != want and shape[m] > 1:
                            return None
                    elif stride[m] % -want:
                        return None
            ptr = t.data_ptr()
            if ptr % align:
                return None
            shapes.append(shape)
            strides.append(stride)
            ptrs.append(ptr)
        if device < 0:
            return None
        return shapes, strides, ptrs, device

    def signature(self) -> str:
        return f"{self.owner}({', '.join(a.name for a in self.args)})"

    def bind(self, values: tuple, meta: bool = False) -> tuple[dict[str, int], list, int]:
        """Returns (dynamic dim values by name, per argument its data pointer or scalar value,
        CUDA device index); raises ArgumentError naming the argument and the numbers.
        `meta`: fake or meta tensors; no pointer, alignment or device checks (returns device -1)."""
        import torch

        if len(values) != len(self.args):
            raise ArgumentError(
                f"{self.signature()} takes {len(self.args)} arguments, got {len(values)}"
            )
        dims: dict[str, int] = {}
        device = None
        devices = []
        out = []
        for spec, value in zip(self.args, values):
            where = f"{self.owner}: argument '{spec.name}'"
            if isinstance(spec, ScalarArg):
                out.append(self._bind_scalar(spec, value, where))
                continue
            is_tensor = isinstance(value, torch.Tensor)
            out.append(value.data_ptr() if is_tensor and not meta else None)
            if not isinstance(value, torch.Tensor):
                raise ArgumentError(f"{where} must be a torch.Tensor, got {type(value).__name__}")
            if value.dtype != self._dtypes[spec.name]:
                raise ArgumentError(f"{where} must have dtype {spec.dtype}, got {value.dtype}")
            if value.dim() != len(spec.shape):
                raise ArgumentError(
                    f"{where} must have {len(spec.shape)} dimensions {self._shape_text(spec)}, "
                    f"got shape {tuple(value.shape)}"
                )
            shape, strides = value.shape, value.stride()
            for mode, (want, got) in enumerate(zip(spec.shape, shape)):
                if isinstance(want, Dim):
                    self._bind_dim(dims, want, got, where, f"size of dimension {mode}")
                elif want != got:
                    raise ArgumentError(
                        f"{where} must have shape {self._shape_text(spec)}, got {tuple(shape)}"
                    )
            for mode, (want, got) in enumerate(zip(spec.stride, strides)):
                if shape[mode] <= 1:
                    # A stride over one element is never applied; normalise it so that it meets
                    # the divisibility the kernel assumes.
                    if isinstance(want, Dim):
                        d = want.divisibility
                        dims.setdefault(want.name, -(-max(got, 0) // d) * d)
                    continue
                if isinstance(want, Dim):
                    if got % want.divisibility:
                        raise ArgumentError(
                            f"{where}: stride {got} of dimension {mode} must be a multiple of "
                            f"{want.divisibility} elements (the kernel's vector accesses); use a contiguous "
                            f"or padded tensor"
                        )
                    self._bind_dim(dims, want, got, where, f"stride of dimension {mode}")
                elif want != got:
                    raise ArgumentError(
                        f"{where} must have strides {self._stride_text(spec)}, got {tuple(strides)}"
                        f"; pass a tensor with this layout (e.g. .contiguous())"
                    )
            if meta:
                continue
            if value.data_ptr() % spec.align:
                raise ArgumentError(
                    f"{where}: data pointer 0x{value.data_ptr():x} is not {spec.align}-byte "
                    f"aligned; slice at a multiple of {spec.align // value.element_size()} elements"
                )
            devices.append((where, value.device))
        if meta:
            return dims, out, -1
        # Checked after every argument's other checks, so that those also run on CPU tensors.
        for where, dev in devices:
            if dev.type != "cuda":
                raise ArgumentError(f"{where} must be on a CUDA device, got {dev}")
            if device is None:
                device = dev.index
            elif dev.index != device:
                raise ArgumentError(
                    f"{where} is on cuda:{dev.index} but earlier arguments are on "
                    f"cuda:{device}; put all arguments on one device"
                )
        if device is None:
            raise ArgumentError(f"{self.signature()}: no tensor argument gives the CUDA device")
        return dims, out, device

    @staticmethod
    def _bind_scalar(spec: ScalarArg, value, where: str):
        types, bounds = _SCALAR_RULES[spec.dtype]
        if isinstance(value, bool) or not isinstance(value, types):
            names = " or ".join(t.__name__ for t in types)
            raise ArgumentError(f"{where} must be a Python {names} ({spec.dtype}), got {value!r}")
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            raise ArgumentError(f"{where} = {value} is outside the range of {spec.dtype}")
        return float(value) if float in types else value

    @staticmethod
    def _bind_dim(dims, dim: Dim, value: int, where: str, what: str) -> None:
        if value > _INT_LIMITS[dim.width]:
            raise ArgumentError(f"{where}: {what} = {value} exceeds the kernel's int{dim.width}")
        previous = dims.setdefault(dim.name, value)
        if previous != value:
            raise ArgumentError(
                f"{where}: {what} is {value} but another argument gives '{dim.name}' = {previous}"
            )

    @staticmethod
    def _shape_text(spec: TensorArg) -> str:
        return "[" + ", ".join(d.name if isinstance(d, Dim) else str(d) for d in spec.shape) + "]"

    @staticmethod
    def _stride_text(spec: TensorArg) -> str:
        return "(" + ", ".join("*" if isinstance(s, Dim) else str(s) for s in spec.stride) + ")"


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for extent in reversed(shape):
        out.append(acc)
        acc *= extent
    return tuple(reversed(out))


class ParamPacker:
    """One preallocated buffer holding every kernel parameter of one entry, laid out as the
    variant's record says, and the void* array (`kernelParams`) pointing into it. `pack`
    rewrites the buffer with one struct call."""

    def __init__(self, positions: dict[str, int], params: tuple[ParamRecord, ...]):
        """`positions`: argument name -> its index in the values passed to `fast_values` /
        `values` (call arguments, then workspace)."""
        fmt = "<"
        offset = 0
        offsets = []
        self._sources: list[tuple[int, str, int, str]] = []  # (value index, kind, mode, dim)
        for p in params:
            offset = -(-offset // max(8, p.align)) * max(8, p.align)  # each parameter 8-aligned
            offsets.append(offset)
            for f in p.fields:
                pad = offset + f.offset - struct.calcsize(fmt)
                if pad < 0:
                    raise ValueError(f"parameter {p.name}: fields overlap")
                fmt += (f"{pad}x" if pad else "") + f.fmt
                self._sources.append((positions[p.name], f.kind, f.mode, f.dim))
            offset += p.size
        self.struct = struct.Struct(fmt)
        self.sizes = [p.size for p in params]
        self.buffer = ctypes.create_string_buffer(max(8, -(-offset // 8) * 8))
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * max(1, len(params)))(*[base + o for o in offsets])
        self.address = ctypes.addressof(self.pointers)
        self.params = tuple(p.name for p in params)

    def values(self, values: list, dims: dict[str, int]) -> list:
        """Parameter values from `ArgBinder.bind`'s result (strides normalised by the binder)."""
        out = []
        for i, kind, _mode, dim in self._sources:
            out.append(values[i] if kind in ("ptr", "scalar") else dims[dim])
        return out

    def fast_values(self, shapes, strides, values) -> list:
        """Parameter values straight from `ArgBinder.fast_bind`'s result."""
        out = []
        for i, kind, mode, _dim in self._sources:
            if kind == "ptr" or kind == "scalar":
                out.append(values[i])
            elif kind == "extent":
                out.append(shapes[i][mode])
            else:
                out.append(strides[i][mode])
        return out

    def pack(self, values: list) -> int:
        """Writes the parameters; returns the kernelParams address to pass to the driver."""
        self.struct.pack_into(self.buffer, 0, *values)
        return self.address
