"""Coverage check: does a bundle hold every point a deployment needs, for every arch it serves,
built by a toolchain the fleet's driver can load?

The same check runs in CI (``rose-aot check --bundle B MANIFEST...``) and in a server at
start-up, before it takes traffic::

    report = rose_aot.check_bundle("build/bundle.rosebundle", ["manifests/qwen3-8b.toml"])
    report.raise_if_failed()        # CoverageError listing each missing (point, arch)

Plain Python: reads the bundle index and the manifests; never imports cutlass, never touches a
GPU.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from .archs import get_arch
from .bundle import BundleReader
from .bundle.index_shape import check_kernel_index
from .errors import BundleError, CoverageError, ManifestError
from .loader.runtime import BUNDLE_KIND
from .manifest import Manifest, load_manifests

__all__ = [
    "DEFAULT_MIN_DRIVER",
    "CUDA_RELEASE_DRIVERS",
    "PTX_ISA_RELEASES",
    "FLAVOUR_MIN_DRIVERS",
    "CUBIN_ABI_MIN_DRIVERS",
    "ARCH_MIN_DRIVERS",
    "parse_driver_version",
    "DriverRequirement",
    "driver_requirement",
    "Missing",
    "ManifestCoverage",
    "CoverageReport",
    "check_bundle",
]

# --- Which driver loads what --------------------------------------------------------------------
# Sources: the CUDA Toolkit release notes, table "CUDA Toolkit and Corresponding Driver Versions"
# (minimum Linux x86_64 driver of each GA release); the PTX ISA release notes (the CUDA release
# that introduced each ISA version); NVIDIA's CUDA compatibility guide ("minor version
# compatibility": a cubin from any CUDA 12.x toolkit loads on any driver of the 12 family,
# >= 525.60.13, while PTX is JIT-compiled by the driver, which must know that ISA: at least the
# driver of the toolkit that introduced it). Measured (shared notes, cutedsl-aot-facts.md; and
# the bundles built here): the cu12 DSL writes PTX ISA 8.8 (its PTX header names the NVVM front
# end, "release 13.4", not the ptxas that made the cubins: 12.9.83) and cubins with ELF ABI
# version 7 for sm_90a but 8 (the newer cubin layout) for sm_100a; a cu12 cubin and PTX 8.8 load
# on driver 580, PTX 9.4 does not.
# Assumptions: Linux drivers; the loader calls only CUDA 12.0 driver APIs (cuModule*, cuFunc*,
# cuLaunchKernel(Ex)); ELF ABI 8 cubins need the CUDA 12.8 driver (570.26), the first with that
# layout and with Blackwell support; the PTX fallback (open_bundle(use_ptx=True)) is a reported fallback,
# so its driver is reported, not enforced.
CUDA_RELEASE_DRIVERS: dict[str, str] = {
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}
PTX_ISA_RELEASES: dict[str, str] = {
    "8.0": "12.0",
    "8.1": "12.1",
    "8.2": "12.2",
    "8.3": "12.3",
    "8.4": "12.4",
    "8.5": "12.5",
    "8.7": "12.8",
    "8.8": "12.9",
    "9.0": "13.0",
}
# The DSL's CUDA flavour -> the first driver of that CUDA major (minor version compatibility).
FLAVOUR_MIN_DRIVERS: dict[str, str] = {"cu12": "525.60.13", "cu13": "580.65.06"}
# Cubin ELF ABI version byte -> the first driver that loads that cubin layout.
CUBIN_ABI_MIN_DRIVERS: dict[int, str] = {7: "525.60.13", 8: "570.26"}
# The first driver that supports the GPU an arch runs on (H100/H200: R525 for CUDA 12; B200: R570).
ARCH_MIN_DRIVERS: dict[str, str] = {"sm_90a": "525.60.13", "sm_100a": "570.26"}

# The fleet's stated minimum driver when none is given: the driver of CUDA 12.9, whose PTX ISA
# (8.8) the pinned cu12 DSL (nvidia-cutlass-dsl 4.8.1) writes, so both its cubins and the PTX
# fallback load on it. A toolchain that needs more (e.g. the cu13 flavour) fails the check.
DEFAULT_MIN_DRIVER = "575.51.03"

_VERSION = re.compile(r"\d+(?:\.\d+){0,2}")


def parse_driver_version(text: str) -> tuple[int, ...]:
    """``"575.51.03"`` -> (575, 51, 3); ``"575"`` -> (575, 0, 0). Raises ValueError."""
    text = str(text).strip()
    if not _VERSION.fullmatch(text):
        raise ValueError(
            f"{text!r} is not a driver version; write it as nvidia-smi shows it, e.g. 575.51.03"
        )
    parts = tuple(int(p) for p in text.split("."))
    return parts + (0,) * (3 - len(parts))


@dataclass(frozen=True)
class DriverRequirement:
    """The minimum driver a bundle's toolchain needs. None where the tables do not know."""

    cubin: dict[str, str | None]  # arch -> minimum driver that loads its cubins
    ptx: str | None  # minimum driver that JIT-loads its PTX (the fallback)
    cuda_flavour: str | None
    ptx_isa: str | None
    unknown: tuple[str, ...] = ()  # what the tables could not place, for the message

    def to_json(self) -> dict:
        return {
            "cubin": dict(self.cubin),
            "ptx": self.ptx,
            "cuda_flavour": self.cuda_flavour,
            "ptx_isa": self.ptx_isa,
            "unknown": list(self.unknown),
        }


