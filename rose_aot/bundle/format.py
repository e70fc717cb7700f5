"""The bundle container: one file holding a JSON index and zstd-compressed blobs.

Byte layout, integers little-endian::

    offset  bytes  field
    0       8      magic b"ROSEAOT\\0"
    8       4      format version, u32 (FORMAT_VERSION)
    12      4      flags, u32, always 0 in format version 1
    16      8      index length n, u64
    24      32     sha256 of the index bytes
    56      n      index: canonical JSON in ASCII
                   (sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False);
                   a reader requires what gives it one meaning: keys strictly increasing in
                   every object, floats spelled as repr() spells them, no NaN or Infinity
    56 + n  ...    blob region: one zstd frame per blob, concatenated in sorted name order

The index is the caller's JSON object plus a "blobs" table that this module owns::

    "blobs": {name: {"offset": int, "size": int, "raw_size": int,
                     "sha256": hex, "raw_sha256": hex}}

"offset" counts from the start of the blob region; "size" and "sha256" describe the compressed
frame, "raw_size" and "raw_sha256" the decompressed bytes. Frames follow each other with no gap
and the file ends at the end of the last one. Every frame is compressed at level ZSTD_LEVEL, or
STORED_ZSTD_LEVEL (raw blocks: stored, not compressed) for the blobs the writer is told to
store, single-threaded, with its content size in the frame header and no zstd checksum (sha256
covers it), so the same inputs always give the same file.

The header digest covers the index and the index's digests cover every frame.
:meth:`BundleReader.open` checks the header, the index, the blob table and every frame's header
(which bounds what its decompression allocates); a blob's bytes are checked where they are used:
:meth:`BundleReader.blob` checks what the frame decompresses to against raw_sha256 before
returning it (:meth:`BundleReader.blob_view` the same bytes without a copy where a stored frame
holds them in one raw block: what a preload hands the driver), :meth:`BundleReader.verify` both
digests of every blob. The reader treats the file
as hostile: each length and size is checked against the file and the MAX_* limits before
anything is allocated, and every problem is a :class:`BundleError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import stat
import struct
import threading
from collections import OrderedDict

import zstandard

from ..errors import BundleError
from .cubin import _fastread  # the C extension (None where not built)

__all__ = [
    "MAGIC",
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "ZSTD_LEVEL",
    "STORED_ZSTD_LEVEL",
    "MAX_INDEX_BYTES",
    "MAX_BLOB_BYTES",
    "MAX_BUNDLE_BYTES",
    "BLOB_CACHE_BYTES",
    "BlobNotFoundError",
    "BundleReader",
    "write_bundle",
]

MAGIC = b"ROSEAOT\0"
FORMAT_VERSION = 1
ZSTD_LEVEL = 19
# zstd's fastest level, for the blobs a serving process decompresses at warmup (the cubins):
# nearly every block is stored raw, so decompressing is a copy. DeepSeek-V3's 45 cubins
# (816 KB) took 0.88 ms to decompress at level 19 and 0.03 ms at this level on the build
# machine, for 635 KB more file (benchmarks/results/warmup-stored-cubins.md).
STORED_ZSTD_LEVEL = -(1 << 17)
MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_BLOB_BYTES = 512 * 1024 * 1024  # decompressed size of one blob
MAX_BUNDLE_BYTES = 2 * 1024 * 1024 * 1024  # whole file; bundles are MBs, the reader reads it all
# Decompressed blobs a reader keeps (least recently used dropped first). Cubins are KBs to a few
# MBs, so this holds every artifact of a real bundle; a hostile bundle of 512 MiB blobs cannot
# make the reader hold more than this plus the one blob being returned.
BLOB_CACHE_BYTES = 256 * 1024 * 1024
# verify() decompresses in chunks of this size and hashes as it goes. zstd's own window limit
# (its default, 128 MiB; bundles written here use 8 MiB windows) bounds the decoder's memory.
_VERIFY_CHUNK = 1 << 20
_MAX_WINDOW_BYTES = 1 << 27

_HEADER = struct.Struct("<8sIIQ32s")
HEADER_SIZE = _HEADER.size
_BLOBS_KEY = "blobs"
_BLOB_FIELDS = ("offset", "size", "raw_size", "sha256", "raw_sha256")
_BLOB_FIELD_SET = frozenset(_BLOB_FIELDS)
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# A zstd block yields at most 128 KiB and takes at least 4 bytes (3-byte header + 1 RLE byte;
# RFC 8878 3.1.1.2), so no frame of n bytes decompresses to more than 32768 * n bytes.
_MAX_ZSTD_RATIO = 32768
_REBUILD = "rebuild the bundle with `rose-aot build`"


class BlobNotFoundError(BundleError, KeyError):
    """The bundle has no blob of the requested name."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


