"""run_model: build, export, then run one zoo model in opstrata, onnxruntime and torch, and compare."""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import opstrata.graph as og
import opstrata.ops as ops
from opstrata.runtime import InferenceSession, RuntimeFailure, SessionOptions

from ._bench import interleaved_medians
from ._builders import build, require_torch
from ._compare import TOLERANCE_ORT, TOLERANCE_TORCH, max_rel_error
from ._export import EXPORTERS, ExportError, example_input, export_model, short_reason
from ._memory import session_peak_mib
from ._result import ZooResult
from ._specs import ModelSpec, get_spec

__all__ = ["REFUSALS", "run_model"]

#: Exceptions by which opstrata declines a model with a named reason (node, op, fix): a refusal.
#: Anything else escaping the import, compile or run is a crash.
#: At run time the same errors are a refusal only when opstrata lacks something (_LACKS in the cause
#: chain) or onnxruntime cannot run the feeds either; a kernel failing on feeds onnxruntime runs is a crash.
REFUSALS: tuple[type[BaseException], ...] = (RuntimeFailure, og.GraphError, ops.OpError)
_LACKS: tuple[type[BaseException], ...] = (
    og.UnsupportedOpError, ops.NoKernelError, ops.UnknownOpError, ops.FallbackError,
)  # fmt: skip


def _refusal_text(exc: BaseException, fix_limit: int = 160) -> str:
    """`where: problem. Fix: fix` of an opstrata error; a long fix (a list of ops) stays in the detail."""
    where, problem, fix = (getattr(exc, k, None) for k in ("where", "problem", "fix"))
    if not (where and problem):
        return short_reason(exc)
    return f"{where}: {problem}" + (f". Fix: {fix}" if fix and len(fix) <= fix_limit else "")


def _refused_op(exc: BaseException | None) -> str | None:
    """The op type an UnsupportedOpError in `exc`'s cause chain names, if any."""
    while exc is not None:
        if isinstance(exc, og.UnsupportedOpError):
            return exc.op_type
        exc = exc.__cause__
    return None


def _session_options(threads: int) -> SessionOptions:
    """opstrata options at `threads` intra-op threads, where this runtime version has the option."""
    opts = SessionOptions()
    if "intra_op_num_threads" in {f.name for f in dataclasses.fields(SessionOptions)}:
        opts.intra_op_num_threads = threads  # type: ignore[attr-defined]
    return opts


#: How the zoo times a model against onnxruntime: turns of 5 back-to-back runs each, 50 ms apart, each
#: after 30 ms of untimed runs. onnxruntime's idle workers spin ~25 ms after a run; timed call by call in
#: turns, they held a core through opstrata's next run (ResNet-18 at two threads on two cores: 2.98 ->
#: 4.87 ms for opstrata, ratio 1.27 -> 2.29), while turning spinning off cost onnxruntime 1.5x on
#: SqueezeNet. After 50 ms idle the first 4-5 runs of either runtime are slow on this shared host (ResNet-18,
#: two threads: ours 2.1x, onnxruntime's 1.7x their steady latency; the weights left the caches), so one
#: untimed run did not reach the steady state the ratio is about.
BENCH_TURNS = {"repeats": 12, "block": 5, "settle_s": 0.05, "warm_s": 0.03, "budget_s": 8.0}


@contextlib.contextmanager
def _thread_cap(threads: int) -> Iterator[None]:
    """Cap numpy's BLAS pool (opstrata's host kernels) at `threads` while opstrata runs."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads, user_api="blas"):
        yield


def _ort_session(path: Path, threads: int) -> Any:
    """An onnxruntime CPU session at `threads` intra-op threads (ImportError when not installed), its pool
    spinning between runs as by default (its fastest setting on the small models: SqueezeNet at two
    threads 0.26 ms spinning, 0.40 ms not)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 4  # its failures are caught and reported in the row, not logged
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _graph_facts(path: Path, result: ZooResult) -> None:
    """Node count, opset and the op types opstrata.graph cannot import, read from the ONNX file."""
    import onnx

    model = onnx.load(str(path))
    result.nodes = len(model.graph.node)
    result.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    supported = set(og.supported_onnx_ops())
    types: set[str] = set()
    stack = [model.graph]
    while stack:  # subgraphs (If/Loop bodies) and local functions count too
        graph = stack.pop()
        for node in graph.node:
            if node.domain in ("", "ai.onnx"):
                types.add(node.op_type)
            stack.extend(a.g for a in node.attribute if a.HasField("g"))
            stack.extend(g for a in node.attribute for g in a.graphs)
    for fn in model.functions:
        types.update(n.op_type for n in fn.node if n.domain in ("", "ai.onnx"))
    result.unsupported_ops = sorted(types - supported)


def _fail(result: ZooResult, status: str, reason: str, detail: str | None = None) -> ZooResult:
    result.status, result.reason, result.detail = status, reason, detail or reason
    return result


def _worst(actual: list[np.ndarray], expected: list[np.ndarray]) -> float:
    """The largest max_rel_error over the shapes."""
    return max(max_rel_error(a, e) for a, e in zip(actual, expected, strict=True))


