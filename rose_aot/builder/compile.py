"""Compiling one kernel point for one arch with CuTeDSL. Runs in builder worker processes.

The DSL is imported lazily inside the worker so that the parent process (and anything that
imports the builder's planning code) stays light.
"""

from __future__ import annotations

import importlib
import tempfile
import time
from dataclasses import dataclass

from ..archs import Arch, get_arch
from ..kernels import get_family
from ..kernels.spec import Dim, TensorArg, param_size
from .ptx import parse_entries

__all__ = ["CompiledVariant", "compile_point"]


@dataclass
class CompiledVariant:
    name: str
    entries: list[str]  # kernel entry names in launch order
    ptx: str
    cubin: bytes
    param_sizes: list[list[int]]  # per entry, from the PTX
    seconds: float


def _fake_args(args, variant):
    import cutlass.cute as cute

    from ..kernels.device_utils import cutlass_dtype

    syms: dict[str, object] = {}

    def value(v):
        if isinstance(v, Dim):
            if v.name not in syms:
                syms[v.name] = cute.sym_int(v.width, divisibility=v.divisibility)
            return syms[v.name]
        return v

    by_name = {a.name: a for a in args}
    fakes = []
    for name in variant.params:
        a = by_name[name]
        if not isinstance(a, TensorArg):
            raise NotImplementedError(f"scalar kernel arguments are not supported yet ({name})")
        fakes.append(
            cute.runtime.make_fake_tensor(
                cutlass_dtype(a.dtype),
                tuple(value(d) for d in a.shape),
                tuple(value(s) for s in a.stride),
                assumed_align=a.align,
            )
        )
    return fakes


def compile_point(family_name: str, config, arch: Arch | str) -> list[CompiledVariant]:
    """Compile every variant of (family, config) for `arch`; checks the ABI against the PTX.

    Raises whatever the DSL raises; the caller turns it into a BuildError naming the point.
    """
    import cutlass
    import cutlass.cute as cute

    arch = get_arch(arch) if isinstance(arch, str) else arch
    family = get_family(family_name)
    device = importlib.import_module(family.device_module)
    args = family.kernel_args(config)
    results = []
    for variant in family.variants(config, arch):
        start = time.perf_counter()
        fn = device.host_function(config, variant, arch)
        fakes = _fake_args(args, variant)
        with tempfile.TemporaryDirectory(prefix="rose-aot-") as dump:
            compiled = cute.compile(
                fn,
                *fakes,
                cutlass.Int32(1),
                cutlass.Int32(1),
                cutlass.Int32(1),
                cute.runtime.make_fake_stream(),
                options=f"--gpu-arch {arch.name} --keep-ptx --keep-cubin --dump-dir {dump}",
            )
            ptx = compiled.__ptx__
            cubin = bytes(compiled.__cubin__)
        names = list(compiled.kernel_info.keys())
        entries = {e.name: e for e in parse_entries(ptx)}
        missing = [n for n in names if n not in entries]
        if missing or not names:
            raise RuntimeError(f"kernel entries {missing or names} not found in the PTX")
        by_name = {a.name: a for a in args}
        expected = [param_size(by_name[p]) for p in variant.params]
        for n in names:
            got = list(entries[n].param_sizes)
            if got != expected:
                raise RuntimeError(
                    f"parameter ABI mismatch in {n}: the PTX declares sizes {got}, the argument "
                    f"spec packs {expected}; the spec in {family.name} is out of date"
                )
            req = entries[n].reqntid
            if req is not None and tuple(req) != tuple(variant.block):
                raise RuntimeError(
                    f"{n} was compiled for block {req} but the launch plan uses {variant.block}"
                )
        results.append(
            CompiledVariant(
                variant.name,
                names,
                ptx,
                cubin,
                [list(entries[n].param_sizes) for n in names],
                time.perf_counter() - start,
            )
        )
    return results
