"""The bundle container: round trip, determinism, atomic writes, and a reader that survives any
byte sequence with a BundleError.

Hostile bundles are assembled here by hand from the layout in rose_aot/bundle/format.py (not with
the module's own helpers), so these tests also pin the byte format.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import stat
import struct
import tracemalloc

import pytest
import zstandard

from rose_aot.bundle import (
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    MAX_BLOB_BYTES,
    MAX_INDEX_BYTES,
    BlobNotFoundError,
    BundleReader,
    write_bundle,
)
from rose_aot.errors import BundleError

HEADER = struct.Struct("<8sIIQ32s")
# tracemalloc sees every Python allocation, including the bytes objects zstandard returns.
ALLOC_LIMIT = 8 * 1024 * 1024

INDEX = {
    "format": "rose-aot",
    "toolchain": {"dsl": "4.8.1", "ptx_isa": [8, 7]},
    "archs": ["sm_90a"],
    "points": {"rms_norm/h4096/bf16": {"entries": ["kernel_0"], "smem": 0, "scale": 0.5}},
    "note": "naïve µ-kernels ✓",
    "flags": [True, False, None],
}


def make_blobs(seed: int = 0, scale: int = 1) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {
        "sm_90a/rms_norm.cubin": bytes(rng.getrandbits(8) for _ in range(2000 * scale)),
        "sm_90a/rms_norm.ptx": (".visible .entry kernel_0(.param .u64 p0)\n" * 40 * scale).encode(),
        "empty": b"",
    }


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def frame(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=19, write_content_size=True).compress(raw)


def assemble(
    index_bytes: bytes,
    region: bytes = b"",
    *,
    magic: bytes = MAGIC,
    version: int = FORMAT_VERSION,
    flags: int = 0,
    index_size: int | None = None,
    digest: bytes | None = None,
) -> bytes:
    """A bundle from raw parts; header fields are right unless overridden."""
    header = HEADER.pack(
        magic,
        version,
        flags,
        len(index_bytes) if index_size is None else index_size,
        hashlib.sha256(index_bytes).digest() if digest is None else digest,
    )
    return header + index_bytes + region


def entry(offset: int, data: bytes, raw: bytes, **override) -> dict:
    e = {
        "offset": offset,
        "size": len(data),
        "raw_size": len(raw),
        "sha256": hashlib.sha256(data).hexdigest(),
        "raw_sha256": hashlib.sha256(raw).hexdigest(),
    }
    e.update(override)
    return e


def crafted(blobs: dict[str, tuple[bytes, bytes]], extra: dict | None = None, **override) -> bytes:
    """A consistent bundle from name -> (stored frame, raw bytes); override patches entries."""
    table, region = {}, b""
    for name in sorted(blobs):
        data, raw = blobs[name]
        table[name] = entry(len(region), data, raw, **override.get(name, {}))
        region += data
    return assemble(canonical({**(extra or {}), "blobs": table}), region)


def raw_frame(declared: int, payload: bytes) -> bytes:
    """A zstd frame by hand: single segment, 8-byte content size `declared`, one raw block."""
    block_header = ((len(payload) << 3) | 1).to_bytes(3, "little")  # last block, type raw
    return (
        struct.pack("<I", 0xFD2FB528)
        + bytes([0xE0])
        + struct.pack("<Q", declared)
        + (block_header + payload)
    )


@pytest.fixture
def bundle_bytes(tmp_path) -> bytes:
    path = tmp_path / "small.rab"
    write_bundle(path, INDEX, make_blobs())
    return path.read_bytes()


def open_and_verify(data: bytes) -> str:
    """Where a damaged bundle is caught: 'open' or 'verify'. Fails if it is not caught."""
    try:
        reader = BundleReader.from_bytes(data)
    except BundleError:
        return "open"
    with pytest.raises(BundleError):
        reader.verify()
    return "verify"


# --------------------------------------------------------------------------- round trip


def test_round_trip(tmp_path, monkeypatch):
    blobs = make_blobs()
    path = tmp_path / "b.rab"
    written = write_bundle(path, INDEX, blobs)
    assert written == path.stat().st_size

    decompressions = []
    real = zstandard.ZstdDecompressor

    class CountingDecompressor:  # zstandard's C types must not be subclassed
        def __init__(self, *args, **kwargs):
            self._inner = real(*args, **kwargs)

        def decompress(self, *args, **kwargs):
            decompressions.append(args[0])
            return self._inner.decompress(*args, **kwargs)

        def __getattr__(self, name):  # stream_reader (verify) and the rest, uncounted
            return getattr(self._inner, name)

    monkeypatch.setattr(zstandard, "ZstdDecompressor", CountingDecompressor)

    reader = BundleReader.open(path)
    assert decompressions == [], "open() must not decompress (blobs are lazy)"
    assert reader.path == str(path)
    assert reader.size == written
    assert reader.format_version == FORMAT_VERSION
    assert reader.index == INDEX
    assert "blobs" not in reader.index
    assert reader.blob_names() == sorted(blobs)

    first = reader.blob("sm_90a/rms_norm.cubin")
    assert first == blobs["sm_90a/rms_norm.cubin"]
    assert reader.blob("sm_90a/rms_norm.cubin") is first, "blob() must cache"
    assert len(decompressions) == 1
    for name, raw in blobs.items():
        assert reader.blob(name) == raw
        info = reader.blob_info(name)
        assert info["raw_size"] == len(raw)
        assert info["raw_sha256"] == hashlib.sha256(raw).hexdigest()
        assert set(info) == {"offset", "size", "raw_size", "sha256", "raw_sha256"}
    reader.verify()

    reader.blob_info("empty")["raw_size"] = 99
    assert reader.blob_info("empty")["raw_size"] == 0, "blob_info must hand out a copy"


def test_blobs_from_many_threads_are_exact_and_the_cache_stays_bounded(tmp_path):
    """One reader shares one zstd context between its blobs; threads asking for blobs at
    once (with a cache too small to keep them, so each asks the context again) each get
    exactly the blob's bytes, and the cache never holds more than its limit."""
    import threading

    rng = random.Random(5)
    blobs = {f"b{i}": rng.randbytes(rng.randrange(20_000, 200_000)) for i in range(12)}
    path = tmp_path / "many.rab"
    write_bundle(path, {}, blobs)
    reader = BundleReader(str(path), path.read_bytes(), cache_bytes=300_000)
    wrong, sizes = [], []

    def work(seed):
        local = random.Random(seed)
        for _ in range(60):
            name = local.choice(sorted(blobs))
            if reader.blob(name) != blobs[name]:
                wrong.append(name)
            sizes.append(reader._cache_bytes)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [] and len(sizes) == 480
    assert max(sizes) <= 300_000
    assert reader._cache_bytes == sum(len(v) for v in reader._cache.values())


