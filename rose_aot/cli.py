"""The `rose-aot` command line: build bundles from manifests (whole or in shards, then merged),
inspect and verify them, diff manifests and bundles, check coverage, derive manifests."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from . import settings
from .errors import RoseAotError

__all__ = ["main"]


class _Group(click.Group):
    """The error boundary: every error becomes one line `Error: ...` on stderr and exit code 2.

    Exit codes: 0 success; 1 a negative answer (diff: differs, check: not covered, verify:
    damaged); 2 an error (bad input, unreadable or unwritable path, bad setting). An unexpected
    exception is reported as an internal error (ROSE_AOT_DEBUG=1 shows its traceback).
    """

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("Error: interrupted (SIGINT); nothing was written", err=True)
            sys.exit(130)
        except RoseAotError as exc:
            _fail(str(exc))
        except OSError as exc:
            _fail(_os_message(exc))
        except ValueError as exc:
            if "null byte" in str(exc) or "null character" in str(exc):
                _fail("a path contains a NUL byte; check the arguments")
            _internal(exc)
        except (RecursionError, MemoryError) as exc:
            _fail(f"the input is too large or too deeply nested ({type(exc).__name__})")
        except Exception as exc:  # noqa: BLE001 (the boundary: no traceback for users)
            _internal(exc)


def _os_message(exc: OSError) -> str:
    where = exc.filename if exc.filename is not None else "a path"
    reason = (exc.strerror or str(exc)).lower()
    hints = {
        "ENOENT": "check that it exists",
        "ENOTDIR": "a part of the path is a regular file, not a directory",
        "EEXIST": "a file is in the way of a directory of that name",
        "EACCES": "it is not readable or writable by this user",
        "EPERM": "the operation is not permitted here",
        "EROFS": "the filesystem is read-only; pick a writable path",
        "ENOSPC": "the disk is full",
        "EISDIR": "it is a directory; pass a file path",
    }
    import errno

    hint = hints.get(errno.errorcode.get(exc.errno or 0, ""), "check the path")
    return f"{where}: {reason}; {hint}"


def _internal(exc: BaseException):
    if settings.debug():
        raise exc
    _fail(
        f"internal error ({type(exc).__name__}: {str(exc)[:300]}); this is a rose-aot bug: "
        "report it with the command line (ROSE_AOT_DEBUG=1 shows the traceback)"
    )


def _writable_dir(directory: Path, what: str) -> None:
    """Fail early (before compiling for minutes) when `directory` cannot hold `what`."""
    probe = directory
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        _fail(f"{what}: {probe} is a regular file, not a directory; pick another path")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        _fail(f"{what}: {probe} is not writable by this user; pick a writable path")


def _print_version(ctx, _param, value):
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import version

    from .bundle import cubin
    from .loader import driver

    hot = ("C (rose_aot.loader._native)" if driver.native() is not None
           else "Python (rose_aot.loader._native is not built for this interpreter)")
    reader = ("C (rose_aot.bundle._fastread)" if cubin._fastread is not None
              else "Python (rose_aot.bundle._fastread is not built for this interpreter)")
    click.echo(f"rose-aot, version {version('rose-aot')}\nloader hot path: {hot}\n"
               f"index and cubin reader: {reader}")
    ctx.exit()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version,
              help="Show the version, which hot path the loader runs and which index and cubin "
                   "reader (C or Python), and exit.")
def main():
    """Ahead-of-time CuTeDSL kernel bundles for LLM inference.

    Build bundles on a CPU machine from deployment manifests; serving containers load them with
    `rose_aot.open_bundle` and launch through cuda-python, with no compiler and no DSL.
    """


def _default_output(manifests) -> Path:
    name = manifests[0].name if len(manifests) == 1 else "bundle"
    return settings.DEFAULT_OUTPUT_DIR / f"{name}.rosebundle"


def _shard_option(ctx, param, value):
    if value is None:
        return None
    from .builder.shard import parse_shard_spec

    try:
        return parse_shard_spec(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _progress(quiet: bool):
    def progress(done, total, result):
        if quiet:
            return
        what = "cached  " if result.cached else "compiled"
        secs = "" if result.cached else f" {result.seconds:6.2f} s"
        click.echo(
            f"[{done:>{len(str(total))}}/{total}] {what} {result.item.key} @ {result.item.arch}{secs}",
            err=True,
        )

    return progress


def _summary_info(summary, report) -> dict:
    info = {
        "bundle": str(summary.output),
        "bytes": summary.bundle_bytes,
        "manifests": [m.name for m in summary.plan.manifests],
        "points": summary.points,
        "items": len(summary.items),
        "compiled": summary.compiled,
        "cached": summary.cached,
        "seconds": round(summary.seconds, 2),
        "report": str(report) if report else None,
    }
    if summary.shard is not None:
        info["shard"] = {"index": summary.shard[0], "count": summary.shard[1]}
    return info


@main.command()
@click.argument("manifests", nargs=-1, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help=(
    "Bundle file to write. Default: build/<manifest name>.rosebundle for one manifest, "
    "build/bundle.rosebundle for several; with --shard, build/<name>.shard-I-of-N.roseshard."))
@click.option("--arch", "archs", multiple=True, help=(
    "Target arch (repeatable), e.g. sm_90a, sm_100a. Default: each manifest's own archs."))
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help=(
    "Compile processes (default: ROSE_AOT_JOBS or the CPUs available)."))
@click.option("--cache-dir", type=click.Path(path_type=Path), default=None, help=(
    "Artifact cache (default: ROSE_AOT_CACHE_DIR or ~/.cache/rose-aot)."))
@click.option("--no-cache", is_flag=True, help="Compile everything; read and write no cache.")
@click.option("--shard", "shard", metavar="I/N", callback=_shard_option, default=None, help=(
    "Compile only shard I of N (1-based) of the (point, arch) items and write a shard file; "
    "`rose-aot merge` joins the N shards into the bundle."))
@click.option("--report", "report_file", type=click.Path(path_type=Path), default=None, help=(
    "Build report JSON to write. Default: <output>.report.json."))
@click.option("--sign-key", "sign_key", type=click.Path(path_type=Path), default=None, help=(
    "Private key (from `rose-aot keygen`) to sign the bundle with: writes <output>.sig."))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No per-item progress lines.")
def build(
    manifests, output, archs, jobs, cache_dir, no_cache, shard, report_file, sign_key, as_json,
    quiet,
):
    """Compile the kernel points of MANIFESTS into one bundle.

    MANIFESTS are TOML files or folders of them; with none, every manifest in ./manifests is
    built. Points shared by several manifests are compiled once; (point, arch) pairs already in
    the cache are not compiled again. Nothing is written unless every point compiles. A build
    report (every point and arch, compile seconds, cached or not, artifact sizes) is written
    next to the output as <output>.report.json.
    """
    from .builder.build import ArtifactCache, build_bundle
    from .builder.report import write_report
    from .builder.shard import build_shard, default_shard_output
    from .manifest import load_manifests

    paths = list(manifests) or [settings.DEFAULT_MANIFEST_DIR]
    loaded = load_manifests(paths)
    jobs = jobs or settings.default_jobs()
    private_key = _load_sign_key(sign_key)
    if shard is None:
        output = output or _default_output(loaded)
    else:
        output = output or default_shard_output(_default_output(loaded), *shard)
    _writable_dir(Path(os.path.abspath(output)).parent, "-o/--output")
    if report_file is not None:
        _writable_dir(Path(os.path.abspath(report_file)).parent, "--report")
    cache = None
    if not no_cache:
        cache_root = cache_dir or settings.cache_dir()
        _writable_dir(Path(os.path.abspath(cache_root)), "--cache-dir")
        try:
            Path(cache_root).mkdir(parents=True, exist_ok=True)
            probe = Path(cache_root) / f".write-probe.{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            _fail(
                f"--cache-dir {cache_root}: not a writable directory ({_os_message(exc)}); pass "
                "a writable directory, or --no-cache"
            )
        cache = ArtifactCache(cache_root)
    options = dict(
        archs=tuple(archs) or None,
        jobs=jobs,
        cache=cache,
        progress=_progress(quiet),
    )
    if shard is None:
        summary = build_bundle(loaded, output, **options)
    else:
        summary = build_shard(loaded, output, *shard, **options)
    if private_key is not None:
        _sign(summary.output, private_key)
    report = write_report(summary, report_file)
    info = _summary_info(summary, report)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    what = f"shard {shard[0]}/{shard[1]}" if shard else "built"
    click.echo(
        f"{what} {info['bundle']}: {info['points']} points, {info['items']} (point, arch) "
        f"items, {info['compiled']} compiled, {info['cached']} cached, "
        f"{info['bytes'] / 1e6:.2f} MB in {info['seconds']:.1f} s; report {report}",
        err=True,
    )


@main.command()
@click.argument("shards", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help=(
    "Bundle file to write. Default: as `rose-aot build` names it for the same manifests."))
@click.option("--report", "report_file", type=click.Path(path_type=Path), default=None, help=(
    "Build report JSON to write. Default: <output>.report.json."))
@click.option("--sign-key", "sign_key", type=click.Path(path_type=Path), default=None, help=(
    "Private key to sign the merged bundle with (writes <output>.sig). Shards carry no "
    "signature into the bundle: the merge job signs the result."))
@click.option("--trusted-key", "trusted_keys", multiple=True, type=click.Path(path_type=Path),
              help=("Public key (repeatable): every shard must be signed by one of them "
                    "(`rose-aot sign SHARD --key KEY` in the shard jobs)."))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def merge(shards, output, report_file, sign_key, trusted_keys, as_json):
    """Merge the shard files of one sharded build into its bundle.

    Pass all N shards that `rose-aot build --shard I/N` wrote (any order). The bundle is
    byte-identical to an unsharded `rose-aot build` of the same manifests, sources and
    toolchain. Fails, writing nothing, when a shard is missing or given twice, or when shards
    come from different manifests, kernel sources or toolchains. Needs no compiler.
    """
    from .builder.report import write_report
    from .builder.shard import merge_shards, read_shard

    private_key = _load_sign_key(sign_key)
    trusted = list(trusted_keys) or None
    if output is None:
        # read_shard accepts only plain manifest names; the check below keeps the default
        # output inside build/ whatever a shard says.
        names = [m.name for m in read_shard(shards[0], trusted_keys=trusted).plan.manifests]
        output = settings.DEFAULT_OUTPUT_DIR / (
            f"{names[0]}.rosebundle" if len(names) == 1 else "bundle.rosebundle"
        )
        inside = os.path.abspath(settings.DEFAULT_OUTPUT_DIR)
        if os.path.dirname(os.path.abspath(output)) != inside:
            _fail(f"the shard names an output outside {inside}: {str(output)[:80]!r}; pass -o")
    _writable_dir(Path(os.path.abspath(output)).parent, "-o/--output")
    summary = merge_shards(shards, output, trusted_keys=trusted)
    if private_key is not None:
        _sign(summary.output, private_key)
    report = write_report(summary, report_file)
    info = _summary_info(summary, report)
    info["shards"] = [str(s) for s in shards]
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(
        f"merged {len(shards)} shards into {info['bundle']}: {info['points']} points, "
        f"{info['items']} (point, arch) items, {info['bytes'] / 1e6:.2f} MB; report {report}",
        err=True,
    )


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON.")
def inspect(bundle, as_json):
    """Show a bundle's points, archs, sizes, toolchain and manifests."""
    from .loader import open_bundle

    info = open_bundle(bundle).describe()
    if not isinstance(info["toolchain"], dict):
        _fail(f"{bundle}: damaged bundle index: toolchain is not an object")
    if as_json:
        click.echo(json.dumps(info, indent=2, sort_keys=True))
        return
    tc = info["toolchain"]
    click.echo(f"bundle     {info['path']} ({info['bytes']:,} bytes, format {info['format_version']})")
    click.echo(f"archs      {', '.join(info['archs'])}")
    packages = ", ".join(f"{k} {v}" for k, v in sorted(tc.get("packages", {}).items()))
    click.echo(f"toolchain  {packages}")
    click.echo(
        f"           flavour {tc.get('cuda_flavour')}, PTX ISA {tc.get('ptx_isa')}, "
        f"{tc.get('compiler')}, cubin ELF ABI {tc.get('cubin_elf_abi')}"
    )
    for m in info["manifests"]:
        click.echo(f"manifest   {m['name']} ({len(m['points'])} points, sha256 {m['digest'][:12]})")
    click.echo(f"points     {len(info['points'])} (point, arch) pairs")
    for p in info["points"]:
        sizes = ", ".join(
            f"{v['name']} block {v['block'][0]} cubin {v['cubin_bytes']:,} B" for v in p["variants"]
        )
        click.echo(f"  {p['arch']:8} {p['key']}\n           {sizes}")


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--trusted-key", "trusted_keys", multiple=True, type=click.Path(path_type=Path),
              help=("Public key (repeatable; KEY.pub from `rose-aot keygen`): the bundle must "
                    "carry a valid signature (<bundle>.sig) by one of them."))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def verify(bundle, trusted_keys, as_json):
    """Check a bundle completely: header, index, every artifact's digest and its launch facts,
    and with --trusted-key its signature.

    Exit code 0 when intact (and signed by a trusted key), 1 when damaged, inconsistent,
    unsigned or wrongly signed, 2 when a trusted key cannot be read.
    """
    from .bundle import BundleReader
    from .bundle.signing import check_signature, load_public_key
    from .loader import KernelBundle

    keys = [load_public_key(k) for k in trusted_keys] or None  # unreadable key: exit 2
    signer = None
    try:
        reader = BundleReader.open(bundle)
        signer = check_signature(reader, keys)
        reader.verify()
        KernelBundle(reader)  # checks the index's types first (check_kernel_index)
    except RoseAotError as exc:
        if as_json:
            click.echo(json.dumps({"bundle": str(bundle), "ok": False, "error": str(exc)}))
        else:
            click.echo(f"Error: {exc}", err=True)
        sys.exit(1)
    result = {"bundle": str(bundle), "ok": True, "artifacts": len(reader.blob_names())}
    if signer is not None:
        result["signed_by"] = signer
    if as_json:
        click.echo(json.dumps(result))
    else:
        signed = f", signed by trusted key {signer}" if signer else ""
        click.echo(f"OK: {bundle} ({result['artifacts']} artifacts verified{signed})")


