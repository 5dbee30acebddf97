"""The process's BLAS thread count, limited per run and restored after it, for 2-4 us a run.

``threadpoolctl.threadpool_limits(limits=n, user_api="blas")`` re-scans the loaded libraries on every
entry: measured ~360 us per enter/exit on this machine, several times a tiny MLP's whole run (40-60
us). A ``ThreadpoolController`` kept for the process costs ~8 us per ``limit`` block; reading a
library's count through it ~0.3 us, setting it ~0.6 us. So :class:`BlasThreads` keeps one
controller's library handles (rescanned when a session is created after new imports, so a BLAS loaded
later, e.g. by importing torch, is seen), reads the current count at the start of each run and sets it
only where it differs, and at the end sets back the count it found where the current one differs:
~2 us per run when the count already fits, ~3.5 us when it is switched and restored.

The BLAS count is process-wide (OpenBLAS and MKL have no per-thread setting). Runs are counted: the
first run to start records the count it found (the baseline), a run that ends while others are still
running puts back the count it found, and the last run to end restores the baseline, so overlapping
runs of sessions with different counts (last starter wins meanwhile) never leave a changed count
behind. Without threadpoolctl, or when it finds no BLAS, every call is a no-op.

threadpoolctl (3.8 here) lets one Python thread at a time change OpenBLAS-pthreads' count (the first
to do so, while it lives): its shared pool must not be resized under another thread's GEMM. Runs
from other threads then keep that thread's count; the limits here are exact for sessions run from
one thread (the main thread, or any single serving thread), which is how onnxruntime sessions'
intra-op pools are normally driven too.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

__all__ = ["BLAS", "BlasThreads"]

_Saved = tuple[tuple[Any, int], ...]  # (library controller, its thread count)


class BlasThreads:
    """Get, set and scope the thread count of every loaded BLAS library."""

    def __init__(self) -> None:
        self._libs: tuple[Any, ...] | None = None  # threadpoolctl LibController per BLAS; None: not scanned
        self._lock = threading.Lock()
        self._active = 0  # runs between enter and exit
        self._baseline: _Saved = ()
        self._modules = -1  # len(sys.modules) at the last scan

    def refresh_if_imported(self) -> None:
        """Re-scan when modules were imported since the last scan (a new BLAS comes with an import)."""
        if len(sys.modules) != self._modules:
            self.refresh()

    def refresh(self) -> None:
        """Re-scan the loaded BLAS libraries (~0.35 ms)."""
        try:
            import numpy  # noqa: F401  (loads numpy's BLAS, so the scan finds it)
            from threadpoolctl import ThreadpoolController

            libs = tuple(ThreadpoolController().select(user_api="blas").lib_controllers)
        except Exception:  # threadpoolctl missing, or it cannot inspect this process: limits are no-ops
            libs = ()
        self._libs = libs
        self._modules = len(sys.modules)

    def claim(self) -> None:
        """Set each BLAS to its own count from this thread: under threadpoolctl's one-controlling-thread
        rule (module docstring) the thread creating sessions, not a stream worker whose kernel limits BLAS
        for a moment, then controls the count (when no other live thread does already)."""
        for lib in self._controllers():
            lib.set_num_threads(lib.get_num_threads())

    def _controllers(self) -> tuple[Any, ...]:
        if self._libs is None:
            self.refresh()
        return self._libs  # type: ignore[return-value]

    @property
    def available(self) -> bool:
        """True when at least one BLAS library can be limited."""
        return bool(self._controllers())

    def current(self) -> int | None:
        """The first BLAS library's thread count (None: no controllable BLAS)."""
        libs = self._controllers()
        return int(libs[0].get_num_threads()) if libs else None

    def describe(self) -> list[dict[str, Any]]:
        """Each controlled BLAS: its implementation, version and current thread count."""
        return [
            {"internal_api": lib.internal_api, "version": lib.version, "num_threads": lib.get_num_threads()}
            for lib in self._controllers()
        ]

    def set(self, n: int) -> None:
        """Set every BLAS library to ``n`` threads (inside a run: switches the count for later nodes)."""
        for lib in self._controllers():
            lib.set_num_threads(n)

    def enter(self, n: int) -> _Saved:
        """Limit BLAS to ``n`` threads for a run; pass the result to :meth:`exit` when the run ends."""
        libs = self._controllers()
        with self._lock:
            saved = tuple((lib, int(lib.get_num_threads())) for lib in libs)
            if self._active == 0:
                self._baseline = saved
            self._active += 1
            for lib, had in saved:
                if had != n:
                    lib.set_num_threads(n)
        return saved

    def exit(self, saved: _Saved) -> None:
        """End a run begun with :meth:`enter`: restore the count it found (the baseline for the last run)."""
        with self._lock:
            self._active = max(0, self._active - 1)
            restore = self._baseline if self._active == 0 else saved
            # read back, not remembered: a set from a thread threadpoolctl ignores may not have taken
            for lib, had in restore:
                if lib.get_num_threads() != had:
                    lib.set_num_threads(had)
            if self._active == 0:
                self._baseline = ()


#: The process's one BLAS limiter (the count is process-wide, so its bookkeeping is too).
BLAS = BlasThreads()
