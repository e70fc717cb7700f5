"""The tables of an A/B of two bundles timed by bench_act_quant.py in alternating processes
(benchmarks/results/*-experiment-h200.md), printed from the runs' JSON; no GPU needed.

    python benchmarks/ab_table.py --a base=A1.json,A2.json --b new=B1.json,B2.json \\
        [--forced prefill --forced-family nvfp4_quant --forced-tokens 8192,32768]

First the plan's column for every (family, shape, tokens) of A's first run: each side's µs run
by run, the ratio of the means (B / A) and B's share of the copy bandwidth (against the mean copy
of all runs). With --forced VARIANT, then that variant forced, for the rows of --forced-family
at --forced-tokens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import int_list, read_result  # noqa: E402


def _side(text: str) -> tuple[str, list[dict]]:
    """--a / --b: LABEL=RUN.json[,RUN.json...], each a bench_act_quant.py result."""
    label, sep, paths = text.partition("=")
    if not sep or not label or not paths:
        raise argparse.ArgumentTypeError(f"{text!r} is not LABEL=RUN.json[,RUN.json...]")
    runs = []
    for path in paths.split(","):
        try:
            runs.append(read_result(path))
        except (OSError, ValueError) as exc:
            raise argparse.ArgumentTypeError(f"cannot read {path}: {exc}") from None
    return label, runs


def _by_key(run: dict) -> dict:
    return {(r["family"], r["shape"], r["tokens"]): r for r in run["rows"]}


def ab_tables(a: tuple[str, list[dict]], b: tuple[str, list[dict]], forced: str | None = None,
              forced_family: str = "nvfp4_quant", forced_tokens: tuple[int, ...] = (8192, 32768)
              ) -> str:
    """The A/B tables as markdown (see the module's docstring). ValueError names a row or a
    forced column that a run lacks, or a forced table without rows."""
    (la, ra), (lb, rb) = a, b
    ia, ib = [_by_key(r) for r in ra], [_by_key(r) for r in rb]
    copy = statistics.mean(r["copy_tbs"] for r in ra + rb)

    def runs(n: int) -> str:
        return " / ".join(str(i + 1) for i in range(n))

    def each(ts: list[float]) -> str:
        return " / ".join(f"{t:.2f}" for t in ts)

    def times(index: list[dict], key, column: str) -> list[float]:
        try:
            return [i[key]["us"][column] for i in index]
        except KeyError:
            raise ValueError(f"{column} of {' '.join(map(str, key))} is missing from a run of "
                             f"{la if index is ia else lb}") from None

    lines = [f"| kernel | shape | tokens | {la} µs (runs {runs(len(ra))}) | {lb} µs (runs "
             f"{runs(len(rb))}) | {lb} / {la} (means) | {lb} % copy |",
             "|---|---|---|---|---|---|---|"]
    for key in ia[0]:
        ta, tb = times(ia, key, "rose_aot"), times(ib, key, "rose_aot")
        share = ib[0][key]["bytes"] / (statistics.mean(tb) * 1e-6) / (copy * 1e12) * 100
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {each(ta)} | {each(tb)} | "
                     f"{statistics.mean(tb) / statistics.mean(ta):.3f} | {share:.0f}% |")
    if forced:
        column = f"rose_aot_{forced}"
        keys = [k for k in ia[0] if k[0] == forced_family and k[2] in forced_tokens]
        if not keys:
            raise ValueError(f"no rows of {forced_family} at {forced_tokens} tokens for the "
                             f"{forced} table")
        lines += ["", f"| {forced} forced | tokens | {la} µs | {lb} µs | {lb} / {la} |",
                  "|---|---|---|---|---|"]
        for key in keys:
            ta, tb = times(ia, key, column), times(ib, key, column)
            lines.append(f"| {key[1]} | {key[2]} | {each(ta)} | {each(tb)} | "
                         f"{statistics.mean(tb) / statistics.mean(ta):.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=_side, required=True, help="LABEL=RUN.json,... of the baseline")
    parser.add_argument("--b", type=_side, required=True, help="LABEL=RUN.json,... of the change")
    parser.add_argument("--forced", metavar="VARIANT", help="also a table of this variant forced")
    parser.add_argument("--forced-family", default="nvfp4_quant",
                        help="family of the forced table's rows (default nvfp4_quant)")
    parser.add_argument("--forced-tokens", type=int_list, default=[8192, 32768],
                        help="token counts of the forced table (default 8192,32768)")
    args = parser.parse_args()
    try:
        print(ab_tables(args.a, args.b, args.forced, args.forced_family,
                        tuple(args.forced_tokens)))
    except ValueError as exc:
        sys.exit(f"ab_table.py: {exc}")


if __name__ == "__main__":
    main()