@main.command()
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help=(
    "Private key file to write; the public key goes to OUTPUT.pub."))
def keygen(output):
    """Make an Ed25519 key pair for signing bundles (needs rose-aot[sign]).

    Writes OUTPUT (the private key, PEM, mode 0600: keep it in the CI secret store) and
    OUTPUT.pub (the public key: ship it to the servers that load bundles). Prints the key id,
    the first 16 hex digits of the sha256 of the raw public key. Never overwrites a file.
    """
    from .bundle.signing import generate_key

    private, public, kid = generate_key(output)
    click.echo(f"wrote {private} (private) and {public} (public); key id {kid}")


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--key", "key", required=True, type=click.Path(path_type=Path), help=(
    "Private key from `rose-aot keygen`."))
def sign(bundle, key):
    """Sign BUNDLE (or a shard): verify it, then write its signature to BUNDLE.sig.

    The signature covers the bundle's header, whose index digest covers every byte. BUNDLE.sig
    keeps other keys' signatures of the same bytes, so several keys can sign one bundle.
    """
    _sign(bundle, _load_sign_key(key))


def _load_sign_key(path):
    if path is None:
        return None
    from .bundle.signing import load_private_key

    return load_private_key(path)


def _sign(bundle, private_key) -> None:
    from .bundle.signing import sign_bundle

    sig_file, kid = sign_bundle(bundle, private_key)
    click.echo(f"signed {bundle} with key id {kid}: {sig_file}", err=True)


