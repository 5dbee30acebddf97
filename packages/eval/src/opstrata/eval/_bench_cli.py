"""`opstrata bench ops|models|zoo|comm [--save NAME] [--compare NAME] [--fail-on-regression PCT]`.

Benchmarks of a suite run interleaved (``--rounds`` samples each); ``--save`` stores them with the
machine fingerprint, ``--compare`` gives each benchmark a verdict against a saved run (faster /
slower / same / inconclusive, from a bootstrap confidence interval) and warns when the fingerprints
differ. ``models`` and ``zoo`` also give each model's opstrata/onnxruntime ratio (median of the
per-round ratios, both at ``--threads``); ``comm`` gives bus bandwidth per message size. Exit 1 when
``--fail-on-regression`` is given and a benchmark is slower beyond it (peer rows such as
onnxruntime's get a verdict but are not gated: their drift is the machine's), 2 on bad input or a
suite that cannot run (unknown model, bad sizes, a missing extra, a failed rank).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ._bench_gate import DEFAULT_THRESHOLD, gate
from ._bench_results import ResultsError, fingerprint, fingerprint_diff, load, save
from ._bench_suites import SUITE_HELP, SUITES, BenchError, BenchOptions, SuiteRun
from ._info import cache_dir
from ._progress import PROGRESS_KINDS, resolve_progress

__all__ = ["add_arguments", "run"]

#: Fields of a benchmark that must match the baseline's for a comparison to mean something.
_SETUP_FIELDS = ("threads", "ranks", "bytes", "calls_per_sample", "exporter", "input")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `opstrata bench`."""
    parser.add_argument(
        "suite", choices=list(SUITES), help="; ".join(f"{k}: {v}" for k, v in SUITE_HELP.items())
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
    parser.add_argument(
        "--threads", type=int, default=None, metavar="N",
        help="models, zoo: intra-op threads of opstrata and onnxruntime alike (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--models", metavar="A,B", default=None,
        help="models, zoo: comma-separated models (models: gpt_block,bert_block,mlp,cnn; "
        "zoo default: squeezenet1_1,resnet18,mobilenet_v3_small,gpt2; see `opstrata zoo list`)",
    )  # fmt: skip
    parser.add_argument(
        "--sizes", metavar="S,S", default=None,
        help="comm: message sizes, e.g. 4K,64K,1M,16M (default 4K..16M, x4 apart)",
    )  # fmt: skip
    parser.add_argument(
        "--ranks", type=int, default=None, metavar="N", help="comm: local rank processes (default 2)"
    )
    parser.add_argument(
        "--progress", choices=PROGRESS_KINDS, default="auto",
        help="progress on stderr: tqdm bar on a terminal when installed (auto), or plain lines",
    )  # fmt: skip


def _results_dir(args: argparse.Namespace) -> Path:
    return args.results if args.results is not None else Path(cache_dir(os.environ)["path"]) / "bench"


def _options(args: argparse.Namespace) -> BenchOptions:
    """BenchOptions from the arguments; BenchError for an option the suite does not take or a bad value."""
    suite = args.suite
    for flag, value, suites in (
        ("--threads", args.threads, ("models", "zoo")),
        ("--models", args.models, ("models", "zoo")),
        ("--sizes", args.sizes, ("comm",)),
        ("--ranks", args.ranks, ("comm",)),
    ):
        if value is not None and suite not in suites:
            raise BenchError(f"{flag} applies to the {' and '.join(suites)} suite(s), not {suite}; drop it")
    models = None
    if args.models is not None:
        models = [m.strip() for m in args.models.split(",")]
        if not all(models):
            raise BenchError(
                f"--models {args.models!r}: expected comma-separated names without empty entries"
            )
    sizes = None
    if args.sizes is not None:
        from ._bench_suite_comm import parse_sizes

        sizes = parse_sizes(args.sizes)
    try:
        kind = resolve_progress(args.progress)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    return BenchOptions(
        rounds=args.rounds, threads=1 if args.threads is None else args.threads, models=models, sizes=sizes,
        ranks=2 if args.ranks is None else args.ranks, progress=kind,
    )  # fmt: skip


def _peer_fields(run: SuiteRun) -> dict[str, dict[str, Any]]:
    """Per opstrata benchmark with a peer: the peer, its median and the opstrata/peer ratio with a CI."""
    out: dict[str, dict[str, Any]] = {}
    for peer, meta in run.meta.items():
        mine = meta.get("peer_of")
        if mine not in run.samples or peer not in run.samples:
            continue
        ours, theirs = np.asarray(run.samples[mine]), np.asarray(run.samples[peer])
        v = gate(theirs, ours, paired=True)  # interleaved: round i of both under the same load
        out[mine] = {"peer": peer, "peer_median_s": float(np.median(theirs)),
                     "peer_ratio": float(np.median(ours / theirs)), "peer_ci": [v.low, v.high]}  # fmt: skip
    return out


def _derived(run: SuiteRun) -> dict[str, dict[str, Any]]:
    """Figures computed from the samples that the JSON carries: peer ratios, bus bandwidth."""
    from ._bench_suite_comm import algbw, busbw

    out = _peer_fields(run)
    for bench, meta in run.meta.items():
        if "bytes" in meta and "ranks" in meta:
            t = float(np.median(run.samples[bench]))
            out[bench] = {
                "busbw_GBps": busbw(meta["bytes"], meta["ranks"], t),
                "algbw_GBps": algbw(meta["bytes"], t),
            }
    return out


def _setup_warnings(baseline_meta: dict[str, dict[str, Any]], meta: dict[str, dict[str, Any]]) -> list[str]:
    """Lines for benchmarks measured under another setup than the baseline's (threads, ranks, sizes)."""
    out = []
    for bench, fields in meta.items():
        old = baseline_meta.get(bench, {})
        for key in _SETUP_FIELDS:
            if key in old and key in fields and old[key] != fields[key]:
                out.append(f"{bench}: {key} {old[key]!r} in the baseline, {fields[key]!r} now")
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:10.4f}"


