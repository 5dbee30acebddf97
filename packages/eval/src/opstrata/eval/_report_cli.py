"""`opstrata report RESULTS... -o report.html`: one self-contained HTML file and markdown beside it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._report import KINDS, ReportError, build_report

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `opstrata report`."""
    parser.add_argument("results", nargs="+", type=Path, help=f"results files: {KINDS}")
    parser.add_argument(
        "-o", "--output", type=Path, default=Path("report.html"), help="HTML file (default report.html)"
    )
    parser.add_argument("--title", default="opstrata report", help="page title")


def run(args: argparse.Namespace) -> int:
    """Run `opstrata report`; 0 written, 2 bad input."""
    try:
        html, md = build_report(args.results, args.output, title=args.title)
    except ReportError as exc:
        print(f"opstrata report: error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {html} (markdown: {md})")
    return 0
