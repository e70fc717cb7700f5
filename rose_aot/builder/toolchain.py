"""The compiler toolchain's identity: what goes into cache keys and the bundle header.

Read from package metadata, so it costs no DSL import.
"""

from __future__ import annotations

import importlib.metadata as md

from ..errors import BuildError

__all__ = ["toolchain_versions", "cubin_elf_abi"]

_PACKAGES = (
    "nvidia-cutlass-dsl",
    "nvidia-cutlass-dsl-libs-base",
    "nvidia-cutlass-dsl-libs-core",
    "nvidia-cutlass-dsl-libs-cu12",
    "nvidia-cutlass-dsl-libs-cu13",
)


def toolchain_versions() -> dict:
    """Installed DSL packages and the CUDA flavour they compile with."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    if "nvidia-cutlass-dsl" not in versions:
        raise BuildError(
            "(toolchain)",
            "-",
            "nvidia-cutlass-dsl is not installed; install the builder with "
            "`pip install 'rose-aot[build]'`",
        )
    flavours = [f for f in ("cu12", "cu13") if f"nvidia-cutlass-dsl-libs-{f}" in versions]
    if len(flavours) != 1:
        # With no driver present the DSL silently picks the newest flavour: refuse to guess.
        raise BuildError(
            "(toolchain)",
            "-",
            f"exactly one CUDA flavour of nvidia-cutlass-dsl must be installed, found "
            f"{flavours or 'none'}; uninstall the others (rose-aot builds with cu12)",
        )
    return {"packages": versions, "cuda_flavour": flavours[0]}


def cubin_elf_abi(cubin: bytes) -> int:
    """The ELF header's ABI version byte (7 for CUDA 12 cubins, 8 for CUDA 13)."""
    if len(cubin) < 16 or cubin[:4] != b"\x7fELF":
        raise ValueError("not an ELF cubin")
    return cubin[8]
