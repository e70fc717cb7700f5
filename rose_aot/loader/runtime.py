"""Serving-side bundle: open + verify, pick the arch of the device, load lazily, launch.

Nothing here compiles or imports cutlass. A kernel handle validates its arguments, packs the
parameters into a preallocated buffer and launches on torch's current stream, so CUDA graphs
capture it like any torch op.
"""

from __future__ import annotations

import dataclasses
import struct
import threading
from contextlib import closing
from functools import partial

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
from ..kernels.record import ParamRecord, PointRecord, VariantRecord
from .. import settings
from . import driver
from .args import ArgBinder, ParamPacker

__all__ = ["KernelBundle", "KernelHandle", "open_bundle", "PRELOAD_THREADS",
           "PRELOAD_LOOKAHEAD"]

BUNDLE_KIND = "rose-aot kernel bundle"
_REBUILD = "rebuild the bundle with `rose-aot build`"
# Threads of preload() unless told: the calling thread verifies and loads each variant in turn.
# With `threads` > 1, helpers verify artifacts ahead (zstd and sha256 run without the GIL)
# while the calling thread loads them. That paid while the cubin checks were Python (DeepSeek-V3,
# 45 variants: 8.86 and 6.87 ms against 12.35 and 9.03 with one thread,
# benchmarks/results/preload-probe-2xh200.log, preload-probe-final-2xh200.log, so helpers were
# the default from 32 variants); since the C reader (rose_aot/bundle/_fastread.c) makes the
# verification mostly sha256, the hand-overs between the threads cost what the overlap saves:
# 5.26 ms with the helper against 5.16 with one thread, 6.04 with two helpers against 5.40
# (warmup_ab.py in one call, benchmarks/results/warmup-ab-threads1.log, warmup-ab-threads3.log),
# and on the 2-core build machine check_artifacts(threads=2) took 4.2-5.1 ms against 1.25.
# More loading threads do not help either: the driver's module loads into one context do not
# overlap (14.24 / 14.98 / 17.53 ms with 1 / 2 / 8 threads each verifying and loading,
# benchmarks/results/warmup-threads-h200.log).
PRELOAD_THREADS = 1
# How many tasks preload's helpers may run ahead of the calling thread: each holds a verified
# image until the driver has it, so this bounds the memory of a pipeline over huge cubins
# (DeepSeek-V3's largest is 72 KB).
PRELOAD_LOOKAHEAD = 8
# Dynamic shared memory a kernel may launch with before cuFuncSetAttribute raises its limit.
_SMEM_WITHOUT_OPT_IN = 48 * 1024


def open_bundle(path, *, use_ptx: bool = False, trusted_keys=None) -> "KernelBundle":
    """Open and verify a bundle. `use_ptx` loads PTX (driver JIT, ~100x slower) instead of cubins;
    it is an explicit, reported fallback for drivers that refuse the cubins. With `trusted_keys`
    (public key files or PEM bytes), the bundle must carry a valid signature (`<path>.sig`) by one
    of them, else BundleError naming the key ids (see rose_aot.bundle.signing).

    Verified here: the header, the index (with its table of artifacts and their sha256) and
    every point's config and key (see KernelBundle). The records of an arch are checked when
    the arch is first used (the first device of it, preload, `record`, `check_artifacts`), all
    of that arch's points at once; each artifact's bytes the first time a load needs them
    (preload, or the first launch of its variant on a device), before any byte reaches the
    driver. Either raises the same BundleError an eager check raises; so a damaged record or
    cubin of another arch costs nothing and fails nothing (an H200 process does not read a
    bundle's sm_100a records). A point's forced plans (tests, benchmarks) are checked at its
    first forced launch (check_forced_plans). `rose-aot verify` and KernelBundle(reader) check
    every record, every forced plan and every artifact at once."""
    reader = BundleReader.open(path)
    check_signature(reader, trusted_keys)
    return KernelBundle(reader, use_ptx=use_ptx, check_artifacts=False)


def _plan_in_record(family, config, variants: dict, sizes: dict, sm_count: int,
                    force: str | None) -> tuple:
    """The family's plan on a record's variants, each launch's variant and entry looked up in
    them: KeyError, IndexError or TypeError where the plan misreads the record."""
    plan = family.plan(config, variants, sizes, sm_count, force)
    for launch in plan:
        variants[launch.variant].entries[launch.entry]
    return plan


