"""A/B of moe_combine bundles built from different trees, in one process, against torch.compile.

    python benchmarks/ab_combine.py base=build/exp/base.rosebundle new=build/exp/new.rosebundle \
        --top-k 2,4,8 --hidden 4096,7168 --tokens 1,16,64,128

Each LABEL=BUNDLE is opened by this checkout's loader (a tree's kernel change needs only its
bundle, built with `rose-aot build` from that tree). Per shape, every bundle's output is checked
bitwise against the first bundle's (the combine sums in a fixed order, so any two of its
variants agree bit for bit) and against torch.compile's (relative error < 2^-7), then timed in
`--rounds` rounds with the bundles in alternating order (CUDA-graph replay medians, 30 ms
each), together with torch.compile compiled for the shape and each `--force` variant of every
bundle (columns LABEL:VARIANT). Prints one line per shape: the median over rounds of each, and
the variant each bundle's plan launches.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from ab_norms import check_labels_and_rounds, labelled_bundle  # noqa: E402
from common import (  # noqa: E402
    compile_per_shape,
    int_list,
    preloaded_bundles,
    print_medians,
    refuse_missing_points,
)

# moe_combine's plan choices (MoeCombine.plan_choices); split_block and split_block_late, where a
# bundle lacks one, launch the other
VARIANTS = ("decode", "prefill", "split", "split_wide", "split_block", "split_block_late")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", nargs="+", type=labelled_bundle, metavar="LABEL=BUNDLE",
                        help="bundles to compare; each holds moe_combine at every --top-k and "
                             "--hidden (bf16)")
    parser.add_argument("--top-k", type=int_list, default=[2, 4, 8],
                        help="top_k values (comma-separated)")
    parser.add_argument("--hidden", type=int_list, default=[2048, 4096, 6144, 7168],
                        help="hidden sizes (comma-separated)")
    parser.add_argument("--tokens", type=int_list, default=[1, 16, 32, 64, 128],
                        help="token counts (comma-separated)")
    parser.add_argument("--rounds", type=int, default=2, help="timing rounds per shape")
    parser.add_argument("--force", default="", metavar="VARIANT,...",
                        help=f"variants to time forced in every bundle ({', '.join(VARIANTS)}; "
                             "columns LABEL:VARIANT)")
    args = parser.parse_args(argv)
    check_labels_and_rounds(parser, args)
    args.force = [v for v in args.force.split(",") if v]
    unknown = [v for v in args.force if v not in VARIANTS]
    if unknown:
        parser.error(f"--force takes moe_combine's variants {', '.join(VARIANTS)} "
                     f"(got {', '.join(unknown)})")
    refuse_missing_points(parser, args.bundles, "moe_combine", ("top_k", "hidden"),
                          [(k, h) for k in args.top_k for h in args.hidden],
                          keep=lambda c: c.get("dtype") == "bfloat16", what="bf16 moe_combine")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    from bench_moe import torch_combine

    bundles = preloaded_bundles(args.bundles)
    compiled = compile_per_shape(torch_combine)
    forced = [(f"{label}:{v}", label, v) for label in bundles for v in args.force]
    for top_k in args.top_k:
        for h in args.hidden:
            handles = {k: b.kernel("moe_combine", top_k=top_k, hidden=h)
                       for k, b in bundles.items()}
            for t in args.tokens:
                gen = torch.Generator(device="cuda").manual_seed(t * 64 + top_k)
                rows = t * top_k
                y = torch.randn(rows, h, device="cuda", generator=gen).bfloat16()
                pos = torch.randperm(rows, device="cuda", generator=gen).view(t, top_k).int()
                w = torch.rand(t, top_k, device="cuda", generator=gen)
                out = torch.empty(t, h, device="cuda", dtype=torch.bfloat16)
                ref = compiled(y, pos, w)
                first = None
                for k, handle in handles.items():
                    o = torch.full_like(out, float("nan"))
                    handle(y, pos, w, o)
                    err = ((o.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                    assert err < 2**-7, (k, top_k, h, t, err)
                    if first is None:
                        first = o
                    assert torch.equal(o, first), (k, top_k, h, t, "differs from the first")
                runs = {"compile": lambda: compiled(y, pos, w),
                        **{k: (lambda hd=hd: hd(y, pos, w, out)) for k, hd in handles.items()},
                        **{col: (lambda hd=handles[label], v=v: hd(y, pos, w, out, variant=v))
                           for col, label, v in forced}}
                plans = ",".join(f"{k}:{hd.plan(y, pos, w, out)[0].variant}"
                                 for k, hd in handles.items())
                print_medians(f"K={top_k} h={h:5d} T={t:5d}", runs, args.rounds,
                              f" plan={plans}")


if __name__ == "__main__":
    main()
