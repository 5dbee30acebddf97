"""ONNX backend node tests through InferenceSession: collect, run, classify, tabulate (docs/onnx-backend.md).

The cases come from the installed onnx package's backend test generators
(``onnx.backend.test.case.node``: the same models and reference outputs as the shipped
``test/data/node`` directories): the whole suite, every op that has a node test. Cases with
float8/float6/float4/int4/int2 tensors are skipped (listed separately: outside opstrata's dtypes).
Each case runs as shipped (models older than opset 13 are converted by the importer); a case that
fails only because it feeds axes/shapes as run-time inputs is retried *adapted* (those inputs frozen
into initializers with the case's own values), so the report separates design limits from kernel
bugs. With ``versus_ort`` each case also runs in onnxruntime, as shipped, for the comparison column.
"""

from __future__ import annotations

import argparse
import functools
import itertools
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

__all__ = ["CaseResult", "collect_cases", "format_report", "main", "run_case", "run_cases", "suite_ops"]

#: Node inputs that opstrata needs as constants (axes, shapes, split sizes, range bounds, pads, scales, k).
_SHAPE_ARGS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Slice": (1, 2, 3, 4), "Squeeze": (1,), "Unsqueeze": (1,),
    "Split": (1,), "CumSum": (1,), "CumProd": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
    "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,), "Pad": (1, 3), "Tile": (1,), "Resize": (1, 2, 3), "Upsample": (1,),
    "TopK": (1,), "OneHot": (1,), "CenterCropPad": (1,), "Col2Im": (1, 2), "Trilu": (1,),
    "Dropout": (1, 2), "AffineGrid": (1,), "DFT": (1, 2), "STFT": (1, 3), "HannWindow": (0,),
    "HammingWindow": (0,), "BlackmanWindow": (0,), "MelWeightMatrix": (0, 1, 2, 3, 4),
}  # fmt: skip

#: Element types whose cases are skipped (not run, listed separately): 8-bit and smaller floats, 2-bit ints.
_SKIPPED_TYPES = re.compile(r"^(FLOAT8\w*|FLOAT6\w*|FLOAT4\w*|U?INT2)$")
SKIP_REASON = "float8/float6/float4/int2 tensors (outside opstrata's dtypes; not run)"
RANDOM_REASON = (
    "random outputs: run, and checked for shape, dtype and support (the reference's values come from "
    "another generator, so no runtime matches them elementwise)"
)

_REASONS: tuple[tuple[str, str], ...] = (  # (regex on the error text, short reason); first match wins
    (r"cannot convert opset (\d+) to \d+ at node '[^']*' \((\w+)\)", "opset {0} {1}: not convertible to 13"),
    (r"cannot convert opset (\d+) to (\d+)", "opset {0}: not convertible to {1}"),
    (r"opset (\d+) is outside the supported range", "opset {0} outside the supported range"),
    (
        r"imports no default-domain \(ai\.onnx\) opset",
        "non-default-domain op (the model imports no ai.onnx opset)",
    ),
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
    (r"\): (\w+ with \{[^}]*\}) is not supported", "{0}"),
    (r"\(\w+\): (only [^,.]+?)(?:, got|\.|$)", "{0}"),
    (r"\): ([^.]*?) is not supported", "{0}"),
    (r"\): ([^.]*?) are not supported", "{0}"),
    (r"argument '(\w+)' expected ([^,(]*)", "{0}: expected {1}"),
)


@dataclass(frozen=True)
class CaseResult:
    """One backend node test: ``status`` is pass | adapted | unsupported | wrong | crash | skipped."""

    name: str
    op: str
    status: str
    reason: str = ""  # short reason for anything but a pass as shipped
    detail: str = ""  # the full error or mismatch text
    ort: str = (
        ""  # for passes run with versus_ort: agree | differ: ... (onnxruntime's outputs vs the session's)
    )
    ort_status: str = ""  # with versus_ort: pass | fail | refused (onnxruntime, as shipped, vs the reference)


def _array(x: Any) -> Any:
    """A reference value as numpy: arrays for tensors; sequences stay lists and absent optionals None."""
    from onnx import TensorProto, numpy_helper

    if x is None:
        return None
    if isinstance(x, list):
        return [_array(v) for v in x]
    return np.asarray(numpy_helper.to_array(x) if isinstance(x, TensorProto) else x)


