"""Instructions per element of one kernel point, read from its SASS on the CPU (no GPU needed).

Compiles the point for an arch (as `rose-aot build` does), disassembles every variant's cubin
with nvdisasm and counts the instructions of the kernel's main path: from the entry up to its
last unconditional EXIT (what follows is the out-of-line slow paths, e.g. a division's, and the
padding). For the element-wise row families (act_and_mul, the FP8 and block-scaled quantizers)
it also divides by the elements one thread handles (vec x vecs_per_thread). The count is the
static length of the code, which is what every thread executes when the main path has no
loop (a branch back; then no per-element figure is given and `loops` says so); use it to
compare two versions of a kernel before spending GPU time on them. The "alu / fma pipe" column
splits the count by the pipe each instruction issues to (ALU_OPCODES below).

    pip install nvidia-cuda-nvdisasm          # or put nvdisasm on PATH
    python benchmarks/sass_count.py nvfp4_quant hidden=7168
    python benchmarks/sass_count.py block_scaled_quant hidden=7168 format=mxfp4 --json
    python benchmarks/sass_count.py nvfp4_quant hidden=7168 --dump build/sass   # the listings
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?P<text>[^;]*);")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")


def find_nvdisasm() -> str | None:
    """Path of nvdisasm: on PATH, else from the nvidia-cuda-nvdisasm wheel; None if neither."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:
        for candidate in sorted(Path(root).glob("cu*/bin/nvdisasm")):
            if os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def nvdisasm() -> str:
    found = find_nvdisasm()
    if found is None:
        sys.exit("sass_count.py: nvdisasm not found; install it with `pip install "
                 "nvidia-cuda-nvdisasm` or put the CUDA toolkit's bin directory on PATH")
    return found


def main_path(listing: str) -> tuple[list[str], bool]:
    """(instructions from the entry to the last unconditional EXIT, whether that path loops: a
    branch back to a label at or before it, so its static length is not what a thread runs)."""
    lines, labels, branches = [], {}, []
    for raw in listing.splitlines():
        label = _LABEL.match(raw)
        if label:
            labels[label.group(1)] = len(lines)
            continue
        m = _INSTRUCTION.match(raw)
        if m:
            text = m.group("text").strip()
            target = _BRANCH.search(text)
            if target:
                branches.append((len(lines), target.group(1)))
            lines.append(text)
    last_exit = max((i for i, text in enumerate(lines) if text == "EXIT"), default=None)
    if last_exit is None:
        raise ValueError("no unconditional EXIT in the listing: not a kernel's SASS")
    loops = any(at <= last_exit and labels.get(name, at + 1) <= at for at, name in branches)
    return lines[: last_exit + 1], loops


# The issue pipe of each opcode on sm_90, from Nsight Compute's pipeline descriptions: "alu"
# runs integer and logic instructions other than IMAD/IMUL, min/max, comparisons, selects and
# conversions; "fma" runs FP32 and packed-half arithmetic and IMAD/IMUL. The alu pipe takes half
# as many threads per cycle as the fma pipe, so a kernel can be bound by it with issue slots to
# spare (the FP4 quantizers: docs/results-act-quant.md). Other opcodes (memory, shuffles, special functions,
# uniform datapath, control) are counted as "other". Our classification: VIADD is counted as
# alu, the HFMA2.MMA form as fma.
ALU_OPCODES = frozenset({
    "LOP3", "LOP", "SHF", "SHL", "SHR", "IADD3", "VIADD", "LEA", "PRMT", "ISETP", "FSETP",
    "HSETP2", "PLOP3", "SEL", "FSEL", "IMNMX", "VIMNMX", "FMNMX", "HMNMX2", "VHMNMX", "F2FP",
    "MOV", "IABS", "P2R", "R2P", "BMSK", "SGXT", "FLO", "POPC", "BREV",
})
FMA_OPCODES = frozenset({"FFMA", "FMUL", "FADD", "IMAD", "IMUL", "HFMA2", "HMUL2", "HADD2",
                         "IDP", "IDP4A"})


def pipe(opcode_name: str) -> str:
    """"alu", "fma" or "other" for a base opcode (see ALU_OPCODES)."""
    if opcode_name in ALU_OPCODES:
        return "alu"
    return "fma" if opcode_name in FMA_OPCODES else "other"


