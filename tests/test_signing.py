"""Signed bundles end to end: keygen, sign, verify with trusted keys, open_bundle(trusted_keys),
an index rewritten with recomputed digests refused, merge signing and shard checks."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat

import pytest
from click.testing import CliRunner

pytest.importorskip("cryptography")

from fixtures_tiny import rewrite_bundle  # noqa: E402
from rose_aot.bundle.signing import (  # noqa: E402
    generate_key,
    key_id,
    load_public_key,
    sign_bundle,
    signature_path,
)
from rose_aot.builder.shard import merge_shards  # noqa: E402
from rose_aot.cli import main as cli  # noqa: E402
from rose_aot.errors import BundleError  # noqa: E402
from rose_aot.loader import open_bundle  # noqa: E402


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    a = generate_key(root / "a")
    b = generate_key(root / "b")
    return root, a, b


@pytest.fixture
def signed(tiny_build, tmp_path, keys):
    _, (a_priv, _, _), _ = keys
    bundle = tmp_path / "tiny.rosebundle"
    shutil.copy(tiny_build.path, bundle)
    sign_bundle(bundle, a_priv)
    return bundle


def test_keygen_cli_writes_a_key_pair_and_its_id(tmp_path):
    result = run("keygen", "-o", tmp_path / "k")
    assert result.exit_code == 0, result.output
    private, public = tmp_path / "k", tmp_path / "k.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in private.read_bytes() and b"PUBLIC KEY" in public.read_bytes()
    pub = load_public_key(public)
    from cryptography.hazmat.primitives import serialization

    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    kid = hashlib.sha256(raw).hexdigest()[:16]
    assert key_id(pub) == kid and f"key id {kid}" in result.output
    again = run("keygen", "-o", tmp_path / "k")
    assert again.exit_code == 2 and "never overwrites" in again.output


def test_sign_and_verify_end_to_end(tiny_build, tmp_path, keys):
    root, (a_priv, a_pub, a_id), (b_priv, b_pub, b_id) = keys
    bundle = tmp_path / "tiny.rosebundle"
    shutil.copy(tiny_build.path, bundle)
    assert run("sign", bundle, "--key", a_priv).exit_code == 0
    assert bundle.read_bytes() == tiny_build.data, "signing must not change the bundle's bytes"
    ok = run("verify", bundle, "--trusted-key", a_pub)
    assert ok.exit_code == 0 and f"signed by trusted key {a_id}" in ok.output, ok.output
    as_json = json.loads(run("verify", "--json", bundle, "--trusted-key", a_pub).stdout)
    assert as_json["ok"] and as_json["signed_by"] == a_id
    assert open_bundle(bundle, trusted_keys=[a_pub]).points()
    assert open_bundle(bundle, trusted_keys=[b_pub, a_pub]).points()

    untrusted = run("verify", bundle, "--trusted-key", b_pub)
    assert untrusted.exit_code == 1 and a_id in untrusted.output and b_id in untrusted.output
    with pytest.raises(BundleError, match=f"signed by key id {a_id}, none of them trusted"):
        open_bundle(bundle, trusted_keys=[b_pub])

    # A second key signs the same bytes: both signatures are kept.
    assert run("sign", bundle, "--key", b_priv).exit_code == 0
    doc = json.loads(open(signature_path(bundle)).read())
    assert sorted(s["key_id"] for s in doc["signatures"]) == sorted([a_id, b_id])
    assert open_bundle(bundle, trusted_keys=[b_pub]).points()
    # Without trusted keys nothing changes: signed or not, the bundle opens.
    assert open_bundle(bundle).points() and open_bundle(tiny_build.path).points()
    assert run("verify", tiny_build.path).exit_code == 0


def test_unsigned_bundle_is_refused_naming_the_trusted_key_ids(tiny_build, keys):
    _, (_, a_pub, a_id), (_, b_pub, b_id) = keys
    with pytest.raises(BundleError, match="is not signed") as info:
        open_bundle(tiny_build.path, trusted_keys=[a_pub, b_pub])
    assert a_id in str(info.value) and b_id in str(info.value)
    result = run("verify", tiny_build.path, "--trusted-key", a_pub)
    assert result.exit_code == 1 and "is not signed" in result.output


def test_tampered_index_with_recomputed_digests_is_refused(signed, tmp_path, keys):
    _, (_, a_pub, a_id), _ = keys
    sig = signature_path(signed)

    def tamper(index):  # plausible and self-consistent: only the signature can tell
        index["manifests"][0]["name"] = "evil"

    rewrite_bundle(signed, signed, edit_index=tamper)  # in place; digests recomputed
    from rose_aot.bundle import BundleReader

    BundleReader.open(signed).verify()  # intact as far as digests go
    assert open_bundle(signed).index["manifests"][0]["name"] == "evil"
    with pytest.raises(BundleError, match=f"signature by key id {a_id} does not match"):
        open_bundle(signed, trusted_keys=[a_pub])
    result = run("verify", signed, "--trusted-key", a_pub)
    assert result.exit_code == 1 and "does not match" in result.output
    assert os.path.exists(sig)


@pytest.mark.parametrize(
    "damage",
    ["garbage", "flip", "empty", "wrong-key-id", "huge"],
)
def test_damaged_signature_files_are_refused(signed, keys, damage):
    _, (_, a_pub, _), _ = keys
    sig = signature_path(signed)
    doc = json.loads(open(sig).read())
    if damage == "garbage":
        text = "{not json"
    elif damage == "flip":
        s = doc["signatures"][0]["signature"]
        doc["signatures"][0]["signature"] = ("1" if s[0] == "0" else "0") + s[1:]
        text = json.dumps(doc)
    elif damage == "empty":
        doc["signatures"] = []
        text = json.dumps(doc)
    elif damage == "wrong-key-id":
        doc["signatures"][0]["key_id"] = "0" * 16
        text = json.dumps(doc)
    else:
        text = " " * (1 << 20)
    with open(sig, "w") as f:
        f.write(text)
    with pytest.raises(BundleError):
        open_bundle(signed, trusted_keys=[a_pub])
    assert run("verify", signed, "--trusted-key", a_pub).exit_code == 1


def test_bad_trusted_key_is_a_clear_error(signed, tmp_path):
    bad = tmp_path / "bad.pub"
    bad.write_text("not a key")
    with pytest.raises(BundleError, match="not a PEM public key"):
        open_bundle(signed, trusted_keys=[bad])
    result = run("verify", signed, "--trusted-key", bad)
    assert result.exit_code == 2 and "not a PEM public key" in result.output
    with pytest.raises(BundleError, match="no such public key"):
        open_bundle(signed, trusted_keys=[tmp_path / "missing.pub"])
    with pytest.raises(BundleError, match="empty"):
        open_bundle(signed, trusted_keys=[])


def test_merge_signs_the_bundle_and_checks_shard_signatures(tiny_build, tmp_path, keys):
    _, (a_priv, a_pub, a_id), (_, b_pub, _) = keys
    shards = []
    for i in (1, 2):
        out = tmp_path / f"s{i}.roseshard"
        result = run(
            "build", tiny_build.manifest, "--shard", f"{i}/2", "-o", out,
            "--cache-dir", tiny_build.cache_dir, "-q",
        )
        assert result.exit_code == 0, result.output
        shards.append(out)
    out = tmp_path / "merged.rosebundle"
    unsigned_shards = run("merge", *shards, "-o", out, "--trusted-key", a_pub)
    assert unsigned_shards.exit_code == 2 and "is not signed" in unsigned_shards.output
    assert not out.exists()
    for shard in shards:
        assert run("sign", shard, "--key", a_priv).exit_code == 0
    with pytest.raises(BundleError, match="none of them trusted"):
        merge_shards(shards, out, trusted_keys=[b_pub])
    result = run("merge", *shards, "-o", out, "--trusted-key", a_pub, "--sign-key", a_priv)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == tiny_build.data
    assert open_bundle(out, trusted_keys=[a_pub]).points()
    assert run("verify", out, "--trusted-key", a_pub).exit_code == 0