# --------------------------------------------------------------------------- writing


def write_bundle(path: str | os.PathLike, index: dict, blobs: dict[str, bytes], *,
                 stored: frozenset[str] | set[str] = frozenset()) -> int:
    """Write a bundle atomically and return the number of bytes written.

    ``index`` must survive a JSON round trip unchanged (dicts with str keys, lists, str, int,
    finite float, bool, None) and must not have a "blobs" key. The blobs named in ``stored``
    are framed at STORED_ZSTD_LEVEL (as good as uncompressed), the others at ZSTD_LEVEL. The
    file appears at ``path`` complete or not at all: on any failure an existing file there is
    left untouched.
    """
    path = _fspath(path)
    data = _encode_bundle(index, blobs, stored)
    _atomic_write(path, data)
    return len(data)


def _encode_bundle(index: dict, blobs: dict[str, bytes],
                   stored: frozenset[str] | set[str] = frozenset()) -> bytes:
    if not isinstance(index, dict):
        raise BundleError(f"the bundle index must be a dict (got {type(index).__name__})")
    if _BLOBS_KEY in index:
        raise BundleError(
            f'the bundle index must not have a "{_BLOBS_KEY}" key: write_bundle adds the blobs '
            "table itself; rename that key"
        )
    if not isinstance(blobs, dict):
        raise BundleError(f"blobs must be a dict of name -> bytes (got {type(blobs).__name__})")
    for name, value in blobs.items():
        if not isinstance(name, str) or not name:
            raise BundleError(f"blob names must be non-empty strings (got {_short(name)})")
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise BundleError(f"blob {_short(name)} must be bytes (got {type(value).__name__})")
        if memoryview(value).nbytes > MAX_BLOB_BYTES:
            raise BundleError(
                f"blob {_short(name)} has {memoryview(value).nbytes} bytes, more than the limit of "
                f"{MAX_BLOB_BYTES} (MAX_BLOB_BYTES); split it"
            )

    if not isinstance(stored, (set, frozenset, list, tuple)):
        raise BundleError(
            f"stored must be a set of blob names (got {type(stored).__name__} {_short(stored)})"
        )
    unknown = sorted(set(stored) - set(blobs), key=str)
    if unknown:
        raise BundleError(f"stored names blobs the bundle does not have: {_short(unknown)}")
    compressors = {
        level: zstandard.ZstdCompressor(
            level=level,
            write_content_size=True,
            write_checksum=False,
            write_dict_id=False,
            threads=0,
        )
        for level in (ZSTD_LEVEL, STORED_ZSTD_LEVEL)
    }
    table: dict[str, dict] = {}
    frames: list[bytes] = []
    offset = 0
    for name in sorted(blobs):
        raw = bytes(blobs[name])
        frame = compressors[STORED_ZSTD_LEVEL if name in stored else ZSTD_LEVEL].compress(raw)
        table[name] = {
            "offset": offset,
            "size": len(frame),
            "raw_size": len(raw),
            "sha256": hashlib.sha256(frame).hexdigest(),
            "raw_sha256": hashlib.sha256(raw).hexdigest(),
        }
        frames.append(frame)
        offset += len(frame)

    body = dict(index)
    body[_BLOBS_KEY] = table
    try:
        index_bytes = _canonical_json(body)
        round_trip = json.loads(index_bytes)
        del round_trip[_BLOBS_KEY]
        same = round_trip == index
    except (TypeError, ValueError, RecursionError) as exc:
        raise BundleError(
            f"the bundle index is not JSON-serialisable ({exc}); use only dicts with str keys, "
            "lists, str, int, finite float, bool and None"
        ) from exc
    if not same:
        raise BundleError(
            "the bundle index does not survive a JSON round trip unchanged (a tuple or a non-str "
            "dict key?); use only dicts with str keys, lists, str, int, "
            "finite float, bool and None"
        )
    if len(index_bytes) > MAX_INDEX_BYTES:
        raise BundleError(
            f"the bundle index is {len(index_bytes)} bytes, more than the limit of "
            f"{MAX_INDEX_BYTES} (MAX_INDEX_BYTES); move bulky data into blobs"
        )
    total = HEADER_SIZE + len(index_bytes) + offset
    if total > MAX_BUNDLE_BYTES:
        raise BundleError(
            f"the bundle would be {total} bytes, more than the limit of {MAX_BUNDLE_BYTES} "
            "(MAX_BUNDLE_BYTES); split it into several bundles"
        )
    header = _HEADER.pack(
        MAGIC, FORMAT_VERSION, 0, len(index_bytes), hashlib.sha256(index_bytes).digest()
    )
    return b"".join([header, index_bytes, *frames])


