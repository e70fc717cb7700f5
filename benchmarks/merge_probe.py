"""Can a bundle hold fewer, larger cubins without changing a single kernel? A CPU check.

    pip install nvidia-cuda-nvcc-cu12==12.9.86    # ptxas of the DSL's own release (12.9)
    python benchmarks/merge_probe.py build/models/*.rosebundle [--arch sm_90a] [--json]
        [--write DIR]

Every variant is a cubin of its own today, so a model's warmup loads one module per variant
(DeepSeek-V3: 45). For each point of each bundle, this compiles with ptxas, on the CPU:
  alone   each variant's PTX by itself;
  point   every variant of the point in one PTX module (entries renamed per variant);
  bundle  every variant of every point of the arch in one module (the bundle's only one);
and compares the SASS of each entry (nvdisasm) with the bundle's own cubin. Label numbers,
internal subroutine numbers and the renamed entry's name are normalized away (a module numbers
them per module); anything else that differs counts. --ptxas PATH, else the
nvidia-cuda-nvcc-cu12 wheel's, else ptxas on PATH; a release other than the DSL's shows as
"alone" not identical. Reports the bytes too. Touches no bundle. --write DIR keeps, per
bundle, its cubins and the one-module cubin in DIR/<bundle name>/ with load.json (each file's
entries) for benchmarks/merged_load_probe.py, which times loading both on the GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from sass_count import find_nvdisasm  # noqa: E402

from rose_aot.bundle import BundleReader  # noqa: E402
from rose_aot.errors import RoseAotError  # noqa: E402

_HEADER_END = re.compile(r"^\.address_size\s+\d+\s*$", re.M)
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4}\*/\s+(.*?);")
_SECTION = re.compile(r"\s*\.section\s+\.text\.(\S+?),")


def find_ptxas(given: str | None) -> str | None:
    """--ptxas, else the nvidia-cuda-nvcc wheel's (a known release), else ptxas on PATH."""
    if given:
        return given if Path(given).is_file() else None
    try:
        import nvidia.cuda_nvcc as wheel  # the nvidia-cuda-nvcc-cu12 wheel
    except ImportError:
        wheel = None
    for root in getattr(wheel, "__path__", []):
        candidate = Path(root) / "bin" / "ptxas"
        if candidate.is_file():
            return str(candidate)
    return shutil.which("ptxas")


