"""The loader's driver calls, through the real bindings (ctypes and cuda.bindings), into a stub
libcuda compiled here: what each launch API hands the driver (function, grid, block, shared
memory, stream, kernelParams, launch attributes) and the parameter bytes it points to, for a
handle's hot path and for the checked path, plus a failed launch. No GPU: the stub records
each call and returns the code the test sets. Skipped where no C compiler is found."""

from __future__ import annotations

import json
import os
import struct
import shutil
import subprocess
import sys
import textwrap

import pytest

STUB_C = r"""
#include <stdint.h>
#include <string.h>
typedef int CUresult;
typedef struct { unsigned id; char pad[4]; unsigned value[16]; } Attr;
typedef struct {
  unsigned grid[3], block[3], smem; void* stream; Attr* attrs; unsigned num_attrs;
} Config;
typedef struct {
  long long calls; int which; void* f; unsigned grid[3], block[3], smem; void* stream;
  void** params; void** extra; unsigned num_attrs; Attr attrs[4]; unsigned char bytes[64];
} Last;
static Last last;
static CUresult next_code;
void* stub_last(void) { return &last; }
void stub_set_code(int code) { next_code = code; }
CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int* v) { *v = 13000; return 0; }
static void record_params(void** p) { if (p) memcpy(last.bytes, p[0], 64); }
CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned smem, void* s, void** p, void** e) {
  last.calls++; last.which = 1; last.f = f; last.grid[0] = gx; last.grid[1] = gy;
  last.grid[2] = gz; last.block[0] = bx; last.block[1] = by; last.block[2] = bz;
  last.smem = smem; last.stream = s; last.params = p; last.extra = e; last.num_attrs = 0;
  record_params(p); return next_code;
}
CUresult cuLaunchKernelEx(const Config* c, void* f, void** p, void** e) {
  last.calls++; last.which = 2; last.f = f; memcpy(last.grid, c->grid, sizeof c->grid);
  memcpy(last.block, c->block, sizeof c->block); last.smem = c->smem; last.stream = c->stream;
  last.params = p; last.extra = e; last.num_attrs = c->num_attrs;
  for (unsigned i = 0; i < c->num_attrs && i < 4; i++) last.attrs[i] = c->attrs[i];
  record_params(p); return next_code;
}
CUresult cuGetErrorName(CUresult e, const char** s) { *s = "CUDA_ERROR_STUB"; return 0; }
CUresult cuGetErrorString(CUresult e, const char** s) { *s = "stub says no"; return 0; }
CUresult cuGetProcAddress_v2(const char* sym, void** pfn, int ver, uint64_t flags, int* st);
static void* lookup(const char* n) {
  if (!strcmp(n, "cuGetProcAddress")) return (void*)cuGetProcAddress_v2;
  if (!strcmp(n, "cuInit")) return (void*)cuInit;
  if (!strcmp(n, "cuDriverGetVersion")) return (void*)cuDriverGetVersion;
  if (!strcmp(n, "cuLaunchKernel")) return (void*)cuLaunchKernel;
  if (!strcmp(n, "cuLaunchKernelEx")) return (void*)cuLaunchKernelEx;
  if (!strcmp(n, "cuGetErrorName")) return (void*)cuGetErrorName;
  if (!strcmp(n, "cuGetErrorString")) return (void*)cuGetErrorString;
  return 0;
}
CUresult cuGetProcAddress_v2(const char* sym, void** pfn, int ver, uint64_t flags, int* st) {
  *pfn = lookup(sym); if (st) *st = *pfn ? 0 : 1; return *pfn ? 0 : 500;
}
"""