def opcode(text: str) -> str:
    """Base opcode of one instruction: predicate and modifiers dropped ("@!P0 LDG.E.128" -> LDG)."""
    word = text.split()[1] if text.startswith("@") else text.split()[0]
    return word.split(".")[0]


def count_point(family_name: str, values: dict, arch: str, dump: Path | None = None) -> list[dict]:
    """One row per variant: instructions on the main path, registers, per element, opcodes."""
    from rose_aot.builder.compile import compile_point
    from rose_aot.bundle.cubin import read_cubin
    from rose_aot.kernels import get_family

    family = get_family(family_name)
    config = family.make_config(**values)
    try:
        point = compile_point(family_name, config, arch)
    except Exception as exc:  # the DSL's own errors: name the point, as rose-aot build does
        sys.exit(f"sass_count.py: compiling {family.key(config)} for {arch} failed: "
                 f"{type(exc).__name__}: {exc}")
    tool = nvdisasm()
    rows = []
    for record in point.record.variants:
        _ptx, cubin = point.artifacts[record.name]
        with tempfile.TemporaryDirectory(prefix="rose-aot-sass-") as tmp:
            path = Path(tmp) / f"{record.name}.cubin"
            path.write_bytes(cubin)
            done = subprocess.run([tool, "-c", str(path)], capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"sass_count.py: nvdisasm failed on {family.key(config)} {record.name}: "
                     f"{(done.stderr or done.stdout).strip().splitlines()[-1]}")
        if dump is not None:
            (dump / f"{family_name}-{record.name}-{arch}.sass").write_text(done.stdout)
        path_instructions, loops = main_path(done.stdout)
        constants = record.constants
        elements = None
        if "vec" in constants and "vecs_per_thread" in constants and not loops:
            elements = constants["vec"] * constants["vecs_per_thread"]
        registers = max(f.registers for f in read_cubin(cubin).values())
        rows.append({
            "point": family.key(config),
            "arch": arch,
            "variant": record.name,
            "instructions": len(path_instructions),
            "loops": loops,
            "registers": registers,
            "elements_per_thread": elements,
            "per_element": None if elements is None else len(path_instructions) / elements,
            "opcodes": dict(Counter(map(opcode, path_instructions)).most_common()),
        })
        rows[-1]["pipes"] = dict(Counter(pipe(op) for op in map(opcode, path_instructions)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", help="kernel family, e.g. nvfp4_quant")
    parser.add_argument("config", nargs="*", metavar="key=value",
                        help="the point's config fields, e.g. hidden=7168 format=mxfp4")
    parser.add_argument("--arch", default="sm_90a", help="target arch (default sm_90a)")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    parser.add_argument("--dump", type=Path, default=None,
                        help="also write each variant's full listing into this folder")
    args = parser.parse_args()
    # benchmarks/common.py, imported here only: a module-level `import common` would shadow
    # tests/multigpu's module of that name when the CPU tests load this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import config_fields

    values = config_fields(args.config, parser.error)
    if args.dump is not None:  # before the compile: a bad folder should cost nothing
        if args.dump.exists() and not args.dump.is_dir():
            sys.exit(f"sass_count.py: --dump {args.dump} is not a folder")
        try:
            args.dump.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            sys.exit(f"sass_count.py: cannot use --dump {args.dump}: {exc.strerror or exc}")

    from rose_aot.errors import RoseAotError

    try:
        rows = count_point(args.family, values, args.arch, args.dump)
    except RoseAotError as exc:
        sys.exit(f"sass_count.py: {exc}")
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{rows[0]['point']} @ {args.arch}")
    print("| variant | instructions | alu / fma pipe | loops | registers | elements per thread "
          "| per element | top opcodes |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        top = ", ".join(f"{k} {v}" for k, v in list(r["opcodes"].items())[:6])
        per = "" if r["per_element"] is None else f"{r['per_element']:.1f}"
        pipes = f"{r['pipes'].get('alu', 0)} / {r['pipes'].get('fma', 0)}"
        print(f"| {r['variant']} | {r['instructions']} | {pipes} | "
              f"{'yes' if r['loops'] else 'no'} | {r['registers']} | "
              f"{r['elements_per_thread'] or ''} | {per} | {top} |")


if __name__ == "__main__":
    main()
