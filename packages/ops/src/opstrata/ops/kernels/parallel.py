"""Run a kernel's independent work items on a thread pool, with the BLAS pool pinned to one thread.

Tiled kernels (FlashAttention) issue many small matmuls; OpenBLAS splitting each of them over its
own threads costs a synchronisation per call, and on a busy machine a wait for a core per call. The
layout CPU attention kernels use instead: one BLAS thread per worker, workers over independent
tiles (numpy releases the GIL in matmul and ufunc loops, so Python threads run them in parallel).

Pinning BLAS needs ``threadpoolctl`` (a dependency, tolerated missing). Without it,
``default_workers()`` is 1 and work items run serially with BLAS left as configured. The pin is
process-wide while a kernel runs: concurrent callers may find BLAS at one thread meanwhile.

How many workers: inside ``with intra_op_threads(n)`` (what an InferenceSession sets around each run,
from its ``intra_op_num_threads``) at most ``n``; else ``OPSTRATA_NUM_THREADS``; else the usable cores.
The limit is a context variable, so it follows the caller's thread and context (a session's stream
workers run in a copy of the caller's context) and two sessions in two threads do not see each other's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from .._errors import OpError

__all__ = ["configured_threads", "default_workers", "intra_op_thread_limit", "intra_op_threads", "run_tasks"]

_INTRA_OP: ContextVar[int | None] = ContextVar("opstrata_intra_op_threads", default=None)


@contextmanager
def intra_op_threads(n: int) -> Iterator[None]:
    """Within the block, kernels that split work over threads (tiled attention, quant's int8 GEMM) use at
    most ``n``: the caller's own setting (a session's intra-op threads) beats OPSTRATA_NUM_THREADS and the
    core count. Nests; restored on exit, also when the block raises."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise OpError("intra_op_threads", "n", "an int >= 1", repr(n))
    token = _INTRA_OP.set(n)
    try:
        yield
    finally:
        _INTRA_OP.reset(token)


def intra_op_thread_limit() -> int | None:
    """The innermost :func:`intra_op_threads` limit in this context, None outside one."""
    return _INTRA_OP.get()


_CONTROLLER: list[Any] = []  # [threadpoolctl.ThreadpoolController | None], filled on first use


def _controller() -> Any:
    if not _CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController

            _CONTROLLER.append(ThreadpoolController())
        except Exception:  # not installed, or it cannot inspect this process: run serially
            _CONTROLLER.append(None)
    return _CONTROLLER[0]


def _env_threads() -> int | None:
    """``OPSTRATA_NUM_THREADS`` as an int >= 1, None when unset or empty; ValueError otherwise."""
    env = os.environ.get("OPSTRATA_NUM_THREADS", "").strip()
    if not env:
        return None
    if not env.isdigit() or int(env) < 1:
        raise ValueError(
            f"OPSTRATA_NUM_THREADS: expected an int >= 1, got {env!r}. Fix: unset it or set e.g. 2"
        )
    return int(env)


def configured_threads() -> int:
    """The :func:`intra_op_threads` limit, else ``OPSTRATA_NUM_THREADS``, else the usable cores: the
    threads a kernel that splits its own work may use (the native library's pool takes this count)."""
    limit = _INTRA_OP.get()
    if limit is not None:
        return limit
    env = _env_threads()
    if env is not None:
        return env
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1)


def default_workers() -> int:
    """:func:`configured_threads`, but 1 when BLAS cannot be pinned (Python worker threads would
    oversubscribe it) unless ``OPSTRATA_NUM_THREADS`` asks for a count outside any limit."""
    if _INTRA_OP.get() is None and _env_threads() is not None:
        return configured_threads()
    return configured_threads() if _controller() is not None else 1


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
