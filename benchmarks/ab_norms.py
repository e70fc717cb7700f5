"""A/B of rms_norm bundles built from different trees, in one process, against torch.compile.

    python benchmarks/ab_norms.py base=build/exp/base.rosebundle new=build/exp/new.rosebundle \
        --hidden 6144,7168,8192 --tokens 1024,8192,32768

Each LABEL=BUNDLE is opened by this checkout's loader (bundles are data: a tree's kernel change
needs only its bundle, built with `rose-aot build` from that tree). Per shape, every bundle's
output is checked against per-shape torch.compile's (relative error < 2^-6), then timed in
`--rounds` rounds with the bundles in alternating order (CUDA-graph replay medians, 30 ms each),
together with torch.compile, Liger-Kernel where it is installed (`liger_rms_norm`,
`liger_fused_add_rms_norm`) and each `--force` variant of every bundle forced (in columns
LABEL:VARIANT; default: the first bundle's decode variant, as `decode`; `mid` and
`decode_late`, which only some rows have, are the decode variant elsewhere). Prints one line per shape: the median
over rounds of each. The experiments behind rms_norm's cache hints
(benchmarks/results/norm-cache-hints-experiment-h200.md) are its output.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from common import (  # noqa: E402
    compile_per_shape,
    int_list,
    preloaded_bundles,
    print_medians,
    refuse_missing_points,
)

# rms_norm's plan choices (RmsNorm.plan_choices); where a bundle lacks one (decode_late, mid), the
# plan launches the decode variant in its place
FORCEABLE = ("decode", "decode_late", "mid", "prefill")


def labelled_bundle(text: str) -> tuple[str, str]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: write LABEL=BUNDLE")
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"{path}: no such bundle file")
    return label, path


def check_labels_and_rounds(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The checks every A/B script makes of its LABEL=BUNDLE list and --rounds."""
    labels = [label for label, _ in args.bundles]
    if len(set(labels)) != len(labels):
        parser.error(f"labels repeat: {labels}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", nargs="+", type=labelled_bundle, metavar="LABEL=BUNDLE",
                        help="bundles to compare; each holds rms_norm at every --hidden")
    parser.add_argument("--hidden", type=int_list, default=[5120, 6144, 7168, 8192],
                        help="hidden sizes (comma-separated)")
    parser.add_argument("--tokens", type=int_list, default=[1024, 4096, 8192, 32768],
                        help="token counts (comma-separated)")
    parser.add_argument("--rounds", type=int, default=2, help="timing rounds per shape")
    parser.add_argument("--fused", default="0,1", choices=["0", "1", "0,1"], metavar="0|1|0,1",
                        help="plain (0), fused residual (1) or both")
    parser.add_argument("--force", default="", metavar="VARIANT,...",
                        help=f"variants to time forced in every bundle ({', '.join(FORCEABLE)}; "
                             "columns LABEL:VARIANT; default: the first bundle's decode variant "
                             "only, as 'decode')")
    args = parser.parse_args(argv)
    check_labels_and_rounds(parser, args)
    # plain first, then fused: the order of the lines main() prints
    args.fused = [bool(int(f)) for f in args.fused.split(",")]
    args.force = [v for v in args.force.split(",") if v]
    if any(v not in FORCEABLE for v in args.force):
        parser.error(f"--force takes rms_norm's variants, {', '.join(FORCEABLE[:-1])} and "
                     f"{FORCEABLE[-1]} (got {args.force})")
    refuse_missing_points(parser, args.bundles, "rms_norm", ("hidden", "fused_residual"),
                          [(h, f) for h in args.hidden for f in args.fused])
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    from bench_norms import EPS, fused_rms_norm_torch, rms_norm_torch

    bundles = preloaded_bundles(args.bundles)
    compiled = compile_per_shape(rms_norm_torch)
    compiled_fused = compile_per_shape(fused_rms_norm_torch)
    try:
        from liger_kernel.transformers.functional import liger_fused_add_rms_norm, liger_rms_norm
    except ImportError:
        liger_rms_norm = liger_fused_add_rms_norm = None
        print("liger_kernel is not installed: no Liger column", flush=True)
    # (column, bundle label, variant): every bundle's forced variants, or the first's decode
    forced = ([(f"{label}:{v}", label, v) for label in bundles for v in args.force]
              if args.force else [("decode", next(iter(bundles)), "decode")])
    for fused in args.fused:
        for h in args.hidden:
            handles = {k: b.kernel("rms_norm", hidden=h, eps=EPS, fused_residual=fused)
                       for k, b in bundles.items()}
            for t in args.tokens:
                x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
                r = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
                w = (1 + 0.1 * torch.randn(h, device="cuda")).bfloat16()
                out = torch.empty_like(x)
                call = (x, r, w, out) if fused else (x, w, out)
                ref = torch.empty_like(x)
                if fused:
                    compiled_fused(x, r.clone(), w, ref)
                else:
                    compiled(x, w, ref)
                for k, handle in handles.items():
                    o = torch.full_like(x, float("nan"))
                    handle(*((x, r.clone(), w, o) if fused else (x, w, o)))
                    err = ((o.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                    assert err < 2**-6, (k, h, t, err)
                peers = {"compile": (lambda: compiled_fused(*call)) if fused
                         else (lambda: compiled(*call))}
                if liger_rms_norm is not None:
                    # out of place, like the kernels timed (the residual sum is returned)
                    peers["liger"] = ((lambda: liger_fused_add_rms_norm(x, r, w, EPS, in_place=False))
                                      if fused else (lambda: liger_rms_norm(x, w, EPS, in_place=False)))
                runs = {**peers, **{k: (lambda h=h: h(*call)) for k, h in handles.items()},
                        **{col: (lambda h=handles[label], v=v: h(*call, variant=v))
                           for col, label, v in forced}}
                print_medians(f"fused={int(fused)} h={h:5d} T={t:6d}", runs, args.rounds)


if __name__ == "__main__":
    main()
