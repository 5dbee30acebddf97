"""Render a DiffReport or DriftReport as a text table, a markdown table or JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from ._diff import DiffReport, TensorDiff
from ._drift import DriftReport

__all__ = ["FORMATS", "render_diff", "render_drift"]

FORMATS = ("text", "markdown", "json")


def _num(x: float, digits: int = 3) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return "0" if x == 0 else f"{x:.{digits}e}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], fmt: str) -> list[str]:
    if fmt == "markdown":
        out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        return out + ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    return [line.rstrip()] + [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]


def _cells(r: TensorDiff) -> list[str]:
    m = r.metrics
    shape = f"[{', '.join(map(str, m.shape))}]" if m is not None else "-"
    if m is None:
        return [str(r.index), r.node, r.op, r.name, shape, "-", "-", "-", "yes" if r.within else "NO", r.note]
    cos = "nan" if math.isnan(m.cosine) else f"{m.cosine:.6f}"
    return [str(r.index), r.node, r.op, r.name, shape, _num(m.max_abs), _num(m.max_rel), cos,
            "yes" if r.within else "NO", r.note]  # fmt: skip


def _tol(r: TensorDiff) -> str:
    m = r.metrics
    return "" if m is None else f"{m.dtype.name} tolerance rtol {m.rtol:g}, atol {m.atol:g}"


def _source_line(name: str, r: TensorDiff | None, report: DiffReport) -> str:
    if r is None:
        return f"    {name}: not on both sides (not compared)"
    origin = f"from {r.node} ({r.op})" if r.node else r.op
    if r.metrics is None:
        return f"    {name} ({origin}): {r.note}"
    m = r.metrics
    verdict = "within tolerance" if r.within else f"OUT of tolerance ({m.mismatch_fraction:.1%} of elements)"
    return f"    {name} ({origin}): max abs {_num(m.max_abs)}, max rel {_num(m.max_rel)}, {verdict}"


def _summary(report: DiffReport) -> list[str]:
    f = report.first
    if f is None:
        n = sum(1 for r in report.rows if r.metrics is not None)
        off = [r.name for r in report.sources if not r.within]
        note = f" (though {', '.join(off)} differ beyond it, listed above)" if off else ""
        return [f"result: all {n} compared node outputs are within tolerance{note}"]
    m = f.metrics
    what = (
        f"max abs {_num(m.max_abs)}, max rel {_num(m.max_rel)}, cosine {m.cosine:.6f}, "
        f"{m.mismatch_fraction:.1%} of elements outside the {_tol(f)}"
        if m is not None
        else f.note
    )
    out = [f"first divergence: node '{f.node}' ({f.op}), output '{f.name}': {what}", "  its inputs:"]
    inputs = report.first_inputs()
    out += [_source_line(name, r, report) for name, r in inputs]
    bad = [
        f"'{n}' ({'from ' + r.node if r.node else r.op})" for n, r in inputs if r is not None and not r.within
    ]
    if bad:
        out.append(
            f"  -> input(s) {', '.join(bad)} already differ between the sides: the divergence comes in "
            "through them, not from this node's kernel"
        )
    else:
        unknown = [n for n, r in inputs if r is None or r.metrics is None]
        if unknown:
            out.append(
                f"  -> the inputs compared agree within tolerance ({', '.join(unknown)} not on both sides): "
                "the node, or what feeds it on one side only, diverges"
            )
        else:
            out.append("  -> its inputs agree within tolerance: this node itself diverges")
    return out


def render_diff(report: DiffReport, fmt: str = "text") -> str:
    """The per-node table, the inputs that differ and the verdict (or the report as JSON)."""
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=2)
    tol = "per-dtype defaults" if report.rtol is None else f"rtol {report.rtol:g}, atol {report.atol:g}"
    md = fmt == "markdown"
    head = [
        f"{'# ' if md else ''}opstrata diff: {report.model}", "",
        f"- actual:   {report.actual}", f"- expected: {report.expected}", f"- tolerance: {tol}",
        *(f"- input {n}" for n in report.feeds), "",
    ]  # fmt: skip
    headers = ["#", "node", "op", "output", "shape", "max abs", "max rel", "cosine", "ok", "note"]
    body = _table(headers, [_cells(r) for r in report.rows], fmt)
    differ = [r for r in report.sources if r.metrics is not None and r.metrics.max_abs != 0]
    extra: list[str] = []
    if differ:
        extra += ["", "graph inputs and initializers that differ between the sides:"]
        extra += [_source_line(r.name, r, report) for r in differ]
    if report.whereabouts:
        extra += ["", f"where the passes put the values not compared ({len(report.whereabouts)}):"]
        extra += [f"  {name}: {how}" for name, how in report.whereabouts]
    if report.unmatched:
        shown = ", ".join(report.unmatched[:10]) + (", ..." if len(report.unmatched) > 10 else "")
        extra += ["", f"not on both sides ({len(report.unmatched)}, not compared): {shown}"]
    fence = ["```"] if md else []
    return "\n".join([*head, *body, *extra, "", *fence, *_summary(report), *fence]) + "\n"


def render_drift(report: DriftReport, fmt: str = "text") -> str:
    """Error growth per node: error against float64, the inputs' error and the growth factor."""
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=2)
    md = fmt == "markdown"
    head = [
        f"{'# ' if md else ''}opstrata diff --drift: {report.model} in {report.dtype} against float64", "",
        "error = max |low - float64| / max |float64|; growth = error / worst error of the node's inputs", "",
    ]  # fmt: skip
    headers = ["#", "node", "op", "output", "shape", "error", "inputs' error", "growth"]
    rows = [
        [str(r.index), r.node, r.op, r.output, f"[{', '.join(map(str, r.shape))}]", _num(r.error),
         _num(r.input_error), "inf" if math.isinf(r.growth) else f"{r.growth:.2f}x"]
        for r in report.rows
    ]  # fmt: skip
    tail = [""]
    w, g = report.worst, report.top_growth
    if w is not None:
        tail.append(f"largest error: {_num(w.error)} at node '{w.node}' ({w.op}), output '{w.output}'")
    if g is not None:
        tail.append(f"largest growth: {g.growth:.2f}x at node '{g.node}' ({g.op}), output '{g.output}'")
    if report.rows:
        tail.append(f"last node output error: {_num(report.rows[-1].error)} ('{report.rows[-1].output}')")
    return "\n".join([*head, *_table(headers, rows, fmt), *tail]) + "\n"