class KernelBundle:
    """The kernels of one verified bundle, loaded per device on demand.

    Construction checks the index's JSON types and record version (check_kernel_index), then
    every (point, arch) of the index: its family, config and key. The records are checked per
    arch (check_records): for each point of the arch, its record (read strictly), that the
    artifacts it names are in the bundle with the record's sha256, that each parameter is the
    packing of its argument, and that this rose-aot's plan can launch from it (its forced
    plans at the point's first forced launch: check_forced_plans). With `check_artifacts` (the
    default; `rose-aot verify`) construction checks every arch's records and forced plans
    and decompresses every artifact a load would hand the driver, checks its sha256 and, for a
    cubin, its entries, block size and parameter sizes against the record. Without it
    (open_bundle), an arch's records are checked when the arch is first used and each artifact
    at its first load, in verified_image(): no record is used and no artifact reaches the
    driver unchecked either way, and the error is the same BundleError.
    """

    def __init__(self, reader: BundleReader, *, use_ptx: bool = False,
                 check_artifacts: bool = True):
        self.reader = reader
        self.path = reader.path
        self.use_ptx = use_ptx
        index = reader.index
        if index.get("kind") != BUNDLE_KIND:
            raise BundleError(f"{self.path}: not a rose-aot kernel bundle (kind {index.get('kind')!r})")
        check_kernel_index(index, self.path)
        self.index = index
        # blob name -> sha256 of its decompressed bytes, what each record must name
        self._raw_digests = reader.raw_digests()
        # (point key, arch) -> the point's index entry (config and key checked)
        self._points: dict[tuple[str, str], dict] = {}
        # Filled per arch by check_records: (point key, arch) -> its record, and (point key,
        # arch, variant name) -> the variant's index entry and its record.
        self._records: dict[tuple[str, str], PointRecord] = {}
        self._variants_by_name: dict[tuple[str, str, str], tuple[dict, VariantRecord]] = {}
        # The archs whose records are checked (read without the lock: a set's membership test
        # is atomic, and an arch is added only after its records are in the dicts above).
        self._archs_checked: set[str] = set()
        self._records_lock = threading.Lock()
        self._forced_checked: set[tuple[str, str]] = set()  # (key, arch): check_forced_plans
        points = index.get("points", [])
        # Argument -> its packing: points share many argument specs (a ParamRecord takes longer
        # to derive than to look up).
        self._packings: dict = {}
        # Shared by the records of every point: equal parameters are read once (ParamRecord).
        self._record_memo: dict = {}
        # point key -> (family, config) as checked here: handle() makes its handle from them
        # instead of converting the index's config again.
        self._configs: dict[str, tuple] = {}
        if not isinstance(points, list):
            raise BundleError(f"{self.path}: the index's points are not a list; {_REBUILD}")
        for point in points:
            family, config = self._malformed_as_bundle_error(point, self._check_config, point)
            self._points[(point["key"], point["arch"])] = point
            self._configs.setdefault(point["key"], (family, config))
        # (device, sha256 of the image) -> its module in the device's context and the entries
        # taken from it: {entry: [CUfunction, the dynamic shared memory it allows]}. Variants
        # whose images are the same bytes share one module (DeepSeek-V3: 2 of 55, moe_combine's
        # split and split_wide at top-8, and the routing kernel of its two FP8 dispatch
        # points). Kept: the functions live as long as their module.
        self._modules: dict[tuple[int, str], tuple[object, dict[str, list]]] = {}
        # (device, key, arch, variant name) -> CUfunctions of the variant's entries
        self._device_kernels: dict[tuple[int, str, str, str], list] = {}
        self._device_arch: dict[int, str] = {}
        self._sm_counts: dict[int, int] = {}
        self._handles: dict[str, KernelHandle] = {}
        # (key, arch, variant) whose cubin matched its record; a set's add is atomic, so the
        # threads of a preload share it.
        self._cubins_checked: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()
        if check_artifacts:
            self.check_artifacts()
            self.check_forced_plans()

    # --- the record: read, bound to its artifacts, understood by this rose-aot ----------------
    def _malformed_as_bundle_error(self, point, check, *args):
        """check(*args), with a malformed point's KeyError, TypeError... as one BundleError."""
        try:
            return check(*args)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            if isinstance(exc, RoseAotError):
                raise
            what = point.get("key", "?") if isinstance(point, dict) else "?"
            raise BundleError(
                f"{self.path}: the record of point {str(what)[:200]!r} is malformed or not "
                f"understood by this rose-aot ({type(exc).__name__}: {exc}); {_REBUILD}"
            ) from exc

    def _check_config(self, point: dict) -> tuple:
        """(family, config) of the point, after checking that this rose-aot knows its family,
        config and arch, and that its key is its config's."""
        try:
            family = get_family(point["family"])
            config = family.make_config(**point["config"])
            arch = get_arch(point["arch"])
        except (KeyError, TypeError, ConfigError) as exc:
            raise BundleError(
                f"{self.path}: point {point.get('key', '?')!r} is not understood by this "
                f"rose-aot ({exc}); rebuild the bundle with the rose-aot version that serves it"
            ) from exc
        key = point["key"]
        if family.key(config) != key:
            raise BundleError(f"{self.path}: point key {key!r} does not match its config")
        return family, config

    def check_records(self, arch: str | None = None) -> None:
        """Check the record of every point of `arch` (default: every arch), once per arch: the
        loader does it when an arch is first used. The first error in index order is raised,
        and the arch stays unchecked (a later use raises it again)."""
        if arch is not None and not isinstance(arch, str):
            raise ArgumentError(f"check_records(): the arch is a name such as 'sm_90a' or None "
                                f"(got {type(arch).__name__} {arch!r:.60})")
        if arch is not None and arch not in self._archs_checked:
            self._check_arch_name(arch)
        for a in ([arch] if arch is not None else sorted({a for _, a in self._points})):
            if a in self._archs_checked:
                continue
            with self._records_lock:
                if a in self._archs_checked:
                    continue
                records, variants = {}, {}
                for (key, point_arch), point in self._points.items():
                    if point_arch != a:
                        continue
                    records[key, a] = record = self._malformed_as_bundle_error(
                        point, self._check_record, point)
                    for raw, variant in zip(point["variants"], record.variants):
                        variants[key, a, variant.name] = raw, variant
                self._records.update(records)
                self._variants_by_name.update(variants)
                self._archs_checked.add(a)

    def _check_arch_name(self, arch: str) -> None:
        """ArgumentError unless the bundle was built for `arch`: asking for an arch it lacks
        (a typo such as 'sm_90') must not pass as 'nothing to check'."""
        have = set(self.archs) | {a for _, a in self._points}
        if arch not in have:
            raise ArgumentError(
                f"{self.path}: no arch {arch[:60]!r} in this bundle; it was built for "
                f"{', '.join(sorted(have)) or 'no arch'}"
            )

    def _check_record(self, point: dict) -> PointRecord:
        """The point's record, after checking that it belongs to its point, that the artifacts
        it names are in the bundle with its sha256 (the bytes themselves: verified_image), and
        that this rose-aot's plan for the family can launch from it. Nothing is recomputed."""
        key = point["key"]
        family, config = self._configs[key]
        arch = get_arch(point["arch"])
        record = PointRecord.from_json(point, self._record_memo)
        where = f"{self.path}: {key} on {arch.name}"
        for raw, variant in zip(point["variants"], record.variants):
            for kind, digest in (("cubin", variant.cubin_sha256), ("ptx", variant.ptx_sha256)):
                blob = raw[kind]
                if blob not in self._raw_digests:
                    raise BundleError(f"{where}: artifact {blob!r} of variant {variant.name} is missing")
                if self._raw_digests[blob] != digest:
                    raise BundleError(
                        f"{where}: variant {variant.name}'s {kind} {blob!r} is not the artifact "
                        f"its record was compiled with (sha256 differs); {_REBUILD}"
                    )
        # The record is self-consistent: each parameter is the packing of the argument it
        # names (a loader packs exactly what the record says, so a mismatch would corrupt
        # the launch rather than fail it).
        packings = {}
        for a in (*record.args, *record.workspace):
            packing = self._packings.get(a)
            if packing is None:
                packing = self._packings[a] = ParamRecord.of(a, self._record_memo)
            packings[a.name] = packing
        for variant in record.variants:
            for param in variant.params:
                # Through the shared memo, a parameter equal to its packing is usually that
                # very object; the comparison decides otherwise.
                packing = packings.get(param.name)
                if packing is not param and packing != param:
                    raise BundleError(
                        f"{where}: parameter {param.name!r} of variant {variant.name} is not the "
                        f"packing of the record's argument of that name; {_REBUILD}"
                    )
        # Every launch the plan can issue is in the record; the forced plans (tests,
        # benchmarks) at a point's first forced use (check_forced_plans): about three quarters
        # of this check's plans, which a serving process never makes.
        self._check_plans(where, family, config, record, arch, (None,))
        return record

    def _check_plans(self, where: str, family, config, record: PointRecord, arch,
                     forces: tuple) -> None:
        """BundleError unless every launch of these plans (each force, at the family's sample
        sizes) names a variant and an entry of the record."""
        variants = record.by_name
        try:
            for force in forces:
                for sizes in family.sample_sizes(config):
                    _plan_in_record(family, config, variants, sizes, arch.sm_count, force)
        except (KeyError, IndexError, TypeError) as exc:
            raise BundleError(
                f"{where}: this rose-aot's {family.name} launch plan does not understand the "
                f"record ({type(exc).__name__}: {exc}); rebuild the bundle with the rose-aot "
                f"version that serves it"
            ) from None

    def check_forced_plans(self, key: str | None = None, arch: str | None = None) -> None:
        """Check that every forced plan (the family's plan_choices) of point `key` on `arch`
        (None: every point, every arch) launches only variants and entries of its record,
        once per (point, arch): a handle does it before its first forced launch, `rose-aot
        verify` for every point. BundleError otherwise, the same as check_records raises."""
        if isinstance(key, str) and (key, arch) in self._forced_checked:  # later forced calls
            return
        if key is not None and (not isinstance(key, str)
                                or not any(k == key for k, _ in self._points)):
            raise ArgumentError(f"check_forced_plans(): no point {key!r:.200} in {self.path}; "
                                f"bundle.points() lists them")
        self.check_records(arch)
        if key is not None and arch is not None:  # a handle's first forced launch
            todo = [(key, arch)] if (key, arch) in self._points else []
        else:
            todo = sorted(p for p in self._points
                          if (key is None or p[0] == key) and (arch is None or p[1] == arch))
        for k, a in todo:
            if (k, a) in self._forced_checked:
                continue
            family, config = self._configs[k]
            self._check_plans(f"{self.path}: {k} on {a}", family, config, self._records[k, a],
                              get_arch(a), family.plan_choices)
            self._forced_checked.add((k, a))

    # --- the artifacts: verified before a load hands them to the driver ------------------------
    def verified_image(self, key: str, arch: str, variant_name: str) -> bytes | memoryview:
        """What a load of the variant hands the driver: its cubin (with use_ptx, its PTX,
        NUL-terminated), checked against its sha256 by the reader (a cubin as a read-only view
        of the bundle's bytes where they hold it whole: BundleReader.blob_view), and a cubin
        also against its record: its entries, the block size it was compiled for and its
        parameter sizes (so an artifact stored under the wrong point or variant never reaches
        the driver). BundleError otherwise. The CPU side of every load; safe from any thread."""
        checked = (key, arch, variant_name)
        self.check_records(arch)
        raw, record = self._variants_by_name[checked]
        if self.use_ptx:
            return self.reader.blob(raw["ptx"]) + b"\0"
        cubin = self.reader.blob_view(raw["cubin"])
        if checked not in self._cubins_checked:
            try:
                record.check_cubin(cubin)
            except ValueError as exc:
                raise BundleError(
                    f"{self.path}: {key} on {arch}: the cubin of variant {variant_name} does "
                    f"not match its record ({exc}); the artifact is misplaced or damaged; "
                    f"{_REBUILD}"
                ) from None
            self._cubins_checked.add(checked)
        return cubin

    def check_artifacts(self, arch: str | None = None, *, threads: int = 1) -> int:
        """Verify now, as loads would (verified_image), the artifact of every variant of
        `arch`'s points (default: every arch); with `threads` > 1, on `threads - 1` helper
        threads while this one takes their results in order. The first error in (point, arch,
        variant) order is raised, after every record of those archs was checked (check_records).
        Returns the number of variants checked."""
        self.check_records(arch)
        tasks = self._variants(arch)
        with closing(_in_order(self.verified_image, tasks, threads - 1)) as outcomes:
            error = next((exc for ok, exc in outcomes if not ok), None)
        if error is not None:
            raise error
        return len(tasks)

    def _variants(self, arch: str | None) -> list[tuple[str, str, str]]:
        """(key, arch, variant name) of every variant of `arch` (None: every arch), sorted."""
        return [
            (key, a, v["name"])
            for (key, a), point in sorted(self._points.items())
            if arch is None or a == arch
            for v in point["variants"]
        ]

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
        if key not in self._configs:
            raise KernelNotFoundError(key, self._nearest(fam, cfg))
        return KernelHandle(self, fam, cfg)

    def handle(self, key: str) -> "KernelHandle":
        """The handle of a point by its key (as `points()` lists them)."""
        if not isinstance(key, str):
            raise ArgumentError(f"a point key is a string, got {type(key).__name__} {key!r:.60}")
        handle = self._handles.get(key)
        if handle is None:
            checked = self._configs.get(key)
            if checked is None:
                raise KernelNotFoundError(key, [])
            handle = self._handles[key] = KernelHandle(self, *checked)
        return handle

    def record_args(self, key: str) -> tuple:
        """The call arguments of a point, from its record (the same on every arch but for
        alignment): of an arch already checked where there is one (a device's), so that asking
        checks no other arch's records."""
        archs = self._archs_of(key)
        if not archs:
            raise KernelNotFoundError(key, [])
        return self.record(key, self._preferred_arch(archs)).args

    def _preferred_arch(self, archs: list[str]) -> str:
        """Of `archs`, one whose records are checked already (an arch a device used), else the
        first."""
        return next((a for a in archs if a in self._archs_checked), archs[0])

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
            self.check_records(arch)
            self._device_arch[device] = arch
        return arch

    def device_kernels(self, device: int, key: str, variant_name: str) -> list:
        """CUfunction handles of one variant's entries, loaded into `device`'s context."""
        arch = self.arch_for_device(device)
        kernels = self._device_kernels.get((device, key, arch, variant_name))
        if kernels is not None:
            return kernels
        import torch

        with self._lock, torch.cuda.device(device):
            driver.make_primary_context_current(device)
            return self._load_kernels(device, key, arch, variant_name)

    def _load_kernels(self, device: int, key: str, arch: str, variant_name: str) -> list:
        """device_kernels' work, with the bundle's lock held and `device`'s context current."""
        cache_key = (device, key, arch, variant_name)
        kernels = self._device_kernels.get(cache_key)
        if kernels is not None:
            return kernels
        if (key, arch) not in self._points:
            raise KernelNotFoundError(
                key, [], f"the bundle has it for {self._archs_of(key)} but cuda:{device} "
                f"needs {arch}"
            )
        image = self.verified_image(key, arch, variant_name)
        kernels = self._device_kernels[cache_key] = self._load_variant(image, device, key, arch,
                                                                       variant_name)
        return kernels

    def _load_variant(self, image: bytes | memoryview, device: int, key: str, arch: str,
                      variant_name: str) -> list:
        """CUfunctions of one variant's entries, from its verified image: from the module of
        `device` that holds the same bytes already, else from a module loaded now into the
        current context (that of `device`). The caller holds the bundle's lock."""
        record = self.record(key, arch).variant(variant_name)
        digest = record.ptx_sha256 if self.use_ptx else record.cubin_sha256
        loaded = self._modules.get((device, digest))
        if loaded is None:
            module = driver.load_module(image, f"{key} {variant_name} ({arch}) on cuda:{device}")
            loaded = self._modules[(device, digest)] = (module, {})
        module, functions = loaded
        kernels = []
        for entry in record.entries:
            function = functions.get(entry)
            if function is None:
                function = functions[entry] = [driver.module_function(module, entry),
                                               _SMEM_WITHOUT_OPT_IN]
            if record.smem > function[1]:  # the most any variant sharing it launches with
                driver.set_max_dynamic_smem(function[0], record.smem, entry)
                function[1] = record.smem
            kernels.append(function[0])
        return kernels

    def sm_count(self, device: int) -> int:
        """The device's SM count (cuDeviceGetAttribute), read once: plans size cooperative and
        decode grids from the GPU that runs them, not from the arch table (an H20 has 78 SMs,
        an H100 PCIe 114, both sm_90a)."""
        count = self._sm_counts.get(device)
        if count is None:
            count = driver.sm_count(device)
            self._sm_counts[device] = count
        return count

    def record(self, key: str, arch: str) -> PointRecord:
        """The record of (point key, arch), as the index holds it (checking the arch's records
        first: check_records)."""
        if not isinstance(key, str):
            raise ArgumentError(f"record(): a point key is a string, got {type(key).__name__} "
                                f"{key!r:.60}")
        if not isinstance(arch, str):
            raise ArgumentError(f"record(): the arch is a name such as 'sm_90a' (this bundle: "
                                f"{', '.join(self.archs) or 'no arch'}), got "
                                f"{type(arch).__name__} {arch!r:.60}")
        self.check_records(arch)
        record = self._records.get((key, arch))
        if record is None:
            archs = self._archs_of(key)
            raise KernelNotFoundError(f"{key!s:.200}", [],
                                      f"the bundle has it for {archs} only" if archs else "")
        return record

    def _archs_of(self, key: str) -> list[str]:
        return sorted(a for k, a in self._points if k == key)

    def preload(self, device: int | None = None, *, threads: int | None = None) -> int:
        """Load every kernel for `device` (default: torch's current device) now, for warmup:
        verify each variant's artifact (verified_image) and load it into the device's context.
        With `threads` > 1, `threads - 1` helper threads verify the artifacts ahead, in order,
        while the calling thread hands each verified image to the driver; with 1, the calling
        thread does both. Default: PRELOAD_THREADS (1; see there why). Holds the bundle's
        lock throughout; the first error in (point, variant) order is raised, after every
        other variant was tried and what loaded was kept. Returns the number of kernel
        entries loaded."""
        import torch

        if threads is None:
            threads = PRELOAD_THREADS
        elif isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ArgumentError(f"preload(): threads must be a positive int (got {threads!r})")
        if not torch.cuda.is_available():
            raise DeviceError(
                "preload(): no usable CUDA device (torch.cuda.is_available() is False); run on a "
                "GPU machine with a driver, or skip preloading where there is none"
            )
        count = torch.cuda.device_count()
        if device is None:
            device = torch.cuda.current_device()
        elif isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < count:
            raise ArgumentError(
                f"preload(): the device must be a CUDA device index in [0, {count}) (got "
                f"{device!r})"
            )
        arch = self.arch_for_device(device)
        # One switch to the device's context for every load (not one per variant).
        with self._lock, torch.cuda.device(device):
            driver.make_primary_context_current(device)
            todo = [t for t in self._variants(arch) if (device, *t) not in self._device_kernels]
            error = None
            with closing(_in_order(self.verified_image, todo, threads - 1)) as verified:
                for task, (ok, result) in zip(todo, verified):
                    if ok:
                        try:
                            self._device_kernels[(device, *task)] = self._load_variant(
                                result, device, *task)
                            continue
                        except Exception as exc:
                            result = exc
                    if error is None:
                        error = result
            if error is not None:
                raise error
            return sum(len(self._device_kernels[(device, *t)]) for t in self._variants(arch))

    def describe(self) -> dict:
        """What `rose-aot inspect --json` prints: a summary of the index (no artifacts), of
        every arch's checked records (check_records)."""
        self.check_records()
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



