"""The arena's memory timeline: bytes live and arena extent in use at every step of a memory plan.

A step is one node of the planned graph, in execution order, plus a last step where the graph's
outputs are held. Values the plan put in place share their input's buffer, so a buffer counts once
from its first writer to its last reader — the same liveness the planner's ``lower_bound_bytes``
uses, so the timeline's peak equals it. ``extent`` is the highest arena byte a live buffer reaches:
where it stays above ``live`` the arena has holes the packing could not fill.
"""

from __future__ import annotations

from typing import Any

from opstrata.graph import Graph, MemoryPlan

__all__ = ["MEMORY_KIND", "memory_timeline"]

#: The ``kind`` field of a memory-timeline results file.
MEMORY_KIND = "memory-timeline"


def _buffers(plan: MemoryPlan) -> list[tuple[int, int, int, int]]:
    """(offset, size, first step, last step) per arena buffer; in-place values merged into their source."""

    def root(v: str) -> str:
        seen = set()
        while v in plan.inplace and v not in seen:
            seen.add(v)
            v = plan.inplace[v]
        return v

    spans: dict[str, list[int]] = {}
    for v, (first, last) in plan.lifetimes.items():
        r = root(v)
        span = spans.setdefault(r, [plan.offsets[r], plan.sizes[r], first, last])
        span[2], span[3] = min(span[2], first), max(span[3], last)
    return [(o, s, f, last) for o, s, f, last in spans.values()]


def memory_timeline(plan: MemoryPlan, graph: Graph) -> dict[str, Any]:
    """JSON-ready timeline of ``plan`` over ``graph``'s nodes (the graph the plan was made for)."""
    steps = len(graph.nodes) + 1
    live, extent = [0] * steps, [0] * steps
    for offset, size, first, last in _buffers(plan):
        for i in range(first, min(last, steps - 1) + 1):
            live[i] += size
            extent[i] = max(extent[i], offset + size)
    labels = [(n.name or f"#{i}", n.op_type) for i, n in enumerate(graph.nodes)] + [("(outputs)", "")]
    return {
        "kind": MEMORY_KIND,
        "graph": plan.graph_name,
        "dims": dict(plan.dims),
        "arena_bytes": plan.arena_bytes,
        "lower_bound_bytes": plan.lower_bound_bytes,
        "no_reuse_bytes": plan.no_reuse_bytes,
        "dynamic": list(plan.dynamic),
        "steps": [
            {"step": i, "node": name, "op": op, "live_bytes": live[i], "extent_bytes": extent[i]}
            for i, (name, op) in enumerate(labels)
        ],
    }