@functools.lru_cache(maxsize=1)
def _all_cases() -> tuple[Any, ...]:
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return tuple(node.collect_testcases(None))


@functools.lru_cache(maxsize=1)
def _op_of() -> dict[str, str]:
    """Case name -> the op it tests; ``*_expanded`` (the op's function body) belongs to its op."""
    cases = _all_cases()
    single = {c.name: c.model.graph.node[0].op_type for c in cases if len(c.model.graph.node) == 1}
    out = {}
    for c in cases:
        base = re.sub(r"_expanded(_ver\d+)?$", "", c.name)
        op = single.get(base) or (c.model.graph.node[0].op_type if len(c.model.graph.node) else None)
        if op:
            out[c.name] = op
    return out


def suite_ops() -> list[str]:
    """Every op type that has a backend node test in the installed onnx, sorted."""
    return sorted(set(_op_of().values()), key=str.lower)


def collect_cases(ops: Iterable[str] | None = None) -> list[tuple[str, Any]]:
    """``(op, TestCase)`` for every backend node test (and its function-expanded form) of ``ops``.

    ``ops=None`` is the whole suite. Generating runs all of onnx's case exporters once per process
    (about 10 s).
    """
    op_of = _op_of()
    wanted = None if ops is None else set(ops)
    return [
        (op_of[c.name], c)
        for c in _all_cases()
        if c.name in op_of and (wanted is None or op_of[c.name] in wanted)
    ]


def _type_elems(t: Any) -> Iterable[int]:
    """Element types inside a TypeProto (tensors, and tensors inside sequences/optionals/maps)."""
    kind = t.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        yield getattr(t, kind).elem_type
    elif kind in ("sequence_type", "optional_type"):
        yield from _type_elems(getattr(t, kind).elem_type)
    elif kind == "map_type":
        yield from _type_elems(t.map_type.value_type)


def _node_elems(nodes: Iterable[Any]) -> Iterable[int]:
    """Element types the nodes name: Cast-style ``to``/``output_dtype``/``dtype``, constant tensors, subgraphs."""
    for n in nodes:
        for a in n.attribute:
            if a.name in ("to", "output_dtype", "dtype") and a.type == a.INT:
                yield a.i
            if a.HasField("t"):
                yield a.t.data_type
            for sub in [a.g] if a.HasField("g") else a.graphs:
                yield from _graph_elems(sub)


def _graph_elems(g: Any) -> Iterable[int]:
    for v in (*g.input, *g.output, *g.value_info):
        yield from _type_elems(v.type)
    for t in g.initializer:
        yield t.data_type
    yield from _node_elems(g.node)


#: ONNX elem types held in ml_dtypes arrays. onnx < 1.19 hands a case's data of these types over in its
#: storage types (bfloat16 as uint16 bit patterns, int4/uint4 as int8/uint8 or float32 values).
_ML_ELEMS = {16: "bfloat16", 21: "uint4", 22: "int4"}


def _elem_type(values: Any, name: str) -> int:
    """The tensor elem type declared for ``name`` among graph inputs or outputs (0 when none)."""
    for v in values:
        if v.name == name and v.type.WhichOneof("value") == "tensor_type":
            return int(v.type.tensor_type.elem_type)
    return 0


def _declared(a: Any, elem: int) -> Any:
    """``a`` in the ml_dtypes type the model declares, when an older onnx gave it in a storage type."""
    name = _ML_ELEMS.get(elem)
    if name is None or not isinstance(a, np.ndarray):
        return a
    import ml_dtypes

    dtype = np.dtype(getattr(ml_dtypes, name))
    if a.dtype == dtype:
        return a
    if name == "bfloat16" and a.dtype == np.uint16:
        return a.view(dtype)  # the bit patterns
    return a.astype(dtype)  # int4/uint4 values held in a wider type: exact


def _skipped_dtype(case: Any) -> str:
    """The first float8/float6/float4/int4/int2 element type the case's model uses ('' when none)."""
    from onnx import TensorProto

    names = {v: k for k, v in TensorProto.DataType.items()}
    elems = itertools.chain(
        _graph_elems(case.model.graph), *(_node_elems(f.node) for f in case.model.functions)
    )
    return next((names[e].lower() for e in elems if _SKIPPED_TYPES.match(names.get(e, ""))), "")


