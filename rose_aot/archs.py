"""Target GPU architectures a bundle can be built for.

Everything device-specific that shapes generated code or a launch (compute capability, SM count)
comes from this table, never from the machine that builds: CI has no GPU, and the GPU that serves
may differ from any GPU the builder could see.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

__all__ = ["Arch", "ARCHS", "DEFAULT_ARCHS", "get_arch", "arch_for_capability"]


@dataclass(frozen=True)
class Arch:
    name: str  # the --gpu-arch value the DSL takes, e.g. "sm_90a"
    capability: tuple[int, int]  # the device compute capability its cubin runs on
    sm_count: int  # SMs of the product the launch shapes are tuned for
    max_smem_per_block: int  # bytes of dynamic shared memory one block may opt in to
    # Widest global load/store per thread: 128-bit on Hopper, 256-bit on Blackwell (the seed's
    # Blackwell port widens the vector). Families use it where a row allows.
    max_access_bytes: int = 16


# sm_90a: H100/H200 SXM (132 SMs). sm_100a: B200 (148 SMs). The SM count shapes launches only
# where the builder needs one (checks, tests); the loader reads the real device's count.
ARCHS: dict[str, Arch] = {
    "sm_90a": Arch("sm_90a", (9, 0), 132, 227 * 1024),
    "sm_100a": Arch("sm_100a", (10, 0), 148, 227 * 1024, max_access_bytes=32),
}

DEFAULT_ARCHS: tuple[str, ...] = ("sm_90a",)


def get_arch(name: str) -> Arch:
    try:
        return ARCHS[name]
    except KeyError:
        raise ConfigError(
            "target", "arch", f"unknown arch {name!r}; supported: {', '.join(sorted(ARCHS))}"
        ) from None


def arch_for_capability(capability: tuple[int, int], available: list[str]) -> str | None:
    """The arch among `available` whose cubins run on a device of this compute capability."""
    for name in available:
        arch = ARCHS.get(name)
        if arch is not None and arch.capability == tuple(capability):
            return name
    return None
