"""The build: manifests -> (point, arch) work items -> cached or compiled artifacts -> one bundle.

Compiles run in a pool of spawned worker processes (each pays the DSL import once); the parent
never imports cutlass. Results are cached on disk by content, so a rebuild with nothing changed
compiles nothing. The bundle is written only once every item has succeeded.

Everything that decides a bundle's bytes apart from the artifacts themselves is one
:class:`BuildPlan` (manifests, items, toolchain, kernel source digests): an unsharded build and a
merge of shards (``builder/shard.py``) both feed a plan and the compiled items to the same
:func:`_assemble`, which is what makes a merged bundle byte-identical to an unsharded one.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..archs import get_arch
from ..bundle import BundleReader, write_bundle
from ..errors import BuildError, BundleError, RoseAotError
from ..kernels import config_json, get_family, point_key
from ..kernels.spec import param_fields
from .ptx import ptx_header
from .toolchain import cubin_elf_abi, toolchain_versions

__all__ = [
    "WorkItem",
    "ItemResult",
    "BuildSummary",
    "ManifestRecord",
    "BuildPlan",
    "plan_items",
    "build_bundle",
    "compile_items",
    "write_plan_bundle",
    "ArtifactCache",
]

BUNDLE_KIND = "rose-aot kernel bundle"
_CACHE_FORMAT = 1


@dataclass(frozen=True)
class WorkItem:
    family: str
    config: Any
    arch: str

    @property
    def key(self) -> str:
        return point_key(self.family, self.config)


@dataclass
class ItemResult:
    item: WorkItem
    variants: list[dict]  # see _variant_record; "ptx" and "cubin" hold the artifacts
    seconds: float
    cached: bool


@dataclass
class BuildSummary:
    output: Path
    items: list[ItemResult] = field(default_factory=list)
    seconds: float = 0.0
    bundle_bytes: int = 0
    plan: BuildPlan | None = None
    shard: tuple[int, int] | None = None  # (index, count), 1-based, for a shard file

    @property
    def points(self) -> int:
        return len({r.item.key for r in self.items})

    @property
    def compiled(self) -> int:
        return sum(not r.cached for r in self.items)

    @property
    def cached(self) -> int:
        return sum(r.cached for r in self.items)


def plan_items(manifests, archs: tuple[str, ...] | None = None) -> list[WorkItem]:
    """Every distinct (point, arch) of the manifests, in a stable order."""
    items = set()
    for manifest in manifests:
        for arch in archs or manifest.archs:
            get_arch(arch)
            for point in manifest.points:
                items.add(WorkItem(point.family, point.config, arch))
    return sorted(items, key=lambda i: (i.family, i.key, i.arch))


@dataclass(frozen=True)
class ManifestRecord:
    """What a bundle records of one manifest: name, file digest, the archs built, point keys."""

    name: str
    digest: str
    archs: tuple[str, ...]
    points: tuple[str, ...]  # sorted point keys

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "digest": self.digest,
            "archs": list(self.archs),
            "points": list(self.points),
        }


@dataclass(frozen=True)
class BuildPlan:
    """Every input of a bundle except the compiled artifacts.

    Two builds with equal plans (equal :attr:`digest`) and equal artifacts write the same bytes.
    A shard file carries its plan as JSON so that a merge needs neither the manifests nor the
    compiler: :meth:`from_json` rebuilds the configs through each family's ``make_config``.
    """

    manifests: tuple[ManifestRecord, ...]  # sorted by name
    items: tuple[WorkItem, ...]  # sorted as plan_items sorts them
    toolchain: dict  # toolchain_versions(): DSL packages and CUDA flavour
    source_digests: dict[str, str]  # family -> source digest, for the families of `items`

    @classmethod
    def from_manifests(cls, manifests, archs: tuple[str, ...] | None = None) -> BuildPlan:
        if not manifests:
            raise BuildError("(build)", "-", "no manifests given")
        toolchain = toolchain_versions()
        items = tuple(plan_items(manifests, archs))
        families = sorted({i.family for i in items})
        records = tuple(
            ManifestRecord(
                m.name, m.digest, tuple(archs or m.archs), tuple(sorted({p.key for p in m.points}))
            )
            for m in sorted(manifests, key=lambda m: m.name)
        )
        return cls(
            records,
            items,
            toolchain,
            {name: get_family(name).source_digest() for name in families},
        )

    def to_json(self) -> dict:
        return {
            "manifests": [m.to_json() for m in self.manifests],
            "items": [
                {"family": i.family, "config": config_json(i.config), "arch": i.arch}
                for i in self.items
            ],
            "toolchain": self.toolchain,
            "source_digests": dict(sorted(self.source_digests.items())),
        }

    @classmethod
    def from_json(cls, data: Any) -> BuildPlan:
        """The plan a shard recorded. Raises ConfigError/KeyError/TypeError/ValueError on a plan
        this rose-aot cannot read (the caller names the file)."""
        manifests = tuple(
            ManifestRecord(
                str(m["name"]), str(m["digest"]), tuple(m["archs"]), tuple(m["points"])
            )
            for m in data["manifests"]
        )
        items = []
        for entry in data["items"]:
            family = get_family(entry["family"])
            get_arch(entry["arch"])
            items.append(
                WorkItem(family.name, family.make_config(**entry["config"]), entry["arch"])
            )
        toolchain = data["toolchain"]
        sources = data["source_digests"]
        if not isinstance(toolchain, dict) or not isinstance(sources, dict):
            raise TypeError("toolchain and source_digests must be objects")
        return cls(manifests, tuple(items), toolchain, dict(sources))

    @property
    def digest(self) -> str:
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def shard_items(self, index: int, count: int) -> tuple[WorkItem, ...]:
        """Shard `index` of `count` (1-based): every count-th item of the sorted plan, starting
        at index - 1. Round robin over the sorted order spreads each family over the shards."""
        if not 1 <= index <= count:
            raise ValueError(f"shard {index}/{count}: the index must be between 1 and {count}")
        return self.items[index - 1 :: count]

    def cache_key(self, item: WorkItem) -> str:
        return _cache_key(item, self.toolchain, self.source_digests)


def _cache_key(item: WorkItem, toolchain: dict, source_digests: dict[str, str]) -> str:
    blob = json.dumps(
        {
            "cache_format": _CACHE_FORMAT,
            "family": item.family,
            "config": config_json(item.config),
            "arch": item.arch,
            "source": source_digests[item.family],
            "toolchain": toolchain,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


class ArtifactCache:
    """Compiled variants on disk, one small verified container file per cache key.

    Entries are written atomically; a damaged entry counts as a miss and is rebuilt.
    """

    def __init__(self, root: Path):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.rosecache"

    def get(self, key: str) -> list[dict] | None:
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            reader = BundleReader.open(path)
            variants = reader.index["variants"]
            for v in variants:
                v["ptx"] = reader.blob(f"{v['name']}.ptx").decode()
                v["cubin"] = reader.blob(f"{v['name']}.cubin")
            return variants
        except (BundleError, KeyError, TypeError, UnicodeDecodeError):
            return None

    def put(self, key: str, variants: list[dict]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = [{k: v for k, v in var.items() if k not in ("ptx", "cubin")} for var in variants]
        blobs = {}
        for v in variants:
            blobs[f"{v['name']}.ptx"] = v["ptx"].encode()
            blobs[f"{v['name']}.cubin"] = v["cubin"]
        write_bundle(path, {"variants": meta}, blobs)


def _compile_task(item: WorkItem) -> tuple[list[dict], float]:
    """Worker entry point. Any failure becomes a BuildError that names the point."""
    from .compile import compile_point

    start = time.perf_counter()
    try:
        compiled = compile_point(item.family, item.config, item.arch)
    except BuildError:
        raise
    except RoseAotError as exc:  # e.g. a ConfigError from the family code: name the point
        raise BuildError(item.key, item.arch, str(exc)) from None
    except Exception as exc:  # the DSL raises many types; keep its message
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        raise BuildError(item.key, item.arch, detail) from None
    return [
        {
            "name": c.name,
            "entries": c.entries,
            "param_sizes": c.param_sizes,
            "ptx": c.ptx,
            "cubin": c.cubin,
            "compile_seconds": round(c.seconds, 3),
        }
        for c in compiled
    ], time.perf_counter() - start


ProgressFn = Callable[[int, int, ItemResult], None]


def _run_pool(items: list[WorkItem], jobs: int, on_done: Callable[[WorkItem, list, float], None]):
    """Compile `items` in spawned worker processes. Workers die with the parent (SIGKILL
    included: see _worker_init); SIGTERM/SIGINT or any error kills them at once instead of
    waiting for the compiles in flight, so a killed build leaves no process behind."""
    ctx = multiprocessing.get_context("spawn")
    pool = cf.ProcessPoolExecutor(
        max_workers=max(1, min(jobs, len(items))),
        mp_context=ctx,
        initializer=_worker_init,
        initargs=(os.getpid(),),
    )
    restore = _raise_on_sigterm()
    try:
        futures = {pool.submit(_compile_task, item): item for item in items}
        for fut in cf.as_completed(futures):
            variants, seconds = fut.result()
            on_done(futures[fut], variants, seconds)
    except _Terminated as exc:
        _kill_pool(pool)
        raise SystemExit(128 + exc.signum) from None
    except BaseException:
        _kill_pool(pool)
        raise
    finally:
        restore()
    pool.shutdown(wait=True)  # every worker is idle now


class _Terminated(BaseException):
    """SIGTERM arrived in the parent while the pool ran."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_on_sigterm() -> Callable[[], None]:
    """Turn SIGTERM into an exception while the pool runs (only the main thread can)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise _Terminated(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _kill_pool(pool: cf.ProcessPoolExecutor) -> None:
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        try:
            process.kill()
        except (OSError, ValueError, AttributeError):
            pass
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        try:
            process.join(timeout=2)
        except (OSError, ValueError, AssertionError):
            pass


def _worker_init(parent_pid: int) -> None:
    """Runs first in each worker: ignore SIGINT (the parent decides and kills the pool; a Ctrl-C
    reaches the whole process group) and exit when the parent dies, however it dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)

    def watch():  # portable fallback, and covers a parent that died between fork and prctl
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="rose-aot-parent-watch", daemon=True).start()