def _fail(message: str, code: int = 2):
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


@main.command()
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the differences as JSON.")
def diff(a, b, as_json):
    """Kernel points that differ between A and B, grouped by family.

    A and B are each a manifest, a folder of manifests or a bundle, in any mix. Shows points
    added, removed and changed (same family and shape, e.g. rms_norm hidden, other settings),
    archs added or removed; for two bundles also the points whose artifacts were rebuilt, and
    why (kernel source, toolchain, launch facts, artifact sha256).

    Exit code 0 when A and B have the same points (and artifacts), 1 when they differ, 2 on
    an error, like diff(1).
    """
    from .manifest.diff import diff_paths, render

    try:
        result = diff_paths(a, b)
    except RoseAotError as exc:
        _fail(str(exc))
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2, sort_keys=True))
    else:
        click.echo(render(result))
    sys.exit(0 if result.same else 1)


@main.command()
@click.option("--bundle", "bundle", required=True, type=click.Path(path_type=Path),
              help="The bundle to check.")
@click.argument("manifests", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--arch", "archs", multiple=True, help=(
    "Arch that must be covered (repeatable). Default: each manifest's own archs."))
@click.option("--min-driver", default=None, metavar="VERSION", help=(
    "The oldest NVIDIA driver the fleet runs, e.g. 575.51.03 (default: "
    "rose_aot.check.DEFAULT_MIN_DRIVER). Fails if the bundle's cubins need a newer one."))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check(bundle, manifests, archs, min_driver, as_json):
    """Check that BUNDLE covers every point of MANIFESTS for every arch.

    MANIFESTS are manifest files or folders of them. Passes (exit 0, a line per manifest) when
    every (point, arch) is in the bundle and the stated minimum driver loads its cubins; fails
    (exit 1) listing each missing (point, arch) and any driver problem; exit 2 on an error.
    The same check from Python: rose_aot.check_bundle(bundle, manifests).
    """
    from .check import DEFAULT_MIN_DRIVER, check_bundle, parse_driver_version

    min_driver = min_driver or DEFAULT_MIN_DRIVER
    try:
        parse_driver_version(min_driver)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--min-driver") from None
    try:
        report = check_bundle(bundle, list(manifests), tuple(archs) or None, min_driver=min_driver)
    except RoseAotError as exc:
        _fail(str(exc))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        for line in report.lines():
            click.echo(line)
    sys.exit(0 if report.ok else 1)


