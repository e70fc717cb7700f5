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
    "cooperative_launcher",
    "ExLauncher",
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
    )


@cache
def launcher():
    """cuLaunchKernel as a plain C call: the entry point is resolved by cuda-python
    (cuGetProcAddress) and called through ctypes.

    cuda.bindings' own Python wrapper converts and checks every argument object on each call
    (several µs); a serving engine launches thousands of kernels a second from the host, so
    the hot path calls the same driver entry point directly with prepared integers.
    Called as launch(function, gx, gy, gz, bx, by, bz, smem, stream, kernel_params, None).
    """
    import ctypes

    return _entry_point("cuLaunchKernel", *_launch_argtypes(), ctypes.c_void_p)  # void** extra


@cache
def cooperative_launcher():
    """cuLaunchCooperativeKernel, as `launcher()` without the `extra` argument; the driver refuses
    (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) a grid whose blocks cannot all be resident."""
    return _entry_point("cuLaunchCooperativeKernel", *_launch_argtypes())


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

    launch = _entry_point("cuLaunchKernelEx", ctypes.POINTER(LaunchConfig), ctypes.c_void_p,
                          ctypes.c_void_p, ctypes.c_void_p)
    return LaunchAttribute, LaunchConfig, launch


class ExLauncher:
    """cuLaunchKernelEx with a fixed set of launch attributes (one per variant record):
    programmatic dependent launch, cooperative, cluster dimensions. The config struct is
    preallocated; a call fills in the grid, block, shared memory and stream and launches.
    Not thread-safe on its own: callers hold the handle's lock, as for the parameter buffer."""

    def __init__(self, *, pdl: bool, cooperative: bool, cluster: tuple[int, int, int]):
        import ctypes

        LaunchAttribute, LaunchConfig, self._launch = _ex_types()
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
        self._config = LaunchConfig()
        self._config.attrs = ctypes.cast(self._attrs, ctypes.POINTER(LaunchAttribute))
        self._config.numAttrs = len(attrs)
        self._pointer = ctypes.pointer(self._config)

    def __call__(self, function, gx, gy, gz, bx, by, bz, smem, stream, params) -> int:
        c = self._config
        c.gridDimX, c.gridDimY, c.gridDimZ = gx, gy, gz
        c.blockDimX, c.blockDimY, c.blockDimZ = bx, by, bz
        c.sharedMemBytes = smem
        c.hStream = stream
        return self._launch(self._pointer, function, params, None)


def raise_launch_error(code: int, what: str):
    cu = driver()
    raise DeviceError(f"{what} failed: {_error_text(cu, cu.CUresult(code))}")
