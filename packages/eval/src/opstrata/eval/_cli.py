"""The `opstrata` command: argparse subcommands, each one small function pair registered in COMMANDS.

Adding a subcommand: write `add_arguments(parser)` and `run(args) -> exit code` in its own module and
append one `Command(...)` row to COMMANDS below.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import (
    _bench_cli,
    _conformance_cli,
    _demo,
    _diff_cli,
    _info,
    _quantize_cli,
    _report_cli,
    _run,
    _zoo_cli,
)

__all__ = ["COMMANDS", "Command", "build_parser", "main"]


@dataclass(frozen=True)
class Command:
    """One `opstrata <name>` subcommand."""

    name: str
    help: str  # one line, shown by `opstrata --help`
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]  # returns the process exit code


#: Every subcommand, in `--help` order.
COMMANDS: tuple[Command, ...] = (
    Command(
        "info",
        "installed opstrata versions and their ranges, versions.lock, Python/numpy/BLAS, cache directory",
        _info.add_arguments,
        _info.run,
    ),
    Command(
        "demo",
        "the end-to-end job on a GPT-style model built in code: export, compile, run, check, profile",
        _demo.add_arguments,
        _demo.run,
    ),
    Command(
        "run",
        "run a model file on .npy/.npz (or random) inputs: outputs summary, timings, Chrome trace, ORT check",
        _run.add_arguments,
        _run.run,
    ),
    Command(
        "zoo",
        "well-known models built in code (torchvision, transformers), exported by torch.onnx, checked here",
        _zoo_cli.add_arguments,
        _zoo_cli.run,
    ),
    Command(
        "diff",
        "layer diff: every node output against onnxruntime, ref, float64, bf16/fp16 or another model; --drift",
        _diff_cli.add_arguments,
        _diff_cli.run,
    ),
    Command(
        "conformance",
        "every registered op x dtype on a device against the ref device: native/fallback/missing/deviates",
        _conformance_cli.add_arguments,
        _conformance_cli.run,
    ),
    Command(
        "bench",
        "interleaved timings with the machine fingerprint; --save, --compare with a bootstrap regression gate",
        _bench_cli.add_arguments,
        _bench_cli.run,
    ),
    Command(
        "report",
        "one self-contained HTML report (and markdown) from diff, drift, bench, conformance results and traces",
        _report_cli.add_arguments,
        _report_cli.run,
    ),
    Command(
        "quantize",
        "quantize a model (w8a8, w8a8-dynamic, w8, w4-g128, fp8) on .npz data: per-node report, accuracy budget",
        _quantize_cli.add_arguments,
        _quantize_cli.run,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per COMMANDS row."""
    parser = argparse.ArgumentParser(
        prog="opstrata", description="opstrata: an open, auditable AI compute stack (ops → … → eval)."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_info.own_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(sub)
        sub.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `opstrata` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        names = ", ".join(c.name for c in COMMANDS)
        print(f"\nopstrata: expected a command ({names}), got none; try `opstrata info`", file=sys.stderr)
        return 2
    return int(args._run(args))
