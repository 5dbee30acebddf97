"""`opstrata bench ops [--save NAME] [--compare NAME] [--fail-on-regression PCT]`: timings with a gate.

Benchmarks of a suite run interleaved (``--rounds`` samples each); ``--save`` stores them with the
machine fingerprint, ``--compare`` gives each benchmark a verdict against a saved run (faster /
slower / same / inconclusive, from a bootstrap confidence interval) and warns when the fingerprints
differ. Exit 1 when ``--fail-on-regression`` is given and a benchmark is slower beyond it, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from ._bench_gate import DEFAULT_THRESHOLD, gate
from ._bench_results import ResultsError, fingerprint, fingerprint_diff, load, save
from ._bench_run import interleave
from ._bench_suites import SUITES
from ._info import cache_dir

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `opstrata bench`."""
    parser.add_argument(
        "suite", choices=sorted(SUITES), help="what to time (ops: opstrata.ops kernels on cpu)"
    )
    parser.add_argument(
        "--rounds", type=int, default=20, help="interleaved samples per benchmark (default 20)"
    )
    parser.add_argument("--save", metavar="NAME", help="store the run as NAME in the results directory")
    parser.add_argument(
        "--compare", metavar="NAME", help="verdict of each benchmark against the saved run NAME"
    )
    parser.add_argument(
        "--fail-on-regression", type=float, metavar="PCT",
        help="with --compare: exit 1 when a benchmark is slower by more than PCT %% (also the verdict threshold)",
    )  # fmt: skip
    parser.add_argument(
        "--results", type=Path, default=None, help="results directory (default CACHE_DIR/bench)"
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")


def _results_dir(args: argparse.Namespace) -> Path:
    return args.results if args.results is not None else Path(cache_dir(os.environ)["path"]) / "bench"


def run(args: argparse.Namespace) -> int:
    """Run `opstrata bench`; 0 ok, 1 a regression beyond --fail-on-regression, 2 bad input."""

    def fail(msg: str) -> int:
        print(f"opstrata bench: error: {msg}", file=sys.stderr)
        return 2

    if args.rounds < 3:
        return fail(f"--rounds must be >= 3 for a confidence interval, got {args.rounds}")
    if args.fail_on_regression is not None and (args.compare is None or args.fail_on_regression < 0):
        return fail("--fail-on-regression PCT needs --compare NAME and PCT >= 0")
    directory = _results_dir(args)
    try:
        baseline = load(directory, args.compare) if args.compare else None
    except ResultsError as exc:
        return fail(str(exc))
    if baseline is not None and baseline.suite != args.suite:
        return fail(f"saved run '{baseline.name}' is of suite '{baseline.suite}', not '{args.suite}'")
    samples = interleave(SUITES[args.suite](), rounds=args.rounds)
    threshold = DEFAULT_THRESHOLD if args.fail_on_regression is None else args.fail_on_regression / 100
    rows, regressed = [], []
    for bench, times in samples.items():
        row: dict[str, object] = {"bench": bench, "median_s": float(np.median(times)), "rounds": len(times)}
        if baseline is not None and bench in baseline.results:
            v = gate(baseline.results[bench], times, threshold=threshold)
            row |= {"baseline_median_s": float(np.median(baseline.results[bench])), "ratio": v.ratio,
                    "ci": [v.low, v.high], "verdict": v.verdict}  # fmt: skip
            if v.verdict == "slower":
                regressed.append(bench)
        rows.append(row)
    warnings = fingerprint_diff(baseline.fingerprint, fingerprint()) if baseline is not None else []
    for line in warnings:
        print(f"opstrata bench: warning: the baseline was measured elsewhere: {line}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps({"suite": args.suite, "baseline": args.compare, "rows": rows,
                          "fingerprint_differences": warnings}, indent=2))  # fmt: skip
    else:
        print(f"opstrata bench {args.suite}: {args.rounds} interleaved rounds"
              + (f", against '{args.compare}' (threshold {threshold:.0%})" if baseline else ""))  # fmt: skip
        for r in rows:
            line = f"  {r['bench']:<22} {r['median_s'] * 1e3:9.4f} ms"
            if "verdict" in r:
                lo, hi = r["ci"]  # type: ignore[misc]
                line += (f"   baseline {r['baseline_median_s'] * 1e3:9.4f} ms   x{r['ratio']:.3f} "  # type: ignore[operator]
                         f"[{lo:.3f}, {hi:.3f}]   {r['verdict']}")  # fmt: skip
            print(line)
    if args.save:
        try:
            path = save(directory, args.save, args.suite, samples)
        except (ResultsError, OSError) as exc:
            return fail(f"--save: {exc}")
        print(f"saved: {path}")
    if args.fail_on_regression is not None and regressed:
        print(f"opstrata bench: slower than '{args.compare}' beyond {args.fail_on_regression:g}%: "
              f"{', '.join(regressed)}", file=sys.stderr)  # fmt: skip
        return 1
    return 0
