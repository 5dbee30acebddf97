"""`opstrata zoo`: list the zoo's models, or export and run them and print one row per model x exporter.

Exit status: 0 when every row is right or declined with a reason, 1 when a row gives a wrong answer
(error above 1e-4 relative against onnxruntime) or crashes — and, with ``--strict``, also when a row
is refused or its export fails; 2 for bad usage (unknown model, torch not installed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "run"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `opstrata zoo list` and `opstrata zoo run`."""
    sub = parser.add_subparsers(dest="zoo_command", metavar="{list,run}")
    sub.add_parser("list", help="the zoo's models: family, input kind, shapes checked, what was shrunk")
    run_p = sub.add_parser(
        "run", help="export models with torch.onnx and run them in opstrata against onnxruntime and torch"
    )
    run_p.add_argument("names", nargs="*", metavar="NAME", help="models to run (default: all)")
    run_p.add_argument(
        "--exporter", choices=("dynamo", "torchscript", "both"), default="both",
        help="torch.onnx exporter: dynamo (torch.export) or torchscript (opset 17); default both",
    )  # fmt: skip
    run_p.add_argument(
        "--bench", action="store_true",
        help="add the median latency ratio opstrata/onnxruntime, and for the decoders (gpt2, llama) a table "
        "of per-token decode latency on the paged KV cache against torch eager with its KV cache",
    )  # fmt: skip
    run_p.add_argument("--threads", type=int, default=1, help="intra-op threads on both sides (default 1)")
    run_p.add_argument(
        "--memory", action="store_true",
        help="add the peak resident MiB each side's session adds (fresh processes; Linux)",
    )  # fmt: skip
    run_p.add_argument("--out", type=Path, default=None, help="keep the exported .onnx files in DIR")
    run_p.add_argument("--strict", action="store_true", help="exit 1 on a refusal or exporter failure too")
    run_p.add_argument(
        "--format", choices=("text", "markdown", "json"), default="text",
        help="text rows as they finish (default), a Markdown table, or JSON rows",
    )  # fmt: skip


def _list() -> int:
    from .zoo import MODELS

    print(f"{'model':<20} {'family':<13} {'input':<7} {'shapes':<28} description")
    for spec in MODELS.values():
        shapes = " ".join("x".join(map(str, s)) for s in spec.shapes)
        print(f"{spec.name:<20} {spec.family:<13} {spec.input_kind:<7} {shapes:<28} {spec.description}")
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from .zoo import MODELS, UnknownModelError, run_model
    from .zoo._builders import require_torch
    from .zoo._table import markdown_table, missing_ops_line, summary_line, text_header, text_row

    names = args.names or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"opstrata zoo: {UnknownModelError(unknown[0])}", file=sys.stderr)
        return EXIT_USAGE
    if args.threads < 1:
        print(f"opstrata zoo: --threads must be at least 1, got {args.threads}", file=sys.stderr)
        return EXIT_USAGE
    try:
        require_torch()
    except ImportError as exc:
        print(f"opstrata zoo: {exc}", file=sys.stderr)
        return EXIT_USAGE
    exporters = ("dynamo", "torchscript") if args.exporter == "both" else (args.exporter,)
    text = args.format == "text"
    if text:
        print(text_header(), flush=True)
    rows = []
    for name in names:
        for exporter in exporters:
            row = run_model(
                name, exporter, threads=args.threads, bench=args.bench, out_dir=args.out, memory=args.memory
            )
            rows.append(row)
            if text:
                print(text_row(row), flush=True)
    decode = _decode_rows(names, args.threads) if args.bench else []
    if args.format == "markdown":
        print(markdown_table(rows))
    elif args.format == "json":
        by_model = {d.model: d for d in decode}
        for r in rows:
            if r.model in by_model:
                r.decode = {**dataclasses.asdict(by_model[r.model]), "ratio": by_model[r.model].ratio}
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    if decode and args.format != "json":
        from .zoo._decode import decode_markdown, decode_text

        title = f"decode, per token on the paged KV cache vs torch eager with its KV cache ({args.threads} thread(s))"
        print(
            f"\n{title}:\n" + (decode_markdown(decode) if args.format == "markdown" else decode_text(decode))
        )
    bad = {"wrong", "crashed"} | ({"refused", "export-failed"} if args.strict else set())
    stream = sys.stdout if text else sys.stderr
    print(summary_line(rows), file=stream)
    ops_line = missing_ops_line(rows)
    if ops_line:
        print(ops_line, file=stream)
    wrong_decode = [d.model for d in decode if d.wrong]
    if wrong_decode:
        print(
            f"decode logits disagree with torch (or were not compared): {', '.join(wrong_decode)}",
            file=stream,
        )
    return EXIT_FAILED if any(r.status in bad for r in rows) or wrong_decode else EXIT_OK


def _decode_rows(names: list[str], threads: int) -> list[Any]:
    """The decode benchmark of each decoder among `names`; a failure is a row with the reason, not a crash."""
    from .zoo._decode import DECODERS, DecodeResult, decode_bench

    rows = []
    for name in (n for n in names if n in DECODERS):
        try:
            rows.append(decode_bench(name, threads=threads))
        except Exception as exc:
            rows.append(
                DecodeResult(name, threads, 0, 0, notes=[f"decode bench failed: {type(exc).__name__}: {exc}"])
            )
    return rows


def run(args: argparse.Namespace) -> int:
    """Run `opstrata zoo list|run`; returns the exit code."""
    if args.zoo_command == "list":
        return _list()
    if args.zoo_command == "run":
        return _run(args)
    print("opstrata zoo: expected a subcommand: list or run (try `opstrata zoo list`)", file=sys.stderr)
    return EXIT_USAGE
