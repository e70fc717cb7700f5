"""read_cubin against the reference implementation it replaced (kept below as it was, a
straightforward reading of the ELF): the same facts for every cubin of the shipped build, and
the same facts or the same ValueError for thousands of damaged copies (bytes flipped, the
file cut, section headers and .nv.info records rewritten), never another exception. Both
readers: the Python one (read_cubin_python, the definition) and read_cubin through the C
extension (rose_aot.bundle._fastread), which must read every shipped cubin itself and decline,
never misread, what it does not read."""

from __future__ import annotations

import random
import struct

import pytest

from rose_aot.bundle import BundleReader
from rose_aot.bundle import cubin as cubin_module
from rose_aot.bundle.cubin import CubinEntry, read_cubin, read_cubin_python
from rose_aot.bundle.cubin import (  # constants and the string helper: unchanged by the rewrite
    _EIATTR_CBANK_PARAM_SIZE,
    _EIATTR_KPARAM_INFO,
    _EIATTR_MAX_THREADS,
    _EIATTR_REGCOUNT,
    _EIATTR_REQNTID,
    _EIFMT_SVAL,
    _MAX_SECTIONS,
    _SHT_SYMTAB,
)
from rose_aot.bundle.cubin import _cstring as _ref_cstring


# ------------------------------------------------------------------ the reference (unchanged)


def _ref_unpack(fmt: str, data: bytes, offset: int):
    size = struct.calcsize(fmt)
    if offset < 0 or offset + size > len(data):
        raise ValueError("truncated ELF structure")
    return struct.unpack_from(fmt, data, offset)


