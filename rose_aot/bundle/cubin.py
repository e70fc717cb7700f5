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

The Python reader below is the definition. Where the C extension rose_aot.bundle._fastread is
built (`pip install`), read_cubin takes its result for the cubins it reads (every cubin the DSL
writes: about 20x faster, a tenth of a cold DeepSeek-V3 preload) and runs the Python reader for
anything it declines, which then raises its own error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

try:
    from . import _fastread
except ImportError:  # no C compiler at install: the Python reader alone
    _fastread = None

__all__ = ["CubinEntry", "read_cubin", "read_cubin_python"]

_EIFMT_SVAL = 0x04
_EIATTR_MAX_THREADS = 0x05
_EIATTR_REQNTID = 0x10
_EIATTR_KPARAM_INFO = 0x17
_EIATTR_CBANK_PARAM_SIZE = 0x19
_EIATTR_REGCOUNT = 0x2F
_SHT_SYMTAB = 2
_MAX_SECTIONS = 65536
_U64 = struct.Struct("<Q")
_HEADER_TAIL = struct.Struct("<HHH")  # e_shentsize, e_shnum, e_shstrndx


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


_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_RECORD = struct.Struct("<BBH")  # .nv.info record header
_U32 = struct.Struct("<I")
_SYMBOL = struct.Struct("<I4xQQ")  # Elf64_Sym: st_name, (info, other, shndx), value, size

_DIMS = struct.Struct("<III")
_KPARAM = struct.Struct("<IHHI")
_REGCOUNT = struct.Struct("<II")
_SHT_NOBITS = 8
_TEXT, _SHARED, _INFO = b".text.", b".nv.shared.", b".nv.info"


def _cstring(data: bytes, offset: int) -> str:
    if not 0 <= offset < len(data):
        raise ValueError("string offset outside the file")
    end = data.find(b"\0", offset)
    if end < 0:
        raise ValueError("unterminated string")
    return data[offset:end].decode("ascii", errors="replace")


def read_cubin(data: bytes) -> dict[str, CubinEntry]:
    """Entry name -> facts, for a 64-bit little-endian CUDA ELF. Raises ValueError.

    Through _fastread.cubin_facts where it is built and reads the file (the same facts),
    else read_cubin_python."""
    if _fastread is not None:
        facts = _fastread.cubin_facts(data)
        if facts is not None:
            return {name: CubinEntry(name, *fact) for name, fact in facts.items()}
    return read_cubin_python(data)


