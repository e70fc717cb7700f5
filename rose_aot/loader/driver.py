"""The few CUDA driver calls the loader makes, through cuda-python, with checked results.

cuda.bindings is imported on first use, not at import, so importing the loader costs nothing on a
machine without a driver.
"""

from __future__ import annotations

from functools import cache

from ..errors import DeviceError

__all__ = [
    "driver",
    "check",
    "load_library",
    "get_kernel",
    "kernel_function",
    "set_max_dynamic_smem",
    "sm_count",
    "function_param_info",
    "launcher",
    "PreparedLaunch",
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


def load_library(image: bytes, what: str):
    """cuLibraryLoadData of a verified cubin (or PTX, NUL-terminated, for the driver to JIT)."""
    cu = driver()
    return check(cu.cuLibraryLoadData(image, None, None, 0, None, None, 0), f"loading {what}")


def get_kernel(library, name: str):
    cu = driver()
    return check(cu.cuLibraryGetKernel(library, name.encode()), f"cuLibraryGetKernel({name})")


def kernel_function(kernel, name: str):
    """The kernel's function in the current context; loads its module into that context."""
    cu = driver()
    return check(cu.cuKernelGetFunction(kernel), f"cuKernelGetFunction({name})")


def set_max_dynamic_smem(kernel, device: int, nbytes: int, name: str) -> None:
    cu = driver()
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    dev = check(cu.cuDeviceGet(device), "cuDeviceGet")
    check(cu.cuKernelSetAttribute(attr, nbytes, kernel, dev), f"raising {name}'s shared memory")


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

    # The config is passed as an address (c_void_p): no per-call pointer conversion.
    launch = _entry_point("cuLaunchKernelEx", ctypes.c_void_p, ctypes.c_void_p,
                          ctypes.c_void_p, ctypes.c_void_p)
    return LaunchAttribute, LaunchConfig, launch


class PreparedLaunch:
    """One launch of a resolved plan, ready for cuLaunchKernelEx: the function, grid, block,
    shared memory and attributes (programmatic dependent launch, cooperative, cluster) are set
    once in a preallocated CUlaunchConfig. Per call only the stream is written:

        prepared.config.hStream = stream
        code = prepared.call(kernel_params, None)

    (the handle's hot path does exactly this, inline). Not thread-safe on its own: callers hold
    the handle's lock, as for the parameter buffer."""

    __slots__ = ("config", "call", "_attrs", "function", "grid", "block", "smem", "attributes")

    def __init__(self, function: int, grid, block, smem: int, *, pdl: bool = False,
                 cooperative: bool = False, cluster=(1, 1, 1)):
        import ctypes
        from functools import partial

        LaunchAttribute, LaunchConfig, launch = _ex_types()
        attrs = []
        if pdl:
            attrs.append((_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, (1,)))
        if cooperative:
            attrs.append((_ATTR_COOPERATIVE, (1,)))
        if tuple(cluster) != (1, 1, 1):
            attrs.append((_ATTR_CLUSTER_DIMENSION, tuple(cluster)))
        self._attrs = (LaunchAttribute * max(1, len(attrs)))()
        for slot, (ident, values) in zip(self._attrs, attrs):
            slot.id = ident
            for i, v in enumerate(values):
                slot.value[i] = v
        c = self.config = LaunchConfig()
        c.gridDimX, c.gridDimY, c.gridDimZ = grid
        c.blockDimX, c.blockDimY, c.blockDimZ = block
        c.sharedMemBytes = smem
        c.attrs = ctypes.cast(self._attrs, ctypes.POINTER(LaunchAttribute))
        c.numAttrs = len(attrs)
        self.call = partial(launch, ctypes.addressof(c), function)
        self.function, self.grid, self.block, self.smem = function, tuple(grid), tuple(block), smem
        self.attributes = tuple(ident for ident, _ in attrs)

    def bind(self, kernel_params: int):
        """The launch as a call without arguments, for a fixed kernelParams address (a
        ParamPacker's): the generated launchers call it after writing the stream."""
        from functools import partial

        return partial(self.call, kernel_params, None)

    def __call__(self, stream: int, params: int) -> int:
        self.config.hStream = stream
        return self.call(params, None)


def raise_launch_error(code: int, what: str):
    cu = driver()
    raise DeviceError(f"{what} failed: {_error_text(cu, cu.CUresult(code))}")
