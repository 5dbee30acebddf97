"""Report sections of ``opstrata bench models|zoo|comm --format json``: latency against peers, bus bandwidth.

``models`` and ``zoo`` runs become "latency against peers": per model the opstrata and onnxruntime
medians at the same thread count, a bar chart of the opstrata/onnxruntime ratio (median of the
per-round ratios; below 1 opstrata is faster) and a table with its confidence interval and the
verdict against a saved baseline when the run was compared. ``comm`` runs become "comm bus bandwidth
against message size": a line of bus bandwidth per size on a log axis and a table of time, bus and
algorithm bandwidth per size.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ._report import Section, _num
from ._svg import bar_chart, line_chart

__all__ = ["PEER_SUITES", "bench_section", "comm_section", "peer_latency_section"]

#: Suites whose JSON the report turns into a latency-against-peers section.
PEER_SUITES = ("models", "zoo")


def _fmt(x: Any, spec: str) -> str:
    v = _num(x)
    return format(v, spec) if math.isfinite(v) else ""


def _notes(doc: dict[str, Any]) -> list[str]:
    notes = [str(n) for n in doc.get("notes", [])]
    notes += [f"fingerprint differs: {line}" for line in doc.get("fingerprint_differences", [])]
    notes += [f"setup differs: {line}" for line in doc.get("setup_differences", [])]
    return notes


def peer_latency_section(doc: dict[str, Any], src: str) -> Section:
    """Latency against peers: opstrata beside onnxruntime per model, from a models or zoo bench JSON."""
    rows = doc["rows"]
    by_bench = {r["bench"]: r for r in rows}
    ours = [r for r in rows if r.get("runtime", "opstrata") == "opstrata" and not r.get("peer_of")]
    threads = sorted({r["threads"] for r in rows if "threads" in r})
    where = f"{', '.join(map(str, threads))} thread(s) on each side" if threads else "threads not recorded"
    s = Section(f"latency against peers: bench {doc['suite']} ({where})", "bench-peers", src)
    with_peer = [r for r in ours if "peer_ratio" in r]
    if with_peer:
        s.charts.append(bar_chart(
            [r.get("model", r["bench"]) for r in with_peer], [_num(r["peer_ratio"]) for r in with_peer],
            title="opstrata / onnxruntime latency (median of per-round ratios; below 1: opstrata faster)",
            unit="x onnxruntime",
        ))  # fmt: skip
    else:
        s.notes.append("no onnxruntime rows in this run: times only")
        s.charts.append(bar_chart([r.get("model", r["bench"]) for r in ours],
                                  [_num(r["median_s"]) * 1e3 for r in ours],
                                  title="opstrata median time per run", unit="ms"))  # fmt: skip
    s.headers = ["model", "opstrata ms", "onnxruntime ms", "opstrata/onnxruntime", "95% CI", "vs baseline"]
    for r in ours:
        peer = by_bench.get(r.get("peer", ""), {})
        ci = r.get("peer_ci")
        verdicts = [f"{x['bench'].split('/')[-1]} {x['verdict']} x{_num(x['ratio']):.3f}"
                    for x in (r, peer) if "verdict" in x]  # fmt: skip
        s.rows.append([
            r.get("model", r["bench"]), _fmt(_num(r["median_s"]) * 1e3, ".4f"),
            _fmt(_num(r["peer_median_s"]) * 1e3, ".4f") if "peer_median_s" in r else "",
            _fmt(r["peer_ratio"], ".3f") if "peer_ratio" in r else "",
            f"[{_fmt(ci[0], '.3f')}, {_fmt(ci[1], '.3f')}]" if ci else "", "; ".join(verdicts),
        ])  # fmt: skip
    s.notes += _notes(doc)
    return s


def _size_label(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def _x_ticks(svg: str, labels: list[str]) -> str:
    """Label each point of a line chart with its message size, under the plot (at the points' x)."""
    xs = re.findall(r'<circle cx="([0-9.]+)"', svg)
    height = re.search(r'height="([0-9.]+)"', svg)
    if len(xs) != len(labels) or not height:
        return svg
    y = float(height.group(1)) - 24
    ticks = "".join(f'<text class="xtick" x="{x}" y="{y:.1f}" text-anchor="middle" font-size="9">{label}</text>'
                    for x, label in zip(xs, labels, strict=True))  # fmt: skip
    return svg.replace("</svg>", ticks + "</svg>")


def comm_section(doc: dict[str, Any], src: str) -> Section:
    """Comm bus bandwidth against message size, from a comm bench JSON."""
    rows = sorted(doc["rows"], key=lambda r: int(r["bytes"]))
    ranks = sorted({int(r["ranks"]) for r in rows})
    op = rows[0].get("op", "all_reduce") if rows else "all_reduce"
    s = Section(f"comm bus bandwidth against message size: {op}, {'/'.join(map(str, ranks))} ranks",
                "bench-comm", src)  # fmt: skip

    def bw(r: dict[str, Any]) -> float:
        if "busbw_GBps" in r:
            return _num(r["busbw_GBps"])
        n, k, t = int(r["bytes"]), int(r["ranks"]), _num(r["median_s"])
        return n * 2 * (k - 1) / k / t / 1e9

    labels = [_size_label(int(r["bytes"])) for r in rows]
    values = [bw(r) for r in rows]
    chart = line_chart(values, title=f"{op} bus bandwidth (bytes x 2(n-1)/n / time) per message size",
                       xlabel="message size (one point per size)", ylabel="bus bandwidth GB/s")  # fmt: skip
    s.charts.append(_x_ticks(chart, labels))
    s.headers = ["size", "bytes", "ranks", "ms/call", "busbw GB/s", "algbw GB/s", "vs baseline"]
    for r, label, v in zip(rows, labels, values, strict=True):
        algbw = _num(r["algbw_GBps"]) if "algbw_GBps" in r else int(r["bytes"]) / _num(r["median_s"]) / 1e9
        verdict = f"{r['verdict']} x{_num(r['ratio']):.3f}" if "verdict" in r else ""
        s.rows.append([label, str(r["bytes"]), str(r["ranks"]), _fmt(_num(r["median_s"]) * 1e3, ".4f"),
                       _fmt(v, ".3f"), _fmt(algbw, ".3f"), verdict])  # fmt: skip
    s.notes += _notes(doc)
    return s


def bench_section(doc: dict[str, Any], src: str) -> Section:
    """The section of a models, zoo or comm bench JSON (the caller checked ``doc['suite']``)."""
    if doc["suite"] == "comm":
        return comm_section(doc, src)
    return peer_latency_section(doc, src)