def temp_path(path: str) -> str:
    """The temp file name an atomic write of ``path`` uses: hidden, next to it, and naming the
    writer's pid, so that :func:`remove_stale_temps` can tell a dead writer's leftovers."""
    directory, base = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{base}.{os.getpid()}.{secrets.token_hex(8)}.tmp")


def remove_stale_temps(path: str | os.PathLike) -> list[str]:
    """Remove the temp files that atomic writes of ``path`` left behind when their writer was
    killed (SIGKILL, a power cut) before it could clean up. A temp file is removed only when the
    pid in its name is no longer running on this machine, so a write in progress (another build
    writing the same output) is never touched. Best effort; returns the paths removed."""
    directory, base = os.path.split(os.path.abspath(os.fspath(path)))
    pattern = re.compile(r"\." + re.escape(base) + r"\.(\d{1,10})\.[0-9a-f]{16}\.tmp")
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = pattern.fullmatch(name)
        if not m or _pid_alive(int(m.group(1))):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(os.path.join(directory, name))
        except OSError:
            pass
    return removed


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # exists (another user's) or cannot tell: keep the file
    return True


def _atomic_write(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    remove_stale_temps(path)
    tmp = temp_path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    try:
        # 0o666 and the umask give the file the permissions of any other new file; mkstemp's
        # 0o600 would hide the bundle from a server running as another user.
        fd = os.open(tmp, flags, 0o666)
    except OSError as exc:
        raise BundleError(
            f"cannot create a temporary file in {directory} to write {path}: {exc}; check that "
            "the directory exists and is writable"
        ) from exc
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise BundleError(
                f"cannot write bundle {path}: {exc}; nothing was changed at that path"
            ) from exc
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: str) -> None:
    # Makes the rename durable. Best effort: not every platform or filesystem allows it.
    if os.name != "posix":
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- reading


