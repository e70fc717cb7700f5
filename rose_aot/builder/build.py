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
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..archs import get_arch
from ..bundle import BundleReader, write_bundle
from ..errors import BuildError, BundleError, RoseAotError
from ..kernels import config_json, get_family, kernel_source_digest, point_key
from ..kernels.record import PointRecord
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
_CACHE_FORMAT = 2
_CACHE_KIND = "rose-aot cache entry"


class CacheWarning(UserWarning):
    """A cache entry did not match its key or its own record; it was ignored and rebuilt."""


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
    record: PointRecord  # the checked launch facts, exactly as the bundle index will hold them
    variants: list[dict]  # per variant, in record order: name, ptx, cubin, compile_seconds
    seconds: float
    cached: bool

    def check_artifacts(self) -> None:
        """Raise ValueError unless every variant's artifacts are the ones its record names
        (sha256) and the cubin agrees with the record (entries, block, parameters)."""
        if [v["name"] for v in self.variants] != [r.name for r in self.record.variants]:
            raise ValueError("artifacts and record list different variants")
        for art, rec in zip(self.variants, self.record.variants):
            if hashlib.sha256(art["cubin"]).hexdigest() != rec.cubin_sha256:
                raise ValueError(f"variant {rec.name}: the cubin is not the one its record names")
            if hashlib.sha256(art["ptx"].encode()).hexdigest() != rec.ptx_sha256:
                raise ValueError(f"variant {rec.name}: the PTX is not the one its record names")
            rec.check_cubin(art["cubin"])


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
            {name: kernel_source_digest() for name in families},
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
    """Compiled points on disk, one small verified container file per cache key.

    An entry holds its own key, the point's record and the artifacts. It is used only when the
    key it names is the key asked for and its artifacts are the ones its record names (sha256,
    and the cubin's entries, block and parameters); anything else is a miss (warned once) and
    is rebuilt. Entries are written atomically.
    """

    def __init__(self, root: Path):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.rosecache"

    def get(self, key: str, item: WorkItem) -> ItemResult | None:
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            reader = BundleReader.open(path)
            index = reader.index
            if index.get("kind") != _CACHE_KIND or index.get("cache_key") != key:
                raise ValueError(f"it was written for key {str(index.get('cache_key'))[:16]}...")
            record = PointRecord.from_json(index["record"])
            variants = [
                {
                    "name": v["name"],
                    "compile_seconds": v["compile_seconds"],
                    "ptx": reader.blob(f"{v['name']}.ptx").decode("ascii"),
                    "cubin": reader.blob(f"{v['name']}.cubin"),
                }
                for v in index["variants"]
            ]
            result = ItemResult(item, record, variants, 0.0, True)
            result.check_artifacts()
            return result
        except (BundleError, KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
            warnings.warn(
                f"ignoring cache entry {path}: {exc}; compiling {item.key} for {item.arch} again",
                CacheWarning,
                stacklevel=2,
            )
            return None

    def put(self, key: str, result: ItemResult) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        index = {
            "kind": _CACHE_KIND,
            "cache_key": key,
            "record": result.record.to_json(),
            "variants": [
                {"name": v["name"], "compile_seconds": v["compile_seconds"]} for v in result.variants
            ],
        }
        blobs = {}
        for v in result.variants:
            blobs[f"{v['name']}.ptx"] = v["ptx"].encode()
            blobs[f"{v['name']}.cubin"] = v["cubin"]
        write_bundle(path, index, blobs)


def _compile_task(item: WorkItem) -> tuple[dict, list[dict], float]:
    """Worker entry point: (record JSON, artifacts per variant, seconds). Any failure becomes a
    BuildError that names the point."""
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
    variants = [
        {
            "name": v.name,
            "ptx": compiled.artifacts[v.name][0],
            "cubin": compiled.artifacts[v.name][1],
            "compile_seconds": round(compiled.seconds[v.name], 3),
        }
        for v in compiled.record.variants
    ]
    return compiled.record.to_json(), variants, time.perf_counter() - start


ProgressFn = Callable[[int, int, ItemResult], None]


def _run_pool(
    items: list[WorkItem], jobs: int, on_done: Callable[[WorkItem, PointRecord, list, float], None]
):
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
            record, variants, seconds = fut.result()
            on_done(futures[fut], PointRecord.from_json(record), variants, seconds)
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
    # Taken before shutdown, which drops the executor's reference to it.
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        try:
            process.join(timeout=2)
        except (OSError, ValueError, AssertionError):
            pass
    # Let the manager thread finish closing its wakeup pipe before the interpreter exits:
    # otherwise concurrent.futures' exit hook can write to the pipe while it is being closed
    # and print an "Exception ignored ... Bad file descriptor" traceback after the one-line
    # error (seen once in CI on a SIGINT'd build).
    if manager is not None:
        manager.join(timeout=2)


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

    def finish(result: ItemResult):
        nonlocal done
        done += 1
        results[result.item] = result
        if progress:
            progress(done, len(items), result)

    misses = []
    for item in items:
        hit = cache.get(plan.cache_key(item), item) if cache else None
        if hit is not None:
            finish(hit)
        else:
            misses.append(item)

    def compiled(item, record, variants, seconds):
        result = ItemResult(item, record, variants, seconds, False)
        if cache:
            cache.put(plan.cache_key(item), result)
        finish(result)

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
    return write_bundle(output, index, blobs, stored=driver_images(blobs))


def driver_images(blobs: dict[str, bytes]) -> set[str]:
    """The blobs a serving process's load hands the driver as they are: the cubins. A bundle
    stores them (STORED_ZSTD_LEVEL) instead of compressing them, as their decompression was
    most of the CPU time of a preload's verification (the PTX, a reported fallback, stays
    compressed)."""
    return {name for name in blobs if name.endswith(".cubin")}


def _assemble(plan: BuildPlan, results: dict[WorkItem, ItemResult]):
    blobs: dict[str, bytes] = {}
    points = []
    headers = set()
    elf_abis = {}
    for item in plan.items:
        result = results[item]
        point = result.record.to_json()
        for record, compiled in zip(point["variants"], result.variants):
            base = artifact_base(item, compiled["name"])
            record["cubin"] = base + ".cubin"
            record["ptx"] = base + ".ptx"
            blobs[record["cubin"]] = compiled["cubin"]
            blobs[record["ptx"]] = compiled["ptx"].encode()
            h = ptx_header(compiled["ptx"])
            headers.add((h["ptx_isa"], h["compiler"]))
            elf_abis[item.arch] = cubin_elf_abi(compiled["cubin"])
        points.append(
            {
                "key": item.key,
                "family": item.family,
                "config": config_json(item.config),
                "arch": item.arch,
                **point,
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