def _in_order(work, tasks: list[tuple], helpers: int, lookahead: int = PRELOAD_LOOKAHEAD):
    """(True, work(*task)) or (False, the exception it raised) for each task, yielded in task
    order as soon as it is ready, while `helpers` threads (0: none, the caller's thread works)
    work ahead, at most `lookahead` tasks past the outcome the caller holds (so at most that
    many results wait in memory). Preload's pipeline: the helpers verify artifacts (zstd
    and sha256 run without the GIL) while the caller's driver loads run. Closing the generator
    early lets the helpers finish the task they hold and start no other; it returns once they
    have stopped."""
    if helpers <= 0 or len(tasks) <= 1:
        for task in tasks:
            try:
                yield True, work(*task)
            except Exception as exc:
                yield False, exc
        return
    outcomes: list = [None] * len(tasks)
    ready = [threading.Event() for _ in tasks]
    pending = iter(range(len(tasks)))
    take = threading.Lock()
    # One slot per task started whose outcome the caller has not yet taken and finished with.
    slots = threading.Semaphore(max(1, lookahead))
    stop = False

    def worker() -> None:
        while True:
            slots.acquire()
            if stop:
                return
            with take:
                i = next(pending, None)
            if i is None:
                return
            try:
                outcomes[i] = (True, work(*tasks[i]))
            except BaseException as exc:  # handed to the caller, who raises it
                outcomes[i] = (False, exc)
            ready[i].set()

    threads = [threading.Thread(target=worker, name=f"rose-aot verify {n}", daemon=True)
               for n in range(min(helpers, len(tasks)))]
    for t in threads:
        t.start()
    try:
        for i in range(len(tasks)):
            ready[i].wait()
            outcome, outcomes[i] = outcomes[i], None  # the caller keeps what it needs
            yield outcome
            slots.release()  # the caller is done with it (for preload: the driver has it)
    finally:
        stop = True
        for _ in threads:  # wakes a helper waiting for a slot: it sees `stop` and returns
            slots.release()
        for t in threads:
            t.join()


