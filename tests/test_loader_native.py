"""The C hot path (rose_aot/loader/_native.c) against the Python it replaces, on CPU tensors.

- Its checks (`_native.bind`) accept exactly the calls the generated Python checks
  (`ArgBinder.fast_bind`) accept, and read the same device, sizes and atoms: every point of the
  shipped bundle, its own well-formed sample and a set of deformed ones per argument.
- Its launchers (`_native.plan`) lay every parameter buffer out byte for byte as the Python
  packer does, and refuse what does not fit.
The driver half (what reaches cuLaunchKernelEx) is in tests/test_loader_driver_stub.py; the GPU
suite runs the same path on the H200.
"""

from __future__ import annotations

import os
import struct

import pytest
import torch

from rose_aot.kernels.spec import Dim, ScalarArg
from rose_aot.loader import driver, open_bundle
from rose_aot.loader.args import ArgBinder, ParamPacker
from loader_samples import sample_arguments, shipped_samples

native = driver.native()
needs_native = pytest.mark.skipif(native is None, reason="rose_aot.loader._native is not built")


@pytest.fixture(scope="module")
def bundle(shipped_build):
    return open_bundle(shipped_build.path)


def test_ci_builds_the_extension():
    """CI installs with a C compiler: a missing extension there is a build failure, not a
    silent fall back to the Python hot path."""
    if os.environ.get("CI") != "true":
        pytest.skip("checked on CI (CI=true)")
    assert native is not None, "pip install -e . did not build rose_aot.loader._native"


class _Sub(torch.Tensor):
    pass


def _strided(shape, strides, dtype, align, shift=0):
    """A tensor of this layout on fresh storage, `shift` elements past an `align`ed start."""
    size = 1 + sum((n - 1) * abs(st) for n, st in zip(shape, strides))
    storage = torch.zeros(size + 64, dtype=dtype)
    start = (-storage.data_ptr() % align) // storage.element_size()
    return storage.as_strided(shape, strides, start + shift)


def _deformed(args, values):
    """(what, values) pairs: the sample, then one deformation at a time."""
    yield "sample", list(values)
    yield "one argument missing", values[:-1]
    yield "one argument too many", [*values, values[-1]]
    for i, (a, v) in enumerate(zip(args, values)):
        def put(x, i=i):
            out = list(values)
            out[i] = x
            return out

        if isinstance(a, ScalarArg):
            for what, x in (("bool", True), ("float", 0.5), ("int", 1), ("huge", 2**40),
                            ("negative", -1), ("over int64", 2**63), ("str", "1")):
                yield f"{a.name}: {what}", put(x)
            continue
        other = torch.float32 if v.dtype != torch.float32 else torch.bfloat16
        yield f"{a.name}: dtype", put(v.to(other))
        yield f"{a.name}: rank + 1", put(v.unsqueeze(0))
        yield f"{a.name}: a Parameter", put(torch.nn.Parameter(v, requires_grad=False))
        yield f"{a.name}: a subclass", put(v.as_subclass(_Sub))
        yield f"{a.name}: a list", put([1, 2])
        if v.dim() and v.shape[0] > 1:
            yield f"{a.name}: extent 0 - 1", put(v[1:])
        if v.dim() and v.shape[-1] > 1:
            yield f"{a.name}: last extent - 1", put(v[..., :-1])
        if v.dim() >= 2:
            yield f"{a.name}: transposed", put(v.transpose(-1, -2))
        if v.numel():
            shape, strides = tuple(v.shape), v.stride()
            yield f"{a.name}: misaligned", put(_strided(shape, strides, v.dtype, a.align, 1))
            for m in range(v.dim()):
                bumped = list(strides)
                bumped[m] += 1
                yield f"{a.name}: stride {m} + 1", put(_strided(shape, bumped, v.dtype, a.align))
        if isinstance(a.shape[0], Dim) and v.shape[0] == 3:
            # the same dynamic extent given twice with another value (its first use)
            yield f"{a.name}: tokens 1", put(v[:1])


@needs_native
def test_c_checks_accept_exactly_what_the_python_checks_accept(bundle):
    checked = accepted = refused = 0
    for key, arch, record, values in shipped_samples(bundle):
        family = bundle.handle(key).family
        sources = [next((i, m) for i, a in enumerate(record.args)
                        for m, d in enumerate(getattr(a, "shape", ()))
                        if getattr(d, "name", None) == size) for size in family.size_names]
        binder = ArgBinder(key, record.args, sources, allow_cpu=True)
        checker = binder.native_checker()
        assert checker is not None, key
        for what, case in _deformed(record.args, values):
            want = binder.fast_bind(tuple(case))
            got = native.bind(checker, tuple(case))
            assert got == want, (key, arch, what)
            checked += 1
            accepted += want is not None
            refused += want is None
    # both outcomes seen many times, or the comparison proved little
    assert checked > 1000 and accepted > 100 and refused > 800, (checked, accepted, refused)


