"""`opstrata diff model.onnx --against PEER`: the layer diff (and `--drift`) from the command line.

Exit codes: 0 every node output within tolerance (always 0 with --drift, which only measures),
1 a node output out of tolerance or a kernel failed, 2 bad input (one line naming it and the fix).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import opstrata.runtime as rt

from ._diff import diff_model
from ._diff_format import FORMATS, render_diff, render_drift
from ._diff_inputs import DiffError
from ._diff_sides import AGAINST
from ._drift import DRIFT_DTYPES, drift_model, plot_drift
from ._run import RunError, load_feeds

__all__ = ["add_arguments", "run"]

EXIT_DIVERGED, EXIT_BAD_INPUT = 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `opstrata diff`."""
    parser.add_argument("model", type=Path, help="the .onnx model (the expected side for OTHER.onnx)")
    parser.add_argument(
        "--against", default=None, metavar="PEER",
        help=f"{'|'.join(AGAINST)}|OTHER.onnx (default onnxruntime; bfloat16 with --drift)",
    )  # fmt: skip
    parser.add_argument(
        "--inputs", "--input", action="append", default=[], metavar="FEEDS.npz|NAME=FILE",
        help="feeds: an .npz whose keys are input names, or NAME=FILE.npy; inputs not given are random",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument(
        "--dim", action="append", default=[], metavar="NAME=VALUE",
        help="value of a symbolic dim for random inputs (default 1); repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--drift", action="store_true",
        help="the model in bfloat16/float16 (--against) against float64: error growth per node",
    )  # fmt: skip
    parser.add_argument(
        "--fused", action="store_true",
        help="run the actual side's optimised graph as the session does (fusions kept; fused-away values "
        "are not compared); default: every value exposed, which keeps most fusions from happening",
    )  # fmt: skip
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format (default text)")
    parser.add_argument("--rtol", type=float, help="relative tolerance for every tensor (with --atol)")
    parser.add_argument("--atol", type=float, help="absolute tolerance for every tensor (with --rtol)")
    parser.add_argument("--device", default="cpu", help="opstrata device of the actual side (default cpu)")
    parser.add_argument("--level", type=int, default=3, choices=range(4), help="optimisation level 0-3")
    parser.add_argument("--output", "-o", type=Path, help="also write the report to this file")
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.svg|FILE.png",
        help="with --drift: the error per node as SVG (or PNG: matplotlib)",
    )


def _dims(specs: list[str]) -> dict[str, int]:
    dims = {}
    for text in specs:
        name, sep, value = text.partition("=")
        if not sep or not name or not value.strip().isdigit():
            raise DiffError(f"--dim expects NAME=VALUE with a non-negative integer VALUE, got {text!r}")
        dims[name] = int(value)
    return dims


def _feeds(specs: list[str]) -> dict[str, object] | None:
    if not specs:
        return None
    for spec in specs:
        path = Path(spec.partition("=")[2] or spec)
        if not path.is_file():
            raise DiffError(
                f"--inputs: no such file '{path}'; pass an .npz keyed by input name, or NAME=FILE.npy"
            )
    try:
        loaded = load_feeds(specs)
    except RunError as exc:
        raise DiffError(f"--inputs: {exc}") from None
    return {k: arr for k, (arr, _) in loaded.items()}


def _execute(args: argparse.Namespace) -> int:
    import opstrata.ops as ops

    if args.device not in ops.list_devices():
        raise DiffError(
            f"--device: unknown device {args.device!r}; registered devices are {ops.list_devices()}"
        )
    if (args.rtol is None) != (args.atol is None):
        raise DiffError("--rtol and --atol go together: pass both, or neither for the per-dtype defaults")
    if args.fused and args.drift:
        raise DiffError("--fused applies to the layer diff; --drift runs both copies unfused (drop one)")
    if args.plot is not None and not args.drift:
        raise DiffError("--plot draws the --drift table; add --drift (or drop --plot)")
    if args.plot is not None and args.plot.suffix.lower() not in (".svg", ".png"):
        raise DiffError(f"--plot {args.plot}: expected a .svg or .png file name")
    dims, feeds = _dims(args.dim), _feeds(args.inputs)
    common = dict(
        feeds=feeds, dims=dims, seed=args.seed, device=args.device, level=args.level,
        feeds_source=", ".join(args.inputs) or "feeds",
    )  # fmt: skip
    if args.drift:
        dtype = args.against or "bfloat16"
        if dtype not in DRIFT_DTYPES:
            raise DiffError(
                f"--drift compares a low-precision copy against float64, so --against must be one of "
                f"{', '.join(DRIFT_DTYPES)}, got {dtype!r}"
            )
        drift = drift_model(args.model, dtype, **common)  # type: ignore[arg-type]
        text, code = render_drift(drift, args.format), 0
    else:
        report = diff_model(
            args.model,
            args.against or "onnxruntime",
            rtol=args.rtol,
            atol=args.atol,
            fused=args.fused,
            **common,  # type: ignore[arg-type]
        )
        text, code = render_diff(report, args.format), (0 if report.ok else EXIT_DIVERGED)
    sys.stdout.write(text)
    if args.output is not None:
        try:
            args.output.write_text(text)
        except OSError as exc:
            raise DiffError(f"--output: cannot write '{args.output}': {exc.strerror or exc}") from None
    if args.plot is not None:
        print(f"plot: {plot_drift(drift, args.plot)}")
    return code


def run(args: argparse.Namespace) -> int:
    """Run `opstrata diff`; see the module docstring for the exit codes."""
    try:
        return _execute(args)
    except DiffError as exc:
        print(f"opstrata diff: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except rt.ExecutionError as exc:
        print(f"opstrata diff: a kernel failed: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_DIVERGED
    except rt.RuntimeFailure as exc:
        print(f"opstrata diff: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
