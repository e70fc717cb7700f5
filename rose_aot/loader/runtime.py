"""Serving-side bundle: open + verify, pick the arch of the device, load lazily, launch.

Nothing here compiles or imports cutlass. A kernel handle validates its arguments, packs the
parameters into a preallocated buffer and launches on torch's current stream, so CUDA graphs
capture it like any torch op.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

from ..archs import ARCHS, arch_for_capability, get_arch
from ..bundle import BundleReader
from ..bundle.index_shape import check_kernel_index
from ..bundle.signing import check_signature
from ..errors import (
    ArgumentError,
    BundleError,
    ConfigError,
    DeviceError,
    KernelNotFoundError,
    RoseAotError,
)
from ..kernels import get_family
from ..kernels.spec import param_fields, param_size
from . import driver
from .args import ArgBinder, ParamPacker

__all__ = ["KernelBundle", "KernelHandle", "open_bundle"]

BUNDLE_KIND = "rose-aot kernel bundle"


def open_bundle(path, *, use_ptx: bool = False, trusted_keys=None) -> "KernelBundle":
    """Open and verify a bundle. `use_ptx` loads PTX (driver JIT, ~100x slower) instead of cubins;
    it is an explicit, reported fallback for drivers that refuse the cubins. With `trusted_keys`
    (public key files or PEM bytes), the bundle must carry a valid signature (`<path>.sig`) by one
    of them, else BundleError naming the key ids (see rose_aot.bundle.signing)."""
    reader = BundleReader.open(path)
    check_signature(reader, trusted_keys)
    check_kernel_index(reader.index, reader.path)
    return KernelBundle(reader, use_ptx=use_ptx)


class KernelBundle:
    def __init__(self, reader: BundleReader, *, use_ptx: bool = False):
        self.reader = reader
        self.path = reader.path
        self.use_ptx = use_ptx
        index = reader.index
        if index.get("kind") != BUNDLE_KIND:
            raise BundleError(f"{self.path}: not a rose-aot kernel bundle (kind {index.get('kind')!r})")
        self.index = index
        self._blob_names = set(reader.blob_names())
        # (point key, arch) -> point record
        self._points: dict[tuple[str, str], dict] = {}
        for point in index.get("points", []):
            try:
                self._check_point(point)
                self._points[(point["key"], point["arch"])] = point
            except (KeyError, TypeError, AttributeError) as exc:
                if isinstance(exc, RoseAotError):
                    raise
                raise BundleError(
                    f"{self.path}: a point record of the index is malformed "
                    f"({type(exc).__name__}: {exc}); rebuild the bundle with `rose-aot build`"
                ) from exc
        self._libraries: dict[tuple[str, str, str], object] = {}
        self._device_kernels: dict[tuple[int, str, str, str], list] = {}
        self._device_arch: dict[int, str] = {}
        self._lock = threading.Lock()

    # --- verification of the index against this rose-aot's plain-Python kernel specs --------
    def _check_point(self, point: dict) -> None:
        try:
            family = get_family(point["family"])
            config = family.make_config(**point["config"])
            arch = get_arch(point["arch"])
        except (KeyError, TypeError, ConfigError) as exc:
            raise BundleError(
                f"{self.path}: point {point.get('key', '?')!r} is not understood by this "
                f"rose-aot ({exc}); rebuild the bundle with the rose-aot version that serves it"
            ) from exc
        if family.key(config) != point["key"]:
            raise BundleError(f"{self.path}: point key {point['key']!r} does not match its config")
        args = {a.name: a for a in family.kernel_args(config)}
        specs = {v.name: v for v in family.variants(config, arch)}
        recorded = {v["name"]: v for v in point["variants"]}
        if set(recorded) != set(specs):
            raise BundleError(
                f"{self.path}: {point['key']} on {point['arch']} has variants {sorted(recorded)}, "
                f"this rose-aot expects {sorted(specs)}; rebuild the bundle"
            )
        for name, spec in specs.items():
            rec = recorded[name]
            expect = {
                "block": list(spec.block),
                "smem": spec.smem,
                "params": list(spec.params),
                "param_layouts": [[f.to_json() for f in param_fields(args[p])] for p in spec.params],
            }
            sizes = [param_size(args[p]) for p in spec.params]
            bad = [k for k, v in expect.items() if rec.get(k) != v]
            entries = rec.get("entries")
            if not entries or len(rec.get("param_sizes", [])) != len(entries):
                bad.append("entries")
            if bad or any(s != sizes for s in rec.get("param_sizes", [])):
                raise BundleError(
                    f"{self.path}: {point['key']} variant {name} on {point['arch']}: launch facts "
                    f"{bad or ['param_sizes']} differ from this rose-aot's kernel spec; rebuild "
                    f"the bundle with the rose-aot version that serves it"
                )
            for blob in (rec["cubin"], rec["ptx"]):
                if blob not in self._blob_names:
                    raise BundleError(f"{self.path}: artifact {blob!r} is missing")

    # --- what the bundle has -------------------------------------------------------------------
    @property
    def archs(self) -> list[str]:
        return list(self.index.get("archs", []))

    def points(self, arch: str | None = None) -> list[str]:
        return sorted({k for k, a in self._points if arch is None or a == arch})

    def kernel(self, family: str, /, **config) -> "KernelHandle":
        """The handle of one point, looked up by family and config fields (defaults apply)."""
        if not isinstance(family, str):
            raise ArgumentError(
                f"kernel(): the family must be a str such as 'rms_norm' (got "
                f"{type(family).__name__}); pass config fields as keywords"
            )
        fam = get_family(family)
        cfg = fam.make_config(**config)
        key = fam.key(cfg)
        if not any(k == key for k, _ in self._points):
            raise KernelNotFoundError(key, self._nearest(fam, cfg))
        return KernelHandle(self, fam, cfg)

    def _nearest(self, family, config, limit: int = 3) -> list[str]:
        mine = dataclasses.asdict(config)
        scored = []
        for key, arch in self._points:
            point = self._points[(key, arch)]
            if point["family"] != family.name:
                continue
            diff = {k: v for k, v in point["config"].items() if mine.get(k) != v}
            scored.append((len(diff), key, diff))
        scored.sort(key=lambda s: (s[0], s[1]))
        out, seen = [], set()
        for n, key, diff in scored:
            if key in seen:
                continue
            seen.add(key)
            detail = ", ".join(f"{k}={v!r}" for k, v in diff.items())
            out.append(f"{key}  [differs: {detail}]")
            if len(out) == limit:
                break
        return out

    # --- device side ---------------------------------------------------------------------------
    def arch_for_device(self, device: int) -> str:
        arch = self._device_arch.get(device)
        if arch is None:
            import torch

            capability = torch.cuda.get_device_capability(device)
            arch = arch_for_capability(capability, self.archs)
            if arch is None:
                have = ", ".join(f"{a} (sm {ARCHS[a].capability[0]}.{ARCHS[a].capability[1]})"
                                 for a in self.archs if a in ARCHS)
                raise DeviceError(
                    f"cuda:{device} has compute capability {capability[0]}.{capability[1]}; the "
                    f"bundle {self.path} has cubins for: {have or 'no arch'}; rebuild it with "
                    f"--arch for this GPU"
                )
            self._device_arch[device] = arch
        return arch

    def _library(self, key: str, arch: str, variant: dict):
        lib_key = (key, arch, variant["name"])
        lib = self._libraries.get(lib_key)
        if lib is None:
            if self.use_ptx:
                image = self.reader.blob(variant["ptx"]) + b"\0"
            else:
                image = self.reader.blob(variant["cubin"])  # sha256-verified before this point
            lib = driver.load_library(image, f"{key} {variant['name']} ({arch})")
            self._libraries[lib_key] = lib
        return lib

    def device_kernels(self, device: int, key: str, variant_name: str) -> list:
        """CUfunction handles of one variant's entries, loaded into `device`'s context."""
        arch = self.arch_for_device(device)
        cache_key = (device, key, arch, variant_name)
        kernels = self._device_kernels.get(cache_key)
        if kernels is not None:
            return kernels
        with self._lock:
            kernels = self._device_kernels.get(cache_key)
            if kernels is not None:
                return kernels
            point = self._points.get((key, arch))
            if point is None:
                raise KernelNotFoundError(
                    key, [], f"the bundle has it for {self._archs_of(key)} but cuda:{device} "
                    f"needs {arch}"
                )
            variant = next(v for v in point["variants"] if v["name"] == variant_name)
            lib = self._library(key, arch, variant)
            kernels = []
            import torch

            with torch.cuda.device(device):
                torch.cuda.current_stream(device)  # makes the primary context current
                for entry in variant["entries"]:
                    kernel = driver.get_kernel(lib, entry)
                    if variant["smem"] > 48 * 1024:
                        driver.set_max_dynamic_smem(kernel, device, variant["smem"], entry)
                    # The context's own function: loads the module into this device's context now
                    # (not at the first launch) and spares the driver a per-launch lookup.
                    kernels.append(driver.kernel_function(kernel, entry))
            self._device_kernels[cache_key] = kernels
            return kernels

    def _archs_of(self, key: str) -> list[str]:
        return sorted(a for k, a in self._points if k == key)

    def preload(self, device: int | None = None) -> int:
        """Load every kernel for `device` (default: torch's current device) now, for warmup.
        Returns the number of kernel entries loaded."""
        import torch

        if not torch.cuda.is_available():
            raise DeviceError(
                "preload(): no usable CUDA device (torch.cuda.is_available() is False); run on a "
                "GPU machine with a driver, or skip preloading where there is none"
            )
        device = torch.cuda.current_device() if device is None else device
        arch = self.arch_for_device(device)
        count = 0
        for (key, a), point in sorted(self._points.items()):
            if a != arch:
                continue
            for v in point["variants"]:
                count += len(self.device_kernels(device, key, v["name"]))
        return count

    def describe(self) -> dict:
        """What `rose-aot inspect --json` prints: a summary of the index (no artifacts)."""
        points = []
        for (key, arch), p in sorted(self._points.items()):
            points.append(
                {
                    "key": key,
                    "arch": arch,
                    "variants": [
                        {
                            "name": v["name"],
                            "block": v["block"],
                            "smem": v["smem"],
                            "entries": v["entries"],
                            "cubin_bytes": self.reader.blob_info(v["cubin"])["raw_size"],
                            "ptx_bytes": self.reader.blob_info(v["ptx"])["raw_size"],
                        }
                        for v in p["variants"]
                    ],
                }
            )
        return {
            "path": str(self.path),
            "bytes": self.reader.size,
            "format_version": self.reader.format_version,
            "archs": self.archs,
            "toolchain": self.index.get("toolchain", {}),
            "manifests": self.index.get("manifests", []),
            "families": self.index.get("families", {}),
            "points": points,
        }


class KernelHandle:
    """A callable kernel point. Call with torch tensors in the family's argument order.

    The hot path: one pass of cheap checks over the tensors (the detailed checker runs only when
    one fails, to raise a precise error), a dict lookup of the launch plan already resolved to
    kernel handles for (device, sizes), one struct pack per launch and the driver call.
    """

    def __init__(self, bundle: KernelBundle, family, config):
        self.bundle = bundle
        self.family = family
        self.config = config
        self.key = family.key(config)
        args = family.args(config)
        self._workspace_spec = tuple(family.workspace(config))
        kernel_args = tuple(args) + self._workspace_spec
        self._binder = ArgBinder(self.key, args)
        self._packers = {}
        for arch in {a for k, a in bundle._points if k == self.key}:
            for v in family.variants(config, get_arch(arch)):
                self._packers.setdefault(v.name, ParamPacker(kernel_args, v.params))
        self._names = tuple(a.name for a in args)
        self._workspaces: dict[tuple[int, int], list] = {}
        self._workspace_ptrs: dict[tuple[int, int], list[int]] = {}
        # Where each runtime size of the plan is read from: (argument index, mode).
        self._size_sources = []
        for size in family.size_names:
            self._size_sources.append(
                next(
                    (i, m)
                    for i, a in enumerate(args)
                    for m, d in enumerate(a.shape)
                    if getattr(d, "name", None) == size
                )
            )
        self._resolved: dict[tuple, list] = {}
        self._lock = threading.Lock()
        self._launch = None
        self._launch_cooperative = None
        self._raw_stream = None

    def __repr__(self) -> str:
        return f"KernelHandle({self.key}, bundle={self.bundle.path})"

    @property
    def arg_names(self) -> tuple[str, ...]:
        return self._names

    def plan(self, *tensors, variant: str | None = None):
        """The launches a call with these tensors would issue (nothing is launched)."""
        dims, device = self._binder.bind(tensors)
        arch = get_arch(self.bundle.arch_for_device(device))
        sizes = {n: dims[n] for n in self.family.size_names}
        return self.family.plan(self.config, arch, sizes, variant)

    def _resolve(self, device: int, sizes: tuple, variant: str | None) -> list:
        """The plan for (device, sizes) with each launch's kernel handle and packer bound."""
        arch = get_arch(self.bundle.arch_for_device(device))
        plan = self.family.plan(
            self.config, arch, dict(zip(self.family.size_names, sizes)), variant
        )
        resolved = []
        for launch in plan:
            kernel = self.bundle.device_kernels(device, self.key, launch.variant)[launch.entry]
            resolved.append(
                (int(kernel), *launch.grid, *launch.block, launch.smem, self._packers[launch.variant],
                 launch.variant, launch.cooperative)
            )
        if len(self._resolved) > 1024:  # bound the cache for engines with unbounded sizes
            self._resolved.clear()
        self._resolved[(device, sizes, variant)] = resolved
        return resolved

    def _stream_getter(self):
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is None:
            return lambda device: torch.cuda.current_stream(device).cuda_stream
        return raw

    def workspace(self, device: int, stream: int) -> list:
        """The zero-initialised scratch tensors of (device, stream), allocated on first use.

        Kernels leave them as they found them, so one set serves every later launch on that
        stream, CUDA-graph replays included. Allocate before capturing a graph: warm up once.
        """
        key = (device, stream)
        tensors = self._workspaces.get(key)
        if tensors is None:
            import torch

            tensors = [
                torch.zeros(a.shape, dtype=getattr(torch, a.dtype), device=f"cuda:{device}")
                for a in self._workspace_spec
            ]
            self._workspaces[key] = tensors
        return tensors

    def __call__(self, *tensors, variant: str | None = None) -> None:
        """Launch on torch's current stream of the tensors' device. `variant` forces one variant
        of the launch plan (for tests and benchmarks); by default the plan picks from the sizes."""
        bound = self._binder.fast_bind(tensors)
        if bound is not None:
            shapes, strides, ptrs, device = bound
            sizes = tuple(shapes[i][m] for i, m in self._size_sources)
            slow_dims = None
        else:
            slow_dims, device = self._binder.bind(tensors)  # raises the precise error
            sizes = tuple(slow_dims[n] for n in self.family.size_names)
        launches = self._resolved.get((device, sizes, variant))
        if launches is None:
            launches = self._resolve(device, sizes, variant)
        if not launches:
            return
        if self._launch is None:
            self._launch = driver.launcher()
            self._launch_cooperative = driver.cooperative_launcher()
            self._raw_stream = self._stream_getter()
        stream = self._raw_stream(device)
        by_name = None
        if self._workspace_spec:
            if slow_dims is None:
                scratch_ptrs = self._workspace_ptrs.get((device, stream))
                if scratch_ptrs is None:
                    scratch_ptrs = [t.data_ptr() for t in self.workspace(device, stream)]
                    self._workspace_ptrs[(device, stream)] = scratch_ptrs
                ptrs = ptrs + scratch_ptrs
            else:
                scratch = self.workspace(device, stream)
                by_name = dict(zip(self._names, tensors))
                by_name.update((a.name, t) for a, t in zip(self._workspace_spec, scratch))
        for kernel, gx, gy, gz, bx, by, bz, smem, packer, name, cooperative in launches:
            with self._lock:
                if slow_dims is None:
                    values = packer.fast_values(shapes, strides, ptrs)
                else:
                    by_name = by_name or dict(zip(self._names, tensors))
                    values = packer.values(by_name, slow_dims)
                params = packer.pack(values)
                if cooperative:
                    code = self._launch_cooperative(kernel, gx, gy, gz, bx, by, bz, smem, stream, params)
                else:
                    code = self._launch(kernel, gx, gy, gz, bx, by, bz, smem, stream, params, None)
            if code:
                driver.raise_launch_error(code, f"launching {self.key} ({name})")
