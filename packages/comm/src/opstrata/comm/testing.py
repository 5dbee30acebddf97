"""Test helpers: run a function on N real ranks (spawned processes) with a hard timeout."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def free_port() -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RankResult:
    """What one rank returned (``value``) or raised (``error``), and its exit code."""

    rank: int
    ok: bool
    value: Any = None
    error: str = ""
    exitcode: int | None = None


def _entry(
    fn: Callable[..., Any],
    rank: int,
    world: int,
    backend: str | None,
    init_method: str,
    comm_timeout: float,
    env: dict[str, str],
    q: Any,
    args: tuple,
) -> None:
    os.environ.update(env)
    from opstrata import comm

    try:
        if backend is not None:
            comm.init_process_group(
                backend, rank=rank, world_size=world, init_method=init_method, timeout=comm_timeout
            )
        value = fn(rank, world, *args)
        q.put((rank, True, value, ""))
    except BaseException as e:  # reported to the parent
        q.put((rank, False, None, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        if backend is not None:
            with contextlib.suppress(Exception):
                comm.destroy_process_group()


def run_ranks(
    fn: Callable[..., Any],
    world: int,
    *,
    backend: str | None = "shm",
    args: tuple = (),
    timeout: float = 90.0,
    comm_timeout: float = 30.0,
    init_method: str | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> list[RankResult]:
    """Run ``fn(rank, world, *args)`` in ``world`` spawned processes after init_process_group(backend).

    ``check`` raises AssertionError with every failing rank's traceback; otherwise results are returned.
    """
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    tmp = None
    if init_method is None:
        init_method = f"tcp://127.0.0.1:{free_port()}"
    elif init_method == "file":
        tmp = tempfile.mkdtemp(prefix="opstrata-comm-")
        init_method = f"file://{tmp}"
    env = {"OPSTRATA_COMM_JOB_ID": f"t{os.getpid()}x{time.monotonic_ns() % 10**9}", **(env or {})}
    procs = [
        ctx.Process(
            target=_entry, args=(fn, r, world, backend, init_method, comm_timeout, env, q, args), daemon=True
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    got: dict[int, RankResult] = {}
    deadline = time.monotonic() + timeout
    while len(got) < world and time.monotonic() < deadline:
        try:
            rank, ok, value, err = q.get(timeout=0.1)
            got[rank] = RankResult(rank, ok, value, err)
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and q.empty():
                break
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)
    results = []
    for r, p in enumerate(procs):
        res = got.get(r) or RankResult(r, False, error=f"rank {r} reported nothing (exit code {p.exitcode})")
        res.exitcode = p.exitcode
        results.append(res)
    if check:
        bad = [x for x in results if not x.ok]
        if bad:
            raise AssertionError("\n".join(f"--- rank {x.rank} (exit {x.exitcode}):\n{x.error}" for x in bad))
    return results


def shm_leftovers(job_id: str) -> list[str]:
    """Segments of ``job_id`` still present in /dev/shm."""
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"opst_{job_id}"))
    except FileNotFoundError:
        return []