#: Lowest rtol/atol per low-precision dtype: ONNX's expected outputs round an fp32 reference once, while a
#: kernel that accumulates in fp32 and rounds at its own points may land one ulp away (bf16: 2**-8 relative).
_ULP_FLOOR = {"bfloat16": 1e-2, "float16": 1e-3}


def _compare_one(g: Any, w: Any, rtol: float, atol: float) -> str:
    """'' when ``g`` matches ``w`` (None, a list of arrays, or an array: shape, dtype, values)."""
    if w is None or isinstance(w, list):
        if w is None:
            return "" if g is None else f"got {type(g).__name__}, expected None (an absent optional)"
        if not isinstance(g, list) or len(g) != len(w):
            return f"got {type(g).__name__}, expected a sequence of {len(w)}"
        return next((d for d in (_compare_one(a, b, rtol, atol) for a, b in zip(g, w, strict=True)) if d), "")
    g = np.asarray(g)
    if g.shape != w.shape or g.dtype != w.dtype:
        return f"got {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}"
    try:
        if w.dtype.kind in "biuOSU":
            np.testing.assert_array_equal(g, w)
        else:
            # the case's tolerance, never below ~1 ulp of the dtype
            floor = _ULP_FLOOR.get(w.dtype.name, 0.0)
            as_ = np.complex128 if w.dtype.kind == "c" else np.float64
            np.testing.assert_allclose(
                g.astype(as_), w.astype(as_), rtol=max(rtol, floor), atol=max(atol, floor)
            )
    except AssertionError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        return "; ".join(lines[1:4])
    return ""


def _compare(got: Sequence[Any], want: Sequence[Any], rtol: float, atol: float) -> str:
    """'' when every output matches (shape, dtype, then values within rtol/atol), else what differs."""
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        diff = _compare_one(g, w, rtol, atol)
        if diff:
            return f"output {i}: {diff}"
    return ""


def _reason(text: str) -> str:
    for pattern, fmt in _REASONS:
        m = re.search(pattern, text)
        if m:
            return fmt.format(*m.groups()).strip()
    return text.split(". Fix:")[0][:120]


def _adapt(model: Any, feeds: dict[str, Any]) -> tuple[Any, dict[str, Any]] | None:
    """The case with its shape-like run-time inputs frozen into initializers; None when there are none."""
    import onnx
    from onnx import numpy_helper

    frozen = {
        x
        for n in model.graph.node
        for i, x in enumerate(n.input)
        if i in _SHAPE_ARGS.get(n.op_type, ()) and isinstance(feeds.get(x), np.ndarray)
    }
    if not frozen:
        return None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [v for v in m.graph.input if v.name not in frozen]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.extend(numpy_helper.from_array(feeds[x], x) for x in sorted(frozen))
    return m, {k: v for k, v in feeds.items() if k not in frozen}


def _attempt(model: Any, feeds: dict[str, Any], want: list[Any], case: Any) -> tuple[str, str, list[Any]]:
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


def _ort_run(model: Any, feeds: dict[str, Any], want: list[Any]) -> list[Any] | None:
    """onnxruntime's outputs for the model as shipped; None when it refuses the model (or is not installed)."""
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            theirs = sess.run(None, feeds)
    except Exception:  # onnxruntime does not run this model: no comparison
        return None

    def like(t: Any, w: Any) -> Any:  # onnxruntime hands bfloat16 outputs back as their bit patterns
        if isinstance(t, list):
            return [
                like(a, b) for a, b in zip(t, w if isinstance(w, list) else [None] * len(t), strict=False)
            ]
        t = t if t is None else np.asarray(t)
        if t is not None and isinstance(w, np.ndarray) and t.dtype.kind == "u" and w.dtype.kind != "u":
            return t.view(w.dtype) if t.itemsize == w.itemsize else t
        return t

    return [like(t, w) for t, w in zip(theirs, [*want, *[None] * len(theirs)], strict=False)]


def _random_ops(model: Any) -> list[str]:
    """The nondeterministic ops (OpDef.nondeterministic: RandomNormal, Bernoulli, ...) in the model's graph."""
    import opstrata.graph as og

    types = {n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")}
    types |= {n.op_type for f in model.functions for n in f.node if n.domain in ("", "ai.onnx")}
    return sorted(t for t in types if (d := og.lookup_op(t)) is not None and d.nondeterministic)


def _random_check(got: Sequence[Any], want: Sequence[Any], ops: list[str]) -> str:
    """'' when every output has the reference's shape and dtype (and Bernoulli's only 0 and 1), else why not."""
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}"
        if "Bernoulli" in ops and not np.isin(g, (0, 1)).all():
            return f"output {i}: Bernoulli values other than 0 and 1"
    return ""