def _text(args: argparse.Namespace, rows: list[dict[str, Any]], threshold: float, compared: bool) -> None:
    suite = args.suite
    head = f"opstrata bench {suite}: {args.rounds} interleaved rounds"
    if rows and "threads" in rows[0]:
        head += f", {rows[0]['threads']} thread(s) on each side"
    if rows and "ranks" in rows[0]:
        head += f", all_reduce float32 sum on {rows[0]['ranks']} ranks ({rows[0].get('backend', 'shm')})"
    print(head + (f", against '{args.compare}' (threshold {threshold:.0%})" if compared else ""))
    if suite in ("models", "zoo"):
        print(f"  {'model':<20} {'opstrata ms':>11} {'onnxruntime ms':>15}   opstrata/onnxruntime [95% CI]")
        for r in rows:
            if r.get("runtime") != "opstrata":
                continue
            line = f"  {r['model']:<20} {_ms(r['median_s']):>11}"
            if "peer_ratio" in r:
                lo, hi = r["peer_ci"]
                line += f" {_ms(r['peer_median_s']):>15}   x{r['peer_ratio']:.3f} [{lo:.3f}, {hi:.3f}]"
            else:
                line += f" {'-':>15}   -"
            print(line)
    elif suite == "comm":
        print(f"  {'size':>8} {'bytes':>10} {'ms/call':>10} {'busbw GB/s':>11} {'algbw GB/s':>11}")
        for r in rows:
            print(f"  {r['bench'].split('/')[-1]:>8} {r['bytes']:>10} {_ms(r['median_s'])} "
                  f"{r['busbw_GBps']:11.3f} {r['algbw_GBps']:11.3f}")  # fmt: skip
    if suite == "ops" or compared:
        if suite != "ops":
            print(f"  against '{args.compare}':")
        for r in rows:
            line = f"  {r['bench']:<26} {_ms(r['median_s'])} ms"
            if "verdict" in r:
                lo, hi = r["ci"]
                line += (f"   baseline {_ms(r['baseline_median_s'])} ms   x{r['ratio']:.3f} "
                         f"[{lo:.3f}, {hi:.3f}]   {r['verdict']}")  # fmt: skip
            elif compared:
                line += "   (not in the baseline)"
            if "peer_of" in r and "verdict" in r:
                line += "   (peer: reported, not gated)"
            print(line)