@main.group()
def manifest():
    """Derive deployment manifests (from-config)."""


@manifest.command("from-config")
@click.argument("config", type=click.Path(path_type=Path))
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help=(
    "Tensor-parallel ranks: Q/K heads and experts per rank."))
@click.option("--ep", "--dp", "ep", type=click.IntRange(min=1), default=1, show_default=True,
              help=("Expert-parallel (data-parallel) ranks over NVLink: adds the "
                    "moe_ep_dispatch / moe_ep_combine points of the MoE layers."))
@click.option("--arch", "archs", multiple=True, help=(
    "Target arch (repeatable), e.g. sm_90a, sm_100a. Default: sm_90a."))
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]),
              default="bfloat16", show_default=True, help="Activation dtype served.")
@click.option("--name", default=None, help=(
    "Deployment name. Default: the config's folder name, lower-cased."))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, help=(
    "Manifest file to write. Default: print it."))
@click.option("--json", "as_json", is_flag=True, help=(
    "Print the derived points, MoE facts and fields read as JSON (with -o, the manifest is "
    "still written)."))
def from_config(config, tp, ep, archs, dtype, name, output, as_json):
    """Derive a manifest from a Hugging Face CONFIG (config.json, or the model folder).

    Knows Qwen3 (dense and MoE), Qwen2 / Qwen2.5, Qwen1.5-MoE / Qwen2-MoE, Llama, Mistral,
    Phi-3 / Phi-4, Mixtral, Gemma 2, Gemma 3, DeepSeek-V2 / V2-Lite, DeepSeek-V3 and gpt-oss:
    rms_norm points for the decoder norms (plain and fused residual add), qk_norm for models
    with per-head Q/K norms, with eps, head_dim and Gemma's weight offset; moe_dispatch /
    moe_combine for MoE layers (the rank's experts under --tp); gated activation and FP8 /
    NVFP4 / MXFP4 quantization points from hidden_act and quantization_config; all_reduce
    points under --tp, expert-parallel dispatch/combine under --ep (2-8 ranks).
    """
    from .manifest.from_config import manifest_from_config

    derived = manifest_from_config(
        config, tp=tp, ep=ep, archs=tuple(archs) or None, dtype=dtype, name=name
    )
    text = derived.to_toml()
    if output is not None:
        _write_text(output, text)
    if as_json:
        click.echo(json.dumps(derived.to_json(), indent=2))
    elif output is None:
        click.echo(text, nl=False)
    else:
        click.echo(f"wrote {output}: {len(derived.manifest().points)} points", err=True)


def _write_text(path: Path, text: str) -> None:
    import os
    import secrets

    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise click.ClickException(f"cannot write {path}: {exc}") from exc


if __name__ == "__main__":
    main()