def test_empty_bundle_and_memory_reader(tmp_path):
    path = tmp_path / "e.rab"
    write_bundle(path, {}, {})
    reader = BundleReader.open(path)
    assert (reader.index, reader.blob_names()) == ({}, [])
    reader.verify()
    assert BundleReader.from_bytes(path.read_bytes()).index == {}


def test_byte_layout(bundle_bytes):
    magic, version, flags, index_size, digest = HEADER.unpack_from(bundle_bytes)
    assert (magic, version, flags) == (b"ROSEAOT\0", 1, 0)
    assert HEADER_SIZE == HEADER.size == 56
    index_bytes = bundle_bytes[HEADER_SIZE : HEADER_SIZE + index_size]
    assert hashlib.sha256(index_bytes).digest() == digest
    body = json.loads(index_bytes)
    assert canonical(body) == index_bytes
    region = bundle_bytes[HEADER_SIZE + index_size :]
    table = body.pop("blobs")
    assert body == INDEX
    offset = 0
    for name in sorted(table):
        e = table[name]
        assert e["offset"] == offset
        data = region[offset : offset + e["size"]]
        params = zstandard.get_frame_parameters(data)
        assert params.content_size == e["raw_size"] and not params.has_checksum
        raw = zstandard.ZstdDecompressor().decompress(data)
        assert hashlib.sha256(raw).hexdigest() == e["raw_sha256"]
        assert raw == make_blobs()[name]
        offset += e["size"]
    assert offset == len(region)


def test_rewrite_is_byte_identical_and_ignores_insertion_order(tmp_path):
    def reverse(obj):
        if isinstance(obj, dict):
            return {k: reverse(obj[k]) for k in reversed(list(obj))}
        return obj

    blobs = make_blobs()
    write_bundle(tmp_path / "a", INDEX, blobs)
    write_bundle(tmp_path / "b", INDEX, blobs)
    write_bundle(tmp_path / "c", reverse(INDEX), dict(reversed(list(blobs.items()))))
    a = (tmp_path / "a").read_bytes()
    assert a == (tmp_path / "b").read_bytes() == (tmp_path / "c").read_bytes()
    write_bundle(tmp_path / "d", {**INDEX, "archs": ["sm_100a"]}, blobs)
    assert (tmp_path / "d").read_bytes() != a


def test_large_compressible_blob_round_trips(tmp_path):
    # Zeros compress close to zstd's maximum ratio; the reader's ratio bound must allow them.
    raw = bytes(4 * 1024 * 1024)
    write_bundle(tmp_path / "z", {}, {"zeros": raw})
    assert BundleReader.open(tmp_path / "z").blob("zeros") == raw


