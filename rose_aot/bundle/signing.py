"""Ed25519 signatures of bundles, in a detached ``<bundle>.sig`` file.

What is signed: the bundle's 56-byte header (magic, format version, flags, index length and the
sha256 of the index) after a fixed domain prefix. The index holds the sha256 of every blob frame
and of what it decompresses to, which the reader checks before any blob is used, and the reader
refuses trailing bytes, so the header pins every byte of the file; signing it is as strong as
signing the whole file, and verifying costs one Ed25519 check.

Why detached: the bundle's bytes stay exactly what the build wrote (byte-identical rebuilds,
the same sha256 in the build report, no format change), signing is a separate step a CI job with
the key runs after the build, and a bundle can carry several signatures (a key rotation). The
price is a second file to ship next to the bundle; a bundle without it is refused by
``open_bundle(path, trusted_keys=...)`` as unsigned.

The ``.sig`` file is canonical JSON::

    {"kind": "rose-aot bundle signature", "version": 1, "header_sha256": hex,
     "signatures": [{"algorithm": "ed25519", "key_id": hex16, "signature": hex128}, ...]}

Keys: ``rose-aot keygen -o KEY`` writes KEY (the private key, PKCS#8 PEM, mode 0600) and
KEY.pub (the public key, SubjectPublicKeyInfo PEM; ``openssl genpkey -algorithm ed25519``
makes the same formats). A key id is the first 16 hex digits of the sha256 of the raw 32-byte
public key. Needs the ``cryptography`` package (``pip install rose-aot[sign]``); nothing here
imports it until a key is used, so serving without trusted keys needs no extra package.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

from ..errors import BundleError

__all__ = [
    "SIGNATURE_SUFFIX",
    "signature_path",
    "key_id",
    "generate_key",
    "load_private_key",
    "load_public_key",
    "sign_bundle",
    "verify_signature",
    "check_signature",
]

SIGNATURE_SUFFIX = ".sig"
SIGNATURE_KIND = "rose-aot bundle signature"
SIGNATURE_VERSION = 1
_DOMAIN = b"rose-aot bundle signature v1\0"
_MAX_SIG_FILE_BYTES = 64 * 1024
_MAX_KEY_FILE_BYTES = 64 * 1024
_MAX_SIGNATURES = 64
_KEY_ID = re.compile(r"[0-9a-f]{16}")
_SIG_HEX = re.compile(r"[0-9a-f]{128}")
_INSTALL = "install the signing extra: pip install 'rose-aot[sign]' (the cryptography package)"


def signature_path(bundle) -> str:
    """``build/x.rosebundle`` -> ``build/x.rosebundle.sig``."""
    return os.fspath(bundle) + SIGNATURE_SUFFIX


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:
        raise BundleError(f"signing and signature checks need cryptography; {_INSTALL}") from exc
    return ed25519, serialization, InvalidSignature


def _raw_public(public_key) -> bytes:
    _, serialization, _ = _crypto()
    return public_key.public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def key_id(public_key) -> str:
    """First 16 hex digits of the sha256 of the raw public key."""
    return hashlib.sha256(_raw_public(public_key)).hexdigest()[:16]


def generate_key(path) -> tuple[str, str, str]:
    """Write a new private key to ``path`` (0600) and its public key to ``path.pub``;
    return (private path, public path, key id). Refuses to overwrite either file."""
    ed25519, serialization, _ = _crypto()
    path = _path(path, "key")
    pub = path + ".pub"
    private = ed25519.Ed25519PrivateKey.generate()
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    for target in (path, pub):
        if os.path.lexists(target):
            raise BundleError(f"{target}: exists; keygen never overwrites a key, pick another path")
    _write_new(path, private_pem, 0o600)
    _write_new(pub, public_pem, 0o644)
    return path, pub, key_id(private.public_key())


def _write_new(path: str, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except OSError as exc:
        raise BundleError(f"cannot create {path}: {exc.strerror or exc}") from exc
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _read_small(path: str, what: str, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError as exc:
        raise BundleError(f"{path}: no such {what} file") from exc
    except OSError as exc:
        raise BundleError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise BundleError(f"{path}: more than {limit} bytes; this is not a {what}")
    return data


def load_private_key(path):
    """An Ed25519 private key from a PKCS#8 PEM file (what keygen writes)."""
    ed25519, serialization, _ = _crypto()
    path = _path(path, "key")
    data = _read_small(path, "private key", _MAX_KEY_FILE_BYTES)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise BundleError(
            f"{path}: not an unencrypted PEM private key ({exc}); make one with `rose-aot keygen`"
        ) from exc
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise BundleError(f"{path}: is a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_key(key):
    """An Ed25519 public key from a path to a PEM file (KEY.pub), PEM bytes, or a key object."""
    ed25519, serialization, _ = _crypto()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.public_key()
    if isinstance(key, (bytes, bytearray)):
        label, data = "<public key bytes>", bytes(key)
    else:
        label = _path(key, "trusted key")
        data = _read_small(label, "public key", _MAX_KEY_FILE_BYTES)
    try:
        public = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise BundleError(
            f"{label}: not a PEM public key ({exc}); pass the KEY.pub that `rose-aot keygen` wrote"
        ) from exc
    if not isinstance(public, ed25519.Ed25519PublicKey):
        raise BundleError(f"{label}: is a {type(public).__name__}, not an Ed25519 public key")
    return public


def _message(header: bytes) -> bytes:
    return _DOMAIN + header


def sign_bundle(bundle, private_key) -> tuple[str, str]:
    """Sign the bundle (or shard) file at ``bundle``: verify it, then add this key's signature to
    ``<bundle>.sig`` (replacing an older one of the same key, keeping other keys' signatures when
    they are for these same bytes). Returns (signature file, key id)."""
    from .format import BundleReader

    bundle = _path(bundle, "bundle")
    if not hasattr(private_key, "sign"):
        private_key = load_private_key(private_key)
    reader = BundleReader.open(bundle)
    header = reader.header()
    kid = key_id(private_key.public_key())
    sig_file = signature_path(bundle)
    keep = []
    if os.path.exists(sig_file):
        try:
            doc = _read_signature_file(sig_file)
            if doc["header_sha256"] == hashlib.sha256(header).hexdigest():
                keep = [s for s in doc["signatures"] if s["key_id"] != kid]
        except BundleError:
            keep = []  # a damaged or stale file is replaced
    entry = {
        "algorithm": "ed25519",
        "key_id": kid,
        "signature": private_key.sign(_message(header)).hex(),
    }
    doc = {
        "kind": SIGNATURE_KIND,
        "version": SIGNATURE_VERSION,
        "header_sha256": hashlib.sha256(header).hexdigest(),
        "signatures": sorted([*keep, entry], key=lambda s: s["key_id"]),
    }
    from .format import _atomic_write

    data = json.dumps(doc, sort_keys=True, indent=1).encode("ascii") + b"\n"
    _atomic_write(sig_file, data)
    return sig_file, kid


def _read_signature_file(path: str) -> dict:
    data = _read_small(path, "signature", _MAX_SIG_FILE_BYTES)
    try:
        doc = json.loads(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BundleError(f"{path}: damaged signature file (not ASCII JSON)") from exc
    ok = (
        isinstance(doc, dict)
        and doc.get("kind") == SIGNATURE_KIND
        and doc.get("version") == SIGNATURE_VERSION
        and isinstance(doc.get("header_sha256"), str)
        and isinstance(doc.get("signatures"), list)
        and len(doc["signatures"]) <= _MAX_SIGNATURES
        and all(
            isinstance(s, dict)
            and s.get("algorithm") == "ed25519"
            and isinstance(s.get("key_id"), str)
            and _KEY_ID.fullmatch(s["key_id"])
            and isinstance(s.get("signature"), str)
            and _SIG_HEX.fullmatch(s["signature"])
            for s in doc["signatures"]
        )
    )
    if not ok:
        raise BundleError(
            f"{path}: damaged or unknown signature file (expected a {SIGNATURE_KIND!r}, "
            f"version {SIGNATURE_VERSION}); sign the bundle again with `rose-aot sign`"
        )
    return doc


def verify_signature(bundle_path, header: bytes, trusted_keys) -> str:
    """Check ``<bundle_path>.sig`` against ``header`` (the verified header of the bytes about to
    be used, :meth:`BundleReader.header`) and the trusted keys. Returns the key id of the first
    trusted key with a valid signature; raises BundleError naming the key ids otherwise."""
    _, _, InvalidSignature = _crypto()
    keys = [load_public_key(k) for k in trusted_keys]
    if not keys:
        raise BundleError("trusted_keys is empty; pass at least one public key, or None")
    trusted = {key_id(k): k for k in keys}
    trusted_text = ", ".join(sorted(trusted))
    bundle_path = os.fspath(bundle_path)
    sig_file = signature_path(bundle_path)
    if not os.path.lexists(sig_file):
        raise BundleError(
            f"{bundle_path}: is not signed (no {os.path.basename(sig_file)} next to it); trusted "
            f"key ids: {trusted_text}; sign it with `rose-aot sign {bundle_path} --key KEY`"
        )
    doc = _read_signature_file(sig_file)
    signers = [s["key_id"] for s in doc["signatures"]]
    message = _message(header)
    bad = []
    for entry in doc["signatures"]:
        key = trusted.get(entry["key_id"])
        if key is None:
            continue
        try:
            key.verify(bytes.fromhex(entry["signature"]), message)
        except InvalidSignature:
            bad.append(entry["key_id"])
            continue
        return entry["key_id"]
    if bad:
        raise BundleError(
            f"{bundle_path}: the signature by key id {', '.join(bad)} does not match the bundle's "
            "bytes (the bundle or its index was changed after signing); refusing it"
        )
    raise BundleError(
        f"{bundle_path}: signed by key id {', '.join(signers) or '(none)'}, none of them trusted "
        f"(trusted key ids: {trusted_text}); refusing it"
    )


def check_signature(reader, trusted_keys) -> str | None:
    """For loaders: None when ``trusted_keys`` is None (no check), else verify_signature on
    the reader's own verified header."""
    if trusted_keys is None:
        return None
    if isinstance(trusted_keys, (str, bytes, os.PathLike)):
        trusted_keys = [trusted_keys]
    return verify_signature(reader.path, reader.header(), list(trusted_keys))


def _path(path, what: str) -> str:
    try:
        text = os.fsdecode(os.fspath(path))
    except TypeError as exc:
        raise BundleError(f"a {what} path must be a str or os.PathLike") from exc
    if "\0" in text:
        raise BundleError(f"{text!r}: a path cannot contain a NUL byte")
    return text
