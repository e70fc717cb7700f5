"""Deployment manifests: which kernel points a bundle holds, written down as explicit TOML data.

One file per deployment (a model served on some GPUs)::

    [deployment]
    name = "qwen3-8b"              # optional; default: the file stem
    description = "..."            # optional
    archs = ["sm_90a", "sm_100a"]  # optional; default: DEFAULT_ARCHS

    [[kernel]]
    family = "rms_norm"
    hidden = 4096
    fused_residual = [false, true]

A ``[[kernel]]`` entry names a family and its config fields; the family's ``make_config`` is the
one authority on what a field accepts. A field written as a list expands the entry into the
cartesian product of all its list fields, taken in the order the fields are written (the first
list varies slowest). Points are deduplicated by key within a file, keeping file order.

Every problem raises one :class:`ManifestError` naming the file, the entry and the field, and
saying what to do. Loading only reads: it never writes or creates anything.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import re
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from .. import settings
from ..archs import DEFAULT_ARCHS, get_arch
from ..bundle.format import MAGIC as BUNDLE_MAGIC
from ..errors import ConfigError, ManifestError
from ..kernels import get_family

__all__ = [
    "Point",
    "Manifest",
    "MAX_POINTS_PER_ENTRY",
    "FP32_MIN_NORMAL",
    "load_manifest",
    "parse_manifest",
    "find_manifests",
    "load_manifests",
]

# An entry's lists multiply; past this many points a typo (a long list pasted twice) is likelier
# than a bundle anyone wants to build.
MAX_POINTS_PER_ENTRY = 4096
# The kernels compute in fp32: an eps below the smallest normal fp32 is 0 (or flushed to 0) in
# the kernel, and one above the largest is inf. Limits per manifest and per build: see
# rose_aot.settings.max_manifest_points / max_build_items.
FP32_MIN_NORMAL = 1.1754943508222875e-38
_FP32_MAX = 3.4028234663852886e38

_TOP_LEVEL_KEYS = ("deployment", "kernel")
_DEPLOYMENT_KEYS = ("name", "description", "archs")
# Names end up in bundle metadata and CLI output; keep them to one plain token.
_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SCALAR_TYPES = (bool, int, float, str)
_TOML_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string"}


@dataclass(frozen=True)
class Point:
    """One kernel point: a family and its validated, frozen config."""

    family: str
    config: Any

    @property
    def key(self) -> str:
        return get_family(self.family).key(self.config)


@dataclass(frozen=True)
class Manifest:
    name: str
    path: str
    digest: str  # sha256 hex of the file's bytes
    description: str
    archs: tuple[str, ...]
    points: tuple[Point, ...]  # expanded, deduplicated within the file, in file order


def load_manifest(path: str | os.PathLike) -> Manifest:
    """Read and validate one manifest file."""
    path = Path(path)
    return parse_manifest(_read_bytes(path), path)


def parse_manifest(data: bytes, path: str | os.PathLike) -> Manifest:
    """Validate manifest bytes; `path` names them in errors and in the Manifest (default name)."""
    path = Path(path)
    doc = _parse_toml(path, data)
    for key in doc:
        if key not in _TOP_LEVEL_KEYS:
            raise ManifestError(
                path,
                f"unknown top-level key {key!r}; a manifest has only a [deployment] table "
                "and [[kernel]] entries",
            )
    name, description, archs = _parse_deployment(path, doc.get("deployment", {}))
    points = _parse_kernels(path, doc.get("kernel"))
    return Manifest(
        name=name,
        path=str(path),
        digest=hashlib.sha256(data).hexdigest(),
        description=description,
        archs=archs,
        points=points,
    )


def find_manifests(directory: str | os.PathLike) -> list[Path]:
    """The ``*.toml`` files directly inside `directory`, sorted by name (hidden files skipped)."""
    directory = Path(directory)
    if not directory.exists():
        raise ManifestError(
            directory, "no such directory; pass a directory of manifest .toml files"
        )
    if not directory.is_dir():
        raise ManifestError(
            directory, "is not a directory; pass a directory of manifest .toml files"
        )
    try:
        found = sorted(
            p for p in directory.glob("*.toml") if not p.name.startswith(".") and not p.is_dir()
        )
    except OSError as exc:
        raise ManifestError(directory, f"cannot list the directory: {_os_reason(exc)}") from exc
    if not found:
        raise ManifestError(
            directory, "has no *.toml manifests; add one, or pass the manifest files themselves"
        )
    return found


def load_manifests(paths: Iterable[str | os.PathLike] | str | os.PathLike) -> list[Manifest]:
    """Load manifest files and directories of manifests; names must be unique across all."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files: list[Path] = []
    seen: set[Path] = set()
    for item in paths:
        item = Path(item)
        for file in find_manifests(item) if item.is_dir() else [item]:
            # The same file reached twice (as a file and through its directory) is one manifest.
            resolved = file.resolve()
            if resolved not in seen:
                seen.add(resolved)
                files.append(file)
    if not files:
        raise ManifestError("(no manifests)", "pass at least one manifest file or directory")
    manifests: list[Manifest] = []
    by_name: dict[str, Manifest] = {}
    for file in files:
        manifest = load_manifest(file)
        other = by_name.get(manifest.name)
        if other is not None:
            raise ManifestError(
                manifest.path,
                f"{manifest.name!r} is also the name of {other.path}; manifest names must be "
                "unique: set a different name in one [deployment] table",
                entry="deployment",
                field="name",
            )
        by_name[manifest.name] = manifest
        manifests.append(manifest)
    items = {(p.key, arch) for m in manifests for p in m.points for arch in m.archs}
    limit = settings.max_build_items()
    if len(items) > limit:
        raise ManifestError(
            ", ".join(m.path for m in manifests[:3]) + (", ..." if len(manifests) > 3 else ""),
            f"these {len(manifests)} manifest(s) need {len(items)} (point, arch) items, more than "
            f"the limit of {limit} per build (ROSE_AOT_MAX_BUILD_ITEMS); build them in several "
            "bundles or shorten the manifests",
        )
    return manifests


