"""Argument checks and parameter packing for launches from a bundle (no cutlass, no DSL).

The checks run before anything reaches the driver: a wrong dtype, shape, device, stride or
alignment is an ArgumentError that quotes the numbers, never a kernel reading out of bounds.
"""

from __future__ import annotations

import ctypes
import struct
from functools import cached_property, partial

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

    def __init__(self, owner: str, args: tuple[Arg, ...], size_sources=(), *,
                 allow_cpu: bool = False):
        """`size_sources`: (argument index, mode) of each plan size `fast_bind` returns.
        `allow_cpu` lets `fast_bind` accept CPU tensors (device -1): only for testing the
        generated checks on a machine without a GPU; a launch never sets it.

        Builds the text of the generated checks (`_checks`) and nothing else: `fast_bind` is
        compiled on first use, the hot path (`compile_fast_launch`) when a handle first runs on
        a device."""
        self.owner = owner
        self.args = args
        import torch

        self._tensor_types = (torch.Tensor, torch.nn.Parameter)
        self._dtypes = {a.name: _torch_dtype(a.dtype) for a in args if isinstance(a, TensorArg)}
        self._min_device = -1 if allow_cpu else 0
        # The hot path: straight-line code generated for this argument spec.
        self.atoms: dict[tuple[int, str, int], str] = {}
        self._generate_checks(size_sources)

    @cached_property
    def fast_bind(self):
        """`fast_bind(values) -> (device, sizes, atoms) | None`: the generated checks of the hot
        path, returning what they read (see `_generate_checks`); compiled on first use (the
        handle's hot path does not call it: tests and benchmarks do)."""
        sizes = "".join(s + ", " for s in self._size_exprs)
        source = "\n".join(["def fast_bind(values):", *self._checks[:self._device_line],
                            f"    if dev < {self._min_device}: return None",
                            *self._checks[self._device_line:],
                            f"    return dev, ({sizes}), ({''.join(x + ', ' for x in self._atom_exprs)})"])
        self.fast_source = source
        return self._exec(source, "fast_bind", {})

    def _generate_checks(self, size_sources) -> None:
        """Generate the straight-line checks of a call (`self._checks`, Python source lines).

        Every expected dtype, extent, stride and alignment is inlined: one attribute read per
        fact, no loops, no per-call allocation. The lines accept exactly the well-formed calls;
        anything else (wrong count, dtype, shape, device, alignment, a size-1 extent with an odd
        stride...) reaches `return None`, and the caller runs `bind`, which raises the precise
        error or accepts the unusual but valid form. A tensor is a torch.Tensor or an
        nn.Parameter (module weights), never another subclass. The lines leave `dev` (the first
        tensor's device index, -1 for a CPU tensor: the hot path refuses it because no launcher
        is resolved for device -1, `fast_bind` by a check of its own), and what kernel
        parameters carry: each tensor's data pointer, each scalar's value, each dynamic extent
        and stride (`self._atom_exprs`, in `self.atoms` order), and the extents named by
        `size_sources` ((argument, mode) pairs; `self._size_exprs`).
        `self.atoms` maps (argument index, kind, mode) to the expression a packer reads it by.
        """
        lines = [f"    if len(values) != {len(self.args)}: return None",
                 f"    ({''.join(f'v{i}, ' for i in range(len(self.args)))}) = values"]
        env = {"T": self._tensor_types[0], "PARAM": self._tensor_types[1]}
        atoms: list[str] = []
        first_use: dict[str, str] = {}  # dim name -> the expression of its first extent
        seen_device = False

        raw: dict[tuple[int, str, int], str] = {}  # the same facts as local expressions
        # The same checks as data, for the C hot path (rose_aot/loader/_native.c, `checker`):
        # per argument a tuple, atoms by index; `first_atom` is first_use by atom index.
        spec: list[tuple] = []
        first_atom: dict[str, int] = {}

        def atom(key, expr):
            self.atoms[key] = f"a[{len(atoms)}]"
            raw[key] = expr
            atoms.append(expr)
            return len(atoms) - 1

        for i, a in enumerate(self.args):
            v = f"v{i}"
            if isinstance(a, ScalarArg):
                types, bounds = _SCALAR_RULES[a.dtype]
                env[f"TY{i}"] = types
                cond = f"type({v}) not in TY{i}"
                if bounds is not None:
                    cond += f" or not {bounds[0]} <= {v} <= {bounds[1]}"
                lines.append(f"    if {cond}: return None")
                spec.append(("scalar", atom((i, "scalar", 0), v), types,
                             *(bounds if bounds is not None else (None, None))))
                continue
            env[f"D{i}"] = self._dtypes[a.name]
            # type() first: plain tensors pass with one comparison
            is_tensor = f"(type({v}) is T or type({v}) is PARAM)"
            if not seen_device:
                lines.append(f"    if not {is_tensor} or {v}.dtype is not D{i}: return None")
                lines.append(f"    dev = {v}.get_device()")
                device_line = len(lines)
                seen_device = True
            else:
                lines.append(f"    if not {is_tensor} or {v}.dtype is not D{i} or "
                             f"{v}.get_device() != dev: return None")
            static = not any(isinstance(d, Dim) for d in a.shape)
            extents: list[tuple[int, int]] = []  # per mode (atom, first use's atom) or (-1, value)
            strides: list[tuple[int, int, int]] = []  # the same, then the divisibility
            contiguous = None
            if static and tuple(a.stride) == _contiguous(tuple(a.shape)):
                # A fixed, contiguous tensor: its extents and strides are constants.
                shape = tuple(int(d) for d in a.shape)  # ints only: the text is executed
                contiguous = shape
                lines.append(f"    if {v}.shape != {shape!r} or not {v}.is_contiguous(): return None")
                for m, (extent, stride) in enumerate(zip(a.shape, a.stride)):
                    self.atoms[(i, "extent", m)] = raw[(i, "extent", m)] = str(int(extent))
                    self.atoms[(i, "stride", m)] = raw[(i, "stride", m)] = str(int(stride))
            else:
                # One condition for the extents (rank included) and one for the strides: each
                # static entry compared, each dynamic one checked against its first use and its
                # divisibility. A size-1 extent with an unexpected static stride is left to
                # `bind`, which accepts it.
                lines.append(f"    s{i} = {v}.shape")
                conds = [f"len(s{i}) != {len(a.shape)}"]
                for m, d in enumerate(a.shape):
                    got = f"s{i}[{m}]"
                    if not isinstance(d, Dim):
                        conds.append(f"{got} != {int(d)}")
                        self.atoms[(i, "extent", m)] = raw[(i, "extent", m)] = str(int(d))
                        extents.append((-1, int(d)))
                        continue
                    if d.name in first_use:
                        conds.append(f"{got} != {first_use[d.name]}")
                    else:
                        first_use[d.name] = got
                    index = atom((i, "extent", m), got)
                    extents.append((index, first_atom.setdefault(d.name, index)))
                lines.append(f"    if {' or '.join(conds)}: return None")
                lines.append(f"    t{i} = {v}.stride()")
                conds = []
                for m, st in enumerate(a.stride):
                    got = f"t{i}[{m}]"
                    if not isinstance(st, Dim):
                        conds.append(f"{got} != {int(st)}")
                        self.atoms[(i, "stride", m)] = raw[(i, "stride", m)] = str(int(st))
                        strides.append((-1, int(st), 1))
                        continue
                    if st.divisibility > 1:
                        conds.append(f"{got} % {int(st.divisibility)}")
                    if st.name in first_use:
                        conds.append(f"{got} != {first_use[st.name]}")
                    else:
                        first_use[st.name] = got
                    index = atom((i, "stride", m), got)
                    strides.append((index, first_atom.setdefault(st.name, index),
                                    int(st.divisibility)))
                if conds:
                    lines.append(f"    if {' or '.join(conds)}: return None")
            lines.append(f"    p{i} = {v}.data_ptr()")
            if a.align > 1:
                lines.append(f"    if p{i} % {int(a.align)}: return None")
            spec.append(("tensor", atom((i, "ptr", 0), f"p{i}"), self._dtypes[a.name],
                         contiguous, len(a.shape), tuple(extents), tuple(strides),
                         max(1, int(a.align))))
        if not seen_device:
            lines.append("    return None")
            device_line = len(lines)
        # The atoms as the parameters (a0, a1, ...) of a generated launcher; constants as is.
        self.atom_names = {k: f"a{x[2:-1]}" if x.startswith("a[") else x
                           for k, x in self.atoms.items()}
        self._checks, self._env, self._device_line = lines, env, device_line
        self._atom_exprs = atoms
        self.atom_count = len(atoms)
        self._size_exprs = [raw[(i, "extent", m)] for i, m in size_sources]
        sizes = []
        for i, m in size_sources:
            key = self.atoms[(i, "extent", m)]
            sizes.append((int(key[2:-1]), 0) if key.startswith("a[") else (-1, int(key)))
        self.native_spec = (tuple(spec), tuple(sizes), len(atoms), self._min_device)

    def native_checker(self):
        """The same checks in C (rose_aot/loader/_native.c), from `native_spec`; None where
        the extension is missing or the spec is beyond it (more than 64 atoms...)."""
        from . import driver

        module = driver.native()
        if module is None:
            return None
        try:
            return module.checker(self.native_spec, self._tensor_types)
        except ValueError:
            return None

    def compile_fast_launch(self, launchers: dict, stream):
        """`fast_launch(values) -> bool`, the whole hot path of a repeated call: the checks
        (`_checks`), then the launcher resolved for (device, *sizes) in `launchers`, called as
        `launcher(stream(device), *atoms)`. Returns False, having launched nothing, when a
        check fails or no launcher is resolved yet (the caller then takes the checked path,
        which resolves one). A CPU tensor (device -1) finds no launcher: `launchers` holds
        only the devices calls were resolved for.

        In C where the extension is built (`_native.fast` over `native_spec`: the same
        checks, and a launcher made by driver.native_launcher runs without a Python call);
        else generated Python, in which no tuple is built but the lookup key."""
        checker = self.native_checker()
        if checker is not None:
            from . import driver

            return partial(driver.native().fast, checker, launchers, stream)
        key = "".join(f", {s}" for s in self._size_exprs)
        atoms = "".join(f", {x}" for x in self._atom_exprs)
        lines = [line.replace("return None", "return False") for line in self._checks]
        if lines[-1] == "    return False":  # no tensor argument: never fast
            body = lines
        else:
            body = [*lines, f"    go = LAUNCHERS.get((dev{key}))",
                    "    if go is None: return False",
                    f"    go(STREAM(dev){atoms})",
                    "    return True"]
        source = "\n".join(["def fast_launch(values):", *body])
        self.fast_launch_source = source
        return self._exec(source, "fast_launch", {"LAUNCHERS": launchers, "STREAM": stream})

    def _exec(self, source: str, name: str, extra: dict):
        env = {**self._env, **extra}
        exec(compile(source, f"<rose_aot {name} {self.owner}>", "exec"), env)
        return env[name]

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
        """`positions`: argument name -> its index in the values passed to `values` (call
        arguments, then workspace); `exprs` gives the same layout as expressions, which the
        handle's generated launchers pack with."""
        fmt = "<"
        offset = 0
        offsets = []
        self._sources: list[tuple[int, str, int, str]] = []  # (value index, kind, mode, dim)
        # (byte offset in the buffer, struct format) of each field, in `_sources` order
        self.layout: list[tuple[int, str]] = []
        for p in params:
            offset = -(-offset // max(8, p.align)) * max(8, p.align)  # each parameter 8-aligned
            offsets.append(offset)
            for f in p.fields:
                pad = offset + f.offset - struct.calcsize(fmt)
                if pad < 0:
                    raise ValueError(f"parameter {p.name}: fields overlap")
                fmt += (f"{pad}x" if pad else "") + f.fmt
                self._sources.append((positions[p.name], f.kind, f.mode, f.dim))
                self.layout.append((offset + f.offset, f.fmt))
            offset += p.size
        self.struct = struct.Struct(fmt)
        self.sizes = [p.size for p in params]
        self.offsets = tuple(offsets)
        self.buffer_size = max(8, -(-offset // 8) * 8)
        self.buffer = ctypes.create_string_buffer(self.buffer_size)
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

    def exprs(self, atoms: dict[tuple[int, str, int], str], workspace_start: int) -> list[str]:
        """The expression of each field, in `struct` order: `atoms` gives each call value's
        (argument, kind, mode) expression; workspace pointers are `ws[j]`."""
        exprs = []
        for i, kind, mode, _dim in self._sources:
            if i >= workspace_start:
                exprs.append(f"ws[{i - workspace_start}]")
            else:
                # Pointer and scalar fields have no mode (-1); extents and strides name theirs.
                exprs.append(atoms[(i, kind, 0 if kind in ("ptr", "scalar") else mode)])
        return exprs

    def native_fields(self, atoms: dict[tuple[int, str, int], str], workspace_start: int) -> tuple:
        """The fields as the C launch path takes them (rose_aot/loader/_native.c): per field
        (offset, format, index of the call atom it carries or -1, the constant otherwise).
        `atoms` is ArgBinder.atom_names (`aK` for atom K, a literal for a record constant).
        Workspace pointers are not call atoms: a plan with workspace takes the Python
        launchers (ValueError here)."""
        fields = []
        for (offset, fmt), expr in zip(self.layout, self.exprs(atoms, workspace_start)):
            if expr.startswith("ws["):
                raise ValueError("a workspace field has no call atom")
            if expr.startswith("a"):
                fields.append((offset, fmt, int(expr[1:]), 0))
            else:
                fields.append((offset, fmt, -1, int(expr)))
        return tuple(fields)

    def compile(self, atoms: dict[tuple[int, str, int], str], workspace_start: int):
        """Generate `pack(a, ws) -> kernelParams address` for `ArgBinder.fast_bind`'s atoms `a`
        (`atoms`: the binder's expression of each (argument, kind, mode)) and the workspace
        pointers `ws` (values from index `workspace_start` on). One struct call, no loop.
        Built only when asked (tests and tools): a handle's launchers inline the same pack."""
        exprs = self.exprs(atoms, workspace_start)
        env = {"pack_into": self.struct.pack_into, "buf": self.buffer, "address": self.address}
        source = (f"def pack(a, ws):\n    pack_into(buf, 0, {''.join(e + ', ' for e in exprs)})\n"
                  f"    return address")
        exec(compile(source, "<rose_aot pack>", "exec"), env)
        return env["pack"]

    def pack(self, values: list) -> int:
        """Writes the parameters; returns the kernelParams address to pass to the driver."""
        self.struct.pack_into(self.buffer, 0, *values)
        return self.address
