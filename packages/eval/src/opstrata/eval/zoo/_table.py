"""Formatting zoo rows: a fixed-width text table for the terminal, a Markdown table for docs/zoo.md."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from ._result import STATUSES, ZooResult

__all__ = ["COLUMNS", "markdown_table", "missing_ops_line", "summary_line", "text_header", "text_row"]

#: (header, width) of the text table; the reason column takes the rest of the line.
COLUMNS = (
    ("model", 20), ("exporter", 11), ("status", 13), ("nodes", 6), ("import s", 9), ("compile s", 9),
    ("ORT s", 6), ("err vs ORT", 10), ("err vs torch", 12), ("ratio", 6), ("MiB", 6), ("ORT MiB", 7), ("reason", 0),
)  # fmt: skip


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _cells(r: ZooResult) -> list[str]:
    return [
        r.model, r.exporter, r.status, _num(r.nodes, "d"), _num(r.import_s, ".3f"), _num(r.compile_s, ".3f"),
        _num(r.ort_create_s, ".3f"), _num(r.err_vs_ort, ".1e"), _num(r.err_vs_torch, ".1e"), _num(r.latency_ratio, ".2f"),
        _num(r.peak_mib, ".1f"), _num(r.ort_peak_mib, ".1f"), "; ".join([r.reason, *r.notes] if r.reason else r.notes),
    ]  # fmt: skip


def text_header() -> str:
    """The header line of the text table."""
    return " ".join(f"{h:<{w}}" if w else h for h, w in COLUMNS)


def text_row(r: ZooResult) -> str:
    """One row of the text table."""
    return " ".join(f"{c:<{w}}" if w else c for c, (_, w) in zip(_cells(r), COLUMNS, strict=True)).rstrip()


def markdown_table(rows: Iterable[ZooResult]) -> str:
    """A Markdown table of the rows (errors in scientific notation, reasons with `|` escaped)."""
    heads = [h for h, _ in COLUMNS]
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    for r in rows:
        cells = [c.replace("|", "\\|") for c in _cells(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_line(rows: Iterable[ZooResult]) -> str:
    """'N rows: a ok, b refused, ...' counting each status that occurs."""
    rows = list(rows)
    counts = Counter(r.status for r in rows)
    parts = [f"{counts[s]} {s}" for s in STATUSES if counts[s]]
    return f"{len(rows)} rows: " + (", ".join(parts) if parts else "none")


def missing_ops_line(rows: Iterable[ZooResult]) -> str | None:
    """The ONNX op types opstrata.graph does not import, each with the rows that use it; None if none."""
    users: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        for op in r.unsupported_ops:
            users[op].append(f"{r.model}/{r.exporter}")
    if not users:
        return None
    ranked = sorted(users.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return "ops to add: " + "; ".join(f"{op} ({', '.join(who)})" for op, who in ranked)