@needs_native
def test_c_checks_refuse_a_first_tensor_below_the_minimum_device(bundle):
    """fast_bind's device rule (a launch never takes a CPU tensor): bind refuses device -1
    unless the binder allows CPU tensors, as the Python does."""
    key = next(k for k in bundle.points() if k.startswith("qk_norm"))
    record = bundle.record(key, bundle.archs[0])
    values = tuple(sample_arguments(record.args))
    strict = ArgBinder(key, record.args)
    assert strict.fast_bind(values) is None and native.bind(strict.native_checker(), values) is None
    loose = ArgBinder(key, record.args, allow_cpu=True)
    assert native.bind(loose.native_checker(), values) == loose.fast_bind(values) is not None


def _launches(record, binder):
    """Per variant of `record` without workspace: (variant, packer, the launch description)."""
    positions = {a.name: i for i, a in enumerate((*record.args, *record.workspace))}
    for variant in record.variants:
        packer = ParamPacker(positions, variant.params)
        try:
            fields = packer.native_fields(binder.atom_names, len(record.args))
        except ValueError:  # workspace: the Python launchers take it
            continue
        launch = (0x1000, (1, 1, 1), variant.block, 0, (), packer.buffer_size, packer.offsets,
                  fields)
        yield variant, packer, launch


def _never_called(code, index):
    raise AssertionError("a test launcher never reaches the driver")


@needs_native
def test_c_launcher_packs_every_shipped_point_as_the_python_packer(bundle):
    compared = 0
    for key, arch, record, values in shipped_samples(bundle):
        binder = ArgBinder(key, record.args, allow_cpu=True)
        _, _, atoms = binder.fast_bind(tuple(values))
        for variant, packer, launch in _launches(record, binder):
            # address 1: never called; pack() writes what a launch would
            go = native.plan(1, _never_called, binder.atom_count, (launch,))
            native.pack(go, *atoms)
            packer.compile(binder.atoms, len(record.args))(atoms, ())
            want = bytes(packer.buffer)[: packer.buffer_size]
            assert native.buffer(go, 0) == want, (key, arch, variant.name)
            compared += 1
    assert compared > 50


def _plan(fields, natoms=2, size=24, **launch):
    spec = {"function": 0x1000, "grid": (1, 1, 1), "block": (32, 1, 1), "smem": 0,
            "attrs": (), "size": size, "offsets": (0,), **launch}
    return native.plan(1, _never_called, natoms, ((
        spec["function"], spec["grid"], spec["block"], spec["smem"], spec["attrs"],
        spec["size"], spec["offsets"], tuple(fields)),))


@needs_native
def test_c_launcher_writes_each_format_as_struct_does():
    fields = [(0, "Q", 0, 0), (8, "i", 1, 0), (12, "I", -1, 7), (16, "q", -1, -5)]
    go = _plan(fields)
    native.pack(go, 2**64 - 1, -(2**31))
    assert native.buffer(go, 0) == struct.pack("<QiIq", 2**64 - 1, -(2**31), 7, -5)
    go = _plan([(0, "f", 0, 0), (8, "d", 1, 0), (4, "f", -1, 2)], size=16)
    native.pack(go, 1.5, 3)  # an int for a float parameter, as struct takes it
    assert native.buffer(go, 0) == struct.pack("<ffd", 1.5, 2.0, 3.0)
    native.pack(go, float("inf"), -0.0)
    assert native.buffer(go, 0) == struct.pack("<ffd", float("inf"), 2.0, -0.0)


@needs_native
@pytest.mark.parametrize("fmt, value, error", [
    ("i", 2**31, OverflowError), ("i", -(2**31) - 1, OverflowError), ("I", -1, OverflowError),
    ("I", 2**32, OverflowError), ("Q", -1, OverflowError), ("Q", 2**64, OverflowError),
    ("q", 2**63, OverflowError), ("f", 1e300, OverflowError), ("i", True, TypeError),
    ("i", 1.0, TypeError), ("q", "1", TypeError), ("d", None, TypeError),
])
def test_c_launcher_refuses_a_value_its_field_cannot_hold(fmt, value, error):
    """As struct.pack would (the hot path catches OverflowError and takes the checked path,
    which names the argument). Exact ints and floats only: a bool or an int subclass could run
    Python code mid-launch."""
    go = _plan([(0, "Q", 0, 0), (8, fmt, 1, 0)])
    with pytest.raises(error):
        native.pack(go, 0x10, value)


