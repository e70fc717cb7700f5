"""The JSON types of a kernel bundle's index, checked before anything reads it.

The index's digest proves only that it is the index the writer wrote, and anyone who can write
the file can write a new index with matching digests. So the readers (the loader, verify,
inspect, check) first check the types of the fields they walk, and a wrong type is one clear
BundleError instead of a TypeError deep inside. Values are checked where they are used.
"""

from __future__ import annotations

from ..errors import BundleError
from ..kernels.record import RECORD_VERSION

__all__ = ["check_kernel_index"]

_TOP = {
    "kind": str,
    "archs": list,
    "toolchain": dict,
    "manifests": list,
    "families": dict,
    "points": list,
}
_POINT = {
    "key": str,
    "family": str,
    "arch": str,
    "config": dict,
    "args": list,
    "workspace": list,
    "params": list,
    "variants": list,
}
_VARIANT = {
    "name": str,
    "entries": list,
    "block": list,
    "params": list,
    "constants": dict,
    "resources": list,
    "cubin": str,
    "ptx": str,
}
_JSON_NAMES = {str: "a string", list: "an array", dict: "an object", int: "an integer"}


def check_kernel_index(index: object, path: str) -> None:
    """Raise BundleError when a field the readers walk has the wrong JSON type."""

    def fail(where: str, expected: type, value: object) -> None:
        raise BundleError(
            f"{path}: damaged bundle index: {where} must be {_JSON_NAMES[expected]} (got "
            f"{_json_type(value)}); rebuild the bundle with `rose-aot build`"
        )

    if not isinstance(index, dict):
        fail("the index", dict, index)
    for field, kind in _TOP.items():
        if field in index and not isinstance(index[field], kind):
            fail(f'"{field}"', kind, index[field])
    for i, arch in enumerate(index.get("archs", [])):
        if not isinstance(arch, str):
            fail(f'"archs"[{i}]', str, arch)
    for i, m in enumerate(index.get("manifests", [])):
        if not isinstance(m, dict):
            fail(f'"manifests"[{i}]', dict, m)
        for field, kind in (("name", str), ("points", list), ("digest", str), ("archs", list)):
            if field in m and not isinstance(m[field], kind):
                fail(f'"manifests"[{i}].{field}', kind, m[field])
    for name, family in index.get("families", {}).items():
        if not isinstance(family, dict):
            fail(f'"families".{name[:40]}', dict, family)
    for i, point in enumerate(index.get("points", [])):
        if not isinstance(point, dict):
            fail(f'"points"[{i}]', dict, point)
        for field, kind in _POINT.items():
            if field in point and not isinstance(point[field], kind):
                fail(f'"points"[{i}].{field}', kind, point[field])
        for j, variant in enumerate(point.get("variants", [])):
            if not isinstance(variant, dict):
                fail(f'"points"[{i}].variants[{j}]', dict, variant)
            version = variant.get("record_version")
            if version != RECORD_VERSION:  # its fields may have other types: say why first
                raise BundleError(
                    f"{path}: point {str(point.get('key', i))[:200]!r} has record version "
                    f"{str(version)[:20]}; this rose-aot reads record version {RECORD_VERSION}; "
                    "rebuild the bundle with the rose-aot version that serves it"
                )
            for field, kind in _VARIANT.items():
                if field in variant and not isinstance(variant[field], kind):
                    fail(f'"points"[{i}].variants[{j}].{field}', kind, variant[field])


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {str(value)[:20]}"
    return _JSON_NAMES.get(type(value), f"a {type(value).__name__}")