def _variant_record(family, item: WorkItem, variant_spec, compiled: dict) -> dict:
    args = {a.name: a for a in family.kernel_args(item.config)}
    return {
        "name": variant_spec.name,
        "entries": list(compiled["entries"]),
        "block": list(variant_spec.block),
        "smem": variant_spec.smem,
        "params": list(variant_spec.params),
        "param_sizes": compiled["param_sizes"],
        "param_layouts": [[f.to_json() for f in param_fields(args[p])] for p in variant_spec.params],
        "constants": dict(sorted(variant_spec.constants.items())),
    }


def compile_items(
    plan: BuildPlan,
    items,
    *,
    jobs: int = 1,
    cache: ArtifactCache | None = None,
    progress: ProgressFn | None = None,
) -> dict[WorkItem, ItemResult]:
    """Compile (or take from the cache) each of `items`, a subset of the plan's items."""
    items = list(items)
    results: dict[WorkItem, ItemResult] = {}
    done = 0

    def record(item, variants, seconds, cached):
        nonlocal done
        done += 1
        results[item] = ItemResult(item, variants, seconds, cached)
        if progress:
            progress(done, len(items), results[item])

    misses = []
    for item in items:
        hit = cache.get(plan.cache_key(item)) if cache else None
        if hit is not None:
            record(item, hit, 0.0, True)
        else:
            misses.append(item)

    def compiled(item, variants, seconds):
        if cache:
            cache.put(plan.cache_key(item), variants)
        record(item, variants, seconds, False)

    if misses:
        _run_pool(misses, jobs, compiled)
    return results