# --- reading ------------------------------------------------------------------------------------
def _os_reason(exc: OSError) -> str:
    return (exc.strerror or str(exc)).lower()


def _read_bytes(path: Path) -> bytes:
    if path.is_dir():
        raise ManifestError(
            path,
            "is a directory, not a manifest file; pass a manifest .toml file "
            "(load_manifests takes directories of manifests)",
        )
    if not path.exists():
        raise ManifestError(path, "no such file; pass the path of a manifest .toml file")
    if not path.is_file():
        raise ManifestError(path, "is not a regular file; pass a manifest .toml file")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ManifestError(path, f"cannot read the file: {_os_reason(exc)}") from exc


def _parse_toml(path: Path, data: bytes) -> dict[str, Any]:
    if data.startswith(BUNDLE_MAGIC):
        raise ManifestError(
            path,
            "is a rose-aot bundle, not a manifest; pass the manifest .toml files here "
            "(a bundle goes to --bundle, or to `rose-aot inspect`)",
        )
    if b"\0" in data:
        raise ManifestError(
            path,
            "is a binary file (it contains NUL bytes), not a TOML manifest; "
            "pass a manifest .toml file",
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ManifestError(
            path,
            f"is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "a manifest is a TOML file saved as UTF-8",
        ) from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(path, f"invalid TOML: {exc}") from exc


# --- [deployment] -------------------------------------------------------------------------------
def _parse_deployment(path: Path, table: Any) -> tuple[str, str, tuple[str, ...]]:
    entry = "deployment"
    if not isinstance(table, dict):
        raise ManifestError(
            path,
            f"must be a table (got {_toml_type(table)}); write [deployment] on its own line "
            "with its keys below it",
            entry=entry,
        )
    for key in table:
        if key not in _DEPLOYMENT_KEYS:
            raise ManifestError(
                path,
                f"unknown key; [deployment] takes only {', '.join(_DEPLOYMENT_KEYS)}",
                entry=entry,
                field=key,
            )

    if "name" in table:
        name = table["name"]
        if not isinstance(name, str):
            raise ManifestError(
                path, f"must be a string (got {_toml_type(name)})", entry=entry, field="name"
            )
        if not _NAME_PATTERN.fullmatch(name):
            raise ManifestError(
                path,
                f"{name!r} is not a usable name; use letters, digits, '.', '_' and '-', "
                "starting with a letter or digit",
                entry=entry,
                field="name",
            )
    else:
        name = path.stem
        if not _NAME_PATTERN.fullmatch(name):
            raise ManifestError(
                path,
                f"the file name gives the default name {name!r}, which is not usable; set "
                "name = \"...\" (letters, digits, '.', '_', '-') in [deployment]",
                entry=entry,
                field="name",
            )

    description = table.get("description", "")
    if not isinstance(description, str):
        raise ManifestError(
            path,
            f"must be a string (got {_toml_type(description)})",
            entry=entry,
            field="description",
        )

    return name, description, _parse_archs(path, table)


def _parse_archs(path: Path, table: dict[str, Any]) -> tuple[str, ...]:
    if "archs" not in table:
        return tuple(DEFAULT_ARCHS)
    archs = table["archs"]

    def fail(message: str) -> NoReturn:
        raise ManifestError(path, message, entry="deployment", field="archs")

    if not isinstance(archs, list):
        fail(f'must be a list of arch names (got {_toml_type(archs)}), e.g. archs = ["sm_90a"]')
    if not archs:
        fail(
            "empty list; name at least one arch, or leave archs out for the default "
            f"{list(DEFAULT_ARCHS)}"
        )
    for arch in archs:
        if not isinstance(arch, str):
            fail(f"every entry must be an arch name string (got {_toml_type(arch)} {arch!r})")
        try:
            get_arch(arch)
        except ConfigError as exc:
            fail(exc.reason)
        if archs.count(arch) > 1:
            fail(f"{arch!r} is listed more than once; list each arch once")
    return tuple(archs)


# --- [[kernel]] ---------------------------------------------------------------------------------
def _parse_kernels(path: Path, entries: Any) -> tuple[Point, ...]:
    if entries is None or entries == []:
        raise ManifestError(
            path,
            "no [[kernel]] entries; add at least one [[kernel]] table with a family and its "
            'fields, e.g. family = "rms_norm"',
        )
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ManifestError(
            path,
            "'kernel' must be an array of tables; write each entry as [[kernel]] "
            "(double brackets) followed by its fields",
        )
    points: dict[str, Point] = {}
    limit = settings.max_manifest_points()
    for index, entry in enumerate(entries, start=1):
        for point in _expand_entry(path, index, entry):
            points.setdefault(point.key, point)
        if len(points) > limit:
            raise ManifestError(
                path,
                f"its [[kernel]] entries (up to #{index}) expand to {len(points)} distinct points, "
                f"more than the limit of {limit} per manifest (ROSE_AOT_MAX_MANIFEST_POINTS); "
                "a deployment uses a handful: shorten the lists, or split the manifest",
            )
    return tuple(points.values())


def _expand_entry(path: Path, index: int, entry: dict[str, Any]) -> Iterator[Point]:
    family_name = entry.get("family")
    label = f"kernel #{index}"
    if isinstance(family_name, str):
        label += f" ({family_name})"

    def fail(message: str, field: str | None) -> NoReturn:
        raise ManifestError(path, message, entry=label, field=field)

    if "family" not in entry:
        fail('missing; name the kernel family, e.g. family = "rms_norm"', "family")
    if not isinstance(family_name, str):
        fail(
            f"must be a string (got {_toml_type(family_name)}); write one [[kernel]] entry "
            "per family",
            "family",
        )
    try:
        family = get_family(family_name)
    except ConfigError as exc:
        fail(f"{family_name!r}: {exc.reason}", "family")

    fields = {key: value for key, value in entry.items() if key != "family"}
    axes: list[list[Any]] = []
    for key, value in fields.items():
        values = value if isinstance(value, list) else [value]
        if not values:
            fail(
                "empty list; give at least one value, or leave the field out to use its default",
                key,
            )
        for item in values:
            if isinstance(item, list):
                fail(
                    "a list of lists is not supported; give one flat list, each value becomes "
                    "its own point",
                    key,
                )
            if isinstance(item, dict):
                fail(
                    "a table is not a field value; give a value or a flat list of values",
                    key,
                )
            if not isinstance(item, _SCALAR_TYPES):
                fail(
                    f"{item} is {_toml_type(item)}, not a kernel field value; give a string, "
                    "a number or a boolean",
                    key,
                )
        axes.append(values)

    count = math.prod(len(values) for values in axes)
    if count > MAX_POINTS_PER_ENTRY:
        fail(
            f"its lists expand to {count} points, more than the limit of "
            f"{MAX_POINTS_PER_ENTRY} per entry; shorten the lists",
            None,
        )

    listed = [key for key, value in fields.items() if isinstance(value, list)]
    for combination in itertools.product(*axes):
        values = dict(zip(fields, combination, strict=True))
        try:
            config = family.make_config(**values)
        except ConfigError as exc:
            fail(_config_message(exc, values, listed, count), exc.field)
        eps = getattr(config, "eps", None)
        if isinstance(eps, float) and not FP32_MIN_NORMAL <= eps <= _FP32_MAX:
            fail(
                f"{eps!r} is {'0' if eps < FP32_MIN_NORMAL else 'inf'} in the kernel's fp32 "
                f"arithmetic; give a value between {FP32_MIN_NORMAL:.4g} and {_FP32_MAX:.4g} "
                "(typical: 1e-6)",
                "eps",
            )
        yield Point(family_name, config)


def _config_message(exc: ConfigError, values: dict[str, Any], listed: list[str], count: int) -> str:
    message = exc.reason
    if exc.field not in values:
        message += f"; set {exc.field} in this [[kernel]] entry"
    if count > 1 and listed:
        where = ", ".join(f"{key} = {_toml_literal(values[key])}" for key in listed)
        message += f" (in the point with {where})"
    return message


def _toml_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    for kind, name in _TOML_TYPE_NAMES.items():
        if isinstance(value, kind):
            return name
    return f"a {type(value).__name__}"


def _toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)