@needs_native
@pytest.mark.parametrize("what, kwargs, fields", [
    ("field past the end", {}, [(20, "q", 0, 0)]),
    ("misaligned field", {}, [(4, "q", 0, 0)]),
    ("unknown format", {}, [(0, "x", 0, 0)]),
    ("atom out of range", {}, [(0, "q", 2, 0)]),
    ("negative atom", {}, [(0, "q", -2, 0)]),
    ("constant that does not fit", {}, [(0, "i", -1, 2**40)]),
    ("grid of two", {"grid": (1, 1)}, []),
    ("block over 32 bits", {"block": (2**32, 1, 1)}, []),
    ("tiny buffer", {"size": 4}, []),
    ("parameter offset past the end", {"offsets": (0, 24)}, []),
    ("nine attributes", {"attrs": tuple((6, (1,)) for _ in range(9))}, []),
])
def test_c_launcher_refuses_a_malformed_description(what, kwargs, fields):
    with pytest.raises((ValueError, TypeError, OverflowError)):
        _plan(fields, **kwargs)


@needs_native
def test_c_launcher_of_no_launch_does_nothing():
    """The plan of an empty batch: address 1 is never called (it would crash)."""
    go = native.plan(1, _never_called, 2, ())
    assert go(0x10, 1, 2) is None


@needs_native
def test_c_launcher_takes_stream_and_atoms_exactly():
    go = _plan([(0, "Q", 0, 0), (8, "q", 1, 0)])
    with pytest.raises(TypeError, match="takes 2 atoms, got 1"):
        go(0, 1)
    with pytest.raises(TypeError, match="stream is an int"):
        go(None, 1, 2)
    with pytest.raises(TypeError, match="takes 2 atoms"):
        native.pack(go, 1)
    with pytest.raises(TypeError, match="not a rose_aot launcher"):
        native.pack(object(), 1, 2)
    with pytest.raises(IndexError):
        native.buffer(go, 1)


@needs_native
def test_c_checker_refuses_a_malformed_spec():
    tensor = (torch.Tensor, torch.nn.Parameter)
    good = (("tensor", 0, torch.float32, (4,), 1, (), (), 16),)
    assert native.checker((good, (), 1, 0), tensor) is not None
    for spec in [
        ((("tensor", 1, torch.float32, (4,), 1, (), (), 16),), (), 1, 0),  # atom >= natoms
        ((("tensor", 0, torch.float32, None, 1, ((0, 1),), ((-1, 1, 1),), 16),), (), 1, 0),
        ((("tensor", 0, torch.float32, None, 9, (), (), 16),), (), 1, 0),  # rank over 8
        ((("tensor", 0, torch.float32, None, 1, ((-1, 4),), ((-1, 1, 0),), 16),), (), 1, 0),
        ((("matrix", 0, torch.float32, None, 1, (), (), 16),), (), 1, 0),
        ((("scalar", 0, (int,), 0, None),), (), 1, 0),  # one bound only
        (good, ((3, 0),), 1, 0),  # a size from an atom that does not exist
        (good, (), 65, 0),  # more atoms than the C side holds
    ]:
        with pytest.raises((ValueError, TypeError)):
            native.checker(spec, tensor)


@needs_native
def test_a_launcher_in_a_cycle_with_its_handle_is_collected():
    """A handle holds its launchers and each launcher its handle's fail method: garbage
    collection must free the pair once the handle is dropped (a long-lived engine opens and
    drops bundles)."""
    import gc
    import weakref

    class Owner:
        def fail(self, code, index):
            raise AssertionError("never launched")

    owner = Owner()  # owner -> go -> owner.fail -> owner
    owner.go = native.plan(1, owner.fail, 1, ((0x1000, (1, 1, 1), (32, 1, 1), 0, (), 24, (0,),
                                               ((0, "Q", 0, 0),)),))
    alive = weakref.ref(owner)
    del owner
    gc.collect()
    assert alive() is None


def test_native_api_is_refused_where_the_extension_is_missing(monkeypatch):
    from rose_aot.errors import ArgumentError

    monkeypatch.setattr(driver, "native", lambda: None)
    monkeypatch.setattr(driver, "_launch_api", {})
    assert driver.launch_api() == {"plain": "bindings", "attributed": "ctypes-ex"}
    for choice in ({"plain": "native"}, {"attributed": "native"}):
        with pytest.raises(ArgumentError, match="needs the C extension"):
            driver.set_launch_api(**choice)
    assert driver._launch_api == {}  # nothing chosen by a refused call
