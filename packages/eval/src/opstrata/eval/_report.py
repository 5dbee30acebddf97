"""``build_report``: one self-contained HTML file (and markdown beside it) from results files.

Accepted inputs, recognised by content: ``opstrata diff --format json`` (error per node),
``opstrata diff --drift --format json`` (drift per node), ``opstrata bench --format json`` (time per
benchmark, and the baseline's), ``opstrata conformance ops --format json`` (cells per status) and a
Chrome trace from a profiled session (time per op type). Plots are inline SVG (``_svg``), so the file
needs no network, no script and no plotting package to open.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import opstrata.ops as ops

from ._svg import bar_chart, line_chart

__all__ = ["ReportError", "Section", "build_report", "load_section"]

KINDS = (
    "diff, drift, bench, conformance (their --format json output), a Chrome trace (--profile), "
    "a memory timeline (opstrata run --memory) or a quantization report (opstrata quantize --report-json)"
)


class ReportError(ValueError):
    """A results file the report cannot read: names the file, what was expected and the fix."""


@dataclass
class Section:
    """One input file's part of the report: title, charts (SVG), a table and notes."""

    title: str
    kind: str
    source: str
    charts: list[str] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _num(x: Any) -> float:
    """A float from a JSON number or the strings 'inf'/'-inf'/'nan' the reports write."""
    return float(x) if isinstance(x, (int, float, str)) else math.nan


def _drift(doc: dict[str, Any], src: str) -> Section:
    rows = doc["rows"]
    s = Section(f"{doc['dtype']} drift against float64: {doc['model']}", "drift", src)
    s.charts.append(line_chart([_num(r["error"]) for r in rows], title=f"{doc['dtype']} error per node",
                               xlabel="node output (graph order)", ylabel="max |low - f64| / max |f64|"))  # fmt: skip
    s.headers = ["#", "node", "op", "error", "growth"]
    s.rows = [
        [str(r["index"]), r["node"], r["op"], f"{_num(r['error']):.3e}", f"{_num(r['growth']):.2f}x"]
        for r in rows
    ]
    return s


def _diff(doc: dict[str, Any], src: str) -> Section:
    rows = [r for r in doc["rows"] if r.get("metrics")]
    s = Section(f"layer diff: {doc['model']}", "diff", src)
    s.notes = [f"actual: {doc['actual']}", f"expected: {doc['expected']}"]
    first = doc.get("first_divergence")
    s.notes.append("all node outputs within tolerance" if first is None else
                   f"first divergence: node '{first['node']}' ({first['op']}), output '{first['output']}'")  # fmt: skip
    vals = [_num(r["metrics"]["max_abs_scaled"]) for r in rows]
    s.charts.append(line_chart([max(v, 1e-12) for v in vals], title="scaled error per node output",
                               xlabel="node output (graph order)", ylabel="max abs / max |expected|"))  # fmt: skip
    s.headers = ["#", "node", "op", "output", "max abs", "cosine", "ok"]
    s.rows = [[str(r["index"]), r["node"], r["op"], r["name"], f"{_num(r['metrics']['max_abs']):.3e}",
               f"{_num(r['metrics']['cosine']):.6f}", "yes" if r["within"] else "NO"] for r in rows]  # fmt: skip
    return s


def _bench(doc: dict[str, Any], src: str) -> Section:
    rows = doc["rows"]
    s = Section(f"benchmarks: {doc['suite']}", "bench", src)
    labels, values = [], []
    for r in rows:
        labels.append(r["bench"])
        values.append(_num(r["median_s"]) * 1e3)
        if "baseline_median_s" in r:
            labels.append(f"{r['bench']} (baseline {doc.get('baseline')})")
            values.append(_num(r["baseline_median_s"]) * 1e3)
    s.charts.append(bar_chart(labels, values, title="median time per call", unit="ms"))
    s.headers = ["bench", "median ms", "ratio", "verdict"]
    s.rows = [[r["bench"], f"{_num(r['median_s']) * 1e3:.4f}", f"{_num(r['ratio']):.3f}" if "ratio" in r else "",
               r.get("verdict", "")] for r in rows]  # fmt: skip
    s.notes = [f"fingerprint differs: {line}" for line in doc.get("fingerprint_differences", [])]
    return s


def _conformance(doc: dict[str, Any], src: str) -> Section:
    s = Section(f"conformance: device '{doc['device']}' against '{doc['against']}'", "conformance", src)
    counts = doc["counts"]
    s.charts.append(
        bar_chart(list(counts), [float(v) for v in counts.values()], title="op x dtype cells", unit="cells")
    )
    s.headers = ["op", "dtype", "status", "detail"]
    s.rows = [[op, dt, c["status"], c["detail"]] for op, cells in doc["ops"].items() for dt, c in cells.items()
              if c["status"] == "deviates"]  # fmt: skip
    return s