class BundleReader:
    """A bundle read into memory and verified; blobs are decompressed on first use.

    Make one with :meth:`open` or :meth:`from_bytes`. Both check the header, the index, the blob
    table and each frame's header before they return; :meth:`blob` checks each decompressed
    blob against its sha256 before returning it, so nothing unverified ever leaves the reader.
    ``index`` is the caller's dict as written (without the blobs table).
    """

    path: str
    size: int
    index: dict
    format_version: int

    def __init__(self, path: str, data: bytes, *, cache_bytes: int = BLOB_CACHE_BYTES):
        self.path = path
        self.size = len(data)
        self.format_version, self.index, self._blobs, self._region_start = _parse(path, data)
        self._data = memoryview(data)
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cache_bytes = 0
        self._views: dict[str, memoryview] = {}  # raw sha256 -> blob_view's checked view
        self.cache_limit = cache_bytes
        # One decompression context per thread for every blob (making one costs about as much
        # as decompressing a small cubin; a context serves one thread at a time), so threads
        # decompress in parallel (zstd runs without the GIL). The lock guards the cache only.
        self._contexts = threading.local()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str | os.PathLike) -> BundleReader:
        """Read and verify the bundle file at ``path``."""
        path = _fspath(path)
        return cls(path, _read_file(path))

    @classmethod
    def from_bytes(cls, data: bytes, *, path: str = "<bytes>") -> BundleReader:
        """Verify a bundle held in memory; ``path`` only names it in error messages."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise BundleError(f"{path}: a bundle must be bytes (got {type(data).__name__})")
        return cls(path, bytes(data))

    def blob_names(self) -> list[str]:
        """Names of all blobs, sorted."""
        return list(self._blobs)

    def blob_info(self, name: str) -> dict:
        """A copy of the blob's table entry: offset, size, raw_size, sha256, raw_sha256."""
        entry = self._entry(name)
        return {field: entry[field] for field in _BLOB_FIELDS}

    def raw_digests(self) -> dict[str, str]:
        """Blob name -> sha256 (hex) of its decompressed bytes, as the verified index gives it
        (what blob() checks each blob against), for every blob at once."""
        return {name: entry["raw_sha256"] for name, entry in self._blobs.items()}

    def header(self) -> bytes:
        """The file's first HEADER_SIZE bytes as read and verified (what a signature covers:
        the index digest in it covers the index, whose digests cover every blob)."""
        return bytes(self._data[:HEADER_SIZE])

    def blob(self, name: str) -> bytes:
        """The decompressed blob, checked against its raw size and raw sha256. Cached up to
        ``cache_limit`` bytes of blobs, least recently used dropped first; blobs with the same
        raw sha256 (a variant whose code another's repeats) share one cached copy."""
        entry = self._entry(name)  # unknown or unhashable names fail here, with the names it has
        digest = entry["raw_sha256"]
        with self._lock:
            raw = self._cache.get(digest)
            if raw is not None:
                self._cache.move_to_end(digest)
                return raw
        # Outside the lock: two threads asking for one blob at once may both decompress it,
        # each checking what it got; the cache keeps one copy.
        raw = self._decompress(name, entry)
        if len(raw) <= self.cache_limit:
            with self._lock:
                if digest not in self._cache:
                    self._cache[digest] = raw
                    self._cache_bytes += len(raw)
                    while self._cache_bytes > self.cache_limit:
                        _, dropped = self._cache.popitem(last=False)
                        self._cache_bytes -= len(dropped)
        return raw

    def blob_view(self, name: str) -> memoryview:
        """blob(name)'s bytes, checked the same way, as a read-only view: of the file's own
        bytes where the frame stores the blob whole (one raw block: the stored blobs up to
        zstd's 128 KiB block), so nothing is copied, else of blob(name). What a preload hands
        the driver: a copy of DeepSeek-V3's 55 cubins (871 KB) into fresh memory was half of
        the 1.0 ms their verification took on the build machine."""
        entry = self._entry(name)
        digest = entry["raw_sha256"]
        view = self._views.get(digest)
        if view is not None:
            return view
        view = self._stored_bytes(entry)
        if view is None:
            return memoryview(self.blob(name))
        if hashlib.sha256(view).hexdigest() != digest:
            raise _damaged(
                self.path,
                f"blob {_short(name)}: sha256 of the decompressed bytes differs from the index",
            )
        # Views cost no memory (the file's bytes are held anyway), so they are all kept; a
        # dict's item assignment is atomic, and two threads storing one view store equal ones.
        self._views[digest] = view
        return view

    def verify(self) -> None:
        """Check every blob's frame against its sha256, then decompress it and check the result,
        streaming: each frame is decompressed in 1 MiB
        chunks and hashed as it goes, so memory stays at a chunk plus zstd's window, whatever
        the blob sizes. Fills no cache."""
        for name in self._blobs:
            self._check_streaming(name)

    def _check_streaming(self, name: str) -> None:
        entry = self._entry(name)
        start = self._region_start + entry["offset"]
        frame = self._data[start : start + entry["size"]]
        if hashlib.sha256(frame).hexdigest() != entry["sha256"]:
            raise _damaged(
                self.path,
                f"blob {_short(name)}: the sha256 of its compressed bytes differs from the index",
            )
        digest = hashlib.sha256()
        total = 0
        try:
            decompressor = zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW_BYTES)
            with decompressor.stream_reader(frame, read_across_frames=False) as stream:
                while True:
                    chunk = stream.read(_VERIFY_CHUNK)
                    if not chunk:
                        break
                    total += len(chunk)
                    if total > entry["raw_size"]:
                        break
                    digest.update(chunk)
        except (zstandard.ZstdError, MemoryError, ValueError, OSError) as exc:
            raise _damaged(self.path, f"blob {_short(name)} does not decompress: {exc}") from exc
        if total != entry["raw_size"]:
            raise _damaged(
                self.path,
                f"blob {_short(name)} decompresses to {'more than ' if total > entry['raw_size'] else ''}"
                f"{total} bytes, the index says {entry['raw_size']}",
            )
        if digest.hexdigest() != entry["raw_sha256"]:
            raise _damaged(
                self.path,
                f"blob {_short(name)}: sha256 of the decompressed bytes differs from the index",
            )

    def __repr__(self) -> str:
        return (
            f"BundleReader({self.path!r}, format_version={self.format_version}, "
            f"size={self.size}, blobs={len(self._blobs)})"
        )

    def _entry(self, name: str) -> dict:
        try:
            return self._blobs[name]
        except (KeyError, TypeError):
            names = list(self._blobs)
            shown = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
            raise BlobNotFoundError(
                f"{self.path}: the bundle has no blob {_short(name)}; it has "
                f"{len(names)} blob(s): {shown or '(none)'}"
            ) from None

    def _stored_bytes(self, entry: dict) -> memoryview | None:
        """The blob's bytes inside its frame if the frame is exactly a header and one last raw
        block of raw_size bytes (a zstd block header: 3 bytes little-endian, bit 0 "last",
        bits 1-2 the type, 0 = raw, then the size), else None. Open checked the frame header."""
        start = self._region_start + entry["offset"]
        frame = self._data[start : start + entry["size"]]
        try:
            at = zstandard.frame_header_size(frame)
        except zstandard.ZstdError:
            return None
        if at + 3 > len(frame):
            return None
        block = frame[at] | frame[at + 1] << 8 | frame[at + 2] << 16
        raw_size = entry["raw_size"]
        if block != (raw_size << 3) | 1 or at + 3 + raw_size != len(frame):
            return None
        return frame[at + 3 :]

    def _decompress(self, name: str, entry: dict) -> bytes:
        start = self._region_start + entry["offset"]
        frame = self._data[start : start + entry["size"]]
        try:
            # The open-time check that the frame header declares exactly raw_size is what bounds
            # this allocation: with a declared content size zstd ignores max_output_size.
            decompressor = getattr(self._contexts, "decompressor", None)
            if decompressor is None:
                decompressor = self._contexts.decompressor = zstandard.ZstdDecompressor()
            raw = decompressor.decompress(
                frame, max_output_size=entry["raw_size"], allow_extra_data=False
            )
        except (zstandard.ZstdError, MemoryError, ValueError) as exc:
            raise _damaged(self.path, f"blob {_short(name)} does not decompress: {exc}") from exc
        if len(raw) != entry["raw_size"]:
            raise _damaged(
                self.path,
                f"blob {_short(name)} decompresses to {len(raw)} bytes, the index says "
                f"{entry['raw_size']}",
            )
        if hashlib.sha256(raw).hexdigest() != entry["raw_sha256"]:
            raise _damaged(
                self.path,
                f"blob {_short(name)}: sha256 of the decompressed bytes differs from the index",
            )
        return raw