def build_bundle(
    manifests,
    output: Path,
    *,
    archs: tuple[str, ...] | None = None,
    jobs: int = 1,
    cache: ArtifactCache | None = None,
    progress: ProgressFn | None = None,
) -> BuildSummary:
    """Build one bundle covering `manifests`. Raises BuildError; writes nothing on failure."""
    start = time.perf_counter()
    plan = BuildPlan.from_manifests(manifests, archs)
    results = compile_items(plan, plan.items, jobs=jobs, cache=cache, progress=progress)
    size = write_plan_bundle(plan, results, output)
    return BuildSummary(
        Path(output),
        [results[i] for i in plan.items],
        time.perf_counter() - start,
        size,
        plan,
    )


def write_plan_bundle(plan: BuildPlan, results: dict[WorkItem, ItemResult], output) -> int:
    """Assemble the bundle of `plan` from a result for every item and write it atomically."""
    index, blobs = _assemble(plan, results)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    return write_bundle(output, index, blobs)


def _assemble(plan: BuildPlan, results: dict[WorkItem, ItemResult]):
    blobs: dict[str, bytes] = {}
    points = []
    headers = set()
    elf_abis = {}
    for item in plan.items:
        family = get_family(item.family)
        specs = {v.name: v for v in family.variants(item.config, get_arch(item.arch))}
        variants = []
        for compiled in results[item].variants:
            record = _variant_record(family, item, specs[compiled["name"]], compiled)
            base = artifact_base(item, compiled["name"])
            record["cubin"] = base + ".cubin"
            record["ptx"] = base + ".ptx"
            blobs[record["cubin"]] = compiled["cubin"]
            blobs[record["ptx"]] = compiled["ptx"].encode()
            h = ptx_header(compiled["ptx"])
            headers.add((h["ptx_isa"], h["compiler"]))
            elf_abis[item.arch] = cubin_elf_abi(compiled["cubin"])
            variants.append(record)
        points.append(
            {
                "key": item.key,
                "family": item.family,
                "config": config_json(item.config),
                "arch": item.arch,
                "variants": variants,
            }
        )
    (ptx_isa, compiler), *others = sorted(headers, key=str)
    if others:
        raise BuildError("(bundle)", "-", f"artifacts come from several compilers: {headers}")
    index = {
        "kind": BUNDLE_KIND,
        "toolchain": {
            **plan.toolchain,
            "ptx_isa": ptx_isa,
            "compiler": compiler,
            "cubin_elf_abi": dict(sorted(elf_abis.items())),
        },
        "archs": sorted({i.arch for i in plan.items}),
        "manifests": [m.to_json() for m in plan.manifests],
        "families": {
            name: {"source_digest": d} for name, d in sorted(plan.source_digests.items())
        },
        "points": points,
    }
    return index, blobs


def artifact_base(item: WorkItem, variant: str) -> str:
    """Blob name of a variant's artifacts without the suffix: ``<key>@<arch>/<variant>``."""
    return f"{item.key}@{item.arch}/{variant}"
