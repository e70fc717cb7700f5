"""The build report: one JSON file next to a bundle (or shard) for CI artifacts and dashboards.

``<bundle>.report.json`` lists every (point, arch) item with its compile seconds, whether it came
from the cache, and its artifact sizes (raw and zstd-compressed as stored), plus the totals. It
is a record of one build run (its seconds differ between runs); the bundle itself stays
byte-identical. Written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path

from ..bundle import BundleReader
from ..bundle.format import remove_stale_temps
from ..errors import RoseAotError
from .build import BuildSummary, artifact_base

__all__ = ["REPORT_KIND", "REPORT_SUFFIX", "report_path", "build_report", "write_report"]

REPORT_KIND = "rose-aot build report"
REPORT_SUFFIX = ".report.json"
REPORT_VERSION = 1


def report_path(output) -> Path:
    """``build/bundle.rosebundle`` -> ``build/bundle.rosebundle.report.json``."""
    output = Path(output)
    return output.with_name(output.name + REPORT_SUFFIX)


def build_report(summary: BuildSummary) -> dict:
    """The report of a finished build, merge or shard build (reads the written file back for
    the compressed sizes and its sha256)."""
    try:
        data = Path(summary.output).read_bytes()
    except OSError as exc:
        raise RoseAotError(
            f"cannot read back {summary.output} for its build report: {exc}"
        ) from exc
    reader = BundleReader.from_bytes(data, path=str(summary.output))

    items = []
    totals = {"cubin_bytes": 0, "ptx_bytes": 0, "stored_bytes": 0}
    for result in summary.items:
        variants = []
        for v in result.variants:
            base = artifact_base(result.item, v["name"])
            stored = sum(reader.blob_info(base + suffix)["size"] for suffix in (".cubin", ".ptx"))
            record = {
                "name": v["name"],
                "cubin_bytes": len(v["cubin"]),
                "ptx_bytes": len(v["ptx"].encode()),
                "stored_bytes": stored,
                "compile_seconds": v.get("compile_seconds"),
            }
            for key in totals:
                totals[key] += record[key]
            variants.append(record)
        items.append(
            {
                "key": result.item.key,
                "family": result.item.family,
                "arch": result.item.arch,
                "cached": result.cached,
                "seconds": round(result.seconds, 3),
                "cubin_bytes": sum(v["cubin_bytes"] for v in variants),
                "ptx_bytes": sum(v["ptx_bytes"] for v in variants),
                "stored_bytes": sum(v["stored_bytes"] for v in variants),
                "variants": variants,
            }
        )
    plan = summary.plan
    return {
        "kind": REPORT_KIND,
        "version": REPORT_VERSION,
        "output": str(summary.output),
        "output_kind": reader.index.get("kind"),
        "shard": (
            None
            if summary.shard is None
            else {"index": summary.shard[0], "count": summary.shard[1]}
        ),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "seconds": round(summary.seconds, 3),
        "manifests": [m.name for m in plan.manifests] if plan else [],
        "toolchain": reader.index.get("toolchain", plan.toolchain if plan else {}),
        "totals": {
            "points": summary.points,
            "items": len(summary.items),
            "compiled": summary.compiled,
            "cached": summary.cached,
            "compile_seconds": round(sum(r.seconds for r in summary.items if not r.cached), 3),
            **totals,
        },
        "items": items,
    }


def write_report(summary: BuildSummary, path=None) -> Path:
    """Write the report (default: next to the output) atomically; return its path."""
    path = Path(path) if path is not None else report_path(summary.output)
    text = json.dumps(build_report(summary), indent=2, sort_keys=True) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(path)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise RoseAotError(
            f"cannot write the build report {path}: {exc.strerror or exc} (the bundle "
            f"{summary.output} was written); pass --report with a writable path"
        ) from exc
    return path
