"""A device session's intermediates in one device allocation, laid out by the memory plan's packer.

The device kernels allocate their own results (and temporaries), so the arena is planned from what they
ask for, as onnxruntime's memory patterns are: a shape's first run warms up (modules load, libraries
set up their workspaces, initializers go up), its second run is traced through the memory's
``DeviceAllocations`` (every allocation's size, and when it was freed), and
:func:`opstrata.graph.pack_buffers` lays the freed ones out in one block. Later runs serve the k-th
allocation at its planned offset. What outlives a run (outputs, caches) is served from the device's pool.

Serving never trusts the trace blindly: an allocation whose size differs from the trace, or whose bytes
are still used by an earlier allocation that lives longer than it did when traced (a profiler holding a
result, say), is served from the pool instead and counted; a run with such surprises traces again, and
after :data:`MAX_RETRACES` the shape runs on the pool for good, with the reason in its stats.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import opstrata.ops as ops
from opstrata.graph import pack_buffers

__all__ = ["MAX_RETRACES", "DeviceArena", "DeviceArenaStats"]

#: traces a shape may take before its runs stay on the device's pool
MAX_RETRACES = 3


@dataclass(frozen=True)
class DeviceArenaStats:
    """One input-shape signature's device arena: its layout and how its runs were served."""

    state: str  # "warm-up", "tracing", "serving" or "off"
    arena_bytes: int = 0  # the one device allocation
    traced_bytes: int = 0  # the planned allocations' total, aligned (one buffer each: no reuse)
    lower_bound_bytes: int = 0  # the most planned bytes live at once in the trace, aligned
    planned: int = 0  # allocations served from the arena each run
    escaped: int = 0  # allocations that outlive a run (outputs, caches): served from the pool
    runs_served: int = 0
    unplanned: int = 0  # allocations served from the pool against the plan (size or lifetime differed)
    traces: int = 0
    reason: str = ""  # why the state is "off"

    def summary(self) -> str:
        """One line for reports."""
        if self.state != "serving":
            return f"{self.state}{': ' + self.reason if self.reason else ''}"
        return (
            f"arena {self.arena_bytes} B for {self.planned} allocations ({self.traced_bytes} B without reuse, "
            f"lower bound {self.lower_bound_bytes} B), {self.escaped} outlive the run, "
            f"{self.runs_served} runs served, {self.unplanned} allocations off plan"
        )


class _Owner:
    """What a served allocation keeps alive: its finalizer tells the arena the memory is free again."""

    __slots__ = ("__weakref__",)


