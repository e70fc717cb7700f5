"""Sharded builds: N CI jobs each compile a deterministic 1/N of the items, one job merges.

A shard file is a bundle-format container (``write_bundle``: magic, verified JSON index, zstd
blobs) whose index says ``"kind": "rose-aot build shard"`` and holds:

- ``shard``: ``{"index": I, "count": N}`` (1-based);
- ``plan``: the whole :class:`BuildPlan` as JSON (manifests, every item of the unsharded build,
  toolchain, kernel source digests) and ``plan_digest``, its sha256;
- ``results``: one entry per item of this shard (its kernel record, compile seconds per variant,
  cached or not); the blobs are the artifacts, named as in a bundle
  (``<key>@<arch>/<variant>.cubin`` / ``.ptx``) and checked against the record on reading.

Shard I of N holds items ``I-1, I-1+N, I-1+2N, ...`` of the plan's sorted items. The merge checks
that every shard carries the same plan, that shards 1..N are each given exactly once and hold
exactly their items, and that the plan's kernel sources are this checkout's; then it feeds the
plan and the results to the same ``_assemble`` as an unsharded build, so the merged bundle is
byte-identical to ``rose-aot build`` of the same inputs. The merge needs no compiler.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ..bundle import BundleReader, write_bundle
from ..bundle.signing import check_signature
from ..errors import BundleError, ConfigError, ShardError
from ..kernels import get_family
from ..kernels.record import PointRecord
from .build import (
    BUNDLE_KIND,
    ArtifactCache,
    BuildPlan,
    BuildSummary,
    ItemResult,
    ProgressFn,
    WorkItem,
    _assemble,
    artifact_base,
    compile_items,
    driver_images,
)

__all__ = [
    "SHARD_KIND",
    "SHARD_SUFFIX",
    "Shard",
    "parse_shard_spec",
    "build_shard",
    "read_shard",
    "merge_shards",
    "default_shard_output",
]

SHARD_KIND = "rose-aot build shard"
SHARD_SUFFIX = ".roseshard"
_SPEC = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")
# A CI matrix of more jobs than this is a typo, not a fleet.
MAX_SHARDS = 1024
# Manifest names become file names (merge's default output build/<name>.rosebundle): the same
# pattern as rose_aot.manifest's names, so no name from a shard can leave build/.
_MANIFEST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def parse_shard_spec(text: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N) with 1 <= I <= N; raises ValueError with a message saying what to do."""
    m = _SPEC.fullmatch(str(text))
    if not m:
        raise ValueError(
            f"{text!r} is not a shard; write I/N, e.g. 1/3 for the first of three shards"
        )
    index, count = int(m.group(1)), int(m.group(2))
    if not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"{text!r}: the shard count must be between 1 and {MAX_SHARDS}")
    if not 1 <= index <= count:
        raise ValueError(
            f"{text!r}: shard index {index} is outside 1..{count}; shards are numbered from 1 to N"
        )
    return index, count


@dataclass(frozen=True)
class Shard:
    path: str
    index: int
    count: int
    plan: BuildPlan
    plan_json: dict
    plan_digest: str
    results: dict[WorkItem, ItemResult]

    @property
    def label(self) -> str:
        return f"{self.path} (shard {self.index}/{self.count})"


# --------------------------------------------------------------------------- building


def build_shard(
    manifests,
    output,
    index: int,
    count: int,
    *,
    archs: tuple[str, ...] | None = None,
    jobs: int = 1,
    cache: ArtifactCache | None = None,
    progress: ProgressFn | None = None,
) -> BuildSummary:
    """Compile shard `index` of `count` (1-based) of the build of `manifests` into a shard file."""
    start = time.perf_counter()
    parse_shard_spec(f"{index}/{count}")
    plan = BuildPlan.from_manifests(manifests, archs)
    items = plan.shard_items(index, count)
    results = compile_items(plan, items, jobs=jobs, cache=cache, progress=progress)
    records, blobs = [], {}
    for item in items:
        result = results[item]
        variants = []
        for v in result.variants:
            base = artifact_base(item, v["name"])
            blobs[base + ".cubin"] = v["cubin"]
            blobs[base + ".ptx"] = v["ptx"].encode()
            variants.append({k: v[k] for k in ("name", "compile_seconds")})
        records.append(
            {
                "key": item.key,
                "arch": item.arch,
                "seconds": round(result.seconds, 3),
                "cached": result.cached,
                "record": result.record.to_json(),
                "variants": variants,
            }
        )
    index_doc = {
        "kind": SHARD_KIND,
        "shard": {"index": index, "count": count},
        "plan": plan.to_json(),
        "plan_digest": plan.digest,
        "results": records,
    }
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    size = write_bundle(output, index_doc, blobs)
    return BuildSummary(
        output,
        [results[i] for i in items],
        time.perf_counter() - start,
        size,
        plan,
        (index, count),
    )