def run_case(op: str, case: Any, *, versus_ort: bool = False) -> CaseResult:
    """Run one collected case as shipped and, when it fails for run-time shape inputs, adapted.

    With ``versus_ort`` the case also runs in onnxruntime as shipped: ``ort_status`` says whether
    onnxruntime passes it, and for a pass here ``ort`` whether the two sessions' outputs agree.
    """
    dtype = _skipped_dtype(case)
    if dtype:
        return CaseResult(case.name, op, "skipped", SKIP_REASON, f"uses {dtype} tensors")
    inputs, outputs = case.data_sets[0]
    names = [v.name for v in case.model.graph.input]
    feeds = {n: _array(x) for n, x in zip(names, inputs, strict=False)}
    want = [_array(x) for x in outputs]
    feeds = {n: _declared(a, _elem_type(case.model.graph.input, n)) for n, a in feeds.items()}
    outs = [v.name for v in case.model.graph.output]
    want = [_declared(a, _elem_type(case.model.graph.output, n)) for a, n in zip(want, outs, strict=False)]
    theirs = _ort_run(case.model, feeds, want) if versus_ort else None
    ort_status = ""
    if versus_ort:
        ort_status = (
            "refused"
            if theirs is None
            else "fail"
            if _compare(theirs, want, case.rtol, case.atol)
            else "pass"
        )

    def agree(got: list[Any]) -> str:
        if theirs is None:
            return ""
        diff = _compare(got, theirs, case.rtol, case.atol)
        return f"differ: {diff}" if diff else "agree"

    status, detail, got = _attempt(case.model, feeds, want, case)
    random_ops = _random_ops(case.model) if status in ("pass", "wrong") else []
    if random_ops:  # values cannot match (a match is chance): the run, shapes, dtypes and support are checked
        bad = _random_check(got, want, random_ops)
        if bad:
            return CaseResult(case.name, op, "wrong", bad, bad, ort_status=ort_status)
        return CaseResult(
            case.name,
            op,
            "skipped",
            RANDOM_REASON,
            f"random ops {', '.join(random_ops)}",
            ort_status=ort_status,
        )
    if status == "pass":
        return CaseResult(case.name, op, "pass", ort=agree(got), ort_status=ort_status)
    if status == "unsupported" and (adapted := _adapt(case.model, feeds)) is not None:
        status2, detail2, got2 = _attempt(*adapted, want, case)
        if status2 == "pass":
            return CaseResult(case.name, op, "adapted", _reason(detail), detail, agree(got2), ort_status)
        if status2 != "unsupported":  # the adaptation exposed a wrong answer or crash: report that
            return CaseResult(case.name, op, status2, _reason(detail2), detail2, ort_status=ort_status)
        if _reason(detail2) != _reason(detail):  # adapted past the first limit, refused for another
            why = f"{_reason(detail2)} (adapted for {_reason(detail)})"
            return CaseResult(case.name, op, status, why, detail2, ort_status=ort_status)
    why = _reason(detail) if status == "unsupported" else detail
    return CaseResult(case.name, op, status, why, detail, ort_status=ort_status)


def run_cases(ops: Iterable[str] | None = None, *, versus_ort: bool = False) -> list[CaseResult]:
    """Every backend node test of ``ops`` (None: the whole suite), run through InferenceSession.

    With ``versus_ort`` each case also runs in onnxruntime (see run_case).
    """
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


def _pct(n: int, total: int) -> str:
    return f"{n} ({100 * n / max(total, 1):.0f}%)"