def test_stored_blobs_are_framed_uncompressed(tmp_path):
    blobs = {"a.cubin": b"\x7fELF" + bytes(30000), "a.ptx": b".entry k;\n" * 3000}
    stored = tmp_path / "stored.rab"
    packed = tmp_path / "packed.rab"
    write_bundle(stored, INDEX, blobs, stored={"a.cubin"})
    write_bundle(packed, INDEX, blobs)
    a, b = BundleReader.open(stored), BundleReader.open(packed)
    # zeros compress to nearly nothing at level 19; stored, the frame keeps every byte
    assert a.blob_info("a.cubin")["size"] >= 30004 > 100 * b.blob_info("a.cubin")["size"]
    same = ("size", "sha256", "raw_size", "raw_sha256")
    assert [a.blob_info("a.ptx")[f] for f in same] == [b.blob_info("a.ptx")[f] for f in same]
    for reader in (a, b):
        assert {n: reader.blob(n) for n in blobs} == blobs
        reader.verify()
    again = tmp_path / "again.rab"
    write_bundle(again, INDEX, blobs, stored={"a.cubin"})
    assert again.read_bytes() == stored.read_bytes()
    with pytest.raises(BundleError, match="does not have: \\['b.cubin'\\]"):
        write_bundle(tmp_path / "x.rab", INDEX, blobs, stored={"b.cubin"})
    with pytest.raises(BundleError, match="a set of blob names \\(got str 'a.cubin'\\)"):
        write_bundle(tmp_path / "x.rab", INDEX, blobs, stored="a.cubin")
    assert not (tmp_path / "x.rab").exists()


def test_blob_view_is_the_files_own_bytes_where_a_frame_stores_them_whole(tmp_path):
    cubin = b"\x7fELF" + bytes(range(256)) * 40
    blobs = {"a.cubin": cubin, "b.cubin": cubin,  # one image twice (split / split_wide)
             "big.cubin": b"\x7fELF" + bytes(300_000),  # stored in three raw blocks
             "a.ptx": b".entry k;\n" * 3000}  # compressed
    path = tmp_path / "v.rab"
    write_bundle(path, INDEX, blobs, stored={"a.cubin", "b.cubin", "big.cubin"})
    reader = BundleReader.open(path)
    view = reader.blob_view("a.cubin")
    assert view == cubin and view.readonly
    assert view.obj is reader._data.obj, "the file's bytes, not a copy"
    assert reader.blob_view("b.cubin") is view  # one checked view per image
    for name in ("big.cubin", "a.ptx"):  # frames that do not hold the bytes whole: a copy
        assert reader.blob_view(name) == blobs[name]
        assert reader.blob_view(name).obj is reader.blob(name)
    assert reader.blob("a.cubin") is reader.blob("b.cubin")  # one cached copy per image too
    with pytest.raises(BlobNotFoundError, match="has no blob 'nope'"):
        reader.blob_view("nope")
    with pytest.raises(BlobNotFoundError, match=r"has no blob \['unhashable'\]"):
        reader.blob_view(["unhashable"])


def test_blob_view_checks_the_raw_digest_even_when_nothing_is_decompressed():
    # The frame: a header and one raw block holding the payload (the stored form), so the view
    # is taken from the file: its sha256 is what still guards it. A frame with a checksum
    # after its block is not the stored form: decompressed, and checked the same way.
    for payload in (b"payload", b""):
        good = raw_frame(len(payload), payload)
        reader = BundleReader.from_bytes(crafted({"a": (good, payload)}))
        assert reader._stored_bytes(reader._blobs["a"]) is not None
        assert reader.blob_view("a") == payload
        reader = BundleReader.from_bytes(crafted({"a": (good, payload)},
                                                 a={"raw_sha256": "0" * 64}))
        with pytest.raises(BundleError, match="decompressed bytes differs"):
            reader.blob_view("a")
    two_blocks = raw_frame(7, b"pay")[:-6] + ((3 << 3).to_bytes(3, "little") + b"pay"
                                              + (4 << 3 | 1).to_bytes(3, "little") + b"load")
    reader = BundleReader.from_bytes(crafted({"a": (two_blocks, b"payload")}))
    assert reader._stored_bytes(reader._blobs["a"]) is None
    assert reader.blob_view("a") == b"payload"


def test_unknown_blob(bundle_bytes):
    reader = BundleReader.from_bytes(bundle_bytes, path="x.rab")
    with pytest.raises(BlobNotFoundError, match=r"x\.rab: the bundle has no blob 'nope'") as info:
        reader.blob("nope")
    assert isinstance(info.value, BundleError) and isinstance(info.value, KeyError)
    assert "sm_90a/rms_norm.cubin" in str(info.value)
    with pytest.raises(BlobNotFoundError):
        reader.blob_info("nope")
    with pytest.raises(BlobNotFoundError):
        reader.blob(["unhashable"])
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is BlobNotFoundError and str(again) == str(info.value)


# --------------------------------------------------------------------------- damaged input


