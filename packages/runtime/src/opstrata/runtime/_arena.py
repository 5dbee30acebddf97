"""One preallocated arena per input-shape signature: every intermediate is a view at its planned offset.

The layout is opstrata.graph's static memory plan (greedy-by-size offsets, in-place reuse). That
plan gives each node output its own buffer, so results that numpy returns as views of another
buffer (reshape, transpose, slice) are copied into their own slot: a view's base may be reused
while the view is still read.
"""

from __future__ import annotations

import numpy as np

from opstrata.graph import MemoryPlan

__all__ = ["Arena"]


class Arena:
    """``nbytes`` of uint8 laid out by ``plan``; ``views[name]`` is the array of each planned value."""

    def __init__(self, plan: MemoryPlan, dtypes: dict[str, np.dtype]) -> None:
        self.plan = plan
        self.nbytes = plan.arena_bytes
        self.buffer = np.empty(self.nbytes, np.uint8)  # the one allocation for every intermediate
        self.views: dict[str, np.ndarray] = {}
        for name, off in plan.offsets.items():
            dt = np.dtype(dtypes[name])
            shape = plan.shapes[name]
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            self.views[name] = self.buffer[off : off + n].view(dt).reshape(shape)

    def owns(self, x: np.ndarray) -> bool:
        """True when ``x`` is a view into this arena (numpy keeps the owning array as ``base``)."""
        return x is self.buffer or x.base is self.buffer

    def __repr__(self) -> str:
        return f"Arena({self.nbytes} B, {len(self.views)} values, dims {self.plan.dims})"