class DeviceArena:
    """The planned device memory of one input-shape signature (see the module's docstring)."""

    def __init__(self, allocations: ops.DeviceAllocations) -> None:
        self.al = allocations
        self.state = "warm-up"
        self.reason = ""
        self._trace: list[list[Any]] = []  # per allocation: [nbytes, allocated at, freed at or None]
        self._clock = 0  # allocation and free events of the traced run, in order
        self._sizes: list[int] = []  # the plan: per allocation its size, offset (None: from the pool)
        self._offsets: list[int | None] = []
        self._block: Any = None
        self._k = 0  # the next allocation of a served run
        self._live: dict[int, tuple[int, int]] = {}  # carved allocation -> its bytes, while in use
        self._off_plan = False
        self._layout: dict[str, int] = {}  # the serving plan's DeviceArenaStats fields (arena_bytes, ...)
        self.runs_served = self.unplanned = self.traces = 0

    # ------------------------------------------------------------------ a run

    def begin(self) -> Callable[[int], Any] | None:
        """The allocation function for this run's kernels (None: let the device allocate)."""
        if self.state == "warm-up":
            self.state = "tracing"
            return None
        if self.state == "tracing":
            self._trace, self._clock = [], 0
            self.traces += 1
            return self._traced
        if self.state == "serving":
            self._k, self._off_plan = 0, False
            return self._served
        return None

    def end(self) -> None:
        """After the run's last kernel (its outputs still held): plan a trace, or judge a served run."""
        if self.state == "tracing" and self.traces:
            self._plan()
        elif self.state == "serving":
            self.runs_served += 1
            if self._off_plan or self._k != len(self._sizes):
                self._retrace("the run's allocations differed from the traced run")

    # ------------------------------------------------------------------ tracing

    def _traced(self, nbytes: int) -> Any:
        if nbytes == 0 or self.state == "off":
            return self.al.fresh(nbytes, None)
        k = len(self._trace)
        self._trace.append([nbytes, self._clock, None])
        self._clock += 1
        owner = _Owner()
        weakref.finalize(owner, _trace_freed, weakref.ref(self), self._trace, k).atexit = False
        try:
            return self.al.fresh(nbytes, owner)
        except Exception as exc:
            return self._failed(nbytes, exc)

    def _plan(self) -> None:
        freed = [(k, n, a, b) for k, (n, a, b) in enumerate(self._trace) if b is not None]
        offsets, total = pack_buffers([(n, a, b) for _, n, a, b in freed], alignment=self.al.alignment)
        self._sizes = [n for n, _, _ in self._trace]
        self._offsets = [None] * len(self._trace)
        for (k, _, _, _), off in zip(freed, offsets, strict=True):
            self._offsets[k] = off
        align = self.al.alignment
        sizes = [-(-n // align) * align for _, n, _, _ in freed]  # as the arena places them
        live = [0] * (self._clock + 1)
        for size, (_, _, a, b) in zip(sizes, freed, strict=True):
            for t in range(a, b + 1):
                live[t] += size
        self._layout = dict(
            arena_bytes=total, traced_bytes=sum(sizes), lower_bound_bytes=max(live, default=0),
            planned=len(freed), escaped=len(self._trace) - len(freed),
        )  # fmt: skip
        self._trace = []
        self._block = None
        if total:
            try:
                self._block = self.al.reserve(total)
            except Exception as exc:  # out of memory: the pool's cached blocks may still serve the runs
                self._off(f"reserving the {total}-byte arena failed: {type(exc).__name__}: {exc}")
                return
        self.state = "serving"

    # ------------------------------------------------------------------ serving

    def _served(self, nbytes: int) -> Any:
        if nbytes == 0 or self.state == "off":
            return self.al.fresh(nbytes, None)
        k = self._k
        self._k += 1
        if k >= len(self._sizes) or self._sizes[k] != nbytes:
            self._off_plan = True
            self.unplanned += 1
            return self.al.fresh(nbytes, None)
        off = self._offsets[k]
        if off is None:  # outlives the run: the pool's
            return self.al.fresh(nbytes, None)
        end = off + nbytes
        for a, b in self._live.values():
            if a < end and off < b:  # an earlier allocation still uses these bytes
                self._off_plan = True
                self.unplanned += 1
                return self.al.fresh(nbytes, None)
        owner = _Owner()
        self._live[k] = (off, end)
        weakref.finalize(owner, self._live.pop, k, None).atexit = False
        try:
            return self.al.carve(self._block, off, nbytes, owner)
        except Exception as exc:
            return self._failed(nbytes, exc)

    # ------------------------------------------------------------------ state

    def _retrace(self, why: str) -> None:
        if self.traces >= MAX_RETRACES:
            self._off(f"{why} {self.traces} times; runs use the device's pool")
            return
        self.state = "tracing"

    def _failed(self, nbytes: int, exc: Exception) -> Any:
        """The memory's own calls failed under the arena: off with the reason; this request from the pool."""
        self._off(f"the arena's allocation of {nbytes} bytes failed: {type(exc).__name__}: {exc}")
        return self.al.fresh(nbytes, None)

    def _off(self, why: str) -> None:
        self.state, self.reason = "off", why
        self._sizes, self._offsets, self._block = [], [], None
        warnings.warn(f"device arena off for this input shape (runs use the device's pool): {why}", RuntimeWarning, stacklevel=2)  # fmt: skip

    def stats(self) -> DeviceArenaStats:
        """Where this signature's arena stands."""
        layout = self._layout if self.state == "serving" else {}
        return DeviceArenaStats(
            self.state, **layout, runs_served=self.runs_served, unplanned=self.unplanned, traces=self.traces,
            reason=self.reason,
        )  # fmt: skip


def _trace_freed(arena_ref: weakref.ref[DeviceArena], trace: list[list[Any]], k: int) -> None:
    """A traced allocation was freed: stamp it, if its trace is still the arena's current one (a weak
    reference: an allocation that lives on, a cache's, must not keep an evicted arena's block alive)."""
    arena = arena_ref()
    if arena is not None and trace is arena._trace and trace[k][2] is None and arena.state == "tracing":
        trace[k][2] = arena._clock
        arena._clock += 1