def driver_requirement(toolchain: dict, archs: Iterable[str]) -> DriverRequirement:
    """What driver the artifacts of `archs` in a bundle with this toolchain record need."""
    unknown = []

    def text(value):  # the index is data from a file: only plain strings and ints are looked up
        return value if isinstance(value, str) else None

    ptx_isa = text(toolchain.get("ptx_isa"))
    ptx_release = PTX_ISA_RELEASES.get(ptx_isa)
    ptx = CUDA_RELEASE_DRIVERS.get(ptx_release) if ptx_release else None
    if ptx is None:
        unknown.append(f"PTX ISA {ptx_isa}")
    flavour = text(toolchain.get("cuda_flavour"))
    abis = toolchain.get("cubin_elf_abi")
    abis = abis if isinstance(abis, dict) else {}
    cubin: dict[str, str | None] = {}
    for arch in archs:
        abi = abis.get(arch) if type(abis.get(arch)) is int else None
        floors = {
            f"CUDA flavour {flavour}": FLAVOUR_MIN_DRIVERS.get(flavour),
            f"{arch} cubin ELF ABI {abi}": CUBIN_ABI_MIN_DRIVERS.get(abi),
            f"arch {arch}": ARCH_MIN_DRIVERS.get(arch),
        }
        lacking = [what for what, floor in floors.items() if floor is None]
        unknown.extend(w for w in lacking if w not in unknown)
        cubin[arch] = None if lacking else max(floors.values(), key=parse_driver_version)
    return DriverRequirement(cubin, ptx, flavour, ptx_isa, tuple(unknown))


# --- the report ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Missing:
    manifest: str
    key: str
    arch: str

    def __str__(self) -> str:
        return f"{self.manifest}: {self.key} @ {self.arch}"


@dataclass(frozen=True)
class ManifestCoverage:
    name: str
    path: str
    archs: tuple[str, ...]
    points: int
    missing: tuple[Missing, ...]

    @property
    def ok(self) -> bool:
        return not self.missing


@dataclass
class CoverageReport:
    bundle: str
    manifests: list[ManifestCoverage]
    min_driver: str
    driver: DriverRequirement
    driver_problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def missing(self) -> list[Missing]:
        return [m for cov in self.manifests for m in cov.missing]

    @property
    def ok(self) -> bool:
        # A check of no manifest proves nothing: it must not pass.
        return bool(self.manifests) and not self.missing and not self.driver_problems

    def lines(self) -> list[str]:
        """Human lines: one per manifest, each missing (point, arch), then the driver verdict."""
        out = []
        for cov in self.manifests:
            archs = ", ".join(cov.archs)
            if cov.ok:
                out.append(
                    f"ok    {cov.name}: {cov.points} points x {len(cov.archs)} archs ({archs}) "
                    f"covered by {self.bundle}"
                )
                continue
            out.append(
                f"FAIL  {cov.name}: {len(cov.missing)} of {cov.points * len(cov.archs)} "
                f"(point, arch) pairs missing from {self.bundle}:"
            )
            out.extend(f"        {m.key} @ {m.arch}" for m in cov.missing)
        needed = ", ".join(f"{a} {v or '?'}" for a, v in self.driver.cubin.items())
        if self.driver_problems:
            out.extend(f"FAIL  driver: {p}" for p in self.driver_problems)
        else:
            out.append(
                f"ok    driver: stated minimum {self.min_driver} loads the cubins "
                f"(they need {needed})"
            )
        out.extend(f"note  {n}" for n in self.notes)
        return out

    def to_json(self) -> dict:
        return {
            "bundle": self.bundle,
            "ok": self.ok,
            "manifests": [
                {
                    "name": c.name,
                    "path": c.path,
                    "archs": list(c.archs),
                    "points": c.points,
                    "ok": c.ok,
                    "missing": [{"key": m.key, "arch": m.arch} for m in c.missing],
                }
                for c in self.manifests
            ],
            "missing": [
                {"manifest": m.manifest, "key": m.key, "arch": m.arch} for m in self.missing
            ],
            "driver": {
                "min_driver": self.min_driver,
                "required": self.driver.to_json(),
                "ok": not self.driver_problems,
                "problems": list(self.driver_problems),
            },
            "notes": list(self.notes),
        }

    def raise_if_failed(self) -> None:
        """Raise CoverageError (with this report attached) unless the check passed."""
        if self.ok:
            return
        parts = []
        if not self.manifests:
            parts.append("no manifests were checked; pass the manifests the deployment serves")
        if self.missing:
            parts.append(
                f"the bundle {self.bundle} lacks {len(self.missing)} (point, arch) pair(s):\n  "
                + "\n  ".join(str(m) for m in self.missing)
                + "\nadd them to the manifests and rebuild the bundle"
            )
        parts.extend(f"driver: {p}" for p in self.driver_problems)
        raise CoverageError("\n".join(parts), self)