class KernelHandle:
    """A callable kernel point. Call with torch tensors (and Python numbers for scalar
    arguments) in the family's argument order.

    Everything comes from the point's record for the device's arch: argument checks, parameter
    packing, block, shared memory and launch attributes. The family's plan adds only the grid
    and the variant for the runtime sizes and the device's SM count. The hot path: one pass of
    cheap checks over the arguments (the detailed checker runs only when one fails, to raise a
    precise error), a dict lookup of the plan already resolved for (device, sizes), one struct
    pack per launch and the driver call (through the API `driver.launch_api()` chose when the
    size was resolved).

    Making a handle generates no code: an arch's checks, parameter buffers and hot path are
    built when a device of that arch first runs the handle, a launcher when a size is first
    resolved.
    """

    def __init__(self, bundle: KernelBundle, family, config):
        self.bundle = bundle
        self.family = family
        self.config = config
        self.key = family.key(config)
        # The archs the bundle has this point for; an arch's state (`_arch`: its record, where
        # each plan size is read from...) is built when it is first used.
        self._archs = bundle._archs_of(self.key)
        # Per arch: (record, binder, packers by variant, size sources).
        self._arch_state: dict[str, tuple] = {}
        self._raw_stream = _stream_getter()
        # Per arch: the launchers resolved for (device, *sizes), which the generated hot path
        # (ArgBinder.compile_fast_launch) looks up.
        self._launchers: dict[str, dict[tuple, object]] = {}
        self._device_state: dict[int, tuple] = {}
        self._device_arch: dict[int, str] = {}
        # The hot path: that of the first arch a device used (a process with GPUs of two archs
        # takes the checked path on the second; its launchers are in another arch's dict).
        self._fast_launch = _refuse
        self._fast_arch: str | None = None
        self._factories: dict[tuple, object] = {}  # (arch, variants, APIs) -> launcher factory
        self._workspaces: dict[tuple[int, int], list] = {}
        self._workspace_ptrs: dict[tuple[int, int], tuple[int, ...]] = {}
        self._resolved: dict[tuple, tuple] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"KernelHandle({self.key}, bundle={self.bundle.path})"

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self._any_state[0].args)

    @property
    def _has_workspace(self) -> bool:
        return bool(self._any_state[0].workspace)

    def record(self, device: int) -> PointRecord:
        """The record this handle launches from on `device`."""
        return self._state(device)[0]

    def _arch(self, arch: str) -> tuple:
        """(record, binder, packers by variant, size sources) of one arch, built on first use:
        the argument checks' text and one parameter buffer per variant."""
        state = self._arch_state.get(arch)
        if state is None:
            with self._lock:
                state = self._arch_state.get(arch)
                if state is None:
                    record = self.bundle.record(self.key, arch)
                    sources = [_size_source(record.args, size) for size in self.family.size_names]
                    positions = {a.name: i for i, a in enumerate((*record.args, *record.workspace))}
                    packers = {v.name: ParamPacker(positions, v.params) for v in record.variants}
                    state = (record, ArgBinder(self.key, record.args, sources), packers, sources)
                    self._launchers[arch] = {}
                    self._arch_state[arch] = state
        return state

    @property
    def _any_state(self) -> tuple:
        """The state of an arch this handle has, one a device used where there is one (checks
        that need no device)."""
        return self._arch(self.bundle._preferred_arch(self._archs))

    @property
    def _any_binder(self) -> ArgBinder:
        return self._any_state[1]

    def _state(self, device: int) -> tuple:
        state = self._device_state.get(device)
        if state is None:
            arch = self.bundle.arch_for_device(device)
            if arch not in self._archs:
                raise KernelNotFoundError(
                    self.key, [], f"the bundle has it for {self.bundle._archs_of(self.key)} but "
                    f"cuda:{device} needs {arch}"
                )
            arch_state = self._arch(arch)
            state = (*arch_state, self.bundle.sm_count(device))
            with self._lock:
                self._device_state[device] = state
                self._device_arch[device] = arch
                if self._fast_arch is None:
                    self._fast_arch = arch
                    binder = arch_state[1]
                    self._fast_launch = binder.compile_fast_launch(self._launchers[arch],
                                                                   self._raw_stream)
        return state

    def _binder_for(self, values: tuple):
        """The binder of the first argument's device (arch-specific alignment), else any."""
        first = values[0] if values else None
        device = first.get_device() if hasattr(first, "get_device") else -1
        if device >= 0:
            return self._state(device)[1]
        return self._any_binder

    def check_meta(self, args) -> None:
        """Check dtypes, shapes and strides as a launch would, touching no memory and no
        device (fake and meta tensors: torch.compile's fake implementation)."""
        first = args[0] if args else None
        device = getattr(first, "device", None)
        if device is not None and device.type == "cuda":
            binder = self._state(device.index or 0)[1]
        else:
            binder = self._any_binder
        binder.bind(tuple(args), meta=True)

    def plan(self, *args, variant: str | None = None):
        """The launches a call with these arguments would issue (nothing is launched)."""
        dims, _, device = self._binder_for(args).bind(args)
        record, _, _, _, sm_count = self._state(device)
        if variant is not None:
            self.bundle.check_forced_plans(self.key, self._device_arch[device])
        sizes = {n: dims[n] for n in self.family.size_names}
        return self._plan(record, sizes, sm_count, variant)

    def _plan(self, record: PointRecord, sizes: dict, sm_count: int, variant: str | None):
        """The family's plan on the record, each launch's variant and entry looked up in it.
        The record check at the arch's first use runs the plan at the family's sample sizes;
        a branch those do not reach, misreading a crafted record, raises the same BundleError
        here instead of a KeyError at a launch."""
        try:
            return _plan_in_record(self.family, self.config, record.by_name, sizes, sm_count,
                                   variant)
        except (KeyError, IndexError, TypeError) as exc:
            if isinstance(exc, RoseAotError):
                raise
            raise BundleError(
                f"{self.bundle.path}: this rose-aot's {self.family.name} launch plan does not "
                f"understand the record of point {self.key!r:.200} at {sizes} "
                f"({type(exc).__name__}: {exc}); {_REBUILD} from this rose-aot version"
            ) from None

    def _resolve(self, device: int, sizes: tuple, variant: str | None) -> tuple:
        """The plan for (device, sizes): per launch (packer, variant name, prepared driver
        launch: function, grid, block, shared memory and attributes from the record)."""
        record, _, packers, _, sm_count = self._state(device)
        if variant is not None:
            self.bundle.check_forced_plans(self.key, self._device_arch[device])
        plan = self._plan(record, dict(zip(self.family.size_names, sizes)), sm_count, variant)
        resolved = []
        for launch in plan:
            v = record.variant(launch.variant)
            kernel = self.bundle.device_kernels(device, self.key, launch.variant)[launch.entry]
            # Programmatic dependent launch for launches of up to the record's `pdl` threads.
            threads = launch.grid[0] * launch.grid[1] * launch.grid[2] * v.threads
            pdl = 0 < threads <= v.pdl and settings.pdl_enabled()
            prepared = driver.PreparedLaunch(
                int(kernel), launch.grid, v.block, v.smem, pdl=pdl, cooperative=v.cooperative,
                cluster=v.cluster,
            )
            resolved.append((packers[launch.variant], launch.variant, prepared))
        resolved = tuple(resolved)
        if len(self._resolved) > 1024:  # bound the cache for engines with unbounded sizes
            self._forget_resolved()
        self._resolved[(device, sizes, variant)] = resolved
        if variant is None:  # the hot path runs the plan's own choice only
            arch = self._device_arch[device]
            self._launchers[arch][(device, *sizes)] = self._launcher(device, arch, resolved)
        return resolved

    def _forget_resolved(self) -> None:
        """Drop every resolved plan and launcher: the next call of each size resolves again
        (with the driver API `driver.launch_api()` chooses then)."""
        self._resolved.clear()
        for launchers in self._launchers.values():
            launchers.clear()  # in place: the generated hot path holds these dicts

    def _launcher(self, device: int, arch: str, resolved: tuple):
        """`go(stream, *atoms)`: the resolved launches as one call. Through the C launch path
        where every launch takes the "native" API and the point has no workspace: a plan of
        its own buffers, packed and launched in C (driver.native_launcher). Otherwise one
        generated function (every parameter buffer packed, then per launch the driver called
        on the stream, under the handle's lock), generated once per (arch, variants, driver
        APIs) and bound here to this plan's buffers and prepared launches."""
        names = tuple(name for _, name, _ in resolved)
        apis = tuple(prepared.api for _, _, prepared in resolved)
        fail = partial(self._launch_failed, names)
        if not self._has_workspace and all(api == "native" for api in apis):
            _, binder, _, _ = self._arch(arch)
            launches = [
                prepared.native_launch(packer.buffer_size, packer.offsets,
                                       packer.native_fields(binder.atom_names, len(binder.args)))
                for packer, _name, prepared in resolved
            ]
            return driver.native_launcher(launches, binder.atom_count, fail)
        make = self._factories.get((arch, names, apis))
        if make is None:
            record, binder, packers, _ = self._arch(arch)
            fields = [packers[n].exprs(binder.atom_names, len(record.args)) for n in names]
            make = _launcher_factory(self.key, fields, binder.atom_count, bool(record.workspace),
                                     apis)
            self._factories[(arch, names, apis)] = make
        bound = []
        for packer, _name, prepared in resolved:
            bound += [packer.struct.pack_into, packer.buffer, prepared.config,
                      prepared.bind(packer.address), packer.address]
        scratch = partial(self._scratch, device) if self._has_workspace else None
        return make(self._lock.acquire, self._lock.release, fail, scratch, driver.STREAM_OBJECTS,
                    driver.stream_object, *bound)

    def _launch_failed(self, names: tuple, code: int, index: int):
        driver.raise_launch_error(code, f"launching {self.key} ({names[index]})")

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
                for a in self._state(device)[0].workspace
            ]
            self._workspaces[key] = tensors
        return tensors

    def __call__(self, *args, variant: str | None = None) -> None:
        """Launch on torch's current stream of the tensors' device. `variant` forces one variant
        of the launch plan (for tests and benchmarks); by default the plan picks from the sizes.

        The hot path for a repeated call is one generated function
        (`ArgBinder.compile_fast_launch`): the checks, a dict lookup of the launcher resolved
        for (device, sizes), and that launcher's packs, stream writes and driver calls. A call
        it does not take (first call of a size, a forced variant, a failed check) runs the
        checked path."""
        if variant is None:
            try:
                if self._fast_launch(args):
                    return None
            except (struct.error, OverflowError):  # a value outside its C field (an int32
                pass  # extent...): nothing was launched; the checked path raises the precise error
        return self._call_checked(args, variant)

    def _call_checked(self, args, variant) -> None:
        """The launch of a call the hot path did not take: the full checks either raise the
        precise ArgumentError or accept the call. A well-formed call of a new size then runs
        through the launcher just resolved for it (so every plan-chosen launch, the first
        included, runs the generated code); a forced variant or an unusual but valid form
        (size-1 extents with any stride) is packed from the checked dims."""
        binder = self._binder_for(args)
        dims, values, device = binder.bind(args)
        if binder is not self._state(device)[1]:  # checked before the device was known
            dims, values, device = self._state(device)[1].bind(args)
        sizes = tuple(dims[n] for n in self.family.size_names)
        launches = self._resolved.get((device, sizes, variant))
        if launches is None:
            launches = self._resolve(device, sizes, variant)
        if variant is None and self._fast_launch(args):
            return None  # the generated launcher resolved just now ran it, as later calls will
        stream = self._raw_stream(device)
        if self._has_workspace:
            values = [*values, *self._scratch(device, stream)]
        with self._lock:
            for packer, name, prepared in launches:
                code = prepared(stream, packer.pack(packer.values(values, dims)))
                if code:
                    driver.raise_launch_error(code, f"launching {self.key} ({name})")

    def _scratch(self, device: int, stream: int) -> tuple[int, ...]:
        scratch = self._workspace_ptrs.get((device, stream))
        if scratch is None:
            scratch = tuple(t.data_ptr() for t in self.workspace(device, stream))
            self._workspace_ptrs[(device, stream)] = scratch
        return scratch


