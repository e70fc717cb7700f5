"""A/B of qk_norm bundles built from different trees, in one process, against torch.compile.

    python benchmarks/ab_qk_norm.py base=build/exp/base.rosebundle new=build/exp/new.rosebundle \
        --heads 32/4/128,64/4/128 --tokens 1,16,128 --force prefill

Each LABEL=BUNDLE is opened by this checkout's loader. Per shape (Q heads/K heads/head dim,
bf16, eps 1e-6), every bundle's output is checked against a float64 reference (relative error
< 2^-7), then timed in `--rounds` rounds with the bundles in alternating order (CUDA-graph replay
medians, 30 ms each; the norm works in place, so every replay normalizes the output of the one
before, as back-to-back layers would), together with torch.compile and each `--force` variant
forced in every bundle or, written LABEL:VARIANT, in one (columns LABEL:VARIANT; a variant a
bundle lacks is refused before any GPU work). Prints one line per shape: the median over rounds
of each.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from ab_norms import check_labels_and_rounds, labelled_bundle  # noqa: E402
from common import (  # noqa: E402
    bundle_points,
    compile_per_shape,
    int_list,
    preloaded_bundles,
    print_medians,
    refuse_missing_points,
)

EPS = 1e-6


def heads_list(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in text.split(","):
        parts = item.split("/")
        try:
            q, k, d = (int(p) for p in parts)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{item!r}: write Q/K/D, e.g. 32/4/128 (query heads, key heads, head dim)"
            ) from None
        if min(q, k, d) < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: heads and head dim must be positive")
        shapes.append((q, k, d))
    return shapes


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", nargs="+", type=labelled_bundle, metavar="LABEL=BUNDLE",
                        help="bundles to compare; each holds qk_norm at every --heads")
    parser.add_argument("--heads", type=heads_list, default=[(32, 4, 128)], metavar="Q/K/D,...",
                        help="shapes: query heads/key heads/head dim (comma-separated)")
    parser.add_argument("--tokens", type=int_list, default=[1, 16, 128],
                        help="token counts (comma-separated)")
    parser.add_argument("--rounds", type=int, default=2, help="timing rounds per shape")
    parser.add_argument("--force", default="", metavar="[LABEL:]VARIANT,...",
                        help="variants to time forced, in every bundle or in the bundle LABEL "
                             "(columns LABEL:VARIANT)")
    args = parser.parse_args(argv)
    check_labels_and_rounds(parser, args)
    labels = [label for label, _ in args.bundles]
    # (column, bundle label, variant) of every forced run
    args.force_runs = []
    for item in (v for v in args.force.split(",") if v):
        label, _, variant = item.rpartition(":")
        if label and label not in labels:
            parser.error(f"--force {item!r}: no bundle labelled {label!r} (labels: {labels})")
        if not variant:
            parser.error(f"--force {item!r}: name a variant")
        args.force_runs += [(f"{b}:{variant}", b, variant) for b in labels if b == label or not label]
    fields = ("num_q_heads", "num_k_heads", "head_dim")
    refuse_missing_points(parser, args.bundles, "qk_norm", fields, args.heads,
                          keep=lambda c: c.get("dtype") == "bfloat16" and c.get("eps") == EPS)
    for label, path in args.bundles:
        wanted = [v for _, b, v in args.force_runs if b == label]
        points, _ = bundle_points(path)
        for p in points:  # every arch's point of the shape has each forced variant
            if p["family"] != "qk_norm":
                continue
            shape = tuple(p["config"][f] for f in fields)
            if shape not in args.heads:
                continue
            names = {v["name"] for v in p["variants"]}
            absent = [v for v in wanted if v not in names]
            if absent:
                parser.error(f"{label}={path}: qk_norm {'/'.join(map(str, shape))} has no "
                             f"variant {', '.join(absent)}; it has {sorted(names)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    bundles = preloaded_bundles(args.bundles)

    def torch_qk_norm(q, k, wq, wk):
        for x, w in ((q, wq), (k, wk)):
            xf = x.float()
            x.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
                     * w.float()).to(x.dtype))

    compiled = compile_per_shape(torch_qk_norm)
    forced = args.force_runs
    for hq, hk, d in args.heads:
        handles = {label: b.kernel("qk_norm", num_q_heads=hq, num_k_heads=hk, head_dim=d,
                                   eps=EPS)
                   for label, b in bundles.items()}
        for t in args.tokens:
            gen = torch.Generator(device="cuda").manual_seed(t)
            q = torch.randn(t, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            k = torch.randn(t, hk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            wq = (1 + 0.1 * torch.randn(d, device="cuda", generator=gen)).bfloat16()
            wk = (1 + 0.1 * torch.randn(d, device="cuda", generator=gen)).bfloat16()
            want = []
            for x, w in ((q, wq), (k, wk)):
                x64 = x.double()
                want.append(x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
                            * w.double())
            for col, handle, variant in ([(label, h, None) for label, h in handles.items()]
                                         + [(c, handles[label], v) for c, label, v in forced]):
                qc, kc = q.clone(), k.clone()
                handle(qc, kc, wq, wk, variant=variant)
                for got, ref in zip((qc, kc), want):
                    err = ((got.double() - ref).abs() / ref.abs().clamp(min=1)).max().item()
                    assert err < 2**-7, (col, (hq, hk, d), t, err)
            runs = {"compile": lambda: compiled(q, k, wq, wk),
                    **{label: (lambda h=h: h(q, k, wq, wk)) for label, h in handles.items()},
                    **{col: (lambda h=handles[label], v=v: h(q, k, wq, wk, variant=v))
                       for col, label, v in forced}}
            print_medians(f"qk={hq}/{hk}/{d} T={t:6d}", runs, args.rounds)


if __name__ == "__main__":
    main()