# --------------------------------------------------------------------------- reading


def read_shard(path, *, trusted_keys=None) -> Shard:
    """Open and verify one shard file. Raises ShardError (or BundleError for damaged bytes).
    With `trusted_keys`, the shard must be signed (`rose-aot sign SHARD`) by one of them."""
    path = os.fspath(path)
    reader = BundleReader.open(path)
    check_signature(reader, trusted_keys)
    index = reader.index
    kind = index.get("kind")
    if kind == BUNDLE_KIND:
        raise ShardError(
            f"{path}: is a finished bundle, not a build shard; merge takes the files that "
            "`rose-aot build --shard I/N` writes"
        )
    if kind != SHARD_KIND:
        raise ShardError(
            f"{path}: is not a rose-aot build shard (kind {str(kind)[:60]!r}); merge takes the "
            "files that `rose-aot build --shard I/N` writes"
        )
    try:
        shard_info = index["shard"]
        number, count = int(shard_info["index"]), int(shard_info["count"])
        parse_shard_spec(f"{number}/{count}")
        plan_json = index["plan"]
        plan = BuildPlan.from_json(plan_json)
        for record in plan.manifests:
            if not _MANIFEST_NAME.fullmatch(record.name) or len(record.name) > 200:
                raise ValueError(
                    f"manifest name {record.name[:60]!r} is not a plain name "
                    "([A-Za-z0-9][A-Za-z0-9._-]*, as manifests require)"
                )
        plan_digest = index["plan_digest"]
        if plan.digest != plan_digest:
            raise ValueError("the plan does not match its digest")
        by_key = {(i.key, i.arch): i for i in plan.items}
        results: dict[WorkItem, ItemResult] = {}
        for record in index["results"]:
            item = by_key.get((record["key"], record["arch"]))
            if item is None:
                raise ValueError(f"result {record['key']} @ {record['arch']} is not in the plan")
            if item in results:
                raise ValueError(f"result {record['key']} @ {record['arch']} appears twice")
            variants = []
            for v in record["variants"]:
                base = artifact_base(item, v["name"])
                variants.append(
                    {
                        "name": v["name"],
                        "compile_seconds": v["compile_seconds"],
                        "ptx": reader.blob(base + ".ptx").decode("ascii"),
                        "cubin": reader.blob(base + ".cubin"),
                    }
                )
            result = ItemResult(
                item,
                PointRecord.from_json(record["record"]),
                variants,
                float(record["seconds"]),
                bool(record["cached"]),
            )
            result.check_artifacts()
            results[item] = result
    except _DATA_ERRORS as exc:
        raise ShardError(
            f"{path}: damaged or unreadable build shard ({_reason(exc)}); build it again with "
            "`rose-aot build --shard I/N` from the same checkout"
        ) from exc
    return Shard(path, number, count, plan, plan_json, plan_digest, results)


# What reading hostile JSON through the plan and family code can raise besides our own errors.
_DATA_ERRORS = (
    KeyError,
    TypeError,
    ValueError,
    AttributeError,
    IndexError,
    OverflowError,
    RecursionError,
    ConfigError,
    BundleError,
)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."


# --------------------------------------------------------------------------- merging


