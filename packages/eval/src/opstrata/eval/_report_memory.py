"""Report section of an arena memory timeline (``opstrata run --memory``): bytes live per node."""

from __future__ import annotations

from typing import Any

from ._report import Section
from ._svg import line_chart

__all__ = ["memory_section"]


def _kib(n: float) -> str:
    return f"{n / 1024:.1f}"


def memory_section(doc: dict[str, Any], src: str) -> Section:
    """Live bytes and arena extent per step as a line chart; the peak steps and the headline as a table."""
    steps = doc["steps"]
    live = [float(s["live_bytes"]) / 1024 for s in steps]
    s = Section(f"arena memory timeline: {doc['graph']}", "memory", src)
    s.charts.append(
        line_chart(live, title="bytes live in the arena per node", xlabel="node (execution order)",
                   ylabel="KiB live", log=False)
    )  # fmt: skip
    arena, bound = int(doc["arena_bytes"]), int(doc["lower_bound_bytes"])
    s.notes = [
        f"arena {_kib(arena)} KiB; lower bound (most bytes live at once) {_kib(bound)} KiB "
        f"(x{arena / bound if bound else 1.0:.3f}); one buffer per value {_kib(int(doc['no_reuse_bytes']))} KiB",
    ]
    if doc.get("dims"):
        s.notes.append("dims: " + ", ".join(f"{k}={v}" for k, v in doc["dims"].items()))
    if doc.get("dynamic"):
        s.notes.append(f"{len(doc['dynamic'])} value(s) outside the arena (shape depends on input values)")
    s.headers = ["step", "node", "op", "KiB live", "KiB extent"]
    peak = sorted(steps, key=lambda r: (-int(r["live_bytes"]), int(r["step"])))[:10]
    s.rows = [[str(r["step"]), r["node"], r["op"], _kib(r["live_bytes"]), _kib(r["extent_bytes"])]
              for r in sorted(peak, key=lambda r: int(r["step"]))]  # fmt: skip
    return s