def run_model(
    name: str,
    exporter: str = "dynamo",
    shapes: Sequence[Sequence[int]] | None = None,
    threads: int = 1,
    bench: bool = False,
    out_dir: str | Path | None = None,
    memory: bool = False,
) -> ZooResult:
    """Export `name` with `exporter`, run it at each shape in opstrata, onnxruntime and torch; one row.

    Never silent: an exporter failure, a refusal by opstrata (RuntimeFailure / GraphError / OpError
    naming node and fix) or a crash becomes the row's status and reason. `bench` adds the median
    latency ratio opstrata/onnxruntime at the first shape, both at `threads` threads; `memory` the peak
    resident memory each side's session adds at that shape (measured in fresh processes). The exported
    file is kept in `out_dir` when given, else written to a temporary directory.
    """
    spec = get_spec(name)
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; use one of {', '.join(EXPORTERS)}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    require_torch()
    result = ZooResult(name, exporter, threads=threads)
    result.shapes = [tuple(int(d) for d in s) for s in (shapes or spec.shapes)]
    if out_dir is not None:
        _export_and_check(result, spec, Path(out_dir), bench, memory)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            _export_and_check(result, spec, Path(tmp), bench, memory)
    return result


def _export_and_check(
    result: ZooResult, spec: ModelSpec, out: Path, bench: bool, memory: bool = False
) -> None:
    """Build and export into `out`, then fill `result` from the three runtimes' outputs."""
    torch = require_torch()
    try:
        model = build(spec.builder)
    except Exception as exc:
        _fail(result, "export-failed", f"building the model: {short_reason(exc)}", str(exc))
        return
    try:
        path = export_model(spec.name, result.exporter, out, model=model)
    except ExportError as exc:
        _fail(result, "export-failed", f"{result.exporter} exporter: {exc.reason}", str(exc.__cause__))
        return
    _graph_facts(path, result)
    feeds = [example_input(spec, s, seed=i + 1).numpy() for i, s in enumerate(result.shapes)]
    with torch.no_grad():
        expected_torch = [model(torch.from_numpy(x)).numpy() for x in feeds]
    if any(np.ptp(t) == 0 for t in expected_torch):  # a constant output makes every comparison vacuous
        result.notes.append("torch's output is constant for an input: the comparison proves little")
    ort_sess, ort_outputs = _run_ort(result, spec, path, feeds)
    baked: list[tuple[tuple[int, ...], BaseException]] = []
    expected_ort: list[np.ndarray] | None = None
    if ort_outputs is not None:  # shapes onnxruntime cannot run: the exporter fixed a dynamic dimension
        baked = [
            (s, o) for s, o in zip(result.shapes, ort_outputs, strict=True) if isinstance(o, BaseException)
        ]
        keep = [i for i, o in enumerate(ort_outputs) if not isinstance(o, BaseException)]
        feeds, expected_torch = [feeds[i] for i in keep], [expected_torch[i] for i in keep]
        expected_ort = [ort_outputs[i] for i in keep]  # type: ignore[misc]
        if baked:
            _check_baked(result, spec, path, baked)
            if result.status != "ok":
                return
    if expected_ort is not None:
        result.ort_vs_torch = _worst(expected_ort, expected_torch)
    ran = _run_opstrata(result, spec, path, feeds, ort_ran=expected_ort is not None)
    if ran is None:
        return
    sess, actual = ran
    result.err_vs_torch = _worst(actual, expected_torch)
    if expected_ort is not None:
        result.err_vs_ort = _worst(actual, expected_ort)
        if result.err_vs_ort > TOLERANCE_ORT:
            _fail(result, "wrong", _wrong_text(actual, expected_ort, "onnxruntime", result.err_vs_ort))
            return
    elif result.err_vs_torch > TOLERANCE_TORCH:
        _fail(result, "wrong", _wrong_text(actual, expected_torch, "torch", result.err_vs_torch))
        return
    if baked:
        agreed = ", ".join(str(list(np.shape(x))) for x in feeds)
        shape, exc = baked[0]
        reason = (
            f"{result.exporter} exporter: the file runs only at some of its declared dynamic shapes: "
            f"onnxruntime and opstrata both fail at input {list(shape)} ({short_reason(exc, limit=160)}); "
            f"at {agreed} opstrata agrees with onnxruntime"
        )
        _fail(result, "export-failed", reason)
        return
    if bench and ort_sess is not None:
        feed = {spec.input_name: feeds[0]}
        with _thread_cap(result.threads):
            mine, theirs = interleaved_medians(
                lambda: sess.run(None, feed), lambda: ort_sess.run(None, feed), **BENCH_TURNS
            )
        result.latency_ratio = mine / theirs
    if memory:
        result.peak_mib = session_peak_mib("opstrata", path, feeds[0], spec.input_name, result.threads)
        result.ort_peak_mib = session_peak_mib("onnxruntime", path, feeds[0], spec.input_name, result.threads)