def _read_file(path: str) -> bytes:
    # O_NONBLOCK: opening a FIFO must not wait for a writer; it is rejected as not a regular file.
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as exc:
        raise BundleError(
            f"{path}: no such bundle file; check the path or build one with `rose-aot build`"
        ) from exc
    except PermissionError as exc:
        raise BundleError(
            f"{path}: permission denied reading the bundle; make it readable by this user"
        ) from exc
    except OSError as exc:
        raise BundleError(f"{path}: cannot open the bundle: {exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise BundleError(f"{path}: is {kind}; pass the path of a bundle file")
        if st.st_size > MAX_BUNDLE_BYTES:
            raise BundleError(
                f"{path}: {st.st_size} bytes, more than the bundle limit of {MAX_BUNDLE_BYTES} "
                "(MAX_BUNDLE_BYTES); this is not a rose-aot bundle"
            )
        chunks = []
        remaining = st.st_size + 1  # one more byte tells that the file grew while being read
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError as exc:
        raise BundleError(f"{path}: cannot read the bundle: {exc}") from exc
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) != st.st_size:
        raise BundleError(
            f"{path}: the file changed size while being read ({st.st_size} -> at least "
            f"{len(data)} bytes); open it again once it is fully written"
        )
    return data


def _parse(path: str, data: bytes) -> tuple[int, dict, dict[str, dict], int]:
    """Verify everything but the blobs' bytes; return version, index, blobs, region start."""
    size = len(data)
    if data[: len(MAGIC)] != MAGIC[: min(size, len(MAGIC))]:
        raise BundleError(
            f"{path}: not a rose-aot bundle: it starts with {bytes(data[:8])!r}, a bundle with "
            f"{MAGIC!r}; check the path, or {_REBUILD}"
        )
    if size < HEADER_SIZE:
        raise _damaged(path, f"truncated: {size} bytes, shorter than the {HEADER_SIZE}-byte header")
    _, version, flags, index_size, index_digest = _HEADER.unpack_from(data)
    if version != FORMAT_VERSION:
        raise BundleError(
            f"{path}: bundle format version {version}; this rose-aot reads format version "
            f"{FORMAT_VERSION} only; {_REBUILD} from this rose-aot version, or load it with the "
            "rose-aot that wrote it"
        )
    if flags != 0:
        raise _damaged(
            path,
            f"header flags are {flags:#x}; format version {FORMAT_VERSION} "
            "defines none, so they must be 0",
        )
    if index_size > MAX_INDEX_BYTES:
        raise _damaged(
            path,
            f"the header gives an index of {index_size} bytes, more than the "
            f"limit of {MAX_INDEX_BYTES} (MAX_INDEX_BYTES)",
        )
    if index_size > size - HEADER_SIZE:
        raise _damaged(
            path,
            f"truncated: the index needs {index_size} bytes after the header, "
            f"the file has {size - HEADER_SIZE}",
        )
    # A view, not a slice: slicing would copy the index (and fault in fresh pages) only to
    # hash and decode it.
    view = memoryview(data)
    index_bytes = view[HEADER_SIZE : HEADER_SIZE + index_size]
    if hashlib.sha256(index_bytes).digest() != index_digest:
        raise _damaged(path, "the sha256 of the index differs from the header")
    body = _decode_index(path, index_bytes)
    region_start = HEADER_SIZE + index_size
    blobs = _check_blob_table(path, body.pop(_BLOBS_KEY), size - region_start)
    # The frames' bytes are checked where they are used: blob() checks what decompression
    # gives against raw_sha256 (what a load hands the driver), verify() both digests. Their
    # headers are checked now, as they bound what a decompression allocates.
    for name, entry in blobs.items():
        start = region_start + entry["offset"]
        _check_frame_header(path, name, view[start : start + entry["size"]], entry["raw_size"])
    return version, body, blobs, region_start


