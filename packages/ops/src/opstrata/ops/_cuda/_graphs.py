"""CUDA graphs and CUDA events through CuPy: the cuda memory's ``capture``, ``mark`` and ``elapsed_ms``.

A capture runs the work once eagerly on its own stream and its own memory pool (so NVRTC modules load,
cuBLAS sets up its workspace, and the pool holds every block the work needs), then records it with
stream capture. The pool is private to the graph and lives as long as it: every address the graph
replays into (intermediates and results) stays the graph's, and nothing else allocates from it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["CupyGraph", "cupy_capture", "cupy_elapsed_ms", "cupy_mark"]


class CupyGraph:
    """One recorded CUDA graph: ``result`` holds the device arrays its replays rewrite."""

    def __init__(self, cp: ModuleType, fn: Callable[[], Any]) -> None:
        self._cp = cp
        self.pool = cp.cuda.MemoryPool()  # the graph's own blocks: freed only with the graph
        self.stream = cp.cuda.Stream(non_blocking=True)  # capture needs a stream other than the legacy one
        caller = cp.cuda.get_current_stream()
        self.stream.wait_event(caller.record())  # the inputs the caller queued are ready first
        with cp.cuda.using_allocator(self.pool.malloc), self.stream:
            fn()  # warm-up: modules, cuBLAS workspace and the pool's blocks exist before recording
            self.stream.synchronize()
            self.stream.begin_capture(mode=cp.cuda.runtime.streamCaptureModeRelaxed)
            try:
                self.result = fn()
            except BaseException:
                _abandon(self.stream)
                raise
            self.graph = self.stream.end_capture()
        self.graph.upload(self.stream)
        self.stream.synchronize()

    def replay(self) -> None:
        """Launch the graph on the caller's current stream, after the work already queued there."""
        self.graph.launch(self._cp.cuda.get_current_stream())


def _abandon(stream: Any) -> None:
    """End a capture that failed part-way, so the stream is usable again; the first error is the one raised."""
    try:
        stream.end_capture()
    except Exception:  # the capture's own error is what the caller needs to see
        pass


def cupy_capture(cp: ModuleType) -> Callable[[Callable[[], Any]], CupyGraph]:
    """The cuda memory's ``capture``."""
    return lambda fn: CupyGraph(cp, fn)


def cupy_mark(cp: ModuleType) -> Callable[[], Any]:
    """The cuda memory's ``mark``: a CUDA event recorded on the current stream."""
    return lambda: cp.cuda.get_current_stream().record()


def cupy_elapsed_ms(cp: ModuleType) -> Callable[[Any, Any], float]:
    """The cuda memory's ``elapsed_ms`` between two recorded events (both complete: call after a sync)."""
    return lambda a, b: float(cp.cuda.get_elapsed_time(a, b))
