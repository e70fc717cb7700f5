"""`rose-aot diff A B`: which kernel points a model or kernel change adds, removes or changes.

Each side is a manifest file, a folder of manifests, or a bundle (told apart by the bundle
magic, not the file name). A side is a set of points, each with the archs it is built for.
Points are compared by key; a point only in A and a point only in B of the same family and the
same *shape* (the family's ``shape_fields``, e.g. rms_norm's hidden) are one *changed* point
(other eps, dtype, weight offset, ...). When both sides are bundles, the points both hold for an
arch are also compared by what built them: the family's kernel source digest, the toolchain, and
the sha256 of every artifact.

Everything here reads plain data (manifest TOML, the bundle index): no compiler, no GPU, and
no need for the bundle's kernel families to be this checkout's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..archs import ARCHS
from ..bundle import MAGIC, BundleReader
from ..bundle.index_shape import check_kernel_index
from ..errors import BundleError
from ..kernels import FAMILIES, config_json
from .schema import load_manifest, load_manifests

__all__ = [
    "PointView",
    "DiffSide",
    "FamilyDiff",
    "Diff",
    "load_side",
    "diff_sides",
    "diff_paths",
    "render",
]

_BUNDLE_KIND = "rose-aot kernel bundle"


@dataclass(frozen=True)
class PointView:
    family: str
    key: str
    config: dict
    archs: frozenset[str]


@dataclass
class DiffSide:
    path: str
    kind: str  # "manifest", "manifests" or "bundle"
    points: dict[str, PointView]
    # Bundles only:
    toolchain: dict | None = None
    sources: dict[str, str] | None = None  # family -> source digest
    artifacts: dict[tuple[str, str], dict] | None = None  # (key, arch) -> {variant: facts}

    @property
    def is_bundle(self) -> bool:
        return self.kind == "bundle"


def _is_bundle_file(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False  # load_manifest reports why it cannot be read


def load_side(path: str | os.PathLike) -> DiffSide:
    """Read one side of a diff: a manifest, a folder of manifests or a bundle."""
    path = Path(path)
    if path.is_dir():
        return _manifest_side(str(path), "manifests", load_manifests([path]))
    if path.is_file() and _is_bundle_file(path):
        return _bundle_side(path)
    return _manifest_side(str(path), "manifest", [load_manifest(path)])


def _manifest_side(label: str, kind: str, manifests) -> DiffSide:
    points: dict[str, PointView] = {}
    for manifest in manifests:
        for point in manifest.points:
            seen = points.get(point.key)
            archs = frozenset(manifest.archs) | (seen.archs if seen else frozenset())
            points[point.key] = PointView(point.family, point.key, config_json(point.config), archs)
    return DiffSide(label, kind, points)


def _bundle_side(path: Path) -> DiffSide:
    reader = BundleReader.open(path)
    index = reader.index
    check_kernel_index(index, str(path))
    if index.get("kind") != _BUNDLE_KIND:
        raise BundleError(
            f"{path}: is not a rose-aot kernel bundle (kind {str(index.get('kind'))[:60]!r}); "
            "diff takes manifests, folders of manifests and bundles (merge shards first)"
        )
    points: dict[str, PointView] = {}
    artifacts: dict[tuple[str, str], dict] = {}
    try:
        for p in index["points"]:
            key, arch = p["key"], p["arch"]
            seen = points.get(key)
            archs = frozenset([arch]) | (seen.archs if seen else frozenset())
            points[key] = PointView(p["family"], key, dict(p["config"]), archs)
            facts = {}
            for v in p["variants"]:
                launch = {k: val for k, val in v.items() if k not in ("cubin", "ptx")}
                facts[v["name"]] = {
                    "launch": launch,
                    "cubin": reader.blob_info(v["cubin"])["raw_sha256"],
                    "ptx": reader.blob_info(v["ptx"])["raw_sha256"],
                }
            artifacts[(key, arch)] = facts
        sources = {name: f["source_digest"] for name, f in index["families"].items()}
        toolchain = dict(index["toolchain"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise BundleError(
            f"{path}: the bundle index lacks what diff reads ({exc!r}); rebuild the bundle"
        ) from exc
    return DiffSide(str(path), "bundle", points, toolchain, sources, artifacts)


# --- comparing ----------------------------------------------------------------------------------
@dataclass
class FamilyDiff:
    added: list[dict] = field(default_factory=list)  # {key, config, archs}
    removed: list[dict] = field(default_factory=list)
    changed: list[dict] = field(default_factory=list)  # {from, to, shape, fields, archs: [a, b]}
    archs_changed: list[dict] = field(default_factory=list)  # {key, added, removed}
    artifacts_changed: list[dict] = field(default_factory=list)  # {key, arch, reasons, ...}

    def __bool__(self) -> bool:
        return any(
            (self.added, self.removed, self.changed, self.archs_changed, self.artifacts_changed)
        )

    def to_json(self) -> dict:
        return {
            "added": self.added,
            "removed": self.removed,
            "changed": self.changed,
            "archs_changed": self.archs_changed,
            "artifacts_changed": self.artifacts_changed,
        }


@dataclass
class Diff:
    a: DiffSide
    b: DiffSide
    families: dict[str, FamilyDiff]  # only families with a difference, sorted by name
    toolchain: dict[str, list]  # bundles only: field -> [a, b]
    sources: dict[str, list]  # bundles only: family -> [digest a, digest b]

    @property
    def same(self) -> bool:
        return not self.families and not self.toolchain and not self.sources

    def counts(self) -> dict[str, int]:
        names = ("added", "removed", "changed", "archs_changed", "artifacts_changed")
        return {n: sum(len(getattr(f, n)) for f in self.families.values()) for n in names}

    def to_json(self) -> dict:
        return {
            "a": {"path": self.a.path, "kind": self.a.kind},
            "b": {"path": self.b.path, "kind": self.b.kind},
            "same": self.same,
            "counts": self.counts(),
            "families": {name: f.to_json() for name, f in self.families.items()},
            "toolchain": self.toolchain,
            "sources": self.sources,
        }


def _shape_fields(family: str, config: dict) -> tuple[str, ...]:
    known = FAMILIES.get(family)
    fields = known.shape_fields if known is not None else None
    return tuple(fields) if fields is not None else tuple(sorted(config))


def _shape(view: PointView) -> tuple:
    return tuple((f, view.config.get(f)) for f in _shape_fields(view.family, view.config))


def _fields_differing(a: dict, b: dict) -> dict[str, list]:
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def diff_sides(a: DiffSide, b: DiffSide) -> Diff:
    families: dict[str, FamilyDiff] = {}

    def fam(name: str) -> FamilyDiff:
        return families.setdefault(name, FamilyDiff())

    only_a = [a.points[k] for k in sorted(set(a.points) - set(b.points))]
    only_b = [b.points[k] for k in sorted(set(b.points) - set(a.points))]

    # Pair points of one family and shape, fewest differing fields first (ties by key), so that
    # e.g. an eps change of the plain and the fused rms_norm pairs plain with plain.
    candidates = []
    for pa in only_a:
        for pb in only_b:
            if pa.family == pb.family and _shape(pa) == _shape(pb):
                delta = _fields_differing(pa.config, pb.config)
                candidates.append((len(delta), pa.key, pb.key, pa, pb, delta))
    candidates.sort(key=lambda c: c[:3])
    paired_a, paired_b = set(), set()
    for _, ka, kb, pa, pb, delta in candidates:
        if ka in paired_a or kb in paired_b:
            continue
        paired_a.add(ka)
        paired_b.add(kb)
        fam(pa.family).changed.append(
            {
                "from": ka,
                "to": kb,
                "shape": dict(_shape(pa)),
                "fields": delta,
                "archs": [_sorted_archs(pa.archs), _sorted_archs(pb.archs)],
            }
        )
    for p in only_a:
        if p.key not in paired_a:
            fam(p.family).removed.append(
                {"key": p.key, "config": p.config, "archs": _sorted_archs(p.archs)}
            )
    for p in only_b:
        if p.key not in paired_b:
            fam(p.family).added.append(
                {"key": p.key, "config": p.config, "archs": _sorted_archs(p.archs)}
            )

    common = sorted(set(a.points) & set(b.points))
    for key in common:
        pa, pb = a.points[key], b.points[key]
        if pa.archs != pb.archs:
            fam(pa.family).archs_changed.append(
                {
                    "key": key,
                    "added": _sorted_archs(pb.archs - pa.archs),
                    "removed": _sorted_archs(pa.archs - pb.archs),
                }
            )

    toolchain: dict[str, list] = {}
    sources: dict[str, list] = {}
    if a.is_bundle and b.is_bundle:
        toolchain = _toolchain_delta(a.toolchain, b.toolchain)
        for name in sorted(set(a.sources) | set(b.sources)):
            if name in a.sources and name in b.sources and a.sources[name] != b.sources[name]:
                sources[name] = [a.sources[name], b.sources[name]]
        for key in common:
            family = a.points[key].family
            for arch in _sorted_archs(a.points[key].archs & b.points[key].archs):
                change = _artifact_change(a, b, family, key, arch)
                if change:
                    fam(family).artifacts_changed.append(change)

    return Diff(a, b, dict(sorted((n, f) for n, f in families.items() if f)), toolchain, sources)


def _toolchain_delta(a: dict, b: dict) -> dict[str, list]:
    """Differing toolchain fields, nested dicts flattened as 'packages.nvidia-cutlass-dsl'."""

    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
        return out

    fa, fb = flat(a), flat(b)
    return {k: [fa.get(k), fb.get(k)] for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)}


def _artifact_change(a: DiffSide, b: DiffSide, family: str, key: str, arch: str) -> dict | None:
    reasons = []
    if a.sources.get(family) != b.sources.get(family):
        reasons.append("kernel source")
    tool_a = {k: v for k, v in a.toolchain.items() if k != "cubin_elf_abi"}
    tool_b = {k: v for k, v in b.toolchain.items() if k != "cubin_elf_abi"}
    abi_a = (a.toolchain.get("cubin_elf_abi") or {}).get(arch)
    abi_b = (b.toolchain.get("cubin_elf_abi") or {}).get(arch)
    if tool_a != tool_b or abi_a != abi_b:
        reasons.append("toolchain")
    fa, fb = a.artifacts[(key, arch)], b.artifacts[(key, arch)]
    launch_changed = {n: f["launch"] for n, f in fa.items()} != {
        n: f["launch"] for n, f in fb.items()
    }
    bytes_changed = [
        name
        for name in sorted(set(fa) | set(fb))
        if (fa.get(name) or {}).get("cubin") != (fb.get(name) or {}).get("cubin")
        or (fa.get(name) or {}).get("ptx") != (fb.get(name) or {}).get("ptx")
    ]
    if launch_changed:
        reasons.append("launch facts")
    if bytes_changed:
        reasons.append("artifact sha256")
    if not reasons:
        return None
    return {
        "key": key,
        "arch": arch,
        "reasons": reasons,
        "variants_changed": bytes_changed,
        "artifacts_identical": not bytes_changed,
    }


def diff_paths(a, b) -> Diff:
    """Diff two paths (manifest, folder of manifests, or bundle)."""
    return diff_sides(load_side(a), load_side(b))


# --- rendering ----------------------------------------------------------------------------------
def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "-" if v is None else str(v)


def _archs(archs) -> str:
    return ",".join(_sorted_archs(archs))


def _sorted_archs(archs) -> list[str]:
    return sorted(archs, key=_arch_order)


def _arch_order(name: str) -> tuple:
    arch = ARCHS.get(name)
    return (0, arch.capability, name) if arch else (1, (0, 0), name)


def render(diff: Diff) -> str:
    """The human table, grouped by family."""
    lines = [f"--- {diff.a.path} ({diff.a.kind})", f"+++ {diff.b.path} ({diff.b.kind})"]
    if diff.same:
        lines.append(
            "same kernel points"
            + (" and artifacts" if diff.a.is_bundle and diff.b.is_bundle else "")
        )
        return "\n".join(lines)
    rows: list[tuple[str, str, str, str]] = []  # family, change, archs, point
    notes: dict[int, str] = {}  # row index -> a detail line printed under it
    for name, f in diff.families.items():
        for p in f.removed:
            rows.append((name, "removed", _archs(p["archs"]), p["key"]))
        for p in f.added:
            rows.append((name, "added", _archs(p["archs"]), p["key"]))
        for c in f.changed:
            archs = _archs(c["archs"][1])
            if c["archs"][0] != c["archs"][1]:
                archs = f"{_archs(c['archs'][0])} -> {archs}"
            notes[len(rows)] = "-> " + ", ".join(
                f"{k} {_value(x)} -> {_value(y)}" for k, (x, y) in c["fields"].items()
            )
            rows.append((name, "changed", archs, c["from"]))
        for c in f.archs_changed:
            delta = " ".join([f"+{x}" for x in c["added"]] + [f"-{x}" for x in c["removed"]])
            rows.append((name, "archs", delta, c["key"]))
        for c in f.artifacts_changed:
            notes[len(rows)] = (
                "-> "
                + ", ".join(c["reasons"])
                + (" (artifacts identical)" if c["artifacts_identical"] else "")
            )
            rows.append((name, "rebuilt", c["arch"], c["key"]))
    header = ("family", "change", "archs", "point")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    indent = " " * (sum(widths) + 6)
    lines.append("")
    lines.append(
        "  ".join(h.ljust(w) for h, w in zip(header[:3], widths, strict=True)) + "  " + header[3]
    )
    for i, r in enumerate(rows):
        lines.append(
            "  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3]
        )
        if i in notes:
            lines.append(indent + notes[i])
    if diff.toolchain:
        lines.append("")
        lines.append("toolchain:")
        lines.extend(f"  {k}: {_value(x)} -> {_value(y)}" for k, (x, y) in diff.toolchain.items())
    if diff.sources:
        lines.append("")
        lines.append("kernel sources:")
        lines.extend(f"  {k}: {x[:12]} -> {y[:12]}" for k, (x, y) in diff.sources.items())
    counts = diff.counts()
    summary = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in counts.items() if n)
    lines.append("")
    lines.append(f"differs: {summary or 'build inputs only'}")
    return "\n".join(lines)