def _reference_read_cubin(data: bytes) -> dict[str, CubinEntry]:
    """Entry name -> facts, for a 64-bit little-endian CUDA ELF. Raises ValueError."""
    data = bytes(data)
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = _ref_unpack("<Q", data, 0x28)
    shentsize, shnum, shstrndx = _ref_unpack("<HHH", data, 0x3A)
    if shentsize < 64 or not 0 < shnum <= _MAX_SECTIONS or shstrndx >= shnum:
        raise ValueError("bad ELF section header table")
    sections = []
    for i in range(shnum):
        name, kind, _flags, _addr, offset, size, link, info, _align, entsize = _ref_unpack(
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

    named = [(_ref_cstring(data, str_offset + sec[0]), sec) for sec in sections]
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
                (st_name,) = _ref_unpack("<I", body, j * sec[6])
                symbols.append(_ref_cstring(data, strtab[2] + st_name))
    for n, sec in named:
        if n.startswith(".nv.shared.") and n[len(".nv.shared.") :] in entries:
            entries[n[len(".nv.shared.") :]].static_smem = sec[3]
        if n == ".nv.info" or (n.startswith(".nv.info.") and n[len(".nv.info.") :] in entries):
            owner = entries.get(n[len(".nv.info.") :]) if n != ".nv.info" else None
            _ref_read_info(section_bytes(sec), owner, entries, symbols)
    return entries


def _ref_read_info(body: bytes, owner: CubinEntry | None, entries, symbols) -> None:
    pos = 0
    while pos + 4 <= len(body):
        fmt, attr, value = _ref_unpack("<BBH", body, pos)
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
                dims = _ref_unpack("<III", payload, 0)
                if attr == _EIATTR_REQNTID:
                    owner.reqntid = dims
                else:
                    owner.maxntid = dims
            elif attr == _EIATTR_KPARAM_INFO and payload and len(payload) >= 12:
                _index, ordinal, offset, flags = _ref_unpack("<IHHI", payload, 0)
                owner.params.append((ordinal, offset, flags >> 18))
            elif attr == _EIATTR_CBANK_PARAM_SIZE and payload is None:
                owner.param_bytes = value
        elif attr == _EIATTR_REGCOUNT and payload and len(payload) >= 8:
            symbol, count = _ref_unpack("<II", payload, 0)
            if symbol < len(symbols) and symbols[symbol] in entries:
                entries[symbols[symbol]].registers = count


# ------------------------------------------------------------------------------------ tests


def _facts(read, data):
    try:
        entries = read(data)
    except ValueError as exc:
        return ("ValueError", str(exc))
    return ("ok", {name: (e.name, e.reqntid, e.maxntid, sorted(e.params), e.param_bytes,
                          e.registers, e.static_smem) for name, e in entries.items()})


@pytest.fixture(scope="module")
def cubins(shipped_build):
    reader = BundleReader.open(shipped_build.path)
    return [reader.blob(n) for n in reader.blob_names() if n.endswith(".cubin")]


needs_fastread = pytest.mark.skipif(cubin_module._fastread is None,
                                    reason="the C extension rose_aot.bundle._fastread is not built")
READERS = [pytest.param(read_cubin_python, id="python"),
           pytest.param(read_cubin, id="fastread", marks=needs_fastread)]


@pytest.mark.parametrize("reader", READERS)
def test_same_facts_as_the_reference_for_every_shipped_cubin(cubins, reader):
    assert len(cubins) >= 20
    for data in cubins:
        got = _facts(reader, data)
        assert got[0] == "ok" and got == _facts(_reference_read_cubin, data)
        entries = got[1]
        assert entries and all(params for _, _, _, params, *_ in entries.values())
        assert all(registers for *_, registers, _ in entries.values())


def _mutations(data: bytes, rng: random.Random):
    """Damaged copies aimed at every structure the reader walks."""
    size = len(data)
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, _ = struct.unpack_from("<HHH", data, 0x3A)
    for _ in range(40):
        out = bytearray(data)
        what = rng.randrange(7)
        if what == 0:  # random bytes anywhere
            for _ in range(rng.choice((1, 2, 8))):
                out[rng.randrange(size)] = rng.randrange(256)
        elif what == 1:  # cut
            out = out[: rng.randrange(size)]
        elif what == 6:  # cut inside the section header table (a header half there)
            out = out[: rng.randrange(shoff, min(size, shoff + shnum * shentsize))]
        elif what == 2:  # the ELF header's table fields
            i = rng.choice((0x28, 0x3A, 0x3C, 0x3E, 4, 5))
            out[i] = rng.randrange(256)
        else:  # one field of one section header: name, type, offset, size, link, entsize
            sec = shoff + rng.randrange(shnum) * shentsize
            offset, fmt = rng.choice(((0, "<I"), (4, "<I"), (24, "<Q"), (32, "<Q"), (40, "<I"),
                                      (56, "<Q")))
            value = rng.choice((0, 1, 2, 8, 24, size - 1, size, size + 7, 2**31,
                                rng.randrange(size)))
            struct.pack_into(fmt, out, sec + offset, value % (2 ** (8 * struct.calcsize(fmt))))
        yield bytes(out)


@pytest.mark.parametrize("reader", READERS)
def test_same_facts_or_error_as_the_reference_for_damaged_cubins(cubins, reader):
    rng = random.Random(20261130)
    compared = errors = 0
    for data in cubins[:40]:
        for damaged in _mutations(data, rng):
            want = _facts(_reference_read_cubin, damaged)  # any other exception fails here
            assert _facts(reader, damaged) == want
            compared += 1
            errors += want[0] == "ValueError"
    assert compared >= 800 and errors >= compared // 10  # both outcomes well covered


def _native_facts(data):
    facts = cubin_module._fastread.cubin_facts(data)
    if facts is None:
        return None
    return ("ok", {name: (name, reqntid, maxntid, sorted(params), param_bytes, registers, smem)
                   for name, (reqntid, maxntid, params, param_bytes, registers, smem)
                   in facts.items()})


@needs_fastread
def test_the_c_reader_reads_every_shipped_cubin_and_declines_what_is_damaged(cubins):
    """The C reader must read the DSL's cubins itself (else it saves nothing), give exactly the
    Python reader's facts, and decline (None) wherever the Python reader raises: a damaged
    copy it misread would reach the record check with wrong facts."""
    for data in cubins:
        assert _native_facts(data) == _facts(read_cubin_python, data)
    rng = random.Random(7)
    read = declined = 0
    for data in cubins[:40]:
        for damaged in _mutations(data, rng):
            got = _native_facts(damaged)
            want = _facts(read_cubin_python, damaged)
            if got is None:
                declined += 1
            else:
                assert got == want and want[0] == "ok"
                read += 1
    assert read >= 100 and declined >= 100  # both outcomes well covered


def _rename_sections(data: bytes, old: bytes, new: bytes) -> bytes:
    assert len(old) == len(new)
    assert data.count(old) >= 1
    return data.replace(old, new)


@needs_fastread
def test_the_c_reader_declines_shapes_it_does_not_read_and_python_reads_them(cubins):
    data = next(d for d in cubins if len(read_cubin_python(d)) == 1)
    (entry,) = read_cubin_python(data)
    # A name outside ASCII: Python decodes it with a replacement character.
    name = entry.encode()
    odd = name[:-1] + b"\xe9"
    renamed = _rename_sections(data, name, odd)
    assert cubin_module._fastread.cubin_facts(renamed) is None
    assert list(read_cubin(renamed)) == [odd.decode("ascii", errors="replace")]
    # Section header entries of another size than Elf64_Shdr.
    wide = bytearray(data)
    struct.pack_into("<H", wide, 0x3A, 72)
    assert cubin_module._fastread.cubin_facts(bytes(wide)) is None
    assert _facts(read_cubin, bytes(wide)) == _facts(read_cubin_python, bytes(wide))
    # Not one contiguous buffer: declined, and the Python reader decides (bytes() of a strided
    # view reads it; a str is its TypeError).
    strided = memoryview(data + data)[::2]
    assert cubin_module._fastread.cubin_facts(strided) is None
    assert _facts(read_cubin, strided) == _facts(read_cubin_python, bytes(strided))
    assert cubin_module._fastread.cubin_facts("not bytes") is None
    with pytest.raises(TypeError):
        read_cubin("not bytes")


@needs_fastread
def test_the_c_reader_declines_more_entries_than_it_tracks():
    """65 .text.<entry> sections (the C reader tracks 64 by linear lookup): declined, and the
    Python reader reads all 65."""
    names = [f".text.k{i}".encode() for i in range(65)]
    strtab = b"\0" + b"\0".join(names) + b"\0"
    offsets, pos = [], 1
    for n in names:
        offsets.append(pos)
        pos += len(n) + 1
    shnum = 1 + 1 + len(names)  # null section, .shstrtab, the entries
    shstrtab_name = len(strtab)  # ".shstrtab" appended below
    strtab += b".shstrtab\0"
    shoff = 64 + len(strtab)  # the section header table follows the header and the strings
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, shnum, 1)
    section = struct.Struct("<IIQQQQIIQQ")
    table = section.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    table += section.pack(shstrtab_name, 3, 0, 0, 64, len(strtab), 0, 0, 1, 0)
    for offset in offsets:
        table += section.pack(offset, 1, 0, 0, 0, 0, 0, 0, 1, 0)
    data = bytes(header) + strtab + table
    assert cubin_module._fastread.cubin_facts(data) is None
    assert len(read_cubin(data)) == 65
    # 64 of them: read by C, the same as Python.
    fewer = bytearray(data)
    struct.pack_into("<H", fewer, 0x3C, shnum - 1)
    assert _native_facts(bytes(fewer)) == _facts(read_cubin_python, bytes(fewer))
    assert len(read_cubin(bytes(fewer))) == 64
