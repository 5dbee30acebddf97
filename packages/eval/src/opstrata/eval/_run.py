"""`opstrata run`: run a model file in an InferenceSession on .npy/.npz (or random) feeds; outputs and timings.

Prints an outputs summary (name, shape, dtype, min/max/mean, first values) and timings (compile, first
run, steady-state median/p90); optionally saves outputs as .npy, writes a Chrome trace and the arena's
memory timeline, and compares with onnxruntime. Bad input (unknown or missing names, wrong shape or dtype, unreadable files, a
corrupt model) is one line on stderr naming the input, the expected and the actual, with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import opstrata.ops as ops
import opstrata.runtime as rt
from opstrata.graph.testing import random_feeds

from ._memory_timeline import memory_timeline
from ._report import _write

__all__ = ["RunError", "add_arguments", "load_feeds", "run", "summarize"]

EXIT_BAD_INPUT, EXIT_CHECK_FAILED = 2, 1

#: (rtol, atol) of the onnxruntime comparison, by output dtype name; exact for ints and bools.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9), "float32": (1e-4, 1e-5), "float16": (1e-2, 1e-3), "bfloat16": (2e-2, 1e-2),
}  # fmt: skip


class RunError(Exception):
    """A bad command line, feed file or model: printed as one line, exit code 2."""


@dataclass
class Timings:
    """Wall times in milliseconds: compile (load + compile), first run, then the steady-state runs."""

    compile_ms: float = 0.0
    first_ms: float = 0.0
    steady_ms: list[float] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"   compile    {self.compile_ms:10.3f} ms", f"   first run  {self.first_ms:10.3f} ms"]
        if self.steady_ms:
            s = np.asarray(self.steady_ms)
            out.append(
                f"   steady     {np.median(s):10.3f} ms median, {np.percentile(s, 90):.3f} ms p90, "
                f"{s.min():.3f} ms min over {s.size} runs"
            )
        return out


# --------------------------------------------------------------------------- arguments


def _pair(text: str, what: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise RunError(f"{what} expects NAME=VALUE, got {text!r}")
    return name, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `opstrata run`."""
    parser.add_argument("model", type=Path, help="an .onnx model or a saved opstrata plan")
    parser.add_argument(
        "--input", "-i", action="append", default=[], metavar="NAME=FILE",
        help="feed input NAME from FILE (.npy, or .npz holding NAME or one array); a bare FILE.npz feeds "
        "every input named by its keys; repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--random", action="store_true",
        help="generate the inputs not given by --input (floats standard normal, ints uniform in [0, 10))",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seed of --random (default 0)")
    parser.add_argument(
        "--dim", action="append", default=[], metavar="NAME=VALUE",
        help="value of a symbolic dim for --random (default 1); repeatable",
    )  # fmt: skip
    parser.add_argument("--level", type=int, default=3, choices=range(4), help="optimisation level 0-3")
    parser.add_argument(
        "--device", default="cpu", help=f"device to run on (registered: {ops.list_devices()})"
    )
    parser.add_argument(
        "--fallback", choices=("allow", "warn", "error"), default=None,
        help="fallback policy of the ops layer while compiling and running",
    )  # fmt: skip
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs after the first (default 1)")
    parser.add_argument("--repeat", type=int, default=10, help="timed steady-state runs (default 10)")
    parser.add_argument("--output-dir", type=Path, help="save each output as DIR/<name>.npy")
    parser.add_argument("--profile", type=Path, metavar="TRACE.json", help="write a Chrome trace of the runs")
    parser.add_argument(
        "--memory", type=Path, metavar="TIMELINE.json",
        help="write the arena's memory timeline (bytes live per node) for `opstrata report`",
    )  # fmt: skip
    parser.add_argument("--check-ort", action="store_true", help="compare the outputs with onnxruntime")
    parser.add_argument("--values", type=int, default=5, help="first values printed per output (default 5)")


# --------------------------------------------------------------------------- feeds


def _read_array(path: Path, name: str) -> np.ndarray | dict[str, np.ndarray]:
    """The array (.npy) or arrays (.npz) in ``path``; RunError naming the input and the file otherwise."""
    if not path.is_file():
        raise RunError(f"input '{name}': no such file '{path}'")
    try:
        data = np.load(path, allow_pickle=False)
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:
                return {k: data[k] for k in data.files}
        return np.asarray(data)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "pickle" in reason:  # numpy's guess for bytes that are no .npy header
            reason = "not a numeric .npy/.npz file (no .npy header; object arrays are refused)"
        raise RunError(f"input '{name}': cannot read '{path}' as .npy/.npz: {reason}") from None


def load_feeds(specs: Sequence[str]) -> dict[str, tuple[np.ndarray, str]]:
    """``{input name: (array, source)}`` from ``NAME=FILE`` / ``FILE.npz`` specs."""
    feeds: dict[str, tuple[np.ndarray, str]] = {}
    for spec in specs:
        if "=" not in spec and spec.endswith(".npz"):
            arrays = _read_array(Path(spec), "*")
            if not isinstance(arrays, dict):
                raise RunError(
                    f"--input {spec}: holds one unnamed array, not an .npz archive; use NAME={spec}"
                )
            for key, arr in arrays.items():
                if key in feeds:
                    raise RunError(f"input '{key}' is given twice ({feeds[key][1]} and {spec}[{key}])")
                feeds[key] = (arr, f"{spec}[{key}]")
            continue
        name, file = _pair(spec, "--input")
        got = _read_array(Path(file), name)
        if isinstance(got, dict):
            if name in got:
                got = got[name]
            elif len(got) == 1:
                got = next(iter(got.values()))
            else:
                raise RunError(
                    f"input '{name}': '{file}' holds arrays {sorted(got)}, none named '{name}'; "
                    f"use --input {name}=FILE.npy or name the array '{name}'"
                )
        if name in feeds:
            raise RunError(f"input '{name}' is given twice ({feeds[name][1]} and {file})")
        feeds[name] = (got, file)
    return feeds


def _spec(arg: rt.NodeArg) -> str:
    return f"{arg.dtype}[{', '.join(str(d) for d in arg.shape)}]"


def _check_feeds(sess: rt.InferenceSession, feeds: dict[str, tuple[np.ndarray, str]]) -> None:
    """Names, dtypes, ranks and static dims against the model's inputs, naming the file on a mismatch."""
    inputs = {a.name: a for a in sess.get_inputs()}
    described = ", ".join(f"{a.name}: {_spec(a)}" for a in inputs.values())
    for name, (arr, src) in feeds.items():
        a = inputs.get(name)
        if a is None:
            raise RunError(f"unknown input '{name}' (from {src}); the model's inputs are {described}")
        if a.dtype is not None and arr.dtype != a.dtype:
            raise RunError(
                f"input '{name}' (from {src}): expected dtype {a.dtype}, got {arr.dtype}; "
                f"re-save it with np.save(path, x.astype('{a.dtype}'))"
            )
        if arr.ndim != len(a.shape) or any(
            isinstance(d, int) and d != s for d, s in zip(a.shape, arr.shape, strict=False)
        ):
            raise RunError(f"input '{name}' (from {src}): expected shape {_spec(a)}, got {list(arr.shape)}")


def _complete_feeds(
    sess: rt.InferenceSession, feeds: dict[str, tuple[np.ndarray, str]], args: argparse.Namespace,
    say: Any,
) -> dict[str, np.ndarray]:  # fmt: skip
    """The given feeds plus, with --random, seeded random arrays for the inputs not given."""
    missing = [a for a in sess.get_inputs() if a.name not in feeds]
    if missing and not args.random:
        names = ", ".join(f"{a.name}: {_spec(a)}" for a in missing)
        raise RunError(f"missing input(s) {names}; pass --input NAME=FILE for each, or --random")
    out = {k: arr for k, (arr, _) in feeds.items()}
    dims = {k: int(v) for k, v in (_dim(d) for d in args.dim)}
    known = {d for a in sess.get_inputs() for d in a.shape if isinstance(d, str)}
    for name in sorted(set(dims) - known):
        say(f"   note: --dim {name} is not a symbolic dim of the model's inputs ({sorted(known) or 'none'})")
    if missing:
        bound = _bound_dims(sess, out)
        symbols = {d for a in missing for d in a.shape if isinstance(d, str)}
        defaults = sorted(s for s in symbols if s not in dims and s not in bound)
        if defaults:
            say(f"   symbolic dims {', '.join(f'{s}=1' for s in defaults)} (set with --dim NAME=VALUE)")
        values = {**{s: 1 for s in defaults}, **bound, **dims}
        rand = random_feeds(sess.graph, values, seed=args.seed)
        for a in missing:
            out[a.name] = rand[a.name]
            say(f"   {a.name}: random {rand[a.name].dtype}{list(rand[a.name].shape)} (seed {args.seed})")
    return {a.name: out[a.name] for a in sess.get_inputs()}


def _dim(text: str) -> tuple[str, int]:
    name, value = _pair(text, "--dim")
    try:
        n = int(value)
    except ValueError:
        raise RunError(f"--dim {name}: expected a non-negative integer, got {value!r}") from None
    if n < 0:
        raise RunError(f"--dim {name}: expected a non-negative integer, got {n}")
    return name, n


def _bound_dims(sess: rt.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, int]:
    """Symbolic dims already fixed by the fed arrays (so random inputs agree with them)."""
    bound: dict[str, int] = {}
    for a in sess.get_inputs():
        if a.name in feeds:
            for d, s in zip(a.shape, feeds[a.name].shape, strict=False):
                if isinstance(d, str):
                    bound.setdefault(d, int(s))
    return bound


# --------------------------------------------------------------------------- outputs


def summarize(name: str, arr: np.ndarray, values: int = 5) -> str:
    """One line: name, dtype[shape], min/max/mean over finite values, NaN/inf count, first values."""
    head = f"   {name}: {arr.dtype}{list(arr.shape)}"
    if arr.size == 0:
        return f"{head} (empty)"
    x = arr.astype(np.float64) if arr.dtype.kind != "b" else arr.astype(np.int64)
    finite = x[np.isfinite(x)]
    stats = (
        f"min {finite.min():.6g} max {finite.max():.6g} mean {finite.mean():.6g}"
        if finite.size
        else "no finite values"
    )
    bad = x.size - finite.size
    first = ", ".join(f"{v:.6g}" if arr.dtype.kind not in "biu" else str(int(v)) for v in x.ravel()[:values])
    more = ", ..." if arr.size > values else ""
    return f"{head}  {stats}{f'  ({bad} NaN/inf)' if bad else ''}  [{first}{more}]"


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "output"


def _save(path: Path, arr: np.ndarray) -> None:
    """np.save atomically (temp file + rename)."""
    ops.atomic_write(path, lambda f: np.save(f, arr, allow_pickle=False))


def _write_memory(sess: rt.InferenceSession, feeds: dict[str, np.ndarray], path: Path, say: Any) -> None:
    """The memory plan of these feeds' shapes as a timeline file; its headline on stdout."""
    shapes = {k: np.shape(v) for k, v in feeds.items()}
    plan = sess.plan.memory_for(shapes, dynamic=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, json.dumps(memory_timeline(plan, sess.plan.graph), indent=1))
    except OSError as exc:
        raise RunError(f"--memory: cannot write '{path}': {exc.strerror or exc}") from None
    say("== memory")
    say(f"   {plan.summary()}")
    say(f"   timeline: {path} (opstrata report {path} -o report.html)")


def _check_ort(
    model: Path, feeds: dict[str, np.ndarray], names: list[str], outs: list[np.ndarray], say: Any
) -> bool:
    """Compare with onnxruntime when it is installed and the model is ONNX; True when all agree."""
    try:
        import onnxruntime as ort
    except ImportError:
        say("   skipped: onnxruntime is not installed (pip install 'opstrata-eval[peers]')")
        return True
    if zipfile.is_zipfile(model):
        say("   skipped: the model is a saved opstrata plan, onnxruntime needs the .onnx file")
        return True
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
        want = sess.run(names, feeds)
    except Exception as exc:  # onnxruntime's own refusal: report it, it is not our answer
        say(f"   skipped: onnxruntime cannot run this model: {str(exc).splitlines()[0][:200]}")
        return True
    ok = True
    for name, got, w in zip(names, outs, want, strict=True):
        w = np.asarray(w)
        if got.shape != w.shape or got.dtype != w.dtype:
            ok = False
            say(
                f"   FAIL {name}: opstrata {got.dtype}{list(got.shape)}, onnxruntime {w.dtype}{list(w.shape)}"
            )
            continue
        rtol, atol = TOLERANCES.get(got.dtype.name, (0.0, 0.0))
        a, b = got.astype(np.float64), w.astype(np.float64)
        diff = float(np.max(np.abs(a - b), initial=0.0, where=np.isfinite(a) & np.isfinite(b)))
        same = bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))
        ok &= same
        say(f"   {'PASS' if same else 'FAIL'} {name}: max |diff| {diff:.3e} (rtol {rtol:g}, atol {atol:g})")
    return ok


