"""The `rose-aot` command line: build bundles from manifests (whole or in shards, then merged),
inspect and verify them, diff manifests and bundles, check coverage, derive manifests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from . import settings
from .errors import RoseAotError

__all__ = ["main"]


class _Group(click.Group):
    """Turns every RoseAotError into a one-line `Error: ...` and exit code 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except RoseAotError as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rose-aot")
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
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No per-item progress lines.")
def build(manifests, output, archs, jobs, cache_dir, no_cache, shard, report_file, as_json, quiet):
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
    cache = None if no_cache else ArtifactCache(cache_dir or settings.cache_dir())
    options = dict(
        archs=tuple(archs) or None,
        jobs=jobs or settings.default_jobs(),
        cache=cache,
        progress=_progress(quiet),
    )
    if shard is None:
        summary = build_bundle(loaded, output or _default_output(loaded), **options)
    else:
        output = output or default_shard_output(_default_output(loaded), *shard)
        summary = build_shard(loaded, output, *shard, **options)
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
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def merge(shards, output, report_file, as_json):
    """Merge the shard files of one sharded build into its bundle.

    Pass all N shards that `rose-aot build --shard I/N` wrote (any order). The bundle is
    byte-identical to an unsharded `rose-aot build` of the same manifests, sources and
    toolchain. Fails, writing nothing, when a shard is missing or given twice, or when shards
    come from different manifests, kernel sources or toolchains. Needs no compiler.
    """
    from .builder.report import write_report
    from .builder.shard import merge_shards, read_shard

    if output is None:
        names = [m.name for m in read_shard(shards[0]).plan.manifests]
        output = settings.DEFAULT_OUTPUT_DIR / (
            f"{names[0]}.rosebundle" if len(names) == 1 else "bundle.rosebundle"
        )
    summary = merge_shards(shards, output)
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
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def verify(bundle, as_json):
    """Check a bundle completely: header, index, every artifact's digest and its launch facts.

    Exit code 0 when intact, 1 when damaged or inconsistent.
    """
    from .bundle import BundleReader
    from .loader import KernelBundle

    try:
        reader = BundleReader.open(bundle)
        reader.verify()
        KernelBundle(reader)
    except RoseAotError as exc:
        if as_json:
            click.echo(json.dumps({"bundle": str(bundle), "ok": False, "error": str(exc)}))
            sys.exit(1)
        raise
    result = {"bundle": str(bundle), "ok": True, "artifacts": len(reader.blob_names())}
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"OK: {bundle} ({result['artifacts']} artifacts verified)")


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
def from_config(config, tp, archs, dtype, name, output, as_json):
    """Derive a manifest from a Hugging Face CONFIG (config.json, or the model folder).

    Knows Qwen3 (dense and MoE), Llama, Mistral, Mixtral, Gemma 3, DeepSeek-V3 and gpt-oss:
    rms_norm points for the decoder norms (plain and fused residual add), qk_norm for models
    with per-head Q/K norms, with eps, head_dim and Gemma's weight offset. MoE layers (experts,
    top-k, hidden, experts per rank under --tp) are not turned into MoE kernel points yet: they
    are written as a comment block and in --json.
    """
    from .manifest.from_config import manifest_from_config

    derived = manifest_from_config(
        config, tp=tp, archs=tuple(archs) or None, dtype=dtype, name=name
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
