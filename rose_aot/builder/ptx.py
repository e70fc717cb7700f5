"""Reading the facts the builder records from PTX text: entries, parameter sizes, ISA header."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["PtxEntry", "parse_entries", "ptx_header"]

_ENTRY = re.compile(r"\.visible\s+\.entry\s+([A-Za-z_$][\w$]*)\s*\((.*?)\)", re.S)
_PARAM_BYTES = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.b8\s+[\w$]+\[(\d+)\]")
_PARAM_SCALAR = re.compile(r"\.param\s+\.([usbf])(8|16|32|64)\s+[\w$]+")
_REQNTID = re.compile(r"\.reqntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")
_MAXNTID = re.compile(r"\.maxntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")
_EXTERN_SHARED = re.compile(r"^\.extern\s+\.shared\b", re.M)


@dataclass(frozen=True)
class PtxEntry:
    name: str
    param_sizes: tuple[int, ...]
    param_aligns: tuple[int, ...]
    reqntid: tuple[int, int, int] | None  # static block size the kernel was compiled for
    maxntid: tuple[int, int, int] | None
    dynamic_smem: bool  # the module declares extern (dynamic) shared memory


def parse_entries(ptx: str) -> list[PtxEntry]:
    """Every `.visible .entry` in order of appearance, with its parameters' sizes."""
    entries = []
    dynamic_smem = bool(_EXTERN_SHARED.search(ptx))
    matches = list(_ENTRY.finditer(ptx))
    for i, m in enumerate(matches):
        sizes, aligns = [], []
        for p in m.group(2).split(","):
            p = p.strip()
            if not p:
                continue
            if mb := _PARAM_BYTES.search(p):
                sizes.append(int(mb.group(2)))
                aligns.append(int(mb.group(1) or 1))
            elif ms := _PARAM_SCALAR.search(p):
                size = int(ms.group(2)) // 8
                sizes.append(size)
                aligns.append(size)
            else:
                raise ValueError(f"unrecognised PTX parameter declaration: {p!r}")
        end = matches[i + 1].start() if i + 1 < len(matches) else len(ptx)
        body_head = ptx[m.end() : min(end, m.end() + 400)]
        directives = body_head.split("{", 1)[0]
        reqntid = maxntid = None
        if mr := _REQNTID.search(directives):
            reqntid = tuple(int(g or 1) for g in mr.groups())
        if mm := _MAXNTID.search(directives):
            maxntid = tuple(int(g or 1) for g in mm.groups())
        entries.append(
            PtxEntry(m.group(1), tuple(sizes), tuple(aligns), reqntid, maxntid, dynamic_smem)
        )
    return entries


def ptx_header(ptx: str) -> dict:
    """ISA version, target and the compiler release line of a PTX file."""
    version = re.search(r"^\.version\s+(\S+)", ptx, re.M)
    target = re.search(r"^\.target\s+(\S+)", ptx, re.M)
    release = re.search(r"^//\s*(Cuda compilation tools, release .*)$", ptx, re.M)
    return {
        "ptx_isa": version.group(1) if version else None,
        "target": target.group(1) if target else None,
        "compiler": release.group(1).strip() if release else None,
    }
