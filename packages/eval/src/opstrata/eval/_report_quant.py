"""Report section of a quantization report (``opstrata quantize --report-json``): SQNR per layer."""

from __future__ import annotations

import math
from typing import Any

from ._report import Section
from ._svg import bar_chart

__all__ = ["quant_section"]


def _num(x: Any) -> float:
    """A float from a JSON number, ``"inf"``/``"-inf"`` or None (not measured: NaN)."""
    return math.nan if x is None else float(x)


def _fmt(x: Any, spec: str) -> str:
    v = _num(x)
    return "-" if math.isnan(v) else "inf" if math.isinf(v) else format(v, spec)


def _bytes(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def quant_section(doc: dict[str, Any], src: str) -> Section:
    """SQNR of every quantized (or put-back) node's output against float as bars, the nodes as a table."""
    nodes = doc["nodes"]
    s = Section(f"quantization: scheme {doc['scheme']}", "quant", src)
    measured = [n for n in nodes if not math.isnan(_num(n["sqnr_db"]))]
    if measured:
        s.charts.append(
            bar_chart([n["node"] + (" (float)" if n["kept_float"] else "") for n in measured],
                      [_num(n["sqnr_db"]) for n in measured], title="SQNR of each node's output against float",
                      unit="dB")
        )  # fmt: skip
    size = doc["size_bytes"]
    f, q = int(size["float"]), int(size["quantized"])
    s.notes.append(f"weights {_bytes(f)} -> {_bytes(q)} (x{f / q if q else math.inf:.2f} smaller)")
    for o in doc["outputs"]:
        top1 = o.get("top1_agreement")
        s.notes.append(
            f"output '{o['name']}': cosine {_fmt(o['cosine'], '.6f')}, SQNR {_fmt(o['sqnr_db'], '.1f')} dB, "
            f"max abs {_fmt(o['max_abs'], '.3e')}" + (f", top-1 agreement {_num(top1):.1%}" if top1 is not None else "")
        )  # fmt: skip
    ppl = doc.get("perplexity")
    if ppl:
        s.notes.append(f"perplexity {_fmt(ppl['float'], '.4f')} -> {_fmt(ppl['quantized'], '.4f')} "
                       f"(delta {_fmt(ppl['delta'], '+.4f')})")  # fmt: skip
    if doc.get("budget") is not None:
        met = "met" if doc.get("budget_met") else "NOT met"
        s.notes.append(
            f"accuracy budget {doc['budget']}: {met}; put back to float: {doc.get('fallback') or 'none'}"
        )
    if not measured:
        s.notes.append("no data was given: per-node SQNR not measured")
    s.headers = ["node", "op", "SQNR dB", "cosine", "local SQNR dB", "float?"]
    s.rows = [[n["node"], n["op"], _fmt(n["sqnr_db"], ".1f"), _fmt(n["cosine"], ".6f"),
               _fmt(n.get("local_sqnr_db"), ".1f"), n["reason"] if n["kept_float"] else ""] for n in nodes]  # fmt: skip
    return s
