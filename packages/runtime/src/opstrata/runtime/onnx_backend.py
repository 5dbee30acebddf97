"""ONNX backend node tests through InferenceSession: collect, run, classify, tabulate (docs/onnx-backend.md).

The cases come from the installed onnx package's backend test generators
(``onnx.backend.test.case.node``: the same models and reference outputs as the shipped
``test/data/node`` directories). Each case runs as shipped; a case that fails only because its
opset is older than opstrata's minimum or because it feeds axes/shapes as run-time inputs is
retried *adapted* (``onnx.version_converter`` to opset 13; shape-like inputs frozen into
initializers with the case's own values), so the report separates design limits from kernel bugs.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import RuntimeFailure
from ._session import InferenceSession

MIN_OPSET = 13  # opstrata.graph imports opsets 13 .. newest

__all__ = ["OPS", "CaseResult", "collect_cases", "format_report", "main", "run_case", "run_cases"]

#: The ops the graph issue lists (elementwise, comparison, NN, shape ops), by family, in report order.
OPS: tuple[str, ...] = (
    # elementwise and comparison
    "Add", "Sub", "Mul", "Div", "Pow", "Neg", "Abs", "Reciprocal", "Sqrt", "Exp", "Log", "Max", "Min",
    "Sum", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not",
    "Erf", "Gelu", "Tanh", "Sigmoid", "Relu", "Clip", "Where", "ArgMax",
    # linear algebra and NN
    "Gemm", "MatMul", "Einsum", "Conv", "AveragePool", "MaxPool", "GlobalAveragePool", "GlobalMaxPool",
    "LpPool", "BatchNormalization", "LayerNormalization", "RMSNormalization", "Softmax", "LogSoftmax",
    "Attention", "Dropout",
    # reductions
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "CumSum",
    # shape and data movement
    "Shape", "Size", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Split",
    "Slice", "Gather", "Expand", "Range", "ConstantOfShape", "Trilu", "Cast", "Constant", "Identity",
)  # fmt: skip

#: Node inputs that opstrata needs as constants (axes, shapes, split sizes, range bounds).
_SHAPE_ARGS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Slice": (1, 2, 3, 4), "Squeeze": (1,), "Unsqueeze": (1,),
    "Split": (1,), "CumSum": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2), "ReduceSum": (1,),
    "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,), "ReduceL1": (1,),
    "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,),
}  # fmt: skip

_REASONS: tuple[tuple[str, str], ...] = (  # (regex on the error text, short reason); first match wins
    (r"opset (\d+) is outside the supported range", "opset {0} < 13"),
    (r"with (\w+) computed at run time", "{0} given as a run-time input"),
    (r"needs a concrete dtype and shape to be planned", "output shape depends on input values"),
    (r"no opstrata\.ops kernel '(\w+)' for device '\w+' and dtype (\w+)", "no {0} kernel for {1}"),
    (r"dtype (\w+) is not supported by opstrata", "dtype {0} not supported"),
    (r"op type '(\w+)' \(domain '[\w.]*', opset \d+\) is not supported", "uses op {0} (not imported)"),
    (r"tensor element type (\w+) is not supported", "{0} tensors not supported"),
    (r"has type '(\w+)_type'; only tensors", "{0} inputs not supported"),
    (r"type mismatch: input '\w+' must be (a [\w ]+), got (\w+)", "input must be {0}, got {1}"),
    (r"argument 'padding' expected at most half", "padding > half the kernel (ops kernel limit)"),
    (r"Einsum equation '[^']*' uses an (\w+)", "equation with an {0}"),
    (r"\): ([^.]*?) is not supported", "{0}"),
    (r"\): ([^.]*?) are not supported", "{0}"),
    (r"argument '(\w+)' expected ([^,(]*)", "{0}: expected {1}"),
)


@dataclass(frozen=True)
class CaseResult:
    """One backend node test: ``status`` is pass | adapted | unsupported | wrong | crash."""

    name: str
    op: str
    status: str
    reason: str = ""  # short reason for anything but a pass as shipped
    detail: str = ""  # the full error or mismatch text
    ort: str = ""  # for passes run with versus_ort: agree | differ: ... | refused (onnxruntime cannot run it)


def _array(x: Any) -> np.ndarray:
    from onnx import TensorProto, numpy_helper

    return np.asarray(numpy_helper.to_array(x) if isinstance(x, TensorProto) else x)


def collect_cases(ops: Iterable[str] = OPS) -> list[tuple[str, Any]]:
    """``(op, TestCase)`` for every backend node test (and its function-expanded form) of ``ops``.

    Generating runs all of onnx's case exporters once per process (about 10 s).
    """
    wanted = set(ops)
    cases = _all_cases()
    op_of = {c.name: c.model.graph.node[0].op_type for c in cases if len(c.model.graph.node) == 1}
    out = []
    for c in cases:
        op = op_of.get(re.sub(r"_expanded(_ver\d+)?$", "", c.name))
        if op in wanted:
            out.append((op, c))
    return out


@functools.lru_cache(maxsize=1)
def _all_cases() -> tuple[Any, ...]:
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return tuple(node.collect_testcases(None))


#: Lowest rtol/atol per low-precision dtype: ONNX's expected outputs round an fp32 reference once, while a
#: kernel that accumulates in fp32 and rounds at its own points may land one ulp away (bf16: 2**-8 relative).
_ULP_FLOOR = {"bfloat16": 1e-2, "float16": 1e-3}


def _compare(got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float, atol: float) -> str:
    """'' when every output matches (shape, dtype, then values within rtol/atol), else what differs."""
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: got {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}"
        try:
            if w.dtype.kind in "biu":
                np.testing.assert_array_equal(g, w)
            else:
                # the case's tolerance, never below ~1 ulp of the dtype
                floor = _ULP_FLOOR.get(w.dtype.name, 0.0)
                np.testing.assert_allclose(
                    g.astype(np.float64), w.astype(np.float64), rtol=max(rtol, floor), atol=max(atol, floor)
                )
        except AssertionError as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            return f"output {i}: " + "; ".join(lines[1:4])
    return ""


def _reason(text: str) -> str:
    for pattern, fmt in _REASONS:
        m = re.search(pattern, text)
        if m:
            return fmt.format(*m.groups()).strip()
    return text.split(". Fix:")[0][:120]


def _adapt(model: Any, feeds: dict[str, np.ndarray]) -> tuple[Any, dict[str, np.ndarray]] | None:
    """The case with its opset raised to 13 and shape-like inputs frozen; None when nothing changes."""
    import onnx
    from onnx import numpy_helper, version_converter

    m = onnx.ModelProto()
    m.CopyFrom(model)
    changed = False
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), MIN_OPSET)
    if opset < MIN_OPSET:
        try:
            m = version_converter.convert_version(m, MIN_OPSET)
        except Exception:  # the converter has no adapter for this op: stays unsupported
            return None
        changed = True
    frozen = {
        x
        for n in m.graph.node
        for i, x in enumerate(n.input)
        if i in _SHAPE_ARGS.get(n.op_type, ()) and x in feeds
    }
    if frozen:
        keep = [v for v in m.graph.input if v.name not in frozen]
        del m.graph.input[:]
        m.graph.input.extend(keep)
        m.graph.initializer.extend(numpy_helper.from_array(feeds[x], x) for x in sorted(frozen))
        changed = True
    return (m, {k: v for k, v in feeds.items() if k not in frozen}) if changed else None


def _attempt(
    model: Any, feeds: dict[str, np.ndarray], want: list[np.ndarray], case: Any
) -> tuple[str, str, list[np.ndarray]]:
    """(status, detail, outputs) of one session run: pass | wrong | unsupported | crash."""
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            got = InferenceSession(model).run(None, feeds)
    except RuntimeFailure as exc:  # a clear, named error: unsupported op, dtype, attribute, or kernel refusal
        return "unsupported", str(exc), []
    except Exception as exc:  # anything else is a bug: the session must raise RuntimeFailure
        return "crash", f"{type(exc).__name__}: {exc}", []
    diff = _compare(got, want, case.rtol, case.atol)
    return ("wrong", diff, got) if diff else ("pass", "", got)


def _versus_ort(model: Any, feeds: dict[str, np.ndarray], got: list[np.ndarray], case: Any) -> str:
    """'agree' when onnxruntime's outputs match the session's, 'differ: ...', or 'refused' by onnxruntime."""
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        theirs = [np.asarray(o) for o in sess.run(None, feeds)]
    except Exception:  # onnxruntime does not run this model (or is not installed): no comparison
        return "refused"
    theirs = [  # onnxruntime hands float8/bfloat16 outputs back as their unsigned bit patterns
        t.view(g.dtype) if t.dtype.kind == "u" and g.dtype.kind != "u" and t.itemsize == g.itemsize else t
        for t, g in zip(theirs, got, strict=False)
    ]
    diff = _compare(got, theirs, case.rtol, case.atol)
    return f"differ: {diff}" if diff else "agree"


def run_case(op: str, case: Any, *, versus_ort: bool = False) -> CaseResult:
    """Run one collected case as shipped and, when it fails for a design limit, adapted.

    With ``versus_ort`` a passing case is also run in onnxruntime and the two sessions' outputs compared.
    """
    inputs, outputs = case.data_sets[0]
    names = [v.name for v in case.model.graph.input]
    feeds = {n: _array(x) for n, x in zip(names, inputs, strict=False)}
    want = [_array(x) for x in outputs]
    status, detail, got = _attempt(case.model, feeds, want, case)
    if status == "pass":
        ort = _versus_ort(case.model, feeds, got, case) if versus_ort else ""
        return CaseResult(case.name, op, "pass", ort=ort)
    if status == "unsupported" and (adapted := _adapt(case.model, feeds)) is not None:
        status2, detail2, got2 = _attempt(*adapted, want, case)
        if status2 == "pass":
            ort = _versus_ort(*adapted, got2, case) if versus_ort else ""
            return CaseResult(case.name, op, "adapted", _reason(detail), detail, ort)
        if status2 != "unsupported":  # the adaptation exposed a wrong answer or crash: report that
            return CaseResult(case.name, op, status2, _reason(detail2), detail2)
        if _reason(detail2) != _reason(detail):  # adapted past the first limit, refused for another
            return CaseResult(
                case.name, op, status, f"{_reason(detail2)} (adapted for {_reason(detail)})", detail2
            )
    return CaseResult(case.name, op, status, _reason(detail) if status == "unsupported" else detail, detail)


def run_cases(ops: Iterable[str] = OPS, *, versus_ort: bool = False) -> list[CaseResult]:
    """Every backend node test of ``ops``, run through InferenceSession (and onnxruntime with ``versus_ort``)."""
    return [run_case(op, case, versus_ort=versus_ort) for op, case in collect_cases(ops)]


_DTYPE = re.compile(r"\b(u?int\d+|float\d+\w*|bfloat16|bool)\b")


def _merge(reasons: Counter[str]) -> str:
    """'3: no add kernel for int16/uint16/uint32' — reasons differing only in a dtype share one entry."""
    groups: dict[str, tuple[int, list[str]]] = {}
    for text, n in reasons.most_common():
        dts = _DTYPE.findall(text)
        key = _DTYPE.sub("{}", text, count=1) if len(dts) == 1 else text.replace("{", "(").replace("}", ")")
        total, names = groups.get(key, (0, []))
        groups[key] = (total + n, names + dts[:1] if len(dts) == 1 else names)
    return "; ".join(
        f"{n}: {key.format('/'.join(dict.fromkeys(names))) if names else key}"
        for key, (n, names) in sorted(groups.items(), key=lambda kv: -kv[1][0])
    )


def format_report(results: Sequence[CaseResult], ops: Sequence[str] = OPS) -> str:
    """Markdown table: per op, cases, passed as shipped, passed adapted, and why the rest fail."""
    by_op: dict[str, list[CaseResult]] = {op: [] for op in ops}
    for r in results:
        by_op.setdefault(r.op, []).append(r)
    rows = [
        "| op | cases | pass as shipped | pass adapted | = onnxruntime | other failures (count: reason) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    tot = Counter[str]()
    for op, rs in by_op.items():
        c = Counter(r.status for r in rs)
        tot.update(c)
        tot["cases"] += len(rs)
        reasons = Counter(
            f"{r.status}: {r.reason}" if r.status in ("wrong", "crash") else r.reason
            for r in rs
            if r.status not in ("pass", "adapted")
        )
        adapted = Counter(r.reason for r in rs if r.status == "adapted")
        why = _merge(reasons)
        if adapted:
            why = (
                (why + "; " if why else "")
                + "adapted for "
                + ", ".join(f"{t} ({n})" for t, n in adapted.most_common())
            )
        if not rs:
            why = "no backend node test in the installed onnx"
        agree = sum(r.ort == "agree" for r in rs)
        tot["agree"] += agree
        checked = sum(r.ort == "agree" or r.ort.startswith("differ") for r in rs)
        tot["checked"] += checked
        versus = f"{agree}/{checked}" if checked else "-"
        rows.append(f"| {op} | {len(rs)} | {c['pass']} | {c['pass'] + c['adapted']} | {versus} | {why} |")
    n = max(tot["cases"], 1)
    versus_all = f"{tot['agree']}/{tot['checked']}" if tot["checked"] else "-"
    rows.append(
        f"| **all** | {tot['cases']} | {tot['pass']} ({100 * tot['pass'] / n:.0f}%) | "
        f"{tot['pass'] + tot['adapted']} ({100 * (tot['pass'] + tot['adapted']) / n:.0f}%) | "
        f"{versus_all} | "
        f"wrong answers: {tot['wrong']}, crashes: {tot['crash']} |"
    )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Print (or splice into a Markdown file between marker comments) the per-op pass-rate table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", type=Path, help="Markdown file whose <!-- table --> section to replace")
    p.add_argument("--expected", type=Path, help="write the list of passing cases (one name a line) here")
    p.add_argument("--ops", nargs="*", default=list(OPS), help="op types to run (default: the graph issue's)")
    p.add_argument(
        "--versus-ort", action="store_true", help="also compare each pass with onnxruntime's outputs"
    )
    args = p.parse_args(argv)
    results = run_cases(args.ops, versus_ort=args.versus_ort)
    table = format_report(results, args.ops)
    if args.write:
        text = args.write.read_text(encoding="utf-8")
        start, end = "<!-- table -->", "<!-- /table -->"
        if start not in text or end not in text:
            print(f"{args.write}: no '{start}' ... '{end}' markers to replace", file=sys.stderr)
            return 2
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        _atomic_write(args.write, f"{head}{start}\n{table}\n{end}{tail}")
    else:
        print(table)
    if args.expected:
        names = sorted(f"{r.name} {r.status}" for r in results if r.status in ("pass", "adapted"))
        _atomic_write(args.expected, "\n".join(names) + "\n")
    bad = [r for r in results if r.status in ("wrong", "crash") or r.ort.startswith("differ")]
    for r in bad:
        print(f"{r.status.upper()} {r.name} ({r.op}): {(r.detail or r.ort)[:300]}", file=sys.stderr)
    return 1 if bad else 0


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


if __name__ == "__main__":
    raise SystemExit(main())
