"""`opstrata conformance ops|onnx`: the op x dtype matrix a porting team needs; ONNX's backend node tests.

``onnx`` runs the runtime's own backend-test runner (``opstrata.runtime.onnx_backend``, not a copy)
and prints its per-op table; ``--against onnxruntime`` adds onnxruntime's column.

Cells: ``ok`` native and agreeing with the reference, ``dec`` decomposed and agreeing, ``fb:<dev>``
falls back, ``-`` missing, ``DEV`` deviates (listed below the matrix with a reproducer), ``n/s`` no
generated sample. Exit 1 when a cell deviates, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import opstrata.ops as ops

from ._conformance import ConformanceReport, conformance_ops
from ._conformance_search import SearchUnavailable

__all__ = ["add_arguments", "render", "run"]

_SHORT = {"native": "ok", "decomposed": "dec", "missing": "-", "deviates": "DEV", "no-sample": "n/s"}
_DT = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3",
       "float8_e5m2": "e5m2", "bool": "bool"}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `opstrata conformance`."""
    parser.add_argument(
        "suite", choices=("ops", "onnx"),
        help="ops: every registered op x dtype against the reference device; onnx: ONNX backend node tests",
    )  # fmt: skip
    parser.add_argument("--device", default="cpu", help="ops: device under test (default cpu)")
    parser.add_argument(
        "--against",
        default=None,
        help="ops: reference device (default ref); onnx: onnxruntime adds its column",
    )
    parser.add_argument(
        "--ops", default=None, metavar="A,B,...", help="only these ops (opstrata.ops names, or ONNX op types)"
    )
    parser.add_argument("--dtypes", default=None, metavar="A,B,...", help="only these dtypes (default all)")
    parser.add_argument(
        "--out", type=Path, default=Path("opstrata-conformance"), help="directory for reproducers"
    )
    parser.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated inputs (default 0)")
    parser.add_argument(
        "--examples", type=int, default=0, metavar="N",
        help="ops: also search N hypothesis-drawn inputs per shape-searched op x dtype, shrinking any "
        "disagreement to its smallest input (needs opstrata-eval[conformance]; default 0: off)",
    )  # fmt: skip


def _cell(status: str) -> str:
    return _SHORT.get(status, status.replace("fallback:", "fb:"))


def render(report: ConformanceReport, fmt: str = "text") -> str:
    """The matrix (ops x dtypes), the counts, then each deviation with its reproducer."""
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=2)
    heads = ["op", *(_DT.get(d, d.replace("int", "i").replace("ui", "u")) for d in report.dtypes)]
    rows = [[op, *(_cell(report.cells[(op, d)].status) for d in report.dtypes)] for op in report.ops]
    if fmt == "markdown":
        lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(heads)]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [heads, *rows]
        ]
    counts = ", ".join(f"{k} {v}" for k, v in sorted(report.counts().items()))
    out = [
        f"conformance of device '{report.device}' against '{report.against}'",
        "",
        *lines,
        "",
        f"cells: {counts}",
    ]
    for c in report.deviations:
        out.append(f"DEVIATES {c.op} {c.dtype}: {c.detail}" + (f"; reproducer {c.repro}" if c.repro else ""))
    if report.deviations:
        out.append(
            "reproduce: opstrata.eval.replay_reproducer(FILE) reruns the call on the device under test "
            "(device='ref' for the reference); load_reproducer(FILE) gives its args, kwargs and both outputs"
        )
    return "\n".join(out) + "\n"


def _run_onnx(args: argparse.Namespace, names: list[str] | None) -> int:
    """The backend node tests through InferenceSession (and onnxruntime with --against onnxruntime)."""
    if args.against not in (None, "onnxruntime"):
        print(f"opstrata conformance: error: onnx: --against must be onnxruntime or omitted, got {args.against!r}",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        from opstrata.runtime import onnx_backend

        known = set(onnx_backend.suite_ops())
    except ImportError as exc:
        print(f"opstrata conformance: error: onnx: {exc}; pip install onnx", file=sys.stderr)
        return 2
    unknown = sorted(set(names or ()) - known)
    if unknown:
        print(f"opstrata conformance: error: onnx: no backend node tests for {unknown}; "
              "op types are ONNX names (Relu, Softmax, ...)", file=sys.stderr)  # fmt: skip
        return 2
    results = onnx_backend.run_cases(names, versus_ort=args.against == "onnxruntime")
    print(onnx_backend.format_report(results, names))
    bad = [r for r in results if r.status in ("wrong", "crash")]
    for r in bad:
        print(f"{r.status.upper()} {r.name} ({r.op}): {r.detail[:300]}", file=sys.stderr)
    return 1 if bad else 0


def run(args: argparse.Namespace) -> int:
    """Run `opstrata conformance`; 0 all agree, 1 a cell deviates (or a node test is wrong), 2 bad input."""
    names = [s for s in args.ops.split(",") if s] if args.ops else None
    if args.suite == "onnx":
        return _run_onnx(args, names)
    args.against = args.against or "ref"
    try:
        dtypes = [ops.as_dtype(s) for s in args.dtypes.split(",") if s] if args.dtypes else None
    except Exception as exc:
        print(f"opstrata conformance: error: --dtypes: {exc}", file=sys.stderr)
        return 2
    progress = (lambda line: print(line, file=sys.stderr)) if sys.stderr.isatty() else None
    try:
        report = conformance_ops(args.device, against=args.against, op_names=names, dtypes=dtypes,
                                 out_dir=args.out, seed=args.seed, progress=progress,
                                 examples=args.examples)  # fmt: skip
    except (ValueError, SearchUnavailable) as exc:
        print(f"opstrata conformance: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render(report, args.format))
    return 1 if report.deviations else 0
