"""Device-to-device copy bandwidth at the byte counts of the activation/quantization points.

The act_quant tables give "% copy" against one 1 GiB copy (common.copy_bandwidth_tbs). A smaller
transfer may not reach that rate even as a plain copy: this script times `dst.copy_(src)` the
way the kernels are timed (CUDA-graph replay, median: common.bench_us) at the traffic of each
point, so that a point's shortfall can be told apart from what the size itself costs.

    python benchmarks/copy_sizes.py                       # widths 2048-14336 x 8192, 32768 tokens
    python benchmarks/copy_sizes.py --widths 4096 --tokens 8192 --bytes-per-element 2.53

A point of `width` x `tokens` moves `bytes_per_element` bytes per element, read + written (3 for
the FP8 quantizers: 2 read, 1 written; 2.53 for MXFP4); the copy moves the same total, half each
way. Prints a markdown table and writes copy-sizes.json to $OUT (or benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import bench_us, copy_bandwidth_tbs, environment, int_list, out_dir  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int_list, default=[2048, 4096, 7168, 14336])
    parser.add_argument("--tokens", type=int_list, default=[8192, 32768])
    parser.add_argument("--bytes-per-element", type=float, default=3.0,
                        help="read + written bytes per element of a point (default 3: FP8)")
    args = parser.parse_args()
    if args.bytes_per_element <= 0:
        parser.error("--bytes-per-element must be positive")

    import torch

    if not torch.cuda.is_available():
        sys.exit("copy_sizes.py: needs a CUDA device")
    reference = copy_bandwidth_tbs()
    rows = []
    print(f"1 GiB copy: {reference:.2f} TB/s (read + write)")
    print("| width | tokens | MB moved | copy µs | TB/s | % of the 1 GiB copy |")
    print("|---|---|---|---|---|---|")
    for width in args.widths:
        for tokens in args.tokens:
            # each way a multiple of 64 KiB: torch's copy of other lengths can be far slower
            # (21,223,136 bytes each way: 2.96 TB/s; 21,168,128, a multiple of 64 KiB: 4.71;
            # benchmarks/results/copy-alignment-probe-h200.log), which would say nothing about
            # the size. The default widths and tokens at 3 bytes per element need no rounding.
            each_way = max(65536, int(width * tokens * args.bytes_per_element) // 2 // 65536 * 65536)
            try:
                src = torch.empty(each_way, dtype=torch.uint8, device="cuda")
                dst = torch.empty_like(src)
            except torch.cuda.OutOfMemoryError:
                sys.exit(f"copy_sizes.py: {width} x {tokens} needs two buffers of "
                         f"{each_way / 1e9:.1f} GB, more than the GPU has free")
            us = bench_us(lambda: dst.copy_(src))
            tbs = 2 * src.numel() / us / 1e6
            row = {"width": width, "tokens": tokens, "bytes": 2 * src.numel(), "us": us,
                   "tbs": tbs, "of_reference": tbs / reference}
            rows.append(row)
            print(f"| {width} | {tokens} | {row['bytes'] / 1e6:.1f} | {us:.2f} | {tbs:.2f} | "
                  f"{100 * row['of_reference']:.0f}% |", flush=True)
            del src, dst
    out = out_dir(os.path.join(HERE, "results"))
    with open(os.path.join(out, "copy-sizes.json"), "w") as f:
        json.dump({"environment": environment(), "reference_tbs": reference,
                   "bytes_per_element": args.bytes_per_element, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
