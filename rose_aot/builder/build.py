"""The build: manifests -> (point, arch) work items -> cached or compiled artifacts -> one bundle.

Compiles run in a pool of spawned worker processes (each pays the DSL import once); the parent
never imports cutlass. Results are cached on disk by content, so a rebuild with nothing changed
compiles nothing. The bundle is written only once every item has succeeded.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import multiprocessing
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

__all__ = ["WorkItem", "ItemResult", "BuildSummary", "plan_items", "build_bundle", "ArtifactCache"]

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
    except RoseAotError:
        raise
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
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=max(1, min(jobs, len(items))), mp_context=ctx) as pool:
        futures = {pool.submit(_compile_task, item): item for item in items}
        try:
            for fut in cf.as_completed(futures):
                variants, seconds = fut.result()
                on_done(futures[fut], variants, seconds)
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _variant_record(family, item: WorkItem, variant_spec, compiled: dict) -> dict:
    args = {a.name: a for a in family.args(item.config)}
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
    if not manifests:
        raise BuildError("(build)", "-", "no manifests given")
    toolchain = toolchain_versions()
    items = plan_items(manifests, archs)
    families = sorted({i.family for i in items})
    source_digests = {name: get_family(name).source_digest() for name in families}
    keys = {item: _cache_key(item, toolchain, source_digests) for item in items}

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
        hit = cache.get(keys[item]) if cache else None
        if hit is not None:
            record(item, hit, 0.0, True)
        else:
            misses.append(item)

    def compiled(item, variants, seconds):
        if cache:
            cache.put(keys[item], variants)
        record(item, variants, seconds, False)

    if misses:
        _run_pool(misses, jobs, compiled)

    index, blobs = _assemble(manifests, items, results, toolchain, source_digests, archs)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    size = write_bundle(output, index, blobs)
    summary = BuildSummary(output, [results[i] for i in items], time.perf_counter() - start, size)
    return summary


def _assemble(manifests, items, results, toolchain, source_digests, archs):
    blobs: dict[str, bytes] = {}
    points = []
    headers = set()
    elf_abis = {}
    for item in items:
        family = get_family(item.family)
        specs = {v.name: v for v in family.variants(item.config, get_arch(item.arch))}
        variants = []
        for compiled in results[item].variants:
            record = _variant_record(family, item, specs[compiled["name"]], compiled)
            base = f"{item.key}@{item.arch}/{compiled['name']}"
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
            **toolchain,
            "ptx_isa": ptx_isa,
            "compiler": compiler,
            "cubin_elf_abi": dict(sorted(elf_abis.items())),
        },
        "archs": sorted({i.arch for i in items}),
        "manifests": [
            {
                "name": m.name,
                "digest": m.digest,
                "archs": list(archs or m.archs),
                "points": sorted({p.key for p in m.points}),
            }
            for m in sorted(manifests, key=lambda m: m.name)
        ],
        "families": {name: {"source_digest": d} for name, d in sorted(source_digests.items())},
        "points": points,
    }
    return index, blobs