@pytest.mark.parametrize("stored", [False, True], ids=["compressed", "stored"])
def test_every_single_bit_flip_is_detected(tmp_path, stored):
    blobs = make_blobs()
    path = tmp_path / "small.rab"
    write_bundle(path, INDEX, blobs, stored=set(blobs) if stored else set())
    bundle_bytes = path.read_bytes()
    assert 2000 < len(bundle_bytes) < 8000, "keep this bundle a few KB"
    region_start = HEADER_SIZE + HEADER.unpack_from(bundle_bytes)[3]
    where = {"open": 0, "verify": 0}
    for pos in range(len(bundle_bytes)):
        damaged = bytearray(bundle_bytes)
        damaged[pos] ^= 1 << (pos % 8)
        caught = open_and_verify(bytes(damaged))
        where[caught] += 1
        if pos < region_start:
            # The header digest covers the index (and its blob table): open() catches these.
            assert caught == "open", pos
        elif caught == "verify":
            # A flip in a frame's body: verify() catches it (above), and no blob() gives
            # anything but its original bytes: each decompressed blob is checked first.
            reader = BundleReader.from_bytes(bytes(damaged))
            for name, raw in blobs.items():
                for read in (reader.blob, reader.blob_view):  # the view: what a load gets
                    try:
                        assert read(name) == bytes(raw), (pos, name, read)
                    except BundleError:
                        pass
    assert sum(where.values()) == len(bundle_bytes)
    assert where["verify"] > 0, "frame bodies are checked where they are used, not at open"


def test_every_truncation_is_detected(bundle_bytes, tmp_path):
    caught = 0
    for length in range(len(bundle_bytes)):
        with pytest.raises(BundleError):
            BundleReader.from_bytes(bundle_bytes[:length])
        caught += 1
    assert caught == len(bundle_bytes)
    for length in (0, 7, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 10, len(bundle_bytes) - 1):
        path = tmp_path / f"t{length}"
        path.write_bytes(bundle_bytes[:length])
        with pytest.raises(BundleError, match="truncated"):
            BundleReader.open(path)


@pytest.mark.parametrize(
    "start", [b"", b"\x89PNG\r\n\x1a\n", b"\0" * 64, b"ROSEAOT\x01", b"ROSEAOT", b"rose"]
)
def test_wrong_magic(bundle_bytes, start):
    data = start + bundle_bytes[len(start) :] if len(start) >= 8 else start
    if start == b"ROSEAOT":  # a correct prefix of the magic is a truncated bundle
        with pytest.raises(BundleError, match="truncated"):
            BundleReader.from_bytes(data)
        return
    with (
        pytest.raises(BundleError, match="not a rose-aot bundle")
        if start
        else pytest.raises(BundleError, match="truncated")
    ):
        BundleReader.from_bytes(data)


@pytest.mark.parametrize("version", [0, 2, 7, 2**32 - 1])
def test_wrong_version_says_found_and_supported(bundle_bytes, version):
    data = bundle_bytes[:8] + struct.pack("<I", version) + bundle_bytes[12:]
    with pytest.raises(BundleError) as info:
        BundleReader.from_bytes(data)
    msg = str(info.value)
    assert f"format version {version};" in msg
    assert f"reads format version {FORMAT_VERSION} only" in msg
    assert "rose-aot build" in msg


def test_nonzero_flags(bundle_bytes):
    data = bundle_bytes[:12] + struct.pack("<I", 4) + bundle_bytes[16:]
    with pytest.raises(BundleError, match="flags are 0x4"):
        BundleReader.from_bytes(data)


@pytest.mark.parametrize("tail", [b"\0", b"x" * 100, b"ROSEAOT\0"])
def test_trailing_bytes(bundle_bytes, tail):
    with pytest.raises(BundleError, match=f"{len(tail)} trailing bytes after the last blob"):
        BundleReader.from_bytes(bundle_bytes + tail)


