"""The kernels of an opened bundle as torch operators: ``torch.ops.rose_aot.<name>``.

torch.compile (fullgraph) and CUDA graphs take them whole: each operator has a schema that
declares which arguments it writes (``Tensor(a!)``), a fake implementation that checks
shapes and dtypes against the point's recorded arguments without touching memory, and a CUDA
implementation that launches the bundle's point on the current stream. The point is the last
argument (``str point``, its key), so one operator serves every point of a family with the
same argument list.

Registered with ``torch.library.Library`` define/impl, the low-overhead route (measured
~0.9 µs over the launch, against ~10 µs for ``torch.library.custom_op``; see
../shared/notes/perf-anchors.md). No cutlass is imported.

    ops = rose_aot.torch_ops.register(bundle)
    rms = bundle.kernel("rms_norm", hidden=4096, eps=1e-6)
    torch.ops.rose_aot.rms_norm(x, w, out, rms.key)       # or: ops.call(rms, x, w, out)
"""

from __future__ import annotations

import threading

from .errors import ArgumentError, KernelNotFoundError
from .kernels.spec import ScalarArg

__all__ = ["NAMESPACE", "register", "op_name", "schema", "call"]

NAMESPACE = "rose_aot"

_lock = threading.Lock()
_library = None
_schemas: dict[str, str] = {}  # op name -> schema registered in this process
_handles: dict[str, object] = {}  # point key -> KernelHandle (the latest registered bundle wins)


def op_name(handle) -> str:
    """The family's name plus its suffix for points with another argument list (rms_norm with
    fused_residual also writes `residual`: ``rms_norm_residual``)."""
    return handle.family.name + handle.family.op_suffix(handle.config)


def schema(handle) -> str:
    """``name(Tensor x, Tensor(a!) out, ..., str point) -> ()``."""
    parts = []
    alias = iter("abcdefghijklmnopqrstuvwxyz")
    for a in handle.bundle.record_args(handle.key):
        if isinstance(a, ScalarArg):
            kind = "float" if a.dtype.startswith("float") else "int"
            parts.append(f"{kind} {a.name}")
        elif a.writes:
            parts.append(f"Tensor({next(alias)}!) {a.name}")
        else:
            parts.append(f"Tensor {a.name}")
    parts.append("str point")
    return f"{op_name(handle)}({', '.join(parts)}) -> ()"


def _cuda_impl(*args):
    *values, point = args
    handle = _handles.get(point)
    if handle is None:
        raise KernelNotFoundError(point, [], "no registered bundle has it; call register(bundle)")
    handle(*values)


def _fake_impl(*args):
    *values, point = args
    handle = _handles.get(point)
    if handle is None:
        raise KernelNotFoundError(point, [], "no registered bundle has it; call register(bundle)")
    handle.check_meta(values)


def register(bundle) -> "Ops":
    """Register every point of `bundle` behind its family's operator. Idempotent; several
    bundles may be registered (a point key present in several resolves to the latest)."""
    import torch

    from .loader import KernelBundle

    if not isinstance(bundle, KernelBundle):
        raise ArgumentError(
            f"register takes an opened bundle (rose_aot.open_bundle(path)), got "
            f"{type(bundle).__name__}"
        )
    global _library
    with _lock:
        if _library is None:
            _library = torch.library.Library(NAMESPACE, "FRAGMENT")
        for key in bundle.points():
            handle = bundle.handle(key)
            name, text = op_name(handle), schema(handle)
            known = _schemas.get(name)
            if known is None:
                _library.define(text)
                _library.impl(name, _cuda_impl, "CUDA")
                torch.library.register_fake(f"{NAMESPACE}::{name}", _fake_impl, lib=_library)
                _schemas[name] = text
            elif known != text:
                raise ArgumentError(
                    f"{key}: its operator {NAMESPACE}::{name} was registered with schema "
                    f"{known!r}, this point needs {text!r}"
                )
            _handles[key] = handle
    return Ops(bundle)


_overloads: dict[str, object] = {}  # op name -> its OpOverload (`.default`)


def call(handle, *args):
    """Launch `handle` through its torch operator (so torch.compile sees one op). Calls the
    operator's one overload directly, without the packet's overload resolution or the
    attribute lookups on torch.ops (eager calls pay them every time)."""
    name = op_name(handle)
    op = _overloads.get(name)
    if op is None:
        import torch

        op = _overloads[name] = getattr(getattr(torch.ops, NAMESPACE), name).default
    return op(*args, handle.key)


class Ops:
    """What `register` returns: `ops.call(handle, *args)`, `ops.names`."""

    def __init__(self, bundle):
        self.bundle = bundle

    @property
    def names(self) -> list[str]:
        return sorted({op_name(self.bundle.handle(k)) for k in self.bundle.points()})

    def call(self, handle, *args):
        return call(handle, *args)