def read_cubin_python(data: bytes) -> dict[str, CubinEntry]:
    """read_cubin in Python: the definition, and what runs without the C extension.

    Reads the section header table in one pass, names every section, walks the symbol tables
    and the global and per-entry .nv.info sections; every offset and size is checked against
    the file before it is used."""
    data = bytes(data)
    size = len(data)
    if data[:4] != b"\x7fELF" or size < 64 or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = _U64.unpack_from(data, 0x28)
    shentsize, shnum, shstrndx = _HEADER_TAIL.unpack_from(data, 0x3A)
    if shentsize < 64 or not 0 < shnum <= _MAX_SECTIONS or shstrndx >= shnum:
        raise ValueError("bad ELF section header table")
    if shoff + (shnum - 1) * shentsize + _SECTION.size > size:
        raise ValueError("truncated ELF structure")
    if shentsize == _SECTION.size:
        sections = list(_SECTION.iter_unpack(data[shoff : shoff + shnum * shentsize]))
    else:
        sections = [_SECTION.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    str_offset = sections[shstrndx][4]
    # A string at offset o is terminated iff a NUL follows it: iff o <= the file's last NUL.
    last_nul = data.rfind(b"\0")

    # Section names are matched in place (bytes.startswith at an offset); only the names of
    # kernel entries are cut out and decoded. Sections are read in three passes, each in file
    # order (so the first problem found is the same whatever the layout): names, then symbol
    # tables, then shared memory sizes and .nv.info sections, which need every entry's name.
    entries: dict[str, CubinEntry] = {}
    symtabs = []
    named = []  # (entry name, or None for the global .nv.info; is it .nv.shared; section)
    for sec in sections:
        offset = str_offset + sec[0]  # >= 0: both are unsigned
        if offset >= last_nul:
            if offset > last_nul:
                _check_string(offset, size, last_nul)  # raises the error that fits
            # else: the empty name (the NUL itself), e.g. the null section
        elif data[offset + 1] == 0x74:  # ".t..."
            if data.startswith(_TEXT, offset):
                entry = _cstring(data, offset + len(_TEXT))
                entries[entry] = CubinEntry(entry)
        elif data[offset + 1] == 0x6E:  # ".n..."
            if data.startswith(_SHARED, offset):
                named.append((_cstring(data, offset + len(_SHARED)), True, sec))
            elif data.startswith(_INFO, offset):
                if data[offset + len(_INFO)] == 0:
                    named.append((None, False, sec))
                elif data[offset + len(_INFO)] == 0x2E:  # ".nv.info.<entry>"
                    named.append((_cstring(data, offset + len(_INFO) + 1), False, sec))
        if sec[1] == _SHT_SYMTAB:  # by type, whatever its name
            symtabs.append(sec)
    symbols: list[int] = []  # file offsets of the symbol names, decoded when used
    for sec in symtabs:
        link, entsize = sec[6], sec[9]
        if link >= len(sections) or entsize < 24:
            raise ValueError("bad symbol table")
        strtab = sections[link][4]
        body = _section_bytes(data, sec)
        count = len(body) // entsize
        if entsize == _SYMBOL.size:
            names = [strtab + n for n, _, _ in _SYMBOL.iter_unpack(body[: count * entsize])]
        else:
            names = [strtab + _U32.unpack_from(body, j * entsize)[0] for j in range(count)]
        if names and max(names) > last_nul:  # some name is bad: report the first
            for offset in names:
                _check_string(offset, size, last_nul)
        symbols += names
    for name, shared, sec in named:
        if shared:
            entry = entries.get(name)
            if entry is not None:
                entry.static_smem = sec[5]
        elif name is None:
            _read_global_info(_section_bytes(data, sec), entries, symbols, data)
        else:
            owner = entries.get(name)
            if owner is not None:
                _read_entry_info(_section_bytes(data, sec), owner)
    return entries


def _check_string(offset: int, size: int, last_nul: int) -> None:
    """The error for a string at `offset` that is not a terminated string of the file."""
    if not 0 <= offset < size:
        raise ValueError("string offset outside the file")
    if offset > last_nul:
        raise ValueError("unterminated string")


def _section_bytes(data: bytes, sec: tuple) -> bytes:
    if sec[1] == _SHT_NOBITS:  # e.g. .nv.shared.*: occupies no file bytes
        return b""
    offset, length = sec[4], sec[5]
    if offset + length > len(data):
        raise ValueError("section extends past the end of the file")
    return data[offset : offset + length]


# The two kinds of .nv.info section are read by two loops, each testing only the attributes
# it keeps (a cubin's check reads a few dozen records; the loop is most of its cost). Both
# check every record's bounds, whatever its attribute.


def _read_entry_info(body: bytes, owner: CubinEntry) -> None:
    """An entry's .nv.info section: its block size, parameters and parameter bytes."""
    pos = 0
    end = len(body)
    unpack_record = _RECORD.unpack_from
    params = owner.params
    while pos + 4 <= end:
        fmt, attr, value = unpack_record(body, pos)
        pos += 4
        if fmt != _EIFMT_SVAL:  # no payload: `value` is the value
            if attr == _EIATTR_CBANK_PARAM_SIZE:
                owner.param_bytes = value
            continue
        start = pos  # `value` bytes of payload
        pos += value
        if pos > end:
            raise ValueError(".nv.info record extends past its section")
        if value >= 12:
            if attr == _EIATTR_KPARAM_INFO:
                _index, ordinal, offset, flags = _KPARAM.unpack_from(body, start)
                params.append((ordinal, offset, flags >> 18))
            elif attr == _EIATTR_REQNTID:
                owner.reqntid = _DIMS.unpack_from(body, start)
            elif attr == _EIATTR_MAX_THREADS:
                owner.maxntid = _DIMS.unpack_from(body, start)


def _read_global_info(body: bytes, entries: dict, symbols: list[int], data: bytes) -> None:
    """The global .nv.info section: the REGCOUNT of each entry whose symbol is named at
    `symbols[i]` in `data`."""
    pos = 0
    end = len(body)
    unpack_record = _RECORD.unpack_from
    while pos + 4 <= end:
        fmt, attr, value = unpack_record(body, pos)
        pos += 4
        if fmt != _EIFMT_SVAL:
            continue
        start = pos
        pos += value
        if pos > end:
            raise ValueError(".nv.info record extends past its section")
        if attr == _EIATTR_REGCOUNT and value >= 8:
            symbol, count = _REGCOUNT.unpack_from(body, start)
            if symbol < len(symbols):
                entry = entries.get(_cstring(data, symbols[symbol]))
                if entry is not None:
                    entry.registers = count
