"""Plain-Python description of a kernel's interface: arguments, parameter ABI, variants, launches.

This module is shared by the builder (which turns argument specs into fake tensors for the DSL)
and the loader (which turns them into packed parameter buffers and argument checks). It must
never import cutlass.

Parameter ABI of a CuTeDSL kernel (verified on the H200 with cuKernelGetParamInfo): each runtime
argument is one parameter passed by value. A tensor is the C struct
``{T* data; dynamic extents in mode order; dynamic strides in mode order}`` with natural C
alignment and its size rounded up to 8; static extents and strides are not stored.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

__all__ = [
    "DTYPES",
    "Dim",
    "TensorArg",
    "ScalarArg",
    "Arg",
    "ParamField",
    "param_fields",
    "param_size",
    "Variant",
    "Launch",
]

# name -> (bytes per element, torch attribute name). The names are the manifest spellings.
DTYPES: dict[str, tuple[int, str]] = {
    "bfloat16": (2, "bfloat16"),
    "float16": (2, "float16"),
    "float32": (4, "float32"),
    "float8_e4m3fn": (1, "float8_e4m3fn"),
    "int32": (4, "int32"),
    "int64": (8, "int64"),
}

# scalar dtype -> (struct format, C size)
_SCALAR_FORMATS: dict[str, str] = {
    "int32": "i",
    "uint32": "I",
    "int64": "q",
    "float32": "f",
    "float64": "d",
}


@dataclass(frozen=True)
class Dim:
    """A dynamic extent or stride, known only at launch. Same name = same value across tensors."""

    name: str
    width: int = 32  # 32 or 64: the C type of its field
    divisibility: int = 1  # the kernel may assume value % divisibility == 0

    def __post_init__(self):
        if self.width not in (32, 64):
            raise ValueError(f"Dim {self.name}: width must be 32 or 64 (got {self.width})")


@dataclass(frozen=True)
class TensorArg:
    name: str
    dtype: str
    shape: tuple[int | Dim, ...]
    stride: tuple[int | Dim, ...]
    align: int = 16  # bytes the data pointer is assumed aligned to
    writes: bool = False  # the kernel writes it (used for poisoning in tests and for docs)

    def __post_init__(self):
        if len(self.shape) != len(self.stride):
            raise ValueError(f"{self.name}: shape and stride ranks differ")
        if self.dtype not in DTYPES:
            raise ValueError(f"{self.name}: unknown dtype {self.dtype!r}")


@dataclass(frozen=True)
class ScalarArg:
    name: str
    dtype: str

    def __post_init__(self):
        if self.dtype not in _SCALAR_FORMATS:
            raise ValueError(f"{self.name}: unsupported scalar dtype {self.dtype!r}")


Arg = TensorArg | ScalarArg


@dataclass(frozen=True)
class ParamField:
    """One field of a packed kernel parameter."""

    kind: str  # "ptr" | "extent" | "stride" | "scalar"
    fmt: str  # struct format character
    offset: int
    mode: int = -1  # tensor mode for extents and strides
    dim: str = ""  # the Dim name for extents and strides

    def to_json(self) -> list:
        return [self.kind, self.fmt, self.offset, self.mode, self.dim]

    @classmethod
    def from_json(cls, data: list) -> "ParamField":
        kind, fmt, offset, mode, dim = data
        return cls(str(kind), str(fmt), int(offset), int(mode), str(dim))


def _align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def param_fields(arg: Arg) -> tuple[ParamField, ...]:
    """The C fields of one kernel parameter, in memory order."""
    if isinstance(arg, ScalarArg):
        return (ParamField("scalar", _SCALAR_FORMATS[arg.dtype], 0),)
    fields = [ParamField("ptr", "Q", 0)]
    offset = 8
    dynamic = [("extent", m, d) for m, d in enumerate(arg.shape) if isinstance(d, Dim)]
    dynamic += [("stride", m, d) for m, d in enumerate(arg.stride) if isinstance(d, Dim)]
    for kind, mode, dim in dynamic:
        size = dim.width // 8
        offset = _align_up(offset, size)
        fields.append(ParamField(kind, "i" if size == 4 else "q", offset, mode, dim.name))
        offset += size
    return tuple(fields)


def param_size(arg: Arg) -> int:
    """Size in bytes of the packed parameter, as the PTX `.param .b8 name[size]` declares it."""
    if isinstance(arg, ScalarArg):
        return struct.calcsize(_SCALAR_FORMATS[arg.dtype])
    last = param_fields(arg)[-1]
    return _align_up(last.offset + struct.calcsize(last.fmt), 8)


@dataclass(frozen=True)
class Variant:
    """One compile unit of a kernel point: a separately compiled kernel with static launch facts.

    A point has several variants when the launch plan picks between implementations
    (decode vs prefill) whose compile-time constants (warps per block) differ.
    """

    name: str
    block: tuple[int, int, int]
    smem: int = 0  # dynamic shared memory bytes, fixed at compile time
    params: tuple[str, ...] = ()  # call arguments passed to the kernel, in kernel order
    constants: dict = field(default_factory=dict, compare=False, hash=False)  # for the device code

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a plan."""

    variant: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int = 0
    cooperative: bool = False
    entry: int = 0  # index into the variant's kernel entries (launch order)
