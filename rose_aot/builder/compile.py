"""Compiling one kernel point for one arch with CuTeDSL, and building its record. Runs in builder
worker processes.

The DSL is imported lazily inside the worker so that the parent process (and anything that
imports the builder's planning code) stays light. The record is checked against the PTX and the
cubin here, once; everything downstream uses it as is.
"""

from __future__ import annotations

import hashlib
import importlib
import tempfile
import time
from dataclasses import dataclass

from ..archs import Arch, get_arch
from ..bundle.cubin import read_cubin
from ..kernels import get_family
from ..kernels.record import PointRecord, VariantRecord
from ..kernels.spec import Dim, ScalarArg
from .ptx import parse_entries

__all__ = ["CompiledPoint", "compile_point", "check_variant"]


@dataclass
class CompiledPoint:
    record: PointRecord
    artifacts: dict[str, tuple[str, bytes]]  # variant -> (ptx, cubin)
    seconds: dict[str, float]  # variant -> compile seconds


def _fake_args(args, variant):
    import cutlass
    import cutlass.cute as cute

    from ..kernels.device_utils import cutlass_dtype

    syms: dict[str, object] = {}

    def value(v):
        if isinstance(v, Dim):
            if v.name not in syms:
                syms[v.name] = cute.sym_int(v.width, divisibility=v.divisibility)
            return syms[v.name]
        return v

    scalars = {"int32": cutlass.Int32, "uint32": cutlass.Uint32, "int64": cutlass.Int64,
               "float32": cutlass.Float32, "float64": cutlass.Float64}
    by_name = {a.name: a for a in args}
    fakes = []
    for name in variant.params:
        a = by_name[name]
        if isinstance(a, ScalarArg):
            fakes.append(scalars[a.dtype](0))
            continue
        fakes.append(
            cute.runtime.make_fake_tensor(
                cutlass_dtype(a.dtype),
                tuple(value(d) for d in a.shape),
                tuple(value(s) for s in a.stride),
                assumed_align=a.align,
            )
        )
    return fakes


# Per SM on sm_90a and sm_100a: what bounds how many blocks can be resident at once.
REGISTERS_PER_SM = 65536
REGISTER_UNIT = 256  # registers are given to a warp in units of this many
THREADS_PER_SM = 2048
SMEM_PER_SM = 228 * 1024


def resident_blocks(threads: int, registers: int, smem: int) -> int:
    """Blocks of `threads` threads using `registers` per thread and `smem` bytes of shared
    memory that fit on one SM at once (the occupancy calculator's rules for these archs)."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    fits = [THREADS_PER_SM // (warps * 32), REGISTERS_PER_SM // max(1, warps * per_warp)]
    if smem:
        fits.append(SMEM_PER_SM // smem)
    return min(fits)


def check_variant(record: VariantRecord, ptx: str, cubin: bytes, arch: Arch) -> None:
    """Raise RuntimeError unless the record agrees with what the compiler produced: entry
    names, block size (.reqntid/.maxntid), parameter count, order, sizes and alignments,
    shared memory (dynamic use declared iff the record passes some; static + dynamic within
    the arch's limit), and for a cooperative variant whose plan launches `blocks_per_sm`
    blocks per SM (a constant), that so many fit (else the launch would fail at serving)."""
    entries = {e.name: e for e in parse_entries(ptx)}
    if not record.entries:
        raise RuntimeError("the compiled function has no kernel entry")
    sizes = [p.size for p in record.params]
    aligns = [p.align for p in record.params]
    for name in record.entries:
        e = entries.get(name)
        if e is None:
            raise RuntimeError(f"kernel entry {name} is not in the PTX")
        if list(e.param_sizes) != sizes or list(e.param_aligns) != aligns:
            raise RuntimeError(
                f"parameter ABI mismatch in {name}: the PTX declares sizes {list(e.param_sizes)} "
                f"aligned {list(e.param_aligns)}, the record packs {sizes} aligned {aligns}; the "
                f"argument spec of the family is out of date"
            )
        for what, dims in (("reqntid", e.reqntid), ("maxntid", e.maxntid)):
            if dims is not None and tuple(dims) != record.block:
                raise RuntimeError(
                    f"{name} was compiled for .{what} {dims} but its variant launches {record.block}"
                )
        if e.dynamic_smem != (record.smem > 0):
            raise RuntimeError(
                f"{name} {'uses' if e.dynamic_smem else 'does not use'} dynamic shared memory but "
                f"its variant passes {record.smem} bytes"
            )
    try:
        record.check_cubin(cubin)
    except ValueError as exc:
        raise RuntimeError(f"the cubin does not match its record: {exc}") from None
    per_sm = record.constants.get("blocks_per_sm") if record.cooperative else None
    for name, facts in read_cubin(cubin).items():
        if facts.static_smem + record.smem > arch.max_smem_per_block:
            raise RuntimeError(
                f"{name} needs {facts.static_smem} + {record.smem} bytes of shared memory; "
                f"{arch.name} allows {arch.max_smem_per_block}"
            )
        if per_sm is not None and name in record.entries:
            registers = 255 if facts.registers is None else facts.registers  # unknown: the most
            fit = resident_blocks(record.threads, registers, facts.static_smem + record.smem)
            if fit < per_sm:
                raise RuntimeError(
                    f"{name} uses {facts.registers} registers per thread: {fit} block(s) of "
                    f"{record.threads} threads fit an SM, but its cooperative plan launches "
                    f"{per_sm} per SM; lower blocks_per_sm or the kernel's register use"
                )


def compile_point(family_name: str, config, arch: Arch | str) -> CompiledPoint:
    """Compile every variant of (family, config) for `arch` and build the checked record.

    Raises whatever the DSL raises; the caller turns it into a BuildError naming the point.
    """
    import cutlass
    import cutlass.cute as cute

    arch = get_arch(arch) if isinstance(arch, str) else arch
    family = get_family(family_name)
    device = importlib.import_module(family.device_module)
    call_args = family.args(config, arch)
    workspace = family.workspace(config, arch)
    args = {a.name: a for a in (*call_args, *workspace)}
    records, artifacts, seconds = [], {}, {}
    for variant in family.variants(config, arch):
        start = time.perf_counter()
        fn = device.host_function(config, variant, arch)
        fakes = _fake_args(args.values(), variant)
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
        facts = read_cubin(cubin)
        resources = {
            n: {
                "registers": facts[n].registers,
                "static_smem": facts[n].static_smem,
                "param_bytes": facts[n].param_bytes,
            }
            for n in names
            if n in facts
        }
        record = VariantRecord.build(
            variant,
            args,
            names,
            resources,
            hashlib.sha256(cubin).hexdigest(),
            hashlib.sha256(ptx.encode()).hexdigest(),
        )
        check_variant(record, ptx, cubin, arch)
        records.append(record)
        artifacts[variant.name] = (ptx, cubin)
        seconds[variant.name] = time.perf_counter() - start
    point = PointRecord(tuple(call_args), tuple(workspace), tuple(records))
    # The plan must run on the record it will get at launch, for every branch of the plan.
    for sizes in family.sample_sizes(config):
        for launch in family.plan(config, point.by_name, sizes, arch.sm_count):
            if launch.variant not in point.by_name:
                raise RuntimeError(f"the plan launches unknown variant {launch.variant!r}")
    return CompiledPoint(point, artifacts, seconds)