def _refuse(values):
    """The hot path before any device is known: refuse, so the checked path runs."""
    return False


def _launcher_factory(owner: str, fields: list[list[str]], atoms: int, workspace: bool,
                      apis: tuple[str, ...] | None = None):
    """Generate `make(acquire, release, fail, scratch, streams, new_stream, *per launch:
    pack_into, buffer, config, call, kernel_params)` returning `go(stream, a0, a1, ...)` for a
    plan of `len(fields)` launches; `fields[j]` are launch j's parameter expressions
    (ArgBinder.atom_names, workspace `ws[k]`), `apis[j]` its driver API (driver.LAUNCH_APIS;
    default "ctypes-ex"), which says how `config` and `call` are used (driver.PreparedLaunch).
    `streams` caches the driver's stream objects the "bindings" APIs take (`new_stream` makes
    one). Every buffer is packed before the first driver call, so a value that does not fit its
    field (struct.error) launches nothing; the lock is released whatever is raised."""
    # "native" launches that reach here (a point with workspace) go through ctypes, as their
    # PreparedLaunch does on the checked path.
    apis = tuple("ctypes-ex" if api == "native" else api
                 for api in (apis or ("ctypes-ex",) * len(fields)))
    slots = "".join(f", P{j}, B{j}, C{j}, L{j}, A{j}" for j in range(len(fields)))
    params = "".join(f", a{i}" for i in range(atoms))
    lines = [f"def make(acquire, release, fail, scratch, streams, new_stream{slots}):",
             f"    def go(stream{params}):"]
    if workspace:
        lines.append("        ws = scratch(stream)")
    if any(api != "ctypes-ex" for api in apis):
        lines += ["        cs = streams.get(stream)",
                  "        if cs is None: cs = new_stream(stream)"]
    # acquire/release: half the cost of `with lock` (measured), same guarantee with finally
    lines += ["        acquire()", "        try:"]
    for j, exprs in enumerate(fields):
        lines.append(f"            P{j}(B{j}, 0, {''.join(e + ', ' for e in exprs)})")
    for j, api in enumerate(apis):
        if api == "ctypes-ex":
            lines += [f"            C{j}.hStream = stream", f"            code = L{j}()"]
        elif api == "bindings-ex":
            lines += [f"            C{j}.hStream = cs", f"            code = L{j}()[0]"]
        elif api == "bindings":
            lines.append(f"            code = L{j}(cs, A{j}, 0)[0]")
        else:
            raise ValueError(f"unknown launch API {api!r}")
        lines.append(f"            if code: fail(code, {j})")
    lines += ["        finally:", "            release()", "    return go"]
    env: dict = {}
    exec(compile("\n".join(lines), f"<rose_aot launcher {owner}>", "exec"), env)
    return env["make"]


def _stream_getter():
    """device -> torch's current raw CUDA stream (an int), through torch's C getter."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        return lambda device: torch.cuda.current_stream(device).cuda_stream
    return raw


def _size_source(args, size: str) -> tuple[int, int]:
    """(argument index, mode) of the first extent named `size`."""
    for i, a in enumerate(args):
        for m, d in enumerate(getattr(a, "shape", ())):
            if getattr(d, "name", None) == size:
                return i, m
    raise BundleError(f"no argument has an extent named {size!r}")