def _decode_index(path: str, index_bytes: bytes | memoryview) -> dict:
    try:
        text = str(index_bytes, "ascii")
    except UnicodeDecodeError as exc:
        raise _damaged(path, f"the index is not ASCII JSON ({exc})") from exc
    # The header digest (and a signature) pin these bytes; what the reader must add is that
    # they have exactly one meaning, the one every JSON reader gives them: no key twice in an
    # object (readers differ on which value wins), no NaN or Infinity, no float literal that
    # another reader could round differently or overflow to inf (1e999). The parse hooks check
    # it as they go: keys strictly increasing in every object (write_bundle's sorted order,
    # which rules out duplicates) and each float spelled as repr() spells it. Re-encoding the
    # parsed index and comparing bytes (the check before, half again the parse time) refused
    # besides only spellings of the same value (whitespace, "\u0041" for "A", an int's
    # leading "-" on zero), which change nothing a reader sees.
    # The C object hook (rose_aot.bundle._fastread, where built) accepts exactly what
    # _sorted_object accepts, without its reasons: an index it refuses is parsed again with
    # the Python hook, which raises the precise error.
    if _fastread is not None:
        try:
            body = json.loads(
                text,
                object_pairs_hook=_fastread.sorted_object,
                parse_float=_canonical_float,
                parse_constant=_reject_constant,
            )
        except (ValueError, RecursionError):
            pass
        else:
            return _check_index_body(path, body)
    try:
        body = json.loads(
            text,
            object_pairs_hook=_sorted_object,
            parse_float=_canonical_float,
            parse_constant=_reject_constant,
        )
    except _DuplicateKeyError as exc:
        raise _damaged(
            path, f"the index has the key {_short(exc.args[0])} twice in one object"
        ) from exc
    except _UnsortedKeysError as exc:
        before, after = exc.args
        raise _damaged(
            path,
            f"the index is not in canonical form: the key {_short(after)} follows "
            f"{_short(before)} (every object's keys are sorted), so write_bundle did not "
            "write it",
        ) from exc
    except _FloatSpellingError as exc:
        raise _damaged(
            path,
            f"the index holds a value this format cannot store: the number "
            f"{_short_text(exc.args[0], 40)} (floats are finite and spelled as repr() spells "
            "them)",
        ) from exc
    except (ValueError, RecursionError) as exc:
        raise _invalid_json(path, exc) from exc
    return _check_index_body(path, body)