# --- the check ----------------------------------------------------------------------------------
def check_bundle(
    bundle,
    manifests,
    archs: Iterable[str] | None = None,
    *,
    min_driver: str = DEFAULT_MIN_DRIVER,
) -> CoverageReport:
    """Check that `bundle` covers every point of `manifests` for every requested arch (the
    manifests' own archs, or `archs`) and that `min_driver` loads its cubins.

    `bundle`: a path, a BundleReader, or a KernelBundle (rose_aot.open_bundle). `manifests`: a
    Manifest, a manifest file or directory, or a list of those. Problems with the inputs raise
    (ManifestError, BundleError, ValueError); a bundle that does not cover them returns a report
    whose ``ok`` is False (``raise_if_failed`` turns that into a CoverageError).
    """
    index, label = _bundle_index(bundle)
    loaded = _manifests(manifests)
    if not loaded:
        raise ManifestError(
            "(no manifests)",
            "check_bundle needs at least one manifest; pass the manifest files (or folders) "
            "the deployment serves",
        )
    requested = tuple(archs) if archs else None
    for arch in requested or ():
        get_arch(arch)
    min_version = parse_driver_version(min_driver)

    try:
        have = {(p["key"], p["arch"]) for p in index.get("points", [])}
    except (KeyError, TypeError) as exc:
        raise BundleError(
            f"{label}: the bundle index has a malformed point list; rebuild the bundle"
        ) from exc

    coverages = []
    used_archs: list[str] = []
    for manifest in loaded:
        targets = requested or manifest.archs
        used_archs.extend(a for a in targets if a not in used_archs)
        missing = tuple(
            Missing(manifest.name, point.key, arch)
            for point in manifest.points
            for arch in targets
            if (point.key, arch) not in have
        )
        coverages.append(
            ManifestCoverage(
                manifest.name, manifest.path, tuple(targets), len(manifest.points), missing
            )
        )

    toolchain = index.get("toolchain")
    toolchain = toolchain if isinstance(toolchain, dict) else {}  # unknown: the check fails
    # Archs the bundle lacks altogether are already missing points; no driver loads them.
    built = {arch for _, arch in have}
    requirement = driver_requirement(toolchain, [a for a in used_archs if a in built])
    problems, notes = [], []
    for arch, needed in requirement.cubin.items():
        if needed is None:
            problems.append(
                f"cannot tell which driver loads the {arch} cubins of this toolchain "
                f"({', '.join(requirement.unknown)}); add it to the tables in rose_aot/check.py"
            )
        elif parse_driver_version(needed) > min_version:
            problems.append(
                f"the {arch} cubins ({requirement.cuda_flavour} toolchain, ELF ABI "
                f"{(toolchain.get('cubin_elf_abi') or {}).get(arch)}) need driver >= {needed}, "
                f"newer than the stated minimum {min_driver}; build with an older toolchain or "
                "raise the minimum"
            )
    if requirement.ptx is None:
        notes.append(
            f"the PTX fallback's minimum driver is unknown (PTX ISA {requirement.ptx_isa})"
        )
    elif parse_driver_version(requirement.ptx) > min_version:
        notes.append(
            f"the PTX fallback (use_ptx=True; PTX ISA {requirement.ptx_isa}) needs driver >= "
            f"{requirement.ptx}; drivers between {min_driver} and it load only the cubins"
        )
    return CoverageReport(label, coverages, str(min_driver), requirement, problems, notes)


def _bundle_index(bundle) -> tuple[dict, str]:
    index = getattr(bundle, "index", None)
    if isinstance(index, dict):  # a KernelBundle or a BundleReader
        label = str(getattr(bundle, "path", "<bundle>"))
        check_kernel_index(index, label)
        return index, label
    reader = BundleReader.open(bundle)
    check_kernel_index(reader.index, reader.path)
    kind = reader.index.get("kind")
    if kind != BUNDLE_KIND:
        raise BundleError(
            f"{reader.path}: is not a rose-aot kernel bundle (kind {str(kind)[:60]!r}); "
            "a build shard must be merged first (`rose-aot merge`)"
        )
    return reader.index, reader.path


def _manifests(manifests) -> list[Manifest]:
    if isinstance(manifests, (Manifest, str, os.PathLike)):
        manifests = [manifests]
    manifests = list(manifests)
    objects = [m for m in manifests if isinstance(m, Manifest)]
    paths = [m for m in manifests if not isinstance(m, Manifest)]
    return objects + (load_manifests(paths) if paths else [])