def _run_ort(
    result: ZooResult, spec: ModelSpec, path: Path, feeds: list[np.ndarray]
) -> tuple[Any, list[np.ndarray | BaseException] | None]:
    """onnxruntime's session and per-shape outputs (an exception where it failed at that shape).

    (None, None) with a note saying why when onnxruntime is absent, cannot load the file or runs none
    of the shapes.
    """
    try:
        t0 = time.perf_counter()
        sess = _ort_session(path, result.threads)
        result.ort_create_s = time.perf_counter() - t0
    except ImportError:
        result.notes.append("onnxruntime not installed: compared against torch only")
        return None, None
    except Exception as exc:  # the reference itself failed: say so, judge against torch
        result.notes.append(f"onnxruntime could not load the model: {short_reason(exc, limit=240)}")
        return None, None
    outputs: list[np.ndarray | BaseException] = []
    for x in feeds:
        try:
            outputs.append(sess.run(None, {spec.input_name: x})[0])
        except Exception as exc:
            outputs.append(exc)
    failures = [o for o in outputs if isinstance(o, BaseException)]
    if len(failures) == len(outputs):
        result.notes.append(f"onnxruntime could not run the model: {short_reason(failures[0], limit=240)}")
        return None, None
    return sess, outputs


def _run_opstrata(
    result: ZooResult, spec: ModelSpec, path: Path, feeds: list[np.ndarray], ort_ran: bool
) -> tuple[InferenceSession, list[np.ndarray]] | None:
    """opstrata's session and outputs (timing import and compile), or None with the refusal or crash."""
    with _thread_cap(result.threads):
        try:
            t0 = time.perf_counter()
            graph = og.from_onnx(str(path))
            t1 = time.perf_counter()
            opts = _session_options(result.threads)
            sess = InferenceSession(og.compile(graph, opts.graph_optimization_level, "cpu"), opts)
            result.import_s, result.compile_s = t1 - t0, time.perf_counter() - t1
        except REFUSALS as exc:
            _refuse(result, exc)
            return None
        except Exception as exc:
            _fail(result, "crashed", f"opstrata raised {short_reason(exc)}", str(exc))
            return None
        try:
            actual = [sess.run(None, {spec.input_name: x})[0] for x in feeds]
        except REFUSALS as exc:
            if ort_ran and not _declined(exc):  # valid feeds onnxruntime runs: a failing kernel is a bug
                reason = f"failed at run time on feeds onnxruntime runs: {_refusal_text(exc)}"
                _fail(result, "crashed", reason, str(exc))
            else:
                _refuse(result, exc)
            return None
        except Exception as exc:
            _fail(result, "crashed", f"opstrata raised {short_reason(exc)}", str(exc))
            return None
    result.fallbacks = len(sess.plan.fallbacks)
    return sess, actual


def _check_baked(
    result: ZooResult, spec: ModelSpec, path: Path, baked: list[tuple[tuple[int, ...], BaseException]]
) -> None:
    """At the shapes onnxruntime cannot run, opstrata must decline too; running them is a wrong row.

    A file that onnxruntime runs at the traced shape but not at another shape of its declared dynamic
    axes was broken by the exporter (e.g. the TorchScript exporter baking nn.MultiheadAttention's
    sequence length into a Reshape: pytorch/pytorch#117209), so failing there is agreement, not a refusal.
    """
    with _thread_cap(result.threads):
        try:
            sess = InferenceSession(og.from_onnx(str(path)), _session_options(result.threads))
        except REFUSALS as exc:
            _refuse(result, exc)
            return
        for shape, _ in baked:
            x = example_input(spec, shape, seed=0).numpy()
            try:
                out = sess.run(None, {spec.input_name: x})[0]
            except REFUSALS:
                continue
            except Exception as exc:
                _fail(result, "crashed", f"opstrata raised {short_reason(exc)}", str(exc))
                return
            reason = f"opstrata gives an output {list(np.shape(out))} at input {list(shape)}, where onnxruntime fails"
            _fail(result, "wrong", reason)
            return


def _declined(exc: BaseException | None) -> bool:
    """True when a run-time error comes from something opstrata lacks (no kernel, an unsupported op)."""
    while exc is not None:
        if isinstance(exc, _LACKS):
            return True
        exc = exc.__cause__
    return False


def _refuse(result: ZooResult, exc: BaseException) -> None:
    """Record a refusal, adding the op an UnsupportedOpError names to the row's unsupported ops."""
    _fail(result, "refused", _refusal_text(exc), str(exc))
    op = _refused_op(exc)
    if op and op not in result.unsupported_ops:
        result.unsupported_ops = sorted([*result.unsupported_ops, op])


def _wrong_text(actual: list[np.ndarray], expected: list[np.ndarray], peer: str, err: float) -> str:
    """Why a row is wrong: the error, the tolerance, and a shape mismatch when there is one."""
    for a, e in zip(actual, expected, strict=True):
        if np.shape(a) != np.shape(e):
            return f"output shape {list(np.shape(a))} but {peer} gives {list(np.shape(e))}"
    tol = TOLERANCE_ORT if peer == "onnxruntime" else TOLERANCE_TORCH
    return f"max relative error {err:.3g} against {peer} exceeds {tol:g}"