@pytest.mark.parametrize("index_size", [2**64 - 1, 2**63, MAX_INDEX_BYTES + 1, 10**6])
def test_huge_index_length_in_header(index_size):
    data = assemble(b"{}", index_size=index_size)
    tracemalloc.start()
    try:
        with pytest.raises(BundleError, match="MAX_INDEX_BYTES|truncated"):
            BundleReader.from_bytes(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < ALLOC_LIMIT


@pytest.mark.parametrize(
    "declared, raw_size, match",
    [
        (5, 2**62, "MAX_BLOB_BYTES"),
        (5, MAX_BLOB_BYTES + 1, "MAX_BLOB_BYTES"),
        (5, MAX_BLOB_BYTES, "cannot come from a zstd frame"),
        (2**40, 5, "declares 1099511627776 bytes"),
        (300 * 2**20, 300 * 2**20, "cannot come from a zstd frame"),
        (2**40, 2**40, "MAX_BLOB_BYTES"),
    ],
)
def test_enormous_raw_size_is_never_allocated(declared, raw_size, match):
    payload = b"hello"
    data = raw_frame(declared, payload)
    bundle = crafted({"k": (data, payload)}, k={"raw_size": raw_size})
    tracemalloc.start()
    try:
        with pytest.raises(BundleError, match=match):
            BundleReader.from_bytes(bundle).verify()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < ALLOC_LIMIT


def test_hand_made_frame_is_accepted():
    # The control for the test above: the same hand-made frame, declared honestly, loads.
    bundle = crafted({"k": (raw_frame(5, b"hello"), b"hello")})
    assert BundleReader.from_bytes(bundle).blob("k") == b"hello"


def _bad_indexes() -> list[tuple[str, bytes, str]]:
    """(case, bundle bytes with a correct header digest, expected message fragment)."""
    good = frame(b"payload")
    other = frame(b"other")
    two = {"a": (good, b"payload"), "b": (other, b"other")}
    e_a = entry(0, good, b"payload")
    e_b = entry(len(good), other, b"other")
    region = good + other

    def table(**patch):
        t = {"a": dict(e_a), "b": dict(e_b)}
        for name, fields in patch.items():
            t[name].update(fields)
        return t

    def idx(obj) -> bytes:
        return assemble(canonical(obj), region)

    no_size = {k: v for k, v in e_a.items() if k != "size"}
    cases = [
        ("top level list", assemble(b"[]"), "not an object"),
        ("top level string", assemble(b'"blobs"'), "not an object"),
        ("no blobs table", assemble(b"{}"), 'no "blobs" table'),
        ("blobs is a list", idx({"blobs": []}), '"blobs" is a JSON list'),
        ("entry is a number", idx({"blobs": {"a": 1}}), "entry is a JSON int"),
        ("missing field", idx({"blobs": {"a": no_size, "b": e_b}}), "missing field 'size'"),
        ("extra field", idx({"blobs": table(a={"x": 1})}), "unknown field 'x'"),
        ("negative offset", idx({"blobs": table(a={"offset": -1})}), "offset must be"),
        ("bool size", idx({"blobs": table(a={"size": True})}), "size must be"),
        ("float raw_size", idx({"blobs": table(a={"raw_size": 7.0})}), "raw_size must be"),
        ("string offset", idx({"blobs": table(b={"offset": "20"})}), "offset must be"),
        ("null raw_size", idx({"blobs": table(b={"raw_size": None})}), "raw_size must be"),
        ("upper-case sha", idx({"blobs": table(a={"sha256": e_a["sha256"].upper()})}), "hex"),
        ("short sha", idx({"blobs": table(a={"sha256": e_a["sha256"][:-1]})}), "hex"),
        ("sha with newline", idx({"blobs": table(a={"sha256": e_a["sha256"] + "\n"})}), "hex"),
        ("numeric sha", idx({"blobs": table(b={"raw_sha256": 5})}), "hex"),
        ("overlap", idx({"blobs": table(b={"offset": 0})}), "starts at offset 0, expected"),
        ("gap", idx({"blobs": table(b={"offset": len(good) + 1})}), "no gap or overlap"),
        (
            "not in name order",
            idx({"blobs": table(a={"offset": len(other)}, b={"offset": 0})}),
            "starts at offset",
        ),
        ("past the region", idx({"blobs": table(b={"size": len(other) + 1})}), "truncated"),
        ("region too long", assemble(canonical({"blobs": table()}), region + b"\0"), "trailing"),
        ("empty name", crafted({"": (good, b"payload")}), "empty name"),
        (
            "long hostile name",
            crafted({"n" * 100_000: (good, b"payload")}, **{"n" * 100_000: {"raw_size": 6}}),
            "nnn\\.\\.\\.: its zstd frame declares",
        ),
        ("not a zstd frame", crafted({"a": (b"\0" * 16, b"")}), "not a zstd frame"),
        ("truncated zstd header", crafted({"a": (good[:3], b"")}), "not a zstd frame"),
        ("frame size mismatch", crafted(two, a={"raw_size": 6}), "declares 7 bytes"),
        (
            "no content size",
            crafted(
                {"a": (zstandard.ZstdCompressor(write_content_size=False).compress(b"zz"), b"zz")}
            ),
            "declares no content size",
        ),
        ("unsorted keys", assemble(b'{"z":1,"blobs":{}}'), "canonical"),
        ("unsorted nested keys", assemble(b'{"a":{"y":1,"x":2},"blobs":{}}'), "'x' follows 'y'"),
        ("float with a trailing zero", assemble(b'{"blobs":{},"n":1.50}'), "cannot store"),
        ("float with an exponent", assemble(b'{"blobs":{},"n":1E2}'), "cannot store"),
        ("raw utf-8", assemble('{"blobs":{},"n":"é"}'.encode()), "not ASCII"),
        ("invalid utf-8", assemble(b'{"blobs":{},"n":"\xff"}'), "not ASCII"),
        ("duplicate key", assemble(b'{"blobs":{},"blobs":{}}'), "twice"),
        ("nested duplicate", assemble(b'{"a":{"x":1,"x":2},"blobs":{}}'), "twice"),
        ("NaN", assemble(b'{"blobs":{},"n":NaN}'), "not valid JSON"),
        ("Infinity", assemble(b'{"blobs":{},"n":-Infinity}'), "not valid JSON"),
        ("overflowing float", assemble(b'{"blobs":{},"n":1e999}'), "cannot store"),
        ("huge int", assemble(b'{"blobs":{},"n":' + b"9" * 5000 + b"}"), "not valid JSON"),
        ("deep nesting", assemble(b'{"blobs":{},"n":' + b"[" * 200000 + b"]" * 200000 + b"}"), ""),
        ("unterminated", assemble(b'{"blobs":{'), "not valid JSON"),
        ("empty index", assemble(b""), "not valid JSON"),
        ("nul in index", assemble(b'{"blobs":{}}\0'), "not valid JSON"),
        ("bad digest", assemble(b'{"blobs":{}}', digest=b"\0" * 32), "sha256 of the index"),
        ("index longer than file", assemble(b'{"blobs":{}}', index_size=13), "truncated"),
    ]
    return cases


BAD_INDEXES = _bad_indexes()


@pytest.fixture(params=["fastread", "python"])
def index_hook(request, monkeypatch):
    """Read indexes through the C object hook (where built) or the Python one alone: both must
    accept the same indexes and refuse the others with the same message."""
    from rose_aot.bundle import format as format_module

    if request.param == "python":
        monkeypatch.setattr(format_module, "_fastread", None)
    elif format_module._fastread is None:
        pytest.skip("the C extension rose_aot.bundle._fastread is not built")
    return request.param


@pytest.mark.parametrize("case, data, match", BAD_INDEXES, ids=[c[0] for c in BAD_INDEXES])
def test_hand_crafted_bad_index(case, data, match, index_hook):
    with pytest.raises(BundleError, match=match or None) as info:
        BundleReader.from_bytes(data, path="evil.rab")
    msg = str(info.value)
    assert msg.startswith("evil.rab: ") and "rose-aot build" in msg
    assert len(msg) < 600, "messages quote hostile values only in part"


def test_other_spellings_of_the_same_index_mean_the_same(index_hook):
    """The reader refuses what could mean two things (a key twice, a float another reader may
    round otherwise); whitespace and escape spellings mean one thing to every JSON reader, so
    they open, with the index write_bundle's spelling gives."""
    region = frame(b"payload")
    table = {"a": entry(0, region, b"payload")}
    spelled = json.dumps({"blobs": table, "n": "A\u00e9", "x": [1, -0.5]}, indent=1,
                         sort_keys=True, ensure_ascii=True).replace("A\\u00e9", "\\u0041\\u00e9")
    assert "\\u0041" in spelled and "\n" in spelled
    reader = BundleReader.from_bytes(assemble(spelled.encode(), region))
    assert reader.index == {"n": "A\u00e9", "x": [1, -0.5]}
    assert reader.blob("a") == b"payload"


def test_the_c_object_hook_accepts_exactly_what_the_python_hook_accepts():
    """sorted_object (C) against _sorted_object: the same dict, or both refuse, on random
    objects whose keys are sorted, unsorted, repeated, empty, or differ past ASCII."""
    from rose_aot.bundle import format as format_module

    fast = format_module._fastread
    if fast is None:
        pytest.skip("the C extension rose_aot.bundle._fastread is not built")
    rng = random.Random(11)
    alphabet = ["", "a", "b", "ab", "B", "a\u00e9", "\u00e9", "\U0001f600", "a\0", "aa"]
    accepted = refused = 0
    for _ in range(4000):
        keys = [rng.choice(alphabet) for _ in range(rng.randrange(5))]
        if rng.random() < 0.5:
            keys = sorted(set(keys))
        pairs = [(k, rng.randrange(3)) for k in keys]
        try:
            want = format_module._sorted_object(list(pairs))
        except ValueError:
            want = ValueError
        try:
            got = fast.sorted_object(list(pairs))
        except ValueError:
            got = ValueError
        assert got == want and (got is ValueError or list(got) == list(want)), pairs
        accepted += got is not ValueError
        refused += got is ValueError
    assert accepted > 1000 and refused > 500
    with pytest.raises(TypeError):
        fast.sorted_object(((("a", 1),)))  # a tuple, not json's list


def test_bad_index_cases_are_really_consistent():
    # Each hostile case must get past the header digest, or it tests nothing deeper than that.
    shallow = ("bad digest", "index longer than file")
    deeper = [case for case, _, _ in BAD_INDEXES if case not in shallow]
    for case, data, _ in BAD_INDEXES:
        if case in deeper:
            _, _, _, size, digest = HEADER.unpack_from(data)
            assert hashlib.sha256(data[HEADER_SIZE : HEADER_SIZE + size]).digest() == digest, case
    assert len(deeper) == len(BAD_INDEXES) - 2


def test_wrong_compressed_digest_is_caught_by_verify():
    # The frame's digest is checked by verify(); a load checks what it gets from the frame
    # (raw_sha256), so open() and blob() pass when that is right. A hostile name is quoted in
    # part.
    good = frame(b"payload")
    name = "n" * 100_000
    bundle = crafted({name: (good, b"payload")}, **{name: {"sha256": "0" * 64}})
    reader = BundleReader.from_bytes(bundle, path="evil.rab")
    assert reader.blob(name) == b"payload"
    with pytest.raises(BundleError, match=r"nnn\.\.\.: the sha256 of its compressed bytes") as info:
        reader.verify()
    assert len(str(info.value)) < 600


def test_wrong_raw_digest_is_caught_at_first_use():
    # Only decompression can see the raw bytes: open() passes, blob() and verify() refuse.
    good = frame(b"payload")
    bundle = crafted({"a": (good, b"payload")}, a={"raw_sha256": "0" * 64})
    reader = BundleReader.from_bytes(bundle)
    with pytest.raises(BundleError, match="decompressed bytes differs"):
        reader.blob("a")
    with pytest.raises(BundleError, match="decompressed bytes differs"):
        reader.verify()


def test_corrupt_frame_body_is_caught_at_first_use():
    # A frame whose header is right and whose body is garbage (with a matching sha256).
    raw = bytes(range(256)) * 8
    data = bytearray(frame(raw))
    data[-10:] = b"\xff" * 10
    reader = BundleReader.from_bytes(crafted({"a": (bytes(data), raw)}))
    with pytest.raises(BundleError, match="does not decompress|decompress"):
        reader.blob("a")
    with pytest.raises(BundleError):
        reader.verify()


def test_random_byte_strings(bundle_bytes):
    rng = random.Random(1234)
    prefix = HEADER.pack(MAGIC, FORMAT_VERSION, 0, 0, b"\0" * 32)[:16]
    caught = 0
    for i in range(3000):
        body = rng.randbytes(rng.choice([0, 1, 8, 55, 56, 57, 100, 300, 1000]))
        data = body if i % 3 == 0 else (prefix + body if i % 3 == 1 else MAGIC + body)
        with pytest.raises(BundleError):
            BundleReader.from_bytes(data)
        caught += 1
    assert caught == 3000

    # Random multi-byte edits of a valid bundle: overwrite, insert, delete.
    mutated = 0
    for _ in range(1500):
        data = bytearray(bundle_bytes)
        for _ in range(rng.randint(1, 6)):
            pos = rng.randrange(len(data))
            op = rng.randrange(3)
            if op == 0:
                data[pos] ^= rng.randint(1, 255)
            elif op == 1:
                data.insert(pos, rng.getrandbits(8))
            else:
                del data[pos]
        if bytes(data) == bundle_bytes:
            continue
        open_and_verify(bytes(data))
        mutated += 1
    assert mutated > 1400


def test_random_index_values_never_escape(bundle_bytes):
    # Valid digests over random JSON-ish text: the parser and the table checks see it all.
    rng = random.Random(99)
    atoms = [
        b"{",
        b"}",
        b"[",
        b"]",
        b",",
        b":",
        b'"blobs"',
        b'"offset"',
        b'"size"',
        b"0",
        b"-1",
        b"1e400",
        b"true",
        b"null",
        b'"a"',
        b'"' + b"0" * 64 + b'"',
        b"\\u00e9",
    ]
    caught = 0
    for _ in range(2000):
        text = b"".join(rng.choice(atoms) for _ in range(rng.randint(0, 30)))
        with pytest.raises(BundleError):
            BundleReader.from_bytes(assemble(text, rng.randbytes(rng.randint(0, 40))))
        caught += 1
    assert caught == 2000


# --------------------------------------------------------------------------- file system


def test_missing_file_directory_fifo_and_permission(tmp_path, monkeypatch):
    with pytest.raises(BundleError, match="no such bundle file"):
        BundleReader.open(tmp_path / "missing.rab")
    with pytest.raises(BundleError, match="is a directory"):
        BundleReader.open(tmp_path)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        with pytest.raises(BundleError, match="not a regular file"):
            BundleReader.open(tmp_path / "fifo")  # must not block waiting for a writer
    with pytest.raises(BundleError, match="must be a str or os.PathLike"):
        BundleReader.open(None)

    path = tmp_path / "b.rab"
    write_bundle(path, INDEX, make_blobs())

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "open", denied)  # chmod would not stop root
    with pytest.raises(BundleError, match="permission denied"):
        BundleReader.open(path)


