"""Async handles: ``Work`` and the per-group worker thread that runs queued collectives in call order."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from ._errors import CommTimeoutError


class Work:
    """Handle of a queued collective (torch.distributed's ``Work``): ``wait()`` and ``is_completed()``."""

    def __init__(self, what: str, default_timeout: float) -> None:
        self.what = what
        self._timeout = default_timeout
        self._done = threading.Event()
        self._exc: BaseException | None = None

    def is_completed(self) -> bool:
        """True once the collective finished (successfully or not)."""
        return self._done.is_set()

    def exception(self) -> BaseException | None:
        """The error the collective raised, if it finished with one."""
        return self._exc

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (at most ``timeout`` s, default the group timeout + 5 s); re-raise its error."""
        limit = self._timeout + 5.0 if timeout is None else timeout
        if not self._done.wait(limit):
            raise CommTimeoutError(
                f"{self.what}: Work.wait timed out after {limit:.1f}s; the collective is still queued or running "
                "(earlier async collectives on this group run first)"
            )
        if self._exc is not None:
            raise self._exc
        return True

    def _finish(self, exc: BaseException | None = None) -> None:
        self._exc = exc
        self._done.set()


class Worker:
    """One background thread per group executing submitted collectives strictly in order."""

    def __init__(self, name: str) -> None:
        self._q: queue.Queue[tuple[Callable[[], object], Work] | None] = queue.Queue()
        self.pending = 0  # queued or running (a caller's wait budget grows with the backlog)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], object], work: Work) -> Work:
        """Queue ``fn``; ``work`` completes when it returns or raises."""
        self.pending += 1
        self._q.put((fn, work))
        return work

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, work = item
            try:
                fn()
            except BaseException as e:  # handed to the caller through Work.wait
                self.pending -= 1
                work._finish(e)
            else:
                self.pending -= 1
                work._finish()

    def stop(self, timeout: float) -> None:
        """Finish queued work (bounded by ``timeout``) and end the thread."""
        self._q.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