# --------------------------------------------------------------------------- command


def _session(args: argparse.Namespace) -> rt.InferenceSession:
    opts = rt.SessionOptions(
        graph_optimization_level=args.level, enable_profiling=args.profile is not None,
        fallback_policy=args.fallback,
    )  # fmt: skip
    try:
        return rt.InferenceSession(args.model, opts, device=args.device)
    except rt.InvalidModel as exc:
        raise RunError(f"model '{args.model}' cannot be loaded: {_one_line(str(exc))}") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _execute(args: argparse.Namespace, say: Any) -> int:
    if args.repeat < 0 or args.warmup < 0:
        raise RunError(f"--repeat and --warmup must be >= 0, got {args.repeat} and {args.warmup}")
    for d in args.dim:
        _dim(d)
    if not args.model.is_file():
        raise RunError(f"model: no such file '{args.model}'")
    if args.device not in ops.list_devices():
        raise RunError(
            f"--device: unknown device {args.device!r}; registered devices are {ops.list_devices()}"
        )
    feeds_in = load_feeds(args.input)
    t = Timings()
    say(f"== load and compile {args.model} (level {args.level}, device {args.device})")
    t0 = time.perf_counter()
    sess = _session(args)
    t.compile_ms = (time.perf_counter() - t0) * 1e3
    say(f"   inputs  {', '.join(f'{a.name}: {_spec(a)}' for a in sess.get_inputs())}")
    say(f"   outputs {', '.join(f'{a.name}: {_spec(a)}' for a in sess.get_outputs())}")
    _check_feeds(sess, feeds_in)
    feeds = _complete_feeds(sess, feeds_in, args, say)
    names = [a.name for a in sess.get_outputs()]

    say("== run")
    t0 = time.perf_counter()
    try:
        outs = sess.run(None, feeds)
    except rt.InvalidArgument as exc:  # e.g. symbolic dims that disagree between inputs
        raise RunError(_one_line(str(exc))) from None
    t.first_ms = (time.perf_counter() - t0) * 1e3
    for _ in range(args.warmup):
        sess.run(None, feeds)
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        t.steady_ms.append((time.perf_counter() - t0) * 1e3)

    say("== outputs")
    for name, arr in zip(names, outs, strict=True):
        say(summarize(name, arr, args.values))
    say("== timings")
    for line in t.lines():
        say(line)

    if args.output_dir is not None:
        try:
            args.output_dir.mkdir(parents=True, exist_ok=True)
            for name, arr in zip(names, outs, strict=True):
                _save(args.output_dir / f"{_file_name(name)}.npy", arr)
        except OSError as exc:
            raise RunError(
                f"--output-dir: cannot write to '{args.output_dir}': {exc.strerror or exc}"
            ) from None
        say(f"== saved {len(outs)} output(s) to {args.output_dir}/")
    if args.profile is not None:
        try:
            path = sess.end_profiling(args.profile)
        except OSError as exc:
            raise RunError(f"--profile: cannot write '{args.profile}': {exc.strerror or exc}") from None
        say("== profile")
        say(sess.profile_summary(top=10))
        say(f"   Chrome trace: {path} (open in https://ui.perfetto.dev or chrome://tracing)")
    if args.memory is not None:
        _write_memory(sess, feeds, args.memory, say)
    if args.check_ort:
        say("== check against onnxruntime")
        if not _check_ort(args.model, feeds, names, outs, say):
            say("   outputs differ from onnxruntime")
            return EXIT_CHECK_FAILED
    return 0


def run(args: argparse.Namespace) -> int:
    """Run `opstrata run`; 0 ok, 1 outputs differ from onnxruntime or a kernel failed, 2 bad input."""
    say = print
    try:
        return _execute(args, say)
    except RunError as exc:
        print(f"opstrata run: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except rt.ExecutionError as exc:
        print(f"opstrata run: a kernel failed: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    except rt.RuntimeFailure as exc:  # options, memory limit: still one line, no traceback
        print(f"opstrata run: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
