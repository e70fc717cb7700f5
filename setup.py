"""The one compiled part of rose-aot: a kernel handle's hot path in C (rose_aot/loader/_native.c).

Everything else is in pyproject.toml. The extension is optional: where no C compiler is found
the install goes on, and the loader runs its generated Python checks and launchers instead
(`rose_aot.loader.driver.native()` is None). Building needs no CUDA headers or libraries: the
driver's entry point is looked up at run time. It uses CPython's full C API (vectorcall and
method calls without bound-method objects), so a binary serves one CPython version.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rose_aot.loader._native",
            ["rose_aot/loader/_native.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-cast-function-type", "-Wno-missing-field-initializers"],
            optional=True,
        )
    ],
)
