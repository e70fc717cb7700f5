"""Launch facts read out of a cubin (CUDA ELF), in plain Python: no driver, no toolkit.

The builder checks each kernel record against the cubin it compiled, and the loader and
`rose-aot verify` check it again before a cubin can reach the driver, so an artifact stored
under the wrong point or variant is refused. What a cubin tells, per kernel entry:

- the entry exists (a ``.text.<entry>`` section);
- ``EIATTR_REQNTID`` / ``EIATTR_MAX_THREADS``: the block size it was compiled for, if static;
- ``EIATTR_KPARAM_INFO``: every parameter's ordinal, offset and size;
- ``EIATTR_REGCOUNT`` (in the global ``.nv.info``): registers per thread;
- the size of ``.nv.shared.<entry>``: static shared memory.

The ``.nv.info`` records are (format u8, attribute u8, then a u16 value, or a u16 size followed
by that many bytes for EIFMT_SVAL), as cuobjdump prints them. Every read is bounds-checked: a
damaged or hostile file gives ValueError, never an IndexError or a huge allocation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

__all__ = ["CubinEntry", "read_cubin"]

_EIFMT_SVAL = 0x04
_EIATTR_MAX_THREADS = 0x05
_EIATTR_REQNTID = 0x10
_EIATTR_KPARAM_INFO = 0x17
_EIATTR_CBANK_PARAM_SIZE = 0x19
_EIATTR_REGCOUNT = 0x2F
_SHT_SYMTAB = 2
_MAX_SECTIONS = 65536


@dataclass
class CubinEntry:
    name: str
    reqntid: tuple[int, int, int] | None = None
    maxntid: tuple[int, int, int] | None = None
    params: list[tuple[int, int, int]] = field(default_factory=list)  # (ordinal, offset, size)
    param_bytes: int | None = None
    registers: int | None = None
    static_smem: int = 0

    @property
    def param_sizes(self) -> list[int]:
        return [size for _, _, size in sorted(self.params)]


def _unpack(fmt: str, data: bytes, offset: int):
    size = struct.calcsize(fmt)
    if offset < 0 or offset + size > len(data):
        raise ValueError("truncated ELF structure")
    return struct.unpack_from(fmt, data, offset)


def _cstring(data: bytes, offset: int) -> str:
    if not 0 <= offset < len(data):
        raise ValueError("string offset outside the file")
    end = data.find(b"\0", offset)
    if end < 0:
        raise ValueError("unterminated string")
    return data[offset:end].decode("ascii", errors="replace")


def read_cubin(data: bytes) -> dict[str, CubinEntry]:
    """Entry name -> facts, for a 64-bit little-endian CUDA ELF. Raises ValueError."""
    data = bytes(data)
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = _unpack("<Q", data, 0x28)
    shentsize, shnum, shstrndx = _unpack("<HHH", data, 0x3A)
    if shentsize < 64 or not 0 < shnum <= _MAX_SECTIONS or shstrndx >= shnum:
        raise ValueError("bad ELF section header table")
    sections = []
    for i in range(shnum):
        name, kind, _flags, _addr, offset, size, link, info, _align, entsize = _unpack(
            "<IIQQQQIIQQ", data, shoff + i * shentsize
        )
        sections.append((name, kind, offset, size, link, info, entsize))
    str_offset = sections[shstrndx][2]

    def section_bytes(sec) -> bytes:
        _, kind, offset, size, *_ = sec
        if kind == 8:  # SHT_NOBITS (e.g. .nv.shared.*) occupies no file bytes
            return b""
        if offset + size > len(data):
            raise ValueError("section extends past the end of the file")
        return data[offset : offset + size]

    named = [(_cstring(data, str_offset + sec[0]), sec) for sec in sections]
    entries = {
        n[len(".text.") :]: CubinEntry(n[len(".text.") :]) for n, _ in named if n.startswith(".text.")
    }
    symbols: list[str] = []
    for n, sec in named:
        if sec[1] == _SHT_SYMTAB:
            strtab = sections[sec[4]] if sec[4] < len(sections) else None
            if strtab is None or sec[6] < 24:
                raise ValueError("bad symbol table")
            body = section_bytes(sec)
            for j in range(len(body) // sec[6]):
                (st_name,) = _unpack("<I", body, j * sec[6])
                symbols.append(_cstring(data, strtab[2] + st_name))
    for n, sec in named:
        if n.startswith(".nv.shared.") and n[len(".nv.shared.") :] in entries:
            entries[n[len(".nv.shared.") :]].static_smem = sec[3]
        if n == ".nv.info" or (n.startswith(".nv.info.") and n[len(".nv.info.") :] in entries):
            owner = entries.get(n[len(".nv.info.") :]) if n != ".nv.info" else None
            _read_info(section_bytes(sec), owner, entries, symbols)
    return entries


def _read_info(body: bytes, owner: CubinEntry | None, entries, symbols) -> None:
    pos = 0
    while pos + 4 <= len(body):
        fmt, attr, value = _unpack("<BBH", body, pos)
        if fmt == _EIFMT_SVAL:
            payload = body[pos + 4 : pos + 4 + value]
            if len(payload) != value:
                raise ValueError(".nv.info record extends past its section")
            pos += 4 + value
        else:
            payload = None
            pos += 4
        if owner is not None:
            if attr in (_EIATTR_REQNTID, _EIATTR_MAX_THREADS) and payload and len(payload) >= 12:
                dims = _unpack("<III", payload, 0)
                if attr == _EIATTR_REQNTID:
                    owner.reqntid = dims
                else:
                    owner.maxntid = dims
            elif attr == _EIATTR_KPARAM_INFO and payload and len(payload) >= 12:
                _index, ordinal, offset, flags = _unpack("<IHHI", payload, 0)
                owner.params.append((ordinal, offset, flags >> 18))
            elif attr == _EIATTR_CBANK_PARAM_SIZE and payload is None:
                owner.param_bytes = value
        elif attr == _EIATTR_REGCOUNT and payload and len(payload) >= 8:
            symbol, count = _unpack("<II", payload, 0)
            if symbol < len(symbols) and symbols[symbol] in entries:
                entries[symbols[symbol]].registers = count
