"""The `rose-aot` command line: build bundles from manifests, inspect and verify them."""

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


@main.command()
@click.argument("manifests", nargs=-1, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help=(
    "Bundle file to write. Default: build/<manifest name>.rosebundle for one manifest, "
    "build/bundle.rosebundle for several."))
@click.option("--arch", "archs", multiple=True, help=(
    "Target arch (repeatable), e.g. sm_90a, sm_100a. Default: each manifest's own archs."))
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help=(
    "Compile processes (default: ROSE_AOT_JOBS or the CPUs available)."))
@click.option("--cache-dir", type=click.Path(path_type=Path), default=None, help=(
    "Artifact cache (default: ROSE_AOT_CACHE_DIR or ~/.cache/rose-aot)."))
@click.option("--no-cache", is_flag=True, help="Compile everything; read and write no cache.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No per-item progress lines.")
def build(manifests, output, archs, jobs, cache_dir, no_cache, as_json, quiet):
    """Compile the kernel points of MANIFESTS into one bundle.

    MANIFESTS are TOML files or folders of them; with none, every manifest in ./manifests is
    built. Points shared by several manifests are compiled once; (point, arch) pairs already in
    the cache are not compiled again. Nothing is written unless every point compiles.
    """
    from .builder.build import ArtifactCache, build_bundle
    from .manifest import load_manifests

    paths = list(manifests) or [settings.DEFAULT_MANIFEST_DIR]
    loaded = load_manifests(paths)
    output = output or _default_output(loaded)
    cache = None if no_cache else ArtifactCache(cache_dir or settings.cache_dir())

    def progress(done, total, result):
        if quiet:
            return
        what = "cached  " if result.cached else "compiled"
        secs = "" if result.cached else f" {result.seconds:6.2f} s"
        click.echo(
            f"[{done:>{len(str(total))}}/{total}] {what} {result.item.key} @ {result.item.arch}{secs}",
            err=True,
        )

    summary = build_bundle(
        loaded,
        output,
        archs=tuple(archs) or None,
        jobs=jobs or settings.default_jobs(),
        cache=cache,
        progress=progress,
    )
    info = {
        "bundle": str(summary.output),
        "bytes": summary.bundle_bytes,
        "manifests": [m.name for m in loaded],
        "points": summary.points,
        "items": len(summary.items),
        "compiled": summary.compiled,
        "cached": summary.cached,
        "seconds": round(summary.seconds, 2),
    }
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(
            f"built {info['bundle']}: {info['points']} points, {info['items']} (point, arch) "
            f"items, {info['compiled']} compiled, {info['cached']} cached, "
            f"{info['bytes'] / 1e6:.2f} MB in {info['seconds']:.1f} s",
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


if __name__ == "__main__":
    main()