def test_written_file_is_readable_by_others(tmp_path):
    umask = os.umask(0o022)
    try:
        write_bundle(tmp_path / "b.rab", {}, {})
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "b.rab").stat().st_mode) == 0o644


# --------------------------------------------------------------------------- atomic write


class Boom(OSError):
    pass


def _fail(exc):
    def fail(*args, **kwargs):
        raise exc

    return fail


@pytest.mark.parametrize(
    "how", ["replace", "fsync", "write", "interrupt", "unserialisable", "blobs key", "tuple"]
)
def test_failed_write_leaves_existing_bundle_and_no_temp_file(tmp_path, monkeypatch, how):
    path = tmp_path / "b.rab"
    write_bundle(path, INDEX, make_blobs())
    before = path.read_bytes()
    listing = sorted(os.listdir(tmp_path))
    index, expected = {"new": 1}, BundleError
    if how == "replace":
        monkeypatch.setattr(os, "replace", _fail(Boom(28, "No space left on device")))
    elif how == "fsync":
        monkeypatch.setattr(os, "fsync", _fail(Boom(5, "Input/output error")))
    elif how == "write":
        monkeypatch.setattr(os, "write", _fail(Boom(28, "No space left on device")))
    elif how == "interrupt":
        monkeypatch.setattr(os, "replace", _fail(KeyboardInterrupt()))
        expected = KeyboardInterrupt
    elif how == "unserialisable":
        index = {"x": object()}
    elif how == "blobs key":
        index = {"blobs": {}}
    elif how == "tuple":
        index = {"shape": (1, 2)}
    with pytest.raises(expected) as info:
        write_bundle(path, index, make_blobs(seed=1))
    monkeypatch.undo()
    if expected is BundleError and how in ("replace", "fsync", "write"):
        assert isinstance(info.value.__cause__, Boom)
    assert sorted(os.listdir(tmp_path)) == listing
    assert path.read_bytes() == before
    BundleReader.open(path).verify()


