"""Run a kernel's independent work items on a thread pool, with the BLAS pool pinned to one thread.

Tiled kernels (FlashAttention) issue many small matmuls; OpenBLAS splitting each of them over its
own threads costs a synchronisation per call, and on a busy machine a wait for a core per call. The
layout CPU attention kernels use instead: one BLAS thread per worker, workers over independent
tiles (numpy releases the GIL in matmul and ufunc loops, so Python threads run them in parallel).

Pinning BLAS needs ``threadpoolctl`` (a dependency, tolerated missing). Without it,
``default_workers()`` is 1 and work items run serially with BLAS left as configured. The pin is
process-wide while a kernel runs: concurrent callers may find BLAS at one thread meanwhile.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from .._errors import OpError

__all__ = ["default_workers", "run_tasks"]

_CONTROLLER: list[Any] = []  # [threadpoolctl.ThreadpoolController | None], filled on first use


def _controller() -> Any:
    if not _CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController

            _CONTROLLER.append(ThreadpoolController())
        except Exception:  # not installed, or it cannot inspect this process: run serially
            _CONTROLLER.append(None)
    return _CONTROLLER[0]


def default_workers() -> int:
    """Usable cores (``OPSTRATA_NUM_THREADS`` overrides), or 1 when BLAS cannot be pinned."""
    env = os.environ.get("OPSTRATA_NUM_THREADS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(
                f"OPSTRATA_NUM_THREADS: expected an int >= 1, got {env!r}. Fix: unset it or set e.g. 2"
            )
        return int(env)
    if _controller() is None:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1)


def check_workers(op: str, workers: int | None) -> int:
    """``workers`` validated, or :func:`default_workers` for None."""
    if workers is None:
        return default_workers()
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise OpError(op, "workers", "an int >= 1 (or None for one per core)", repr(workers))
    return workers


@contextmanager
def _one_blas_thread() -> Iterator[None]:
    ctl = _controller()
    if ctl is None:
        yield
        return
    with ctl.limit(limits=1, user_api="blas"):
        yield


def run_tasks(tasks: Sequence[Callable[[], None]], workers: int) -> None:
    """Run ``tasks`` (independent, writing disjoint outputs) on up to ``workers`` threads."""
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            task()
        return
    with _one_blas_thread(), ThreadPoolExecutor(min(workers, len(tasks))) as pool:
        for fut in [pool.submit(task) for task in tasks]:
            fut.result()  # re-raises a task's exception here