PROBE = textwrap.dedent(
    r"""
    import ctypes, json, sys
    import torch
    from rose_aot.errors import DeviceError
    from rose_aot.loader import args as args_module, driver, open_bundle, runtime

    class Attr(ctypes.Structure):
        _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4),
                    ("value", ctypes.c_uint * 16)]

    class Last(ctypes.Structure):
        _fields_ = [("calls", ctypes.c_longlong), ("which", ctypes.c_int),
                    ("f", ctypes.c_void_p), ("grid", ctypes.c_uint * 3),
                    ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                    ("stream", ctypes.c_void_p), ("params", ctypes.c_void_p),
                    ("extra", ctypes.c_void_p), ("num_attrs", ctypes.c_uint),
                    ("attrs", Attr * 4), ("bytes", ctypes.c_ubyte * 64)]

    stub = ctypes.CDLL("libcuda.so.1")  # the library cuda.bindings loads: one copy, one state
    stub.stub_last.restype = ctypes.c_void_p
    last = Last.from_address(stub.stub_last())

    def seen():
        return {"calls": last.calls, "entry": {1: "cuLaunchKernel", 2: "cuLaunchKernelEx"}[last.which],
                "function": last.f, "grid": list(last.grid), "block": list(last.block),
                "smem": last.smem, "stream": last.stream or 0, "params": last.params,
                "extra": last.extra, "attrs": [[a.id, *a.value[:3]] for a in last.attrs[:last.num_attrs]],
                "bytes": bytes(last.bytes).hex()}

    out = {"prepared": [], "handle": {}}
    driver.driver()
    buffer = (ctypes.c_ubyte * 64)(*range(64))
    params = (ctypes.c_void_p * 1)(ctypes.addressof(buffer))
    cases = [("ctypes-ex", {}), ("bindings", {}), ("bindings-ex", {}),
             ("ctypes-ex", {"pdl": True}), ("bindings-ex", {"pdl": True}),
             ("ctypes-ex", {"cooperative": True, "cluster": (2, 1, 1)}),
             ("bindings-ex", {"cooperative": True, "cluster": (2, 1, 1)})]
    if driver.native() is not None:  # its checked path: the same call as ctypes-ex
        cases += [("native", {}), ("native", {"pdl": True}),
                  ("native", {"cooperative": True, "cluster": (2, 1, 1)})]
    for api, attrs in cases:
        prepared = driver.PreparedLaunch(0xF00D000, (3, 2, 1), (128, 1, 1), 4096, api=api, **attrs)
        code = prepared(0x5150, ctypes.addressof(params))
        out["prepared"].append({**seen(), "api": api, "asked": sorted(attrs), "code": code})

    # A handle's hot path on CPU tensors (device -1), the real PreparedLaunch of each API.
    class CpuBinder(args_module.ArgBinder):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs, allow_cpu=True)

    runtime.ArgBinder = CpuBinder
    runtime._stream_getter = lambda: (lambda device: 0x7777)
    bundle = open_bundle(sys.argv[1])
    bundle._device_arch[-1] = "sm_90a"
    bundle.check_records("sm_90a")  # as arch_for_device does
    bundle._sm_counts[-1] = 132
    for (key, arch), record in bundle._records.items():
        for v in record.variants:
            bundle._device_kernels[(-1, key, arch, v.name)] = [0xC0DE000 + 64 * i for i in range(len(v.entries))]
    gen = torch.Generator().manual_seed(0)
    # 200 tokens: a qk_norm launch without programmatic dependent launch (the prefill block past
    # 65536 threads), so the call takes the plain api under test
    tokens = 200
    args = (torch.randn(tokens, 32, 128, generator=gen).to(torch.bfloat16),
            torch.randn(tokens, 4, 128, generator=gen).to(torch.bfloat16),
            torch.randn(128, generator=gen).to(torch.bfloat16),
            torch.randn(128, generator=gen).to(torch.bfloat16))
    for api in driver.LAUNCH_APIS:
        if api == "native" and driver.native() is None:
            continue
        driver.set_launch_api(plain=api)
        handle = bundle.kernel("qk_norm", num_q_heads=32, num_k_heads=4, head_dim=128, eps=1e-6)
        handle._state(-1)
        ((packer, name, prepared),) = handle._resolve(-1, (tokens,), None)
        before = last.calls
        handle(*args)
        got = {**seen(), "launches": last.calls - before, "api": prepared.api,
               "want_function": bundle._device_kernels[(-1, handle.key, "sm_90a", name)][0],
               "want_grid": list(prepared.grid), "want_block": list(prepared.block),
               "want_params": packer.address}
        binder = handle._state(-1)[1]
        dims, _, _ = binder.bind(args, meta=True)
        packer.pack(packer.values([t.data_ptr() for t in args], dims))  # the checked path's
        got["want_bytes"] = ctypes.string_at(packer.buffer, 64).hex()
        # a failed launch: DeviceError naming the point and the driver's error; lock released
        stub.stub_set_code(700)
        try:
            handle(*args)
            got["error"] = None
        except DeviceError as exc:
            got["error"] = str(exc)
        stub.stub_set_code(0)
        got["locked_after_error"] = handle._lock.locked()
        handle(*args)
        got["launches_after_error"] = last.calls - before
        # no tokens: the plan has no launch, its launcher (resolved as a first call would)
        # launches nothing
        empty = (args[0][:0], args[1][:0], args[2], args[3])
        assert handle._resolve(-1, (0,), None) == ()
        before = last.calls
        assert handle._fast_launch(empty) is True
        handle(*empty)
        got["launches_without_tokens"] = last.calls - before
        # a value its field cannot hold (a 2**40 stride in an int32 field... none here: the
        # checks bound every extent) is refused by the C packer before any driver call
        out["handle"][api] = got

    # The C launcher alone: two launches with attributes, each atom's bytes, a failure naming
    # the launch, a value that does not fit launching nothing.
    out["native"] = None
    native = driver.native()
    if native is not None:
        failures = []

        def fail(code, index):
            failures.append((code, index))
            raise DeviceError(f"launch {index}: {code}")

        launches = []
        for j, attrs in enumerate((((6, (1,)),), ((2, (1,)), (4, (2, 1, 1))))):
            launches.append((0xAB000 + j, (5 + j, 1, 1), (64, 2, 1), 256 * j, attrs, 24, (0, 8),
                             ((0, "Q", 0, 0), (8, "i", 1, 0), (12, "i", -1, 99), (16, "q", 2, 0))))
        go = native.plan(ctypes.cast(driver._ex_types()[2], ctypes.c_void_p).value, fail, 3,
                         tuple(launches))
        before = last.calls
        go(0x4242, 0xDEAD0, -7, 2**40)
        result = {"two": {**seen(), "launches": last.calls - before}}
        stub.stub_set_code(999)
        try:
            go(0x4242, 0xDEAD0, -7, 2**40)
        except DeviceError as exc:
            result["error"] = str(exc)
        stub.stub_set_code(0)
        result["failures"] = failures
        before = last.calls
        try:
            go(0x4242, 0xDEAD0, 2**31, 5)
        except OverflowError:
            result["overflow_launches"] = last.calls - before
        out["native"] = result
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def stub_libcuda(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the stub libcuda")
    directory = tmp_path_factory.mktemp("stub-libcuda")
    (directory / "stub.c").write_text(STUB_C)
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(directory / "libcuda.so.1"),
                    str(directory / "stub.c")], check=True, capture_output=True)
    return directory


@pytest.fixture(scope="module")
def probe(stub_libcuda, shipped_build):
    env = {**os.environ, "LD_LIBRARY_PATH": f"{stub_libcuda}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    done = subprocess.run([sys.executable, "-c", PROBE, str(shipped_build.path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_each_api_hands_the_driver_the_prepared_launch(probe):
    params_bytes = bytes(range(64)).hex()
    for case in probe["prepared"]:
        what = (case["api"], case["asked"])
        assert case["code"] == 0, what
        assert case["entry"] == ("cuLaunchKernel" if case["api"] == "bindings"
                                 else "cuLaunchKernelEx"), what
        assert case["function"] == 0xF00D000 and case["stream"] == 0x5150, what
        assert (case["grid"], case["block"], case["smem"]) == ([3, 2, 1], [128, 1, 1], 4096), what
        assert case["bytes"] == params_bytes and case["extra"] is None, what
        want = []
        if "pdl" in case["asked"]:
            want.append([6, 1, 0, 0])  # programmatic stream serialization allowed
        if "cooperative" in case["asked"]:
            want += [[2, 1, 0, 0], [4, 2, 1, 1]]  # cooperative; cluster dimension (2, 1, 1)
        assert case["attrs"] == want, what


APIS = ["native", "ctypes-ex", "bindings", "bindings-ex"]


def _handle(probe, api):
    if api not in probe["handle"]:
        pytest.skip("rose_aot.loader._native is not built")
    return probe["handle"][api]


@pytest.mark.parametrize("api", APIS)
def test_handle_hot_path_launches_through_each_api(probe, api):
    got = _handle(probe, api)
    assert got["api"] == api and got["launches"] == 1
    assert got["entry"] == ("cuLaunchKernel" if api == "bindings" else "cuLaunchKernelEx")
    assert got["function"] == got["want_function"] and got["stream"] == 0x7777
    assert got["grid"] == got["want_grid"] and got["block"] == got["want_block"]
    assert got["attrs"] == []
    if api != "native":  # the C launcher packs into buffers of its own
        assert got["params"] == got["want_params"]
    assert got["bytes"] == got["want_bytes"]  # what the checked path packs


@pytest.mark.parametrize("api", APIS)
def test_failed_launch_raises_and_releases_the_lock(probe, api):
    got = _handle(probe, api)
    assert got["error"] is not None and "CUDA_ERROR_STUB (stub says no)" in got["error"]
    assert "launching qk_norm(" in got["error"]
    assert got["locked_after_error"] is False and got["launches_after_error"] == 3


@pytest.mark.parametrize("api", APIS)
def test_a_call_without_tokens_launches_nothing(probe, api):
    assert _handle(probe, api)["launches_without_tokens"] == 0


def test_c_launcher_hands_the_driver_each_launch(probe):
    got = probe["native"]
    if got is None:
        pytest.skip("rose_aot.loader._native is not built")
    two = got["two"]
    assert two["launches"] == 2 and two["entry"] == "cuLaunchKernelEx"
    # the stub keeps the last call: launch 1, with its own function, grid, smem and attributes
    assert two["function"] == 0xAB001 and two["grid"] == [6, 1, 1] and two["block"] == [64, 2, 1]
    assert two["smem"] == 256 and two["stream"] == 0x4242 and two["extra"] is None
    assert two["attrs"] == [[2, 1, 0, 0], [4, 2, 1, 1]]
    want = struct.pack("<QiiQ", 0xDEAD0, -7, 99, 2**40)
    assert bytes.fromhex(two["bytes"])[:24] == want
    # a failed launch: fail(code, index) raises, nothing after it runs
    assert got["failures"] == [[999, 0]] and got["error"] == "launch 0: 999"
    # 2**31 does not fit the int32 field: OverflowError before the first driver call
    assert got["overflow_launches"] == 0