def test_successful_rewrite_replaces_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "b.rab"
    write_bundle(path, INDEX, make_blobs())
    write_bundle(path, {"v": 2}, {"x": b"y"})
    assert os.listdir(tmp_path) == ["b.rab"]
    reader = BundleReader.open(path)
    assert reader.index == {"v": 2} and reader.blob("x") == b"y"


def test_write_into_missing_directory(tmp_path):
    with pytest.raises(BundleError, match="cannot create a temporary file"):
        write_bundle(tmp_path / "no" / "b.rab", {}, {})


@pytest.mark.parametrize(
    "index, blobs, match",
    [
        ([], {}, "must be a dict"),
        ({"a": {1: "int key"}}, {}, "round trip"),
        ({1: "int key"}, {}, "not JSON-serialisable|round trip"),
        ({1: "a", "b": 2}, {}, "not JSON-serialisable"),
        ({"x": float("nan")}, {}, "not JSON-serialisable"),
        ({"x": b"bytes"}, {}, "not JSON-serialisable"),
        ({}, [], "must be a dict"),
        ({}, {"": b"x"}, "non-empty strings"),
        ({}, {3: b"x"}, "non-empty strings"),
        ({}, {"a": "text"}, "must be bytes"),
    ],
)
def test_writer_rejects_bad_input(tmp_path, index, blobs, match):
    with pytest.raises(BundleError, match=match):
        write_bundle(tmp_path / "b.rab", index, blobs)
    assert os.listdir(tmp_path) == []