def run(args: argparse.Namespace) -> int:
    """Run `opstrata bench`; 0 ok, 1 a regression beyond --fail-on-regression, 2 bad input."""

    def fail(msg: str) -> int:
        print(f"opstrata bench: error: {msg}", file=sys.stderr)
        return 2

    if args.rounds < 3:
        return fail(f"--rounds must be >= 3 for a confidence interval, got {args.rounds}")
    if args.fail_on_regression is not None and (args.compare is None or args.fail_on_regression < 0):
        return fail("--fail-on-regression PCT needs --compare NAME and PCT >= 0")
    try:
        opts = _options(args)
    except BenchError as exc:
        return fail(str(exc))
    directory = _results_dir(args)
    try:
        baseline = load(directory, args.compare) if args.compare else None
    except ResultsError as exc:
        return fail(str(exc))
    if baseline is not None and baseline.suite != args.suite:
        return fail(f"saved run '{baseline.name}' is of suite '{baseline.suite}', not '{args.suite}'")
    try:
        result = SUITES[args.suite](opts)
    except BenchError as exc:
        return fail(str(exc))
    for note in result.notes:
        print(f"opstrata bench: note: {note}", file=sys.stderr)
    derived = _derived(result)
    threshold = DEFAULT_THRESHOLD if args.fail_on_regression is None else args.fail_on_regression / 100
    rows, regressed = [], []
    for bench, times in result.samples.items():
        row: dict[str, Any] = {"bench": bench, "median_s": float(np.median(times)), "rounds": len(times)}
        row |= {k: v for k, v in result.meta.get(bench, {}).items() if k != "description"}
        row |= derived.get(bench, {})
        if baseline is not None and bench in baseline.results:
            v = gate(baseline.results[bench], times, threshold=threshold)
            row |= {"baseline_median_s": float(np.median(baseline.results[bench])), "ratio": v.ratio,
                    "ci": [v.low, v.high], "verdict": v.verdict}  # fmt: skip
            if v.verdict == "slower" and "peer_of" not in row:  # a peer's drift is the machine's, not ours
                regressed.append(bench)
        rows.append(row)
    warnings = fingerprint_diff(baseline.fingerprint, fingerprint()) if baseline is not None else []
    for line in warnings:
        print(f"opstrata bench: warning: the baseline was measured elsewhere: {line}", file=sys.stderr)
    setup = _setup_warnings(baseline.meta, result.meta) if baseline is not None else []
    for line in setup:
        print(f"opstrata bench: warning: measured differently from the baseline: {line}", file=sys.stderr)
    if args.format == "json":
        doc = {"suite": args.suite, "baseline": args.compare, "rounds": args.rounds, "rows": rows,
               "notes": result.notes, "fingerprint_differences": warnings, "setup_differences": setup}  # fmt: skip
        print(json.dumps(doc, indent=2))
    else:
        _text(args, rows, threshold, baseline is not None)
    if args.save:
        meta = {b: {**result.meta.get(b, {}), **derived.get(b, {})} for b in result.samples}
        try:
            path = save(directory, args.save, args.suite, result.samples, meta)
        except (ResultsError, OSError) as exc:
            return fail(f"--save: {exc}")
        print(f"saved: {path}", file=sys.stderr if args.format == "json" else sys.stdout)
    if args.fail_on_regression is not None and regressed:
        print(f"opstrata bench: slower than '{args.compare}' beyond {args.fail_on_regression:g}%: "
              f"{', '.join(regressed)}", file=sys.stderr)  # fmt: skip
        return 1
    return 0