def ptxas_release(ptxas: str) -> str:
    out = subprocess.run([ptxas, "--version"], capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    return lines[-2] if len(lines) >= 2 else "unknown release"


def _normalized(line: str) -> str:
    line = re.sub(r"\s+", " ", line)
    line = re.sub(r"\.L_x_\d+", ".L_x", line)  # branch labels, numbered per module
    line = re.sub(r"\$__internal_\d+_", "$__internal_", line)  # shared slow paths, likewise
    return re.sub(r"\bm\d+v\d+__", "", line)  # an entry renamed for the merged module


def sass(nvdisasm: str, cubin: bytes, work: Path) -> dict[str, list[str]]:
    """Entry (section) name -> its instructions, normalized, trailing padding dropped."""
    path = work / "d.cubin"
    path.write_bytes(cubin)
    out = subprocess.run([nvdisasm, "-c", str(path)], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"nvdisasm failed: {out.stderr.strip()[:300]}")
    functions: dict[str, list[str]] = {}
    current = None
    for line in out.stdout.splitlines():
        if m := _SECTION.match(line):
            current = functions.setdefault(m.group(1), [])
        elif (m := _INSTRUCTION.search(line)) and current is not None:
            current.append(_normalized(m.group(1)))
    for code in functions.values():
        while code and code[-1] == "NOP":
            code.pop()
    return functions


def compile_ptx(ptxas: str, arch: str, text: str, work: Path) -> bytes:
    src, dst = work / "m.ptx", work / "m.cubin"
    src.write_text(text)
    out = subprocess.run([ptxas, f"-arch={arch}", str(src), "-o", str(dst)],
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"ptxas failed: {out.stderr.strip()[:300]}")
    return dst.read_bytes()


def merged(modules: list[str]) -> str:
    """One PTX module: the first module's header (.version, .target, .address_size), then the
    body of each."""
    head = _HEADER_END.search(modules[0])
    return modules[0][: head.end()] + "".join(m[_HEADER_END.search(m).end():] for m in modules)


def probe(path: str, arch: str, ptxas: str, nvdisasm: str, work: Path,
          write: Path | None = None) -> dict:
    reader = BundleReader.open(path)
    cubins: list[tuple[bytes, list[str]]] = []  # each variant's cubin and entries, in order
    points = [p for p in reader.index["points"] if p["arch"] == arch]
    want: dict[str, list[str]] = {}  # renamed entry -> the bundle cubin's SASS
    renamed_ptx: list[list[str]] = []
    rows = []
    for i, point in enumerate(points):
        alone_same, texts = True, []
        for j, variant in enumerate(point["variants"]):
            ptx = reader.blob(variant["ptx"]).decode()
            cubin = reader.blob(variant["cubin"])
            cubins.append((cubin, variant["entries"]))
            own = sass(nvdisasm, cubin, work)
            again = sass(nvdisasm, compile_ptx(ptxas, arch, ptx, work), work)
            alone_same &= all(own[e] == again.get(e) for e in variant["entries"])
            for e in variant["entries"]:
                ptx = re.sub(rf"\b{re.escape(e)}\b", f"m{i}v{j}__{e}", ptx)
                want[f"m{i}v{j}__{e}"] = own[e]
            texts.append(ptx)
        renamed_ptx.append(texts)
        one = compile_ptx(ptxas, arch, merged(texts), work)
        got = sass(nvdisasm, one, work)
        names = [n for n in want if n.startswith(f"m{i}v")]
        rows.append({
            "point": point["key"],
            "variants": len(point["variants"]),
            "alone_identical": alone_same,
            "point_module_identical": all(got.get(n) == want[n] for n in names),
            "cubin_bytes": sum(len(reader.blob(v["cubin"])) for v in point["variants"]),
            "point_module_bytes": len(one),
        })
    whole = compile_ptx(ptxas, arch, merged([t for texts in renamed_ptx for t in texts]), work)
    got = sass(nvdisasm, whole, work)
    if write is not None:
        keep(write / Path(path).name.split(".")[0], cubins, whole, list(want))
    return {
        "bundle": path,
        "arch": arch,
        "points": rows,
        "variants": sum(r["variants"] for r in rows),
        "bundle_module_identical": all(got.get(n) == code for n, code in want.items()),
        "bundle_module_bytes": len(whole),
    }


def keep(folder: Path, cubins: list[tuple[bytes, list[str]]], whole: bytes,
         entries: list[str]) -> None:
    """--write: the bundle's cubins, its one-module cubin and load.json naming their entries."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i, (cubin, names) in enumerate(cubins):
        (folder / f"variant-{i:03d}.cubin").write_bytes(cubin)
        files.append([f"variant-{i:03d}.cubin", names])
    (folder / "merged.cubin").write_bytes(whole)
    (folder / "load.json").write_text(json.dumps(
        {"variants": files, "merged": ["merged.cubin", entries]}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", nargs="+")
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--ptxas", help="path of ptxas (default: PATH, then the nvcc wheel)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", type=Path, metavar="DIR",
                        help="keep each bundle's cubins and one-module cubin here, for "
                             "benchmarks/merged_load_probe.py")
    args = parser.parse_args()
    if args.write is not None:  # before any compile: a bad folder should cost nothing
        try:
            args.write.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            sys.exit(f"merge_probe.py: cannot use --write {args.write}: {exc.strerror or exc}")
    ptxas = find_ptxas(args.ptxas)
    if ptxas is None:
        sys.exit("merge_probe.py: no ptxas; pip install nvidia-cuda-nvcc-cu12==12.9.86 or pass "
                 "--ptxas PATH")
    nvdisasm = find_nvdisasm()
    if nvdisasm is None:
        sys.exit("merge_probe.py: no nvdisasm; pip install nvidia-cuda-nvdisasm")
    results = []
    with tempfile.TemporaryDirectory(prefix="rose-aot-merge-") as tmp:
        for path in args.bundles:
            try:
                results.append(probe(path, args.arch, ptxas, nvdisasm, Path(tmp), args.write))
            except RoseAotError as exc:  # names the bundle itself
                sys.exit(f"merge_probe.py: {exc}")
            except (RuntimeError, OSError) as exc:
                sys.exit(f"merge_probe.py: {path}: {exc}")
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"ptxas {ptxas} ({ptxas_release(ptxas)}); SASS per entry against each bundle's own "
          f"cubins ({args.arch})")
    print("| bundle | points | variants | alone identical | point module identical | "
          "bundle module identical | cubin bytes | point modules bytes | bundle module bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        pts = r["points"]
        print(f"| {Path(r['bundle']).stem} | {len(pts)} | {r['variants']} | "
              f"{sum(p['alone_identical'] for p in pts)}/{len(pts)} | "
              f"{sum(p['point_module_identical'] for p in pts)}/{len(pts)} | "
              f"{r['bundle_module_identical']} | {sum(p['cubin_bytes'] for p in pts)} | "
              f"{sum(p['point_module_bytes'] for p in pts)} | {r['bundle_module_bytes']} |")


if __name__ == "__main__":
    main()
