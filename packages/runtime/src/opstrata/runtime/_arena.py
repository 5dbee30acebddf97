"""One preallocated arena per input-shape signature: every intermediate is a view at its planned offset.

The layout is opstrata.graph's static memory plan (greedy-by-size offsets, in-place reuse). That
plan places a reshape-like output on its input's bytes (the same buffer, kept live until the view's
last read); any other result that numpy returns as a view of another buffer (transpose, slice) is
copied into its own slot, because the base may be reused while the view is still read.
:func:`view_aliases` checks the plan: a reshape-like view is kept when no value written during its
lifetime overlaps the bytes it points at (an in-place write at its last read is elementwise, safe).
"""

from __future__ import annotations

import numpy as np

from opstrata.graph import Graph, MemoryPlan, op_defs

__all__ = ["Arena", "view_aliases"]

#: Ops whose cpu kernels return a view of their first input (same bytes, new shape): their OpDef says so.
_RESHAPES = frozenset(d.name for d in op_defs() if d.view and not d.domain)


def view_aliases(graph: Graph, plan: MemoryPlan) -> set[str]:
    """Outputs of reshape-like nodes that may stay views of their input's bytes for this plan.

    A view of an arena buffer is safe while no value written in ``(defining step, last use]``
    overlaps that buffer; views of feeds and initializers are always safe (never written).
    """
    region: dict[str, tuple[int, int] | None] = {}  # value -> arena bytes it points at (None: outside)
    writes: list[list[tuple[int, int]]] = []  # per step: byte ranges its outputs write
    last_ok: list[list[tuple[int, int]]] = []  # per step: ... except in-place outputs (elementwise over
    for n in graph.nodes:  # their input's own bytes, safe at the view's last read)
        w = [(o, (plan.offsets[o], plan.offsets[o] + plan.sizes[o])) for o in n.outputs if o in plan.offsets]
        writes.append([r for _, r in w])
        last_ok.append([r for o, r in w if o not in plan.inplace])
    out: set[str] = set()
    for i, n in enumerate(graph.nodes):
        for o in n.outputs:
            if o in plan.offsets:
                region[o] = (plan.offsets[o], plan.offsets[o] + plan.sizes[o])
        if n.domain not in ("", "ai.onnx") or n.op_type not in _RESHAPES or len(n.outputs) != 1:
            continue
        v, x = n.outputs[0], n.inputs[0]
        if v not in plan.offsets:
            continue
        r = region.get(x)  # None: a feed or initializer
        last = plan.lifetimes[v][1]
        end = min(last, len(writes) - 1)
        if r is not None and any(
            a < r[1] and r[0] < b
            for j in range(i + 1, end + 1)
            for a, b in (last_ok[j] if j == last else writes[j])
        ):
            continue
        region[v] = r
        out.add(v)
    return out


class Arena:
    """``nbytes`` of uint8 laid out by ``plan``; ``views[name]`` is the array of each planned value."""

    def __init__(
        self, plan: MemoryPlan, dtypes: dict[str, np.dtype], aliases: set[str] | None = None
    ) -> None:
        self.plan = plan
        #: values kept as views of another value's bytes (see :func:`view_aliases`), not copied in
        self.aliases = frozenset(aliases or ())
        self._alias_slots: frozenset[int] | None = None  # filled by the executor
        self._view_steps: frozenset[int] | None = None  # filled by the executor (Schedule.view_steps)
        self.nbytes = plan.arena_bytes
        self.buffer = np.empty(self.nbytes, np.uint8)  # the one allocation for every intermediate
        self.views: dict[str, np.ndarray] = {}
        for name, off in plan.offsets.items():
            dt = np.dtype(dtypes[name])
            shape = plan.shapes[name]
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            self.views[name] = self.buffer[off : off + n].view(dt).reshape(shape)

    def is_view_of(self, v: str, x: str) -> bool:
        """True when ``v``'s arena view is ``x``'s bytes reshaped (same offset, dtype, element count):
        a reshape-like node from x to v then has nothing to do."""
        a, b = self.views.get(v), self.views.get(x)
        return (
            a is not None and b is not None and self.plan.offsets[v] == self.plan.offsets[x]
            and a.dtype == b.dtype and a.size == b.size
        )  # fmt: skip

    def owns(self, x: np.ndarray) -> bool:
        """True when ``x`` is a view into this arena (numpy keeps the owning array as ``base``)."""
        return x is self.buffer or x.base is self.buffer

    def __repr__(self) -> str:
        return f"Arena({self.nbytes} B, {len(self.views)} values, dims {self.plan.dims})"