def merge_shards(paths, output, *, trusted_keys=None) -> BuildSummary:
    """Merge the shards of one build into the bundle an unsharded build would write. With
    `trusted_keys`, every shard must be signed by one of them. The bundle is not signed here:
    sign it afterwards (`rose-aot merge --sign-key`, or `rose-aot sign`)."""
    start = time.perf_counter()
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ShardError("no shards given; pass every shard file of one build")
    shards = [read_shard(p, trusted_keys=trusted_keys) for p in paths]
    first = shards[0]
    for other in shards[1:]:
        _check_same_build(first, other)

    count = first.count
    by_index: dict[int, Shard] = {}
    for shard in shards:
        if shard.index in by_index:
            raise ShardError(
                f"shard {shard.index}/{count} is given twice: {by_index[shard.index].path} and "
                f"{shard.path}; pass each shard once"
            )
        by_index[shard.index] = shard
    missing = [i for i in range(1, count + 1) if i not in by_index]
    if missing:
        names = ", ".join(f"{i}/{count}" for i in missing)
        raise ShardError(
            f"missing shard(s) {names} of {count}; got {len(shards)} of {count}: pass every "
            "shard file of the build"
        )

    _check_sources_match_checkout(first)
    plan = first.plan
    results: dict[WorkItem, ItemResult] = {}
    for index in range(1, count + 1):
        shard = by_index[index]
        expected = set(plan.shard_items(index, count))
        got = set(shard.results)
        if got != expected:
            lacking = sorted(f"{i.key} @ {i.arch}" for i in expected - got)
            extra = sorted(f"{i.key} @ {i.arch}" for i in got - expected)
            detail = "; ".join(
                part
                for part in (
                    f"lacks {', '.join(lacking[:3])}" if lacking else "",
                    f"has {', '.join(extra[:3])}, which belong to another shard" if extra else "",
                )
                if part
            )
            raise ShardError(f"{shard.label}: does not hold exactly its items: {detail}")
        results.update(shard.results)

    try:
        index_doc, blobs = _assemble(plan, results)
    except _DATA_ERRORS as exc:
        raise _unmergeable(exc) from exc
    output = Path(output)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ShardError(
            f"cannot create the output directory {output.parent}: {exc.strerror or exc}; pass "
            "-o with a writable path"
        ) from exc
    size = write_bundle(output, index_doc, blobs, stored=driver_images(blobs))
    return BuildSummary(
        Path(output),
        [results[i] for i in plan.items],
        time.perf_counter() - start,
        size,
        plan,
    )


def _unmergeable(exc: BaseException) -> ShardError:
    return ShardError(
        f"the shards' results do not fit their plan ({_reason(exc)}); build the shards again "
        "with `rose-aot build --shard I/N` from this checkout"
    )


def _check_same_build(a: Shard, b: Shard) -> None:
    if a.count != b.count:
        raise ShardError(
            f"{b.label} belongs to a build of {b.count} shards, {a.label} to one of {a.count}; "
            "merge the shards of one `--shard I/N` run"
        )
    if a.plan_digest == b.plan_digest:
        return
    pa, pb = a.plan_json, b.plan_json
    what = []
    if pa["source_digests"] != pb["source_digests"]:
        families = sorted(
            name
            for name in set(pa["source_digests"]) | set(pb["source_digests"])
            if pa["source_digests"].get(name) != pb["source_digests"].get(name)
        )
        what.append(f"other kernel sources (families {', '.join(families)})")
    if pa["toolchain"] != pb["toolchain"]:
        what.append(
            f"another toolchain ({_toolchain_difference(pa['toolchain'], pb['toolchain'])})"
        )
    if pa["manifests"] != pb["manifests"]:
        names_a = [m["name"] for m in pa["manifests"]]
        names_b = [m["name"] for m in pb["manifests"]]
        if names_a != names_b:
            what.append(f"other manifests ({', '.join(names_b)} vs {', '.join(names_a)})")
        else:
            changed = [
                ma["name"]
                for ma, mb in zip(pa["manifests"], pb["manifests"], strict=True)
                if ma != mb
            ]
            what.append(f"other manifest contents or archs ({', '.join(changed)})")
    if not what:
        what.append("another list of (point, arch) items")
    raise ShardError(
        f"{b.label} was built from {'; '.join(what)} than {a.label}; build every shard from "
        "the same checkout, manifests and toolchain"
    )


def _toolchain_difference(a: dict, b: dict) -> str:
    parts = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if va == vb:
            continue
        if isinstance(va, dict) and isinstance(vb, dict):
            for sub in sorted(set(va) | set(vb)):
                if va.get(sub) != vb.get(sub):
                    parts.append(f"{sub} {vb.get(sub)} vs {va.get(sub)}")
        else:
            parts.append(f"{key} {vb} vs {va}")
    return ", ".join(parts[:4])


def _check_sources_match_checkout(shard: Shard) -> None:
    # _assemble derives launch facts from this checkout's kernel specs: they must be the ones
    # the artifacts were compiled from.
    for name, digest in sorted(shard.plan.source_digests.items()):
        here = get_family(name).source_digest()
        if here != digest:
            raise ShardError(
                f"{shard.label}: was built from other {name} kernel sources than this checkout "
                f"(source digest {digest[:12]} vs {here[:12]} here); merge in the checkout the "
                "shards were built from"
            )


def default_shard_output(bundle_output: Path, index: int, count: int) -> Path:
    """``build/bundle.rosebundle`` -> ``build/bundle.shard-1-of-3.roseshard``."""
    bundle_output = Path(bundle_output)
    stem = bundle_output.name.removesuffix(".rosebundle")
    return bundle_output.with_name(f"{stem}.shard-{index}-of-{count}{SHARD_SUFFIX}")
