"""The few CUDA driver calls the loader makes, through cuda-python, with checked results.

cuda.bindings is imported on first use, not at import, so importing the loader costs nothing on a
machine without a driver.
"""

from __future__ import annotations

from functools import cache, partial

from ..errors import DeviceError

__all__ = [
    "driver",
    "check",
    "load_module",
    "make_primary_context_current",
    "module_function",
    "set_max_dynamic_smem",
    "sm_count",
    "function_param_info",
    "launcher",
    "LAUNCH_APIS",
    "launch_api",
    "set_launch_api",
    "stream_object",
    "PreparedLaunch",
    "native",
    "native_launcher",
    "raise_launch_error",
]


@cache
def driver():
    from cuda.bindings import driver as cu

    (err,) = cu.cuInit(0)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise DeviceError(f"cuInit failed: {_error_text(cu, err)}; is an NVIDIA driver installed?")
    return cu


def _error_text(cu, err) -> str:
    name_err, name = cu.cuGetErrorName(err)
    text_err, text = cu.cuGetErrorString(err)
    name = name.decode() if name_err == cu.CUresult.CUDA_SUCCESS else str(err)
    text = text.decode() if text_err == cu.CUresult.CUDA_SUCCESS else ""
    return f"{name} ({text})" if text else name


def check(result, what: str):
    """Unpack a cuda-python result tuple, raising DeviceError on failure."""
    cu = driver()
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise DeviceError(f"{what} failed: {_error_text(cu, err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


# device -> its primary context, retained once per process (the context torch's runtime uses;
# it lives as long as the process, so it is never released here).
_PRIMARY_CONTEXTS: dict[int, object] = {}


def make_primary_context_current(device: int) -> None:
    """Make `device`'s primary context current in the calling thread. A thread that has made
    no CUDA runtime call has no current context, and loading a module there fails with
    CUDA_ERROR_INVALID_CONTEXT (torch's `with torch.cuda.device(d)` sets none when `d` is
    already the thread's device)."""
    cu = driver()
    context = _PRIMARY_CONTEXTS.get(device)
    if context is None:
        dev = check(cu.cuDeviceGet(device), "cuDeviceGet")
        context = check(cu.cuDevicePrimaryCtxRetain(dev), f"retaining cuda:{device}'s context")
        context = _PRIMARY_CONTEXTS.setdefault(device, context)
    check(cu.cuCtxSetCurrent(context), f"making cuda:{device}'s context current")


def load_module(image: bytes, what: str):
    """cuModuleLoadData of a verified cubin (or PTX, NUL-terminated, for the driver to JIT) into
    the current context. A module, not a context-independent library: DeepSeek-V3's 45 cubins
    took 3.88 ms of driver calls as modules and 6.15 ms as libraries (cuLibraryLoadData,
    cuLibraryGetKernel, cuKernelGetFunction) on the H200 (benchmarks/preload_probe.py,
    benchmarks/results/preload-probe-2xh200.log); a second device loads its own module from
    the same verified image."""
    cu = driver()
    return check(cu.cuModuleLoadData(image), f"loading {what}")


def module_function(module, name: str):
    """The entry `name` of a loaded module, a CUfunction of the module's context."""
    cu = driver()
    return check(cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")


def set_max_dynamic_smem(function, nbytes: int, name: str) -> None:
    cu = driver()
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check(cu.cuFuncSetAttribute(function, attr, nbytes), f"raising {name}'s shared memory")


def sm_count(device: int) -> int:
    """Streaming multiprocessors of CUDA device `device` (cuDeviceGetAttribute)."""
    cu = driver()
    dev = check(cu.cuDeviceGet(device), "cuDeviceGet")
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return int(check(cu.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute(SM count)"))


def function_param_info(function, name: str) -> list[tuple[int, int]]:
    """(offset, size) of each parameter as the driver sees it (cuFuncGetParamInfo)."""
    cu = driver()
    # cuFuncGetParamCount is newer than the CUDA 13.0 driver; probe indices until refused.
    info = []
    while True:
        err, offset, size = cu.cuFuncGetParamInfo(function, len(info))
        if err == cu.CUresult.CUDA_ERROR_INVALID_VALUE:
            return info
        check((err, offset, size), f"cuFuncGetParamInfo({name})")
        info.append((offset, size))


def _entry_point(symbol: str, *argtypes):
    import ctypes

    cu = driver()
    pfn, _status = check(
        cu.cuGetProcAddress(
            symbol.encode(), 12000, cu.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
        ),
        f"cuGetProcAddress({symbol})",
    )
    return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(int(pfn))


def _launch_argtypes():
    import ctypes

    return (
        ctypes.c_void_p,  # CUfunction
        *([ctypes.c_uint] * 7),  # grid x, y, z; block x, y, z; dynamic shared memory
        ctypes.c_void_p,  # CUstream
        ctypes.c_void_p,  # void** kernelParams
        ctypes.c_void_p,  # void** extra
    )


@cache
def launcher():
    """cuLaunchKernel as a plain C call (the entry point resolved by cuda-python's
    cuGetProcAddress, called through ctypes): the benchmarks' floor for a Python launch.
    Called as launch(function, gx, gy, gz, bx, by, bz, smem, stream, kernel_params, None)."""
    return _entry_point("cuLaunchKernel", *_launch_argtypes())


# CUlaunchAttributeID values (cuda.h) and the layout of CUlaunchAttribute / CUlaunchConfig.
_ATTR_COOPERATIVE = 2
_ATTR_CLUSTER_DIMENSION = 4
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6

# How a prepared launch reaches the driver:
#   "native"       cuLaunchKernelEx from C (rose_aot/loader/_native.c): a handle's hot path
#                  hands the call's atoms to one C function that packs the parameters and
#                  launches; only where that extension was built (`native()`);
#   "ctypes-ex"    cuLaunchKernelEx through ctypes: a preallocated C CUlaunchConfig (the stream
#                  written into it per call) and the other arguments prebuilt C values;
#   "bindings"     cuLaunchKernel through cuda.bindings' wrapper; launches without attributes
#                  only (it has no place for them);
#   "bindings-ex"  cuLaunchKernelEx through cuda.bindings' wrapper and its CUlaunchConfig.
# Which one a launch takes: `launch_api()`; benchmarks/launch_overhead.py measures them all.
LAUNCH_APIS = ("native", "ctypes-ex", "bindings", "bindings-ex")
# Without the C extension: cuda.bindings' cuLaunchKernel for plain launches (the previous H200
# run: the same prepacked launch 3.92 us through it, 4.21 through ctypes' cuLaunchKernelEx; two
# later hosts put the full calls of the three Python entries within 0.4 us of each other, in a
# different order on each, benchmarks/results/overhead-*.log), ctypes' cuLaunchKernelEx for
# launches with attributes (they need an -ex entry).
_PYTHON_DEFAULT = {"plain": "bindings", "attributed": "ctypes-ex"}
_launch_api: dict = {}  # set_launch_api's choices; the rest defaults (see launch_api)


@cache
def native():
    """The C launch path (rose_aot.loader._native), or None where it was not built (an
    install without a C compiler): launches then take the Python entries."""
    try:
        from . import _native
    except ImportError:
        return None
    return _native


def launch_api() -> dict:
    """{"plain": API of launches without attributes, "attributed": API of launches with
    programmatic dependent launch, cooperative or cluster attributes} (see LAUNCH_APIS).
    By default "native" for both where the C extension is built, else _PYTHON_DEFAULT."""
    default = {"plain": "native", "attributed": "native"} if native() else _PYTHON_DEFAULT
    return {**default, **_launch_api}


def set_launch_api(plain: str | None = None, attributed: str | None = None) -> dict:
    """Choose the API of launches prepared from now on (benchmarks compare them; a handle keeps
    the launches it resolved before). Returns the previous choice."""
    from ..errors import ArgumentError

    before = launch_api()
    for api in (plain, attributed):
        if api is not None and not isinstance(api, str):
            raise ArgumentError(f"a launch API is a string such as 'native' (got {api!r})")
    if plain is not None and plain not in LAUNCH_APIS:
        raise ArgumentError(f"launch API {plain!r} is not one of {', '.join(LAUNCH_APIS)}")
    if attributed is not None and attributed not in ("native", "ctypes-ex", "bindings-ex"):
        raise ArgumentError(
            f"launch API {attributed!r} cannot launch with attributes; use native, ctypes-ex "
            "or bindings-ex"
        )
    if "native" in (plain, attributed) and native() is None:
        raise ArgumentError(
            "launch API 'native' needs the C extension rose_aot.loader._native, which this "
            "install does not have; reinstall rose-aot where a C compiler is found "
            "(`pip install -e .`), or use ctypes-ex / bindings"
        )
    _launch_api.update({k: v for k, v in (("plain", plain), ("attributed", attributed)) if v})
    return before


# Raw stream -> its cuda.bindings CUstream (the "bindings" APIs take the object; making one
# costs more than looking it up). Bounded: an engine uses a handful of streams.
STREAM_OBJECTS: dict[int, object] = {}
_MAX_STREAM_OBJECTS = 256


def stream_object(stream: int):
    """The CUstream of a raw stream, cached in STREAM_OBJECTS."""
    cu = driver()
    if len(STREAM_OBJECTS) >= _MAX_STREAM_OBJECTS:
        STREAM_OBJECTS.clear()
    obj = STREAM_OBJECTS[stream] = cu.CUstream(stream)
    return obj


@cache
def _ex_types():
    import ctypes

    class LaunchAttribute(ctypes.Structure):
        # { CUlaunchAttributeID id; char pad[4]; CUlaunchAttributeValue value (64-byte union) }
        _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                    ("value", ctypes.c_uint * 16)]

    class LaunchConfig(ctypes.Structure):
        _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                    ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                    ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                    ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                    ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]

    # Declared without argument types and called with prebuilt c_void_p values (and None for
    # NULL): ctypes passes those as they are, with no per-call conversion of Python ints.
    launch = _entry_point("cuLaunchKernelEx")
    return LaunchAttribute, LaunchConfig, launch


class PreparedLaunch:
    """One launch of a resolved plan: the function, grid, block, shared memory and attributes
    (programmatic dependent launch, cooperative, cluster) set up once for its API (`api`, one
    of LAUNCH_APIS; by default `launch_api()`'s choice for a launch with or without
    attributes). Per call only the stream and the kernelParams address are given:

        code = prepared(stream, kernel_params)       # 0 or a CUresult code

    The handle's generated launchers inline the same call for a fixed kernelParams address
    (`bind`): per API

        "native", "ctypes-ex":   config.hStream = stream; code = call()
        "bindings":    code = call(stream_object, kernel_params, 0)[0]
        "bindings-ex": config.hStream = stream_object; code = call()[0]

    A "native" launch is called like a "ctypes-ex" one here (the checked path); the hot path
    takes it through the C launcher instead (`native_launch`, `native_launcher`).

    Not thread-safe on its own: callers hold the handle's lock, as for the parameter buffer."""

    __slots__ = ("api", "config", "_attrs", "_attr_values", "_launch", "function", "grid",
                 "block", "smem", "attributes")

    def __init__(self, function: int, grid, block, smem: int, *, pdl: bool = False,
                 cooperative: bool = False, cluster=(1, 1, 1), api: str | None = None):
        attrs = []
        if pdl:
            attrs.append((_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, (1,)))
        if cooperative:
            attrs.append((_ATTR_COOPERATIVE, (1,)))
        if tuple(cluster) != (1, 1, 1):
            attrs.append((_ATTR_CLUSTER_DIMENSION, tuple(cluster)))
        if api is None:
            api = launch_api()["attributed" if attrs else "plain"]
        if api not in LAUNCH_APIS or (api == "bindings" and attrs):
            from ..errors import ArgumentError

            raise ArgumentError(
                f"launch API {api!r} cannot make this launch (attributes {[a for a, _ in attrs]}); "
                f"the APIs are {', '.join(LAUNCH_APIS)}, and only the -ex ones take attributes"
            )
        self.api = api
        self.function, self.grid, self.block, self.smem = function, tuple(grid), tuple(block), smem
        self.attributes = tuple(ident for ident, _ in attrs)
        self._attr_values = tuple((ident, tuple(values)) for ident, values in attrs)
        if api in ("native", "ctypes-ex"):
            # "native": the C path takes the hot path's launches (native_launcher); a call
            # through this object (the checked path) goes through ctypes.
            self._prepare_ctypes(attrs)
        elif api == "bindings-ex":
            self._prepare_bindings_ex(attrs)
        else:
            cu = driver()
            self.config, self._attrs = None, None
            self._launch = partial(cu.cuLaunchKernel, cu.CUfunction(function), *self.grid,
                                   *self.block, smem)

    def _prepare_ctypes(self, attrs) -> None:
        import ctypes

        LaunchAttribute, LaunchConfig, launch = _ex_types()
        self._attrs = (LaunchAttribute * max(1, len(attrs)))()
        for slot, (ident, values) in zip(self._attrs, attrs):
            slot.id = ident
            for i, v in enumerate(values):
                slot.value[i] = v
        c = self.config = LaunchConfig()
        c.gridDimX, c.gridDimY, c.gridDimZ = self.grid
        c.blockDimX, c.blockDimY, c.blockDimZ = self.block
        c.sharedMemBytes = self.smem
        c.attrs = ctypes.cast(self._attrs, ctypes.POINTER(LaunchAttribute))
        c.numAttrs = len(attrs)
        self._launch = partial(launch, ctypes.c_void_p(ctypes.addressof(c)),
                               ctypes.c_void_p(self.function))

    def _prepare_bindings_ex(self, attrs) -> None:
        cu = driver()
        c = self.config = cu.CUlaunchConfig()
        c.gridDimX, c.gridDimY, c.gridDimZ = self.grid
        c.blockDimX, c.blockDimY, c.blockDimZ = self.block
        c.sharedMemBytes = self.smem
        self._attrs = []
        for ident, values in attrs:
            a = cu.CUlaunchAttribute()
            a.id = cu.CUlaunchAttributeID(ident)
            if ident == _ATTR_PROGRAMMATIC_STREAM_SERIALIZATION:
                a.value.programmaticStreamSerializationAllowed = values[0]
            elif ident == _ATTR_COOPERATIVE:
                a.value.cooperative = values[0]
            else:
                a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = values
            self._attrs.append(a)
        c.attrs = self._attrs
        c.numAttrs = len(self._attrs)
        self._launch = partial(cu.cuLaunchKernelEx, c, cu.CUfunction(self.function))

    def bind(self, kernel_params: int):
        """The driver call for a fixed kernelParams address (a ParamPacker's), as the generated
        launchers make it (see the class doc): "ctypes-ex" and "bindings-ex" take no argument,
        "bindings" takes (stream object, kernel_params, 0) (prebinding the trailing arguments
        would cost a call)."""
        import ctypes

        if self.api in ("native", "ctypes-ex"):
            return partial(self._launch, ctypes.c_void_p(kernel_params), None)
        if self.api == "bindings-ex":
            return partial(self._launch, kernel_params, 0)
        return self._launch

    def __call__(self, stream: int, kernel_params: int) -> int:
        import ctypes

        if self.api in ("native", "ctypes-ex"):
            self.config.hStream = stream
            return self._launch(ctypes.c_void_p(kernel_params), None)
        obj = STREAM_OBJECTS.get(stream)
        if obj is None:
            obj = stream_object(stream)
        if self.api == "bindings-ex":
            self.config.hStream = obj
            return int(self._launch(kernel_params, 0)[0])
        return int(self._launch(obj, kernel_params, 0)[0])


    def native_launch(self, buffer_size: int, param_offsets: tuple, fields: tuple) -> tuple:
        """This launch as rose_aot.loader._native.plan takes it, with the parameter layout of
        its buffer (ParamPacker.buffer_size / offsets / native_fields)."""
        return (self.function, self.grid, self.block, self.smem, self._attr_values, buffer_size,
                param_offsets, fields)


def native_launcher(launches: tuple, atoms: int, fail):
    """`go(stream, *atoms)` for the C launch path (a _native Launcher): `launches` as
    PreparedLaunch.native_launch gives them, `atoms` the count of call atoms, `fail(code,
    index)` raises for a failed launch. The launcher owns its parameter buffers (constants
    written once); a call packs the atoms and launches with the GIL held throughout, so it
    needs no lock."""
    import ctypes

    address = ctypes.cast(_ex_types()[2], ctypes.c_void_p).value
    return native().plan(address, fail, atoms, tuple(launches))


def raise_launch_error(code: int, what: str):
    cu = driver()
    raise DeviceError(f"{what} failed: {_error_text(cu, cu.CUresult(code))}")
