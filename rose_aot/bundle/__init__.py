"""The bundle file: a verified container of a JSON index and zstd-compressed blobs.

Imports only the standard library and zstandard, so a serving process can read bundles with no
compiler installed. The builder decides what the index means; this package owns the bytes.
"""

from __future__ import annotations

from .format import (
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    MAX_BLOB_BYTES,
    MAX_BUNDLE_BYTES,
    MAX_INDEX_BYTES,
    STORED_ZSTD_LEVEL,
    ZSTD_LEVEL,
    BlobNotFoundError,
    BundleReader,
    write_bundle,
)

__all__ = [
    "MAGIC",
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "ZSTD_LEVEL",
    "STORED_ZSTD_LEVEL",
    "MAX_INDEX_BYTES",
    "MAX_BLOB_BYTES",
    "MAX_BUNDLE_BYTES",
    "BlobNotFoundError",
    "BundleReader",
    "write_bundle",
]
