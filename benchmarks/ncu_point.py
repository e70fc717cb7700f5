"""Launch one activation/quantization point a few times, for a profiler to look at.

    ncu --set full --kernel-name regex:cutlass --launch-skip 2 --launch-count 1 --csv \
        --page details \
        python benchmarks/ncu_point.py BUNDLE FAMILY TOKENS [FIELD=VALUE ...] [--variant V]

    python benchmarks/ncu_point.py build/bench-act-quant.rosebundle nvfp4_quant 8192 hidden=7168

FIELD=VALUE pick the point (config fields of FAMILY; numbers as numbers); the input is the GPU
suite's case (tests/gpu/act_quant_cases.py: strided rows, group magnitudes 1e-3..1e3). The
output is checked against the float64 reference after the launches, so a profile is never
taken of a kernel that computes something else.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import config_fields  # noqa: E402


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a positive integer, got {text!r}")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("family")
    parser.add_argument("tokens", type=_positive)
    parser.add_argument("fields", nargs="*", help="config fields, FIELD=VALUE")
    parser.add_argument("--variant", help="force a variant (default: the plan's choice)")
    parser.add_argument("--launches", type=_positive, default=3)
    args = parser.parse_args()
    fields = config_fields(args.fields, parser.error)

    import torch
    from act_quant_cases import compare, make_case

    from rose_aot import open_bundle
    from rose_aot.errors import RoseAotError

    if not torch.cuda.is_available():
        sys.exit("ncu_point.py needs a CUDA GPU")
    try:
        handle = open_bundle(args.bundle).kernel(args.family, **fields)
    except RoseAotError as exc:
        sys.exit(f"ncu_point.py: {exc}")
    call_args, want, views = make_case(args.family, handle.config, args.tokens, seed=1)
    for _ in range(args.launches):
        handle(*call_args, variant=args.variant)
    torch.cuda.synchronize()
    compare(args.family, handle.config, want, views, handle.key)
    launches = handle.plan(*call_args, variant=args.variant)
    print(f"ok {handle.key} T={args.tokens}: {args.launches} x {[l.variant for l in launches]}")


if __name__ == "__main__":
    main()
