"""The kernel argument ABI, in plain Python: dtypes, arguments, parameter layouts, variants, launches.

Shared by the builder (argument specs become fake tensors for the DSL; variants become compile
units and records) and the loader (records become argument checks and packed parameter buffers).
It must never import cutlass.

Parameter ABI of a CuTeDSL kernel (verified on the H200 with cuFuncGetParamInfo): each runtime
argument is one parameter passed by value. A tensor is the C struct
``{T* data; dynamic extents in mode order; dynamic strides in mode order}`` with natural C
alignment and its size rounded up to 8; static extents and strides are not stored. A scalar is
its C type.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

__all__ = [
    "PDL_MAX_THREADS",
    "DType",
    "DTYPES",
    "get_dtype",
    "ROLES",
    "SCALE_LAYOUTS",
    "Dim",
    "TensorArg",
    "ScalarArg",
    "Arg",
    "arg_from_json",
    "json_int",
    "ParamField",
    "param_fields",
    "param_size",
    "param_align",
    "Variant",
    "Launch",
]


@dataclass(frozen=True)
class DType:
    """An element type. `bits` is the width of one stored unit; `per_unit` values share it
    (2 for packed e2m1: one byte holds two 4-bit values)."""

    name: str  # manifest spelling; equal to the torch attribute name
    bits: int
    kind: str  # "float" | "int" | "scale" (exponent-only scale factors)
    per_unit: int = 1

    @property
    def bytes(self) -> int:
        return self.bits // 8

    def elements_per_access(self, access_bytes: int) -> int:
        """Stored units per vector access of `access_bytes`."""
        return access_bytes * 8 // self.bits


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("bfloat16", 16, "float"),
        DType("float16", 16, "float"),
        DType("float32", 32, "float"),
        DType("float8_e4m3fn", 8, "float"),
        DType("float8_e5m2", 8, "float"),
        DType("float8_e8m0fnu", 8, "scale"),  # e8m0 / ue8m0: a power of two, no sign
        DType("float4_e2m1fn_x2", 8, "float", per_unit=2),
        DType("uint8", 8, "int"),
        DType("int32", 32, "int"),
        DType("int64", 64, "int"),
    )
}


def get_dtype(name: str) -> DType:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}") from None


# What a kernel does with an argument. "workspace" arguments are owned by the loader (zeroed
# once per device and stream; kernels leave them as they found them).
ROLES = ("input", "output", "inout", "workspace")

# Named layouts of scale-factor tensors; a TensorArg's `layout` documents which one its
# shape/stride encode (the shape and stride stay the ABI).
SCALE_LAYOUTS = {
    "row_major": "[tokens, groups], groups contiguous",
    "col_major_tma": "[groups, tokens padded to 4], tokens contiguous (TMA-aligned, DeepGEMM)",
    "swizzled_128x4": "rows padded to 128, scale columns to 4, 512-byte atoms of 32x4x4 "
    "(CUTLASS/cuBLAS block-scaled GEMMs)",
}

# scalar dtype -> struct format
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

    def to_json(self) -> list:
        return [self.name, self.width, self.divisibility]


@dataclass(frozen=True)
class TensorArg:
    name: str
    dtype: str
    shape: tuple[int | Dim, ...]
    stride: tuple[int | Dim, ...]
    align: int = 16  # bytes the data pointer is assumed aligned to
    role: str = "input"
    layout: str = ""  # a SCALE_LAYOUTS name for scale-factor tensors

    def __post_init__(self):
        if len(self.shape) != len(self.stride):
            raise ValueError(f"{self.name}: shape and stride ranks differ")
        get_dtype(self.dtype)
        if self.role not in ROLES:
            raise ValueError(f"{self.name}: role must be one of {ROLES} (got {self.role!r})")
        if self.layout and self.layout not in SCALE_LAYOUTS:
            raise ValueError(f"{self.name}: unknown layout {self.layout!r}")

    @property
    def writes(self) -> bool:
        return self.role in ("output", "inout", "workspace")

    def to_json(self) -> dict:
        def dims(values):
            return [v.to_json() if isinstance(v, Dim) else v for v in values]

        out = {
            "name": self.name,
            "kind": "tensor",
            "dtype": self.dtype,
            "bits": DTYPES[self.dtype].bits,
            "shape": dims(self.shape),
            "stride": dims(self.stride),
            "align": self.align,
            "role": self.role,
        }
        if self.layout:
            out["layout"] = self.layout
        return out


@dataclass(frozen=True)
class ScalarArg:
    name: str
    dtype: str
    role: str = "input"

    def __post_init__(self):
        if self.dtype not in _SCALAR_FORMATS:
            raise ValueError(
                f"{self.name}: unsupported scalar dtype {self.dtype!r}; "
                f"one of {', '.join(_SCALAR_FORMATS)}"
            )

    @property
    def writes(self) -> bool:
        return False

    def to_json(self) -> dict:
        return {"name": self.name, "kind": "scalar", "dtype": self.dtype, "role": self.role}


Arg = TensorArg | ScalarArg


def json_int(value: object) -> int:
    """`value` if it is an integer (not a bool), else TypeError: the readers of specs and
    records from an index."""
    if type(value) is int:  # what a JSON integer is; the checks below decide the rest
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _dims_from_json(values) -> tuple:
    if not isinstance(values, list):
        raise TypeError(f"expected a list of extents, got {type(values).__name__}")
    out = []
    for v in values:
        if type(v) is int:
            out.append(v)
        elif isinstance(v, list):
            if len(v) != 3 or not isinstance(v[0], str):
                raise ValueError(f"a dynamic extent is [name, width, divisibility], got {v!r}")
            out.append(Dim(v[0], json_int(v[1]), json_int(v[2])))
        else:
            out.append(json_int(v))
    return tuple(out)


def arg_from_json(data: dict) -> Arg:
    """The inverse of ``to_json``; raises KeyError/TypeError/ValueError on malformed data."""
    if data["kind"] == "scalar":
        return ScalarArg(str(data["name"]), str(data["dtype"]), str(data["role"]))
    if data["kind"] != "tensor":
        raise ValueError(f"unknown argument kind {data['kind']!r}")
    return TensorArg(
        str(data["name"]),
        str(data["dtype"]),
        _dims_from_json(data["shape"]),
        _dims_from_json(data["stride"]),
        int(data["align"]),
        str(data["role"]),
        str(data.get("layout", "")),
    )


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
        return cls(*cls.values_from_json(data))

    @staticmethod
    def values_from_json(data: list) -> tuple[str, str, int, int, str]:
        """The field's values, converted as from_json converts them (a hashable key for
        readers that share equal fields)."""
        kind, fmt, offset, mode, dim = data
        return str(kind), str(fmt), int(offset), int(mode), str(dim)


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


def param_size(arg: Arg, fields: tuple[ParamField, ...] | None = None) -> int:
    """Size in bytes of the packed parameter, as the PTX `.param` declaration gives it.
    `fields`: param_fields(arg), if the caller has it already."""
    if isinstance(arg, ScalarArg):
        return struct.calcsize(_SCALAR_FORMATS[arg.dtype])
    last = (fields or param_fields(arg))[-1]
    return _align_up(last.offset + struct.calcsize(last.fmt), 8)


def param_align(arg: Arg, fields: tuple[ParamField, ...] | None = None) -> int:
    """Alignment of the packed parameter: its widest field (C struct rules).
    `fields`: param_fields(arg), if the caller has it already."""
    return max(struct.calcsize(f.fmt) for f in fields or param_fields(arg))


# Launches of at most this many threads in all use programmatic dependent launch. Measured on
# the H200 (benchmarks/results/pdl-h200.md, norms-pdl-h200.md, 2026-11-30), with the next kernel
# triggered at the top of each kernel: a chain of 20 one-token decode kernels in a CUDA graph
# took 44.8 instead of 50.0 µs and one-token norms 0.96-1.47 instead of 1.45-1.92 µs; larger
# launches got slower with it (fused add + norm at 16 tokens: hidden 4096, 4096 threads, 2.13
# vs 1.71 µs; hidden 7168, 7168 threads, 2.63 vs 1.98 µs; at 128 tokens 2.84 vs 1.78 µs), the
# early-launched grid competing for the SMs. 2048 threads keeps every measured gain but the
# 16-token hidden-4096 norm and the one-token dispatch, and none of the measured losses.
PDL_MAX_THREADS = 2048


@dataclass(frozen=True)
class Variant:
    """One compile unit of a kernel point: the single source of its static launch facts.

    A point has several variants when the launch plan picks between implementations
    (decode vs prefill) whose compile-time constants differ. The device code reads block,
    shared memory, the cooperative flag and the constants from here; the compile worker turns
    it into the point's record; the loader launches from that record.
    """

    name: str
    block: tuple[int, int, int]
    smem: int = 0  # dynamic shared memory bytes, fixed at compile time
    params: tuple[str, ...] = ()  # arguments passed to the kernel, in kernel order
    constants: dict = field(default_factory=dict, compare=False, hash=False)
    cooperative: bool = False  # needs every block resident (grid barrier)
    # Programmatic dependent launch: the largest launch (threads in all) made with it; 0 = never.
    # The kernel starts with griddepcontrol (device_utils.pdl_prologue) whenever this is set.
    pdl: int = 0
    cluster: tuple[int, int, int] = (1, 1, 1)

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a plan: which variant, its grid, and which of its entries. Block,
    shared memory and launch attributes come from the variant's record."""

    variant: str
    grid: tuple[int, int, int]
    entry: int = 0  # index into the variant's kernel entries (launch order)
