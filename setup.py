"""The compiled parts of rose-aot: a kernel handle's hot path (rose_aot/loader/_native.c) and
the bundle reader's per-open loops (rose_aot/bundle/_fastread.c), both in C.

Everything else is in pyproject.toml. Both extensions are optional: where no C compiler is
found the install goes on, and the loader runs its generated Python checks and launchers
(`rose_aot.loader.driver.native()` is None) and the reader its Python loops instead. Building needs no CUDA headers or libraries: the
driver's entry point is looked up at run time. It uses CPython's full C API (vectorcall and
method calls without bound-method objects), so a binary serves one CPython version.
"""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-cast-function-type",
         "-Wno-missing-field-initializers"]

setup(
    ext_modules=[
        Extension("rose_aot.loader._native", ["rose_aot/loader/_native.c"],
                  extra_compile_args=FLAGS, optional=True),
        Extension("rose_aot.bundle._fastread", ["rose_aot/bundle/_fastread.c"],
                  extra_compile_args=FLAGS, optional=True),
    ],
)