def _trace(events: list[dict[str, Any]], src: str) -> Section:
    """Time per op type and per node (mean per run: a node runs once per run) from a profiled session."""
    per_op: dict[str, float] = defaultdict(float)
    per_node: dict[str, list[float]] = defaultdict(list)
    op_of: dict[str, str] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") != "session":
            op = (e.get("args") or {}).get("op_type") or e.get("cat") or e.get("name", "?")
            dur = float(e.get("dur", 0))
            per_op[op] += dur
            name = str(e.get("name", "?"))
            per_node[name].append(dur)
            op_of[name] = op
    if not per_op:
        raise ReportError(
            f"{src}: a Chrome trace without node events; profile a run (opstrata run --profile)"
        )
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:20]
    total = sum(per_op.values())
    s = Section("time per op type and per node (profile)", "trace", src)
    s.charts.append(
        bar_chart([k for k, _ in top], [v / 1e3 for _, v in top], title="total time per op type", unit="ms")
    )
    mean = {k: sum(v) / len(v) for k, v in per_node.items()}
    slowest = sorted(mean.items(), key=lambda kv: -kv[1])[:20]
    s.charts.append(
        bar_chart([k for k, _ in slowest], [v / 1e3 for _, v in slowest],
                  title="time per node, mean per run (the 20 slowest)", unit="ms")
    )  # fmt: skip
    runs = max(len(v) for v in per_node.values())
    s.notes = [f"{len(per_node)} nodes, {runs} run(s); op types: "
               + ", ".join(f"{k} {v / total:.1%}" for k, v in top)]  # fmt: skip
    per_run = sum(mean.values())
    s.headers = ["node", "op type", "ms per run", "share"]
    s.rows = [[k, op_of[k], f"{v / 1e3:.4f}", f"{v / per_run:.1%}"] for k, v in slowest]
    return s


def load_section(path: Path) -> Section:
    """The report section of one results file; ReportError naming the file otherwise."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ReportError(
            f"{path}: cannot read ({exc.strerror or exc}); pass an existing results file"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: not JSON ({exc}); expected {KINDS}") from None
    src = str(path)
    try:
        if isinstance(doc, list):
            return _trace(doc, src)
        if isinstance(doc, dict) and "traceEvents" in doc:
            return _trace(doc["traceEvents"], src)
        if isinstance(doc, dict) and doc.get("reference") == "float64" and "rows" in doc:
            return _drift(doc, src)
        if isinstance(doc, dict) and "first_divergence" in doc:
            return _diff(doc, src)
        if isinstance(doc, dict) and doc.get("suite") in ("models", "zoo", "comm") and "rows" in doc:
            from ._report_bench import bench_section  # imports Section from here

            return bench_section(doc, src)
        if isinstance(doc, dict) and "suite" in doc and "rows" in doc:
            return _bench(doc, src)
        if isinstance(doc, dict) and "counts" in doc and "ops" in doc:
            return _conformance(doc, src)
        if isinstance(doc, dict) and doc.get("kind") == "memory-timeline":
            from ._report_memory import memory_section  # imports Section from here

            return memory_section(doc, src)
        if isinstance(doc, dict) and doc.get("kind") == "quant" and "nodes" in doc:
            from ._report_quant import quant_section  # imports Section from here

            return quant_section(doc, src)
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportError(f"{path}: looks like a results file but a field is missing or bad ({exc}); "
                          "regenerate it with the same opstrata-eval version") from None  # fmt: skip
    raise ReportError(f"{path}: not a results file this report knows; expected {KINDS}")


def _table_html(s: Section) -> str:
    if not s.rows:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in s.headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in s.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _html(sections: Sequence[Section], title: str) -> str:
    css = ("body{font-family:sans-serif;margin:2em;max-width:60em}table{border-collapse:collapse;font-size:12px}"
           "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}figure{margin:1em 0}"
           "figcaption{font-size:12px;color:#555}")  # fmt: skip
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
             f"<style>{css}</style></head><body><h1>{escape(title)}</h1>"]  # fmt: skip
    for s in sections:
        parts.append(
            f"<section class='{s.kind}'><h2>{escape(s.title)}</h2><p><code>{escape(s.source)}</code></p>"
        )
        parts += [f"<p>{escape(n)}</p>" for n in s.notes]
        parts += [f"<figure>{svg}<figcaption>{escape(s.title)}</figcaption></figure>" for svg in s.charts]
        parts.append(_table_html(s) + "</section>")
    parts.append("</body></html>")
    return "".join(parts)


def _markdown(sections: Sequence[Section], title: str, html_name: str) -> str:
    out = [f"# {title}", "", f"Plots: [{html_name}]({html_name})", ""]
    for s in sections:
        out += [f"## {s.title}", "", f"`{s.source}`", "", *(f"- {n}" for n in s.notes)]
        if s.rows:
            out += ["", "| " + " | ".join(s.headers) + " |", "|" + "---|" * len(s.headers)]
            out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in s.rows]
        out.append("")
    return "\n".join(out)


def _write(path: Path, text: str) -> None:
    """Write through a temporary file beside ``path`` and rename, so a reader never sees half a file."""
    ops.atomic_write(path, text)


def build_report(
    inputs: Sequence[Path], output: Path, *, title: str = "opstrata report"
) -> tuple[Path, Path]:
    """Write ``output`` (HTML) and the markdown beside it (same name, .md); returns both paths."""
    if not inputs:
        raise ReportError(f"report: no results files given; pass one or more of {KINDS}")
    sections = [load_section(Path(p)) for p in inputs]
    output = Path(output)
    if not output.parent.is_dir():
        raise ReportError(f"-o {output}: directory '{output.parent}' does not exist; create it first")
    md = output.with_suffix(".md")
    _write(output, _html(sections, title))
    _write(md, _markdown(sections, title, output.name))
    return output, md