def test_writer_accepts_bytes_like_blobs(tmp_path):
    write_bundle(tmp_path / "a", {}, {"x": b"abc"})
    write_bundle(tmp_path / "b", {}, {"x": bytearray(b"abc")})
    write_bundle(tmp_path / "c", {}, {"x": memoryview(b"abc")})
    a = (tmp_path / "a").read_bytes()
    assert a == (tmp_path / "b").read_bytes() == (tmp_path / "c").read_bytes()


def test_import_stays_light():
    # The serving side reads bundles with no compiler: no cutlass, no torch behind this import.
    import subprocess
    import sys

    code = (
        "import sys, rose_aot.bundle\n"
        "roots = {m.split('.')[0] for m in sys.modules}\n"
        "heavy = sorted(roots & {'torch', 'cutlass', 'cuda'})\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_raw_digests_are_the_blob_table_s(tmp_path):
    path = tmp_path / "d.rosebundle"
    write_bundle(path, {"kind": "t"}, {"b": b"one", "a": b"two"})
    reader = BundleReader.open(path)
    digests = reader.raw_digests()
    assert digests == {n: reader.blob_info(n)["raw_sha256"] for n in ("a", "b")}
    assert digests["a"] == hashlib.sha256(b"two").hexdigest()
    digests["a"] = "0" * 64  # a copy: the reader's table is unchanged
    assert reader.raw_digests()["a"] == hashlib.sha256(b"two").hexdigest()


def test_the_index_is_decoded_from_a_view_of_the_file_with_the_same_errors():
    """The reader hashes and decodes the index in place (a memoryview of the file, no copy of
    the index): a view reads as its bytes do, and non-ASCII bytes are refused alike."""
    from rose_aot.bundle.format import _decode_index

    text = b'{"a":[1,2.5,"x"],"blobs":{}}'
    assert _decode_index("b", memoryview(b"..." + text)[3:]) == _decode_index("b", text)
    for bad in ('{"blobs":{},"n":"\u00e9"}'.encode(), b'{"blobs":{},"n":"\xff"}'):
        with pytest.raises(BundleError) as from_bytes:
            _decode_index("b", bad)
        with pytest.raises(BundleError) as from_view:
            _decode_index("b", memoryview(bad))
        assert "not ASCII" in str(from_view.value) and str(from_view.value) == str(from_bytes.value)


def test_blob_info_lists_the_fields_in_table_order_whatever_the_index_order():
    """The reader keeps the index's own blob entries (keys in sorted order); blob_info hands out
    a copy in the documented field order."""
    from rose_aot.bundle.format import _encode_bundle

    reader = BundleReader.from_bytes(_encode_bundle({}, {"a": b"abc", "b": b""}))
    for name in ("a", "b"):
        info = reader.blob_info(name)
        assert list(info) == ["offset", "size", "raw_size", "sha256", "raw_sha256"]
        info["size"] = -1
        assert reader.blob_info(name)["size"] >= 0