def format_report(results: Sequence[CaseResult], ops: Sequence[str] | None = None) -> str:
    """Markdown: per op, cases, passed as shipped / adapted, onnxruntime's passes, agreement, why the rest
    fail; a total line (opstrata vs onnxruntime passes, wrong answers); then the skipped cases per op."""
    by_op: dict[str, list[CaseResult]] = {op: [] for op in ops or ()}
    skipped: dict[str, list[CaseResult]] = {}
    for r in results:
        (skipped.setdefault(r.op, []) if r.status == "skipped" else by_op.setdefault(r.op, [])).append(r)
    for op in skipped:  # an op whose every case is skipped still gets a row
        by_op.setdefault(op, [])
    if ops is None:
        by_op = {op: by_op[op] for op in sorted(by_op, key=str.lower)}
    ran_ort = any(r.ort_status for r in results)
    rows = [
        "| op | cases | pass as shipped | pass adapted | onnxruntime passes | = onnxruntime "
        "| other failures (count: reason) |",
        "|---|---:|---:|---:|---:|---:|---|",
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
            why = (
                f"all {len(skipped[op])} skipped (see below)"
                if op in skipped
                else "no backend node test in the installed onnx"
            )
        ort_pass = sum(r.ort_status == "pass" for r in rs)
        tot["ort_pass"] += ort_pass
        tot["both"] += sum(r.ort_status == "pass" and r.status in ("pass", "adapted") for r in rs)
        agree = sum(r.ort == "agree" for r in rs)
        tot["agree"] += agree
        checked = sum(r.ort == "agree" or r.ort.startswith("differ") for r in rs)
        tot["checked"] += checked
        versus = f"{agree}/{checked}" if checked else "-"
        theirs = str(ort_pass) if ran_ort and rs else "-"
        rows.append(
            f"| {op} | {len(rs)} | {c['pass']} | {c['pass'] + c['adapted']} | {theirs} | {versus} | {why} |"
        )
    n, ours = tot["cases"], tot["pass"] + tot["adapted"]
    versus_all = f"{tot['agree']}/{tot['checked']}" if tot["checked"] else "-"
    rows.append(
        f"| **all ({len(by_op)} ops)** | {n} | {_pct(tot['pass'], n)} | {_pct(ours, n)} | "
        f"{_pct(tot['ort_pass'], n) if ran_ort else '-'} | {versus_all} | "
        f"wrong answers: {tot['wrong']}, crashes: {tot['crash']} |"
    )
    total = f"**Total**: opstrata passes {_pct(ours, n)} of {n} cases ({tot['pass']} as shipped, {tot['adapted']} adapted)"
    if ran_ort:
        total += (
            f"; onnxruntime passes {_pct(tot['ort_pass'], n)} on the same run ({tot['both']} pass in both, "
            f"{tot['ort_pass'] - tot['both']} only in onnxruntime, {ours - tot['both']} only in opstrata)"
        )
    total += f"; wrong answers: {tot['wrong']} (must be 0); crashes: {tot['crash']} (must be 0)."
    out = [*rows, "", total]
    if skipped:
        by_reason: dict[str, dict[str, list[CaseResult]]] = {}
        for op, rs in skipped.items():
            for r in rs:
                by_reason.setdefault(r.reason, {}).setdefault(op, []).append(r)
        for reason in sorted(by_reason, key=lambda x: x != SKIP_REASON):
            groups = by_reason[reason]
            dtype_column = reason == SKIP_REASON
            out += [
                "",
                f"**Skipped** ({sum(len(v) for v in groups.values())} cases): {reason}.",
                "",
                f"| op | skipped cases | {'dtypes' if dtype_column else 'ops'} |",
                "|---|---:|---|",
            ]
            for op in sorted(groups, key=str.lower):
                rs = groups[op]
                what = sorted({r.detail.removeprefix("uses ").removesuffix(" tensors") for r in rs})
                if not dtype_column:
                    what = sorted({o for r in rs for o in r.detail.removeprefix("random ops ").split(", ")})
                out.append(f"| {op} | {len(rs)} | {', '.join(what)} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Print (or splice into a Markdown file between marker comments) the per-op pass-rate table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", type=Path, help="Markdown file whose <!-- table --> section to replace")
    p.add_argument("--expected", type=Path, help="write the list of passing cases (one name a line) here")
    p.add_argument("--ops", nargs="*", default=None, help="op types to run (default: every op in the suite)")
    p.add_argument("--versus-ort", action="store_true", help="also run each case in onnxruntime")
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
    bad = [r for r in results if r.status in ("wrong", "crash")]
    for r in bad:
        print(f"{r.status.upper()} {r.name} ({r.op}): {r.detail[:300]}", file=sys.stderr)
    for r in results:  # both pass the reference yet differ from each other: report, do not fail
        if r.ort.startswith("differ"):
            print(f"NOTE {r.name} ({r.op}) vs onnxruntime: {r.ort[:300]}", file=sys.stderr)
    return 1 if bad else 0


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


if __name__ == "__main__":
    raise SystemExit(main())