def _check_index_body(path: str, body: object) -> dict:
    if not isinstance(body, dict):
        raise _damaged(path, f"the index is a JSON {type(body).__name__}, not an object")
    if _BLOBS_KEY not in body:
        raise _damaged(path, f'the index has no "{_BLOBS_KEY}" table')
    return body


def _invalid_json(path: str, exc: Exception) -> BundleError:
    # Python's own advice after a ';' (raise the int digit limit) is not for hostile input.
    reason = _short_text(str(exc).split(";")[0])
    return _damaged(path, f"the index is not valid JSON ({reason})")


def _check_blob_table(path: str, table: object, region_size: int) -> dict[str, dict]:
    if not isinstance(table, dict):
        raise _damaged(
            path, f'the index\'s "{_BLOBS_KEY}" is a JSON {type(table).__name__}, not an object'
        )
    blobs: dict[str, dict] = {}
    end = 0
    for name in sorted(table):
        entry = table[name]
        if not name:
            raise _damaged(path, "a blob has an empty name")
        if not isinstance(entry, dict):
            raise _damaged(
                path,
                f"blob {_short(name)}: its entry is a JSON {type(entry).__name__}, not an object",
            )
        if entry.keys() != _BLOB_FIELD_SET:  # the details only for the error
            missing = [f for f in _BLOB_FIELDS if f not in entry]
            extra = sorted(k for k in entry if k not in _BLOB_FIELDS)
            problems = [f"missing field {f!r}" for f in missing]
            problems += [f"unknown field {_short(k)}" for k in extra[:4]]
            raise _damaged(path, f"blob {_short(name)}: {', '.join(problems)}")
        offset, size, raw_size = entry["offset"], entry["size"], entry["raw_size"]
        # bool is an int subclass: exact types reject it
        if not (type(offset) is int and type(size) is int and type(raw_size) is int
                and offset >= 0 and size >= 0 and raw_size >= 0):
            for field in ("offset", "size", "raw_size"):  # the first bad one, for the error
                value = entry[field]
                if type(value) is not int or value < 0:
                    raise _damaged(
                        path,
                        f"blob {_short(name)}: {field} must be a non-negative integer "
                        f"(got {_short(value)})",
                    )
        for field in ("sha256", "raw_sha256"):
            value = entry[field]
            if not isinstance(value, str) or not _SHA256_HEX.fullmatch(value):
                raise _damaged(
                    path,
                    f"blob {_short(name)}: {field} must be 64 lowercase hex digits "
                    f"(got {_short(value)})",
                )
        if raw_size > MAX_BLOB_BYTES:
            raise _damaged(
                path,
                f"blob {_short(name)}: raw_size {raw_size} is more than the "
                f"limit of {MAX_BLOB_BYTES} (MAX_BLOB_BYTES)",
            )
        if raw_size > _MAX_ZSTD_RATIO * size:
            raise _damaged(
                path,
                f"blob {_short(name)}: raw_size {raw_size} cannot come from "
                f"a zstd frame of {size} bytes",
            )
        if offset != end:
            raise _damaged(
                path,
                f"blob {_short(name)} starts at offset {offset}, expected "
                f"{end}: blobs must follow each other in name order with no gap or "
                "overlap",
            )
        end += size
        if end > region_size:
            raise _damaged(
                path,
                f"truncated: blob {_short(name)} ends at byte {end} of the blob "
                f"region, which has {region_size} bytes",
            )
        # The entry itself, not a copy: it has exactly these fields, and the index the caller
        # keeps no longer holds the table.
        blobs[name] = entry
    if end != region_size:
        raise _damaged(path, f"{region_size - end} trailing bytes after the last blob")
    return blobs


