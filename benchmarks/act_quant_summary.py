"""Print the tables of docs/results-act-quant.md from committed activation/quantization results
(no GPU needed).

    python benchmarks/act_quant_summary.py benchmarks/results/act_quant-*-h200.json

One table per file: the plan's µs per token count (speed-up over torch.compile in brackets)
and the share of the copy bandwidth measured in the same run at 8192 / 32768 tokens."""

from __future__ import annotations

import argparse
import sys

from common import read_result, summary_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="act_quant-*.json files from bench_act_quant.py")
    args = parser.parse_args()
    for path in args.results:
        try:
            data = read_result(path)
            table = summary_table(data["rows"], data["copy_tbs"])
        except (OSError, ValueError, TypeError) as exc:
            sys.exit(f"act_quant_summary.py: cannot read {path}: {exc}")
        print(f"{path} (copy {data['copy_tbs']:.2f} TB/s)\n\n{table}\n")


if __name__ == "__main__":
    main()
