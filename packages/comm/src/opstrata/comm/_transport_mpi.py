"""MPI transport: the opstrata algorithms over MPI point-to-point (mpi4py), every wait a bounded Test loop.

Each process group owns a private communicator (``Idup`` of the world, or ``Create_group`` of its members).
A message is cut into ``OPSTRATA_COMM_MPI_CHUNK``-byte pieces (default 1 MiB) posted at once as ``Isend`` /
``Irecv``; a receive that reduces lands in a staging buffer and is folded piece by piece as pieces complete,
so the reduction overlaps the transfer. MPI calls block forever on a dead peer: here nothing blocks, every
request is polled with ``Test`` against the group's deadline, and a request abandoned by a timeout keeps its
buffer alive so MPI never writes into freed memory. Rank and world size come from MPI (``mpiexec -n N``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._errors import CommError, CommPeerError, CommTimeoutError
from ._store import Store
from ._transport import Op, Transport

INSTALL_HINT = (
    'pip install "opstrata-comm[mpi]" mpich (mpi4py plus the MPICH wheel, which ships mpiexec), '
    "or: pip install mpich mpi4py"
)
_NAME_BYTES = 256
_EXIT_WAIT_MIN = 30.0
_world: Any = None  # this library's private duplicate of MPI.COMM_WORLD (rendezvous, base of subgroups)


def load_mpi() -> Any:
    """Import ``mpi4py.MPI`` (which initialises MPI) or raise ImportError saying how to install it."""
    try:
        from mpi4py import MPI
    except (ImportError, OSError, RuntimeError) as e:
        raise ImportError(
            f"backend='mpi' needs mpi4py and an MPI library, and importing mpi4py.MPI failed "
            f"({type(e).__name__}: {e}); install them with: {INSTALL_HINT}; then run your script under "
            "mpiexec -n N python script.py"
        ) from e
    level = MPI.Query_thread()
    if level < MPI.THREAD_MULTIPLE:
        raise RuntimeError(
            f"backend='mpi': MPI was initialised with thread level {level}, below MPI_THREAD_MULTIPLE "
            f"({MPI.THREAD_MULTIPLE}); opstrata runs collectives on a background thread per group. Do not set "
            "mpi4py.rc.thread_level (its default is 'multiple') and do not call MPI_Init before mpi4py"
        )
    return MPI


def wait_requests(MPI: Any, reqs: Sequence[Any], deadline: float, on_timeout: str) -> None:
    """Poll ``reqs`` with Testall until all complete; CommTimeoutError(on_timeout) after ``deadline``."""
    spins = 0
    while not MPI.Request.Testall(list(reqs)):
        spins += 1
        time.sleep(0 if spins < 16 else min(1e-3, 2e-5 * 2 ** min(spins - 16, 6)))
        if time.monotonic() > deadline:
            raise CommTimeoutError(on_timeout)


def _exit_barrier(MPI: Any, timeout: float) -> None:
    """At interpreter exit, wait (bounded) until every MPI rank is exiting too.

    MPI_Finalize holds the GIL while it waits for the other ranks, so a rank 0 that finalizes early can no
    longer answer the TCP store; a rank still saying goodbye to the store would then block until its socket
    timeout. Meeting here first, in a Python-level Test loop, keeps rank 0's store responsive meanwhile.
    Bounded by the group timeout (at least 30 s); MPI_Finalize itself would wait for the others anyway.
    """
    if MPI.Is_finalized() or _world is None:
        return
    with contextlib.suppress(Exception):
        req = _world.Ibarrier()
        wait_requests(MPI, [req], time.monotonic() + max(timeout, _EXIT_WAIT_MIN), "exit")


def _world_comm(MPI: Any, timeout: float) -> Any:
    """This library's duplicate of COMM_WORLD, created once (collective over every MPI rank)."""
    global _world
    if _world is None:
        atexit.register(_exit_barrier, MPI, timeout)
        comm, req = MPI.COMM_WORLD.Idup()
        wait_requests(
            MPI,
            [req],
            time.monotonic() + timeout,
            f"init_process_group(backend='mpi'): rank {MPI.COMM_WORLD.Get_rank()} waited {timeout:.1f}s for "
            f"all {MPI.COMM_WORLD.Get_size()} MPI ranks to call init_process_group",
        )
        _world = comm
    return _world