def _check_frame_header(path: str, name: str, frame: memoryview, raw_size: int) -> None:
    try:
        params = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError as exc:
        raise _damaged(path, f"blob {_short(name)} is not a zstd frame ({exc})") from exc
    if params.content_size != raw_size:
        declared = (
            "no content size"
            if params.content_size in (zstandard.CONTENTSIZE_UNKNOWN, zstandard.CONTENTSIZE_ERROR)
            else f"{params.content_size} bytes"
        )
        raise _damaged(
            path,
            f"blob {_short(name)}: its zstd frame declares {declared}, the index {raw_size} bytes",
        )
    if params.dict_id != 0:
        raise _damaged(
            path,
            f"blob {_short(name)}: its zstd frame needs dictionary {params.dict_id}, "
            "which bundles never use",
        )


# --------------------------------------------------------------------------- helpers


class _DuplicateKeyError(ValueError):
    pass


class _UnsortedKeysError(ValueError):
    pass


class _FloatSpellingError(ValueError):
    pass


def _sorted_object(pairs: list[tuple[str, object]]) -> dict:
    """json.loads' object hook: the object, if its keys strictly increase (sorted, none twice)."""
    obj = dict(pairs)
    if len(pairs) > 1:
        keys = list(obj)
        if len(keys) != len(pairs) or keys != sorted(keys):
            seen: set[str] = set()
            for i, (key, _) in enumerate(pairs):
                if key in seen:
                    raise _DuplicateKeyError(key)
                seen.add(key)
                if i and key < pairs[i - 1][0]:
                    raise _UnsortedKeysError(pairs[i - 1][0], key)
    return obj


def _canonical_float(text: str) -> float:
    """json.loads' float hook: the float, if `text` is how repr() (and so write_bundle) spells
    it; an overflowing literal such as 1e999 reads as inf, whose repr differs."""
    value = float(text)
    if repr(value) != text:
        raise _FloatSpellingError(text)
    return value


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _canonical_json(obj: object) -> bytes:
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def _damaged(path: str, what: str) -> BundleError:
    return BundleError(f"{path}: damaged bundle: {what}; {_REBUILD}")


def _short(value: object, limit: int = 60) -> str:
    return _short_text(repr(value), limit)


def _short_text(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fspath(path: str | os.PathLike) -> str:
    try:
        text = os.fsdecode(os.fspath(path))
    except TypeError as exc:
        raise BundleError(
            f"a bundle path must be a str or os.PathLike (got {type(path).__name__})"
        ) from exc
    if "\0" in text:
        raise BundleError(f"{text!r}: a path cannot contain a NUL byte; check the path")
    return text
