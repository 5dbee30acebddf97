"""`opstrata quantize model.onnx --scheme w8a8 --calib data.npz`: opstrata.quant.quantize from the command line.

Calibration / evaluation data: .npz files whose arrays are keyed by model input name. An array of the
input's rank + 1 holds one batch per index of its leading axis (shape [batches, *input shape]); an array of
the input's rank is a set of samples along axis 0, cut into batches of --batch-size. Several files: their
batches in order. Every input of the model needs an array in each file, with the same number of batches.

Exit codes: 0 quantized (and the budget met), 1 the accuracy budget cannot be met, 2 bad input (one line
naming the problem and the fix).
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ._report import _write

__all__ = ["add_arguments", "run"]

EXIT_BUDGET, EXIT_BAD_INPUT = 1, 2
_SCHEMES = "w8a8|w8a8-dynamic|w8a8-dynamic-token|w8|w4|w4-g<N>|w8-g<N>|w4-g<N>-gptq|fp8"


class _BadInput(Exception):
    """A command-line input that cannot be used (the message names it and the fix)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `opstrata quantize`."""
    parser.add_argument("model", type=Path, help="the float .onnx model")
    parser.add_argument("--scheme", default="w8a8", help=f"{_SCHEMES} (default w8a8)")
    parser.add_argument(
        "--calib", action="append", default=[], type=Path, metavar="DATA.npz",
        help="calibration data: arrays keyed by input name, leading axis = batches (rank + 1) or samples "
        "(rank, cut by --batch-size); repeatable. Required by w8a8 and fp8, used to measure otherwise",
    )  # fmt: skip
    parser.add_argument(
        "--eval", action="append", default=[], type=Path, metavar="DATA.npz",
        help="measure on this data instead of the calibration data (same layout); repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--batch-size", type=int, default=None,
        help="samples per batch for arrays of the input's own rank (default: the input's fixed first dim, else 32)",
    )  # fmt: skip
    parser.add_argument(
        "-o", "--output", type=Path, help="quantized model path (default MODEL.<scheme>.onnx)"
    )
    parser.add_argument(
        "--budget", type=float, default=None, metavar="MIN_COSINE",
        help="minimum cosine of every output against float; the worst nodes go back to float until it holds",
    )  # fmt: skip
    parser.add_argument(
        "--exclude", action="append", default=[], metavar="NODE", help="keep this node in float; repeatable"
    )
    parser.add_argument(
        "--task", choices=("classifier", "lm"), default=None,
        help="classifier: top-1 agreement of each output; lm: perplexity delta (needs --labels or one int input)",
    )  # fmt: skip
    parser.add_argument(
        "--labels", default=None, metavar="INPUT", help="with --task lm: the input of token ids"
    )
    parser.add_argument("--report-json", type=Path, metavar="FILE.json", help="also write the report as JSON")
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help="stdout format (default text)"
    )


def _input_ranks(model: Path) -> dict[str, tuple[int | None, int | None]]:
    """``{input: (rank or None, fixed first dim or None)}`` of the inputs the caller feeds."""
    import onnx

    if not model.is_file():
        raise _BadInput(f"no such model file '{model}'; check the path")
    try:
        m = onnx.load(str(model), load_external_data=False)
    except Exception as exc:
        raise _BadInput(
            f"'{model}' is not a readable ONNX model ({str(exc).splitlines()[0]}); check the file"
        ) from None
    inits = {t.name for t in m.graph.initializer}
    out: dict[str, tuple[int | None, int | None]] = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            out[vi.name] = (None, None)
            continue
        dims = tt.shape.dim
        first = dims[0].dim_value if len(dims) and dims[0].HasField("dim_value") else None
        out[vi.name] = (len(dims), first or None)
    return out


def _read_npz(path: Path, flag: str) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise _BadInput(f"{flag} {path}: no such file; pass an .npz whose arrays are keyed by input name")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _BadInput(f"{flag} {path}: not a readable .npz ({reason}); write it with np.savez") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise _BadInput(f"{flag} {path}: holds one unnamed array; save an .npz keyed by input name "
                        "(np.savez(path, x=...))")  # fmt: skip
    with data:
        return {k: data[k] for k in data.files}


def _batches(
    files: list[Path], flag: str, ranks: dict[str, Any], batch_size: int | None
) -> list[dict[str, Any]]:
    """Feed dicts from the .npz files (see the module docstring for the layout)."""
    out: list[dict[str, Any]] = []
    for path in files:
        arrays = _read_npz(path, flag)
        missing = [n for n in ranks if n not in arrays]
        unknown = [k for k in arrays if k not in ranks]
        if missing or unknown:
            raise _BadInput(
                f"{flag} {path}: arrays {sorted(arrays)} do not match the model inputs {list(ranks)}"
                + (f" (missing {missing})" if missing else "") + (f" (not inputs: {unknown})" if unknown else "")
                + "; key each array by its input name"
            )  # fmt: skip
        per: dict[str, list[np.ndarray]] = {}
        for name, arr in arrays.items():
            rank, first = ranks[name]
            if rank is not None and arr.ndim == rank + 1:
                per[name] = list(arr)
            elif rank is None or arr.ndim == rank:
                size = batch_size or first or 32
                if arr.ndim == 0:
                    raise _BadInput(f"{flag} {path}[{name}]: a scalar; the model input has rank {rank}")
                per[name] = [arr[i : i + size] for i in range(0, len(arr), size)]
            else:
                raise _BadInput(
                    f"{flag} {path}[{name}]: shape {list(arr.shape)} has rank {arr.ndim}; the input has rank "
                    f"{rank}, so pass [batches, *input shape] (rank {rank + 1}) or [samples, ...] (rank {rank})"
                )  # fmt: skip
        counts = {n: len(v) for n, v in per.items()}
        if len(set(counts.values())) > 1:
            raise _BadInput(f"{flag} {path}: the inputs give different numbers of batches {counts}; "
                            "give every input the same leading axis")  # fmt: skip
        n = next(iter(counts.values()), 0)
        out.extend({k: v[i] for k, v in per.items()} for i in range(n))
    return out


def _execute(args: argparse.Namespace) -> int:
    import opstrata.quant as oq

    if args.batch_size is not None and args.batch_size < 1:
        raise _BadInput(f"--batch-size must be >= 1, got {args.batch_size}")
    ranks = _input_ranks(args.model)
    calib = _batches(args.calib, "--calib", ranks, args.batch_size) if args.calib else None
    ev = _batches(args.eval, "--eval", ranks, args.batch_size) if args.eval else None
    output = args.output or args.model.with_name(f"{args.model.stem}.{args.scheme}.onnx")
    if output.resolve() == args.model.resolve():
        raise _BadInput(f"-o {output}: is the input model; write the quantized model elsewhere")
    try:
        qm = oq.quantize(
            args.model, calib, args.scheme, args.budget, eval_data=ev, exclude=args.exclude, task=args.task,
            labels=args.labels,
        )  # fmt: skip
    except oq.AccuracyError as exc:
        if args.report_json is not None and exc.report is not None:
            _write(args.report_json, json.dumps(exc.report.to_dict(), indent=2))
        print(f"opstrata quantize: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_BUDGET
    qm.save(output)
    d = qm.report.to_dict()
    d["output"] = str(output)
    if args.report_json is not None:
        _write(args.report_json, json.dumps(d, indent=2))
    if args.format == "json":
        print(json.dumps(d, indent=2))
    else:
        print(qm.report)
        print(f"wrote {output}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run `opstrata quantize`; see the module docstring for the exit codes."""
    from opstrata.quant import QuantError

    try:
        return _execute(args)
    except (_BadInput, QuantError) as exc:
        print(f"opstrata quantize: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:  # an output directory that does not exist, a full disk
        print(f"opstrata quantize: error: {exc}; check the output paths", file=sys.stderr)
        return EXIT_BAD_INPUT