def _route_ip(host: str) -> str:
    """The address of this host's interface that routes to ``host`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(host), 9))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def mpi_rendezvous(
    rank: int | None, world_size: int | None, init_method: str, timeout: float
) -> tuple[int, int, str]:
    """(rank, world_size, init_method) for ``init_process_group(backend='mpi')``: ranks come from MPI.

    With ``env://`` and no MASTER_ADDR/MASTER_PORT (a plain ``mpiexec`` launch), rank 0 picks a free port on
    its host and broadcasts ``tcp://host:port`` over MPI; the ranks then meet in the usual TCP store.
    """
    MPI = load_mpi()
    mpi_rank, mpi_size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    for name, given, actual in (
        ("rank", rank, mpi_rank),
        ("world_size", world_size, mpi_size),
        ("RANK", os.environ.get("RANK"), mpi_rank),
        ("WORLD_SIZE", os.environ.get("WORLD_SIZE"), mpi_size),
    ):
        if given is not None and int(given) != actual:
            where = f"the {name}= argument" if name.islower() else f"the {name} environment variable"
            raise ValueError(
                f"init_process_group(backend='mpi'): {where} says {given} but MPI reports rank {mpi_rank} of "
                f"{mpi_size}; with backend='mpi' rank and world size come from MPI. Launch with "
                "mpiexec -n N python script.py (opstrata-launch and torchrun start N separate one-rank MPI jobs), "
                "or use backend='shm'/'tcp' under opstrata-launch"
            )
    world = _world_comm(MPI, timeout)
    if init_method != "env://" or (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
        return mpi_rank, mpi_size, init_method
    mine = np.zeros(_NAME_BYTES, np.uint8)
    raw = socket.gethostname().encode()[:_NAME_BYTES]
    mine[: len(raw)] = np.frombuffer(raw, np.uint8)
    names = np.zeros((mpi_size, _NAME_BYTES), np.uint8)
    port = np.zeros(1, np.int64)
    what = f"init_process_group(backend='mpi') on rank {mpi_rank}"
    deadline = time.monotonic() + timeout
    req = world.Iallgather([mine, MPI.BYTE], [names, MPI.BYTE])
    wait_requests(MPI, [req], deadline, f"{what}: timed out gathering the host names of the MPI ranks")
    hosts = [bytes(n).rstrip(b"\0").decode(errors="replace") for n in names]
    others = [h for h in hosts if h != hosts[0]]
    addr = _route_ip(others[0]) if others else "127.0.0.1"
    if mpi_rank == 0:
        port[0] = _free_port("" if others else addr)
    req = world.Ibcast([port, MPI.INT64_T], root=0)
    wait_requests(MPI, [req], deadline, f"{what}: timed out receiving rank 0's store port")
    ip = np.zeros(_NAME_BYTES, np.uint8)
    ip[: len(addr)] = np.frombuffer(addr.encode(), np.uint8)
    req = world.Ibcast([ip, MPI.BYTE], root=0)  # rank 0's address as rank 0 sees it
    wait_requests(MPI, [req], deadline, f"{what}: timed out receiving rank 0's address")
    host = bytes(ip).rstrip(b"\0").decode()
    return mpi_rank, mpi_size, f"tcp://{host}:{int(port[0])}"


def _collective(what: str) -> str:
    """'all_reduce seq=3' out of 'all_reduce seq=3 (group 0, rank 1)': the same key on every rank."""
    return what.split(" (group")[0]


def _chunk_bytes() -> int:
    env = os.environ.get("OPSTRATA_COMM_MPI_CHUNK")
    chunk = int(env) if env else 1 << 20
    if chunk <= 0:
        raise ValueError(f"OPSTRATA_COMM_MPI_CHUNK must be a positive byte count, got {env!r}")
    return (chunk + 63) // 64 * 64


class MpiTransport(Transport):
    """Transport over MPI point-to-point messages on a communicator private to one process group."""

    name = "mpi"

    def __init__(
        self,
        rank: int,
        size: int,
        store: Store,
        *,
        pids: list[int],
        hosts: list[str],
        members: list[int],
        gid: int,
        timeout: float,
    ) -> None:
        super().__init__(rank, size, store, pids=pids, hosts=hosts)
        if _world is None:
            raise ValueError(
                "backend='mpi' for a group needs the default group initialised with backend='mpi' (under "
                "mpiexec), so that opstrata's ranks are MPI's ranks; call init_process_group('mpi') first"
            )
        self.MPI = MPI = load_mpi()
        world = _world
        if world.Get_size() <= max(members) or world.Get_rank() != members[rank]:
            raise ValueError(
                f"backend='mpi': opstrata rank {members[rank]} is MPI rank {world.Get_rank()} of "
                f"{world.Get_size()}; the default group must come from init_process_group('mpi')"
            )
        self.chunk = _chunk_bytes()
        self._stages: dict[int, np.ndarray] = {}
        self._ops: list[Op] = []
        self._orphans: list[tuple[Any, object]] = []  # (request, buffer) abandoned by a failed exchange
        self._what = "mpi"
        self._marked = ""
        what = f"mpi setup of group {gid} on rank {rank}"
        deadline = time.monotonic() + timeout
        if size == world.Get_size():
            comm, req = world.Idup()
            wait_requests(MPI, [req], deadline, f"{what}: timed out waiting for all {size} ranks")
        else:  # Create_group blocks: meet in the store first (bounded) so every member is about to call it
            store.add("mpi_ready", 1)
            store.wait_count("mpi_ready", size, timeout, what=what)
            comm = world.Create_group(world.Get_group().Incl(members), gid % 32768)
        self.comm = comm

    # -- the progress engine -------------------------------------------------------------------------------------
    def exchange(self, sends, recvs, *, what: str, deadline: float) -> None:
        """Exchange; requests still pending when it fails are abandoned with their buffers kept alive."""
        self._what = what
        try:
            super().exchange(sends, recvs, what=what, deadline=deadline)
        except BaseException:
            self._abandon(self._ops)
            raise
        finally:
            self._ops = []

    def _post(self, o: Op, used: set[int]) -> None:
        MPI, n, step = self.MPI, o.data.nbytes, self.chunk
        buf = o.data
        if not o.send and o.fn is not None:  # reduce: land in a staging buffer, fold piece by piece
            stage = self._stages.get(o.peer)
            if stage is None or stage.nbytes < n or o.peer in used:
                stage = np.empty(n, np.uint8)
                if o.peer not in used:
                    self._stages[o.peer] = stage
            used.add(o.peer)
            buf = o.extra["stage"] = stage
        call = self.comm.Isend if o.send else self.comm.Irecv
        o.extra["reqs"] = [
            call([buf[lo : min(lo + step, n)], MPI.BYTE], o.peer, 0) for lo in range(0, n, step)
        ]
        o.extra["i"] = 0

    def _progress(self, ops: list[Op]) -> bool:
        if ops is not self._ops:
            self._ops = ops
            used: set[int] = set()
            for o in ops:
                if not o.done:
                    self._post(o, used)
        moved = False
        for o in ops:
            if o.done:
                continue
            reqs, i, n = o.extra["reqs"], o.extra["i"], o.data.nbytes
            while i < len(reqs) and self._test(reqs[i], o):
                hi = min((i + 1) * self.chunk, n)
                if not o.send and o.fn is not None:
                    isz = o.typed.itemsize
                    o.fn(o.typed[o.off // isz : hi // isz], o.extra["stage"][o.off : hi].view(o.typed.dtype))
                o.off = hi
                i += 1
                moved = True
            o.extra["i"] = i
        return moved

    def _test(self, req: Any, o: Op) -> bool:
        try:
            return req.Test()
        except self.MPI.Exception as e:
            raise self._failed(
                self._what, [o.peer], e, f"{'sending to' if o.send else 'receiving from'} peer rank {o.peer}"
            ) from e

    def _failed(self, what: str, peers: list[int], e: BaseException, doing: str) -> CommError:
        """The CommError for an MPI error: a dead peer's diagnosis when there is one, else CommPeerError."""
        try:
            self.check_health(what, peers, force=True)
        except CommError as first:
            return first
        err = CommPeerError(
            f"{what}: MPI failed while rank {self.rank} was {doing} ({str(e).strip()}); a peer probably died "
            f"or exited. Look at the output of ranks {peers}"
        )
        self.abort(err, origin=peers[0] if len(peers) == 1 else self.rank)
        return err

    def _abandon(self, ops: list[Op]) -> None:
        for o in ops:
            reqs = o.extra.get("reqs", [])
            pending = [r for r in reqs[o.extra.get("i", 0) :] if r != self.MPI.REQUEST_NULL]
            if not pending:
                continue
            buf = o.extra.get("stage", o.data)
            if buf is self._stages.get(o.peer):
                del self._stages[o.peer]  # MPI may still write into it: never hand it out again
            for r in pending:
                self.abandon(r, buf)

    def abandon(self, req: Any, buf: object) -> None:
        """Give up on ``req``: try to cancel it (MPI cannot cancel a collective), keep ``buf`` alive for good."""
        with contextlib.suppress(Exception):
            req.Cancel()
        self._orphans.append((req, buf))

    def wait(self, reqs: Sequence[Any], bufs: object, *, what: str, deadline: float, call: str) -> None:
        """Wait for native collective requests with the group's deadline and liveness checks."""
        if self.aborted is not None:
            raise type(self.aborted)(f"{what}: the group was aborted earlier: {self.aborted}")
        spins, last_check = 0, time.monotonic()
        peers = [p for p in range(self.size) if p != self.rank]
        try:
            while not self._testall(reqs, what, peers, call):
                spins += 1
                time.sleep(0 if spins < 16 else min(1e-3, 2e-5 * 2 ** min(spins - 16, 6)))
                now = time.monotonic()
                if now - last_check >= 0.2:
                    last_check = now
                    self.check_health(what, peers)
                if now > deadline:
                    absent = self._absent(what, peers)
                    who = (
                        f"peer ranks {absent}, which never reached this collective"
                        if absent
                        else f"peer ranks {peers} (all reached this collective; MPI does not say which is stuck)"
                    )
                    raise CommTimeoutError(
                        f"{what}: rank {self.rank} timed out in MPI's native {call} waiting on {who}; a peer is "
                        "slow, stuck in other code or calling a different collective. Raise timeout= / "
                        "OPSTRATA_COMM_TIMEOUT if it is just slow"
                    )
        except BaseException:
            for r in reqs:
                self.abandon(r, bufs)
            raise

    def check_health(self, what: str, waiting_on: Sequence[int], force: bool = False) -> None:
        """Also mark, once per collective that blocks this long, that this rank reached it (see _absent)."""
        if what != self._marked:
            self._marked = what
            with contextlib.suppress(CommError, OSError):
                self.store.set(f"reached/{_collective(what)}/{self.rank}", b"1")
        super().check_health(what, waiting_on, force)

    def _absent(self, what: str, peers: list[int]) -> list[int]:
        """Peers with no mark for this collective: MPI's native calls cannot name the rank they wait for."""
        try:
            return [p for p in peers if self.store.try_get(f"reached/{_collective(what)}/{p}") is None]
        except (CommError, OSError):
            return []

    def _testall(self, reqs: Sequence[Any], what: str, peers: list[int], call: str) -> bool:
        try:
            return self.MPI.Request.Testall(list(reqs))
        except self.MPI.Exception as e:
            raise self._failed(what, peers, e, f"in MPI's native {call}") from e

    def close(self) -> None:
        """Free the communicator (kept when abandoned requests may still use it)."""
        comm, self.comm = getattr(self, "comm", None), None
        if comm is not None and not self._orphans and self.aborted is None:
            with contextlib.suppress(Exception):
                comm.Free()
        self._stages = {}
