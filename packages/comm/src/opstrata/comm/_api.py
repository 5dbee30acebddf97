"""The torch.distributed-shaped module API: init/destroy, ranks, groups, and the collective functions."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import time
import uuid
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import numpy as np

from . import _tensor_parallel
from ._errors import CommError
from ._group import NON_GROUP_MEMBER, ProcessGroup
from ._group_mpi import MpiProcessGroup
from ._store import FileStore, PrefixStore, Store, TCPStore
from ._transport import Transport
from ._transport_mpi import MpiTransport, mpi_rendezvous
from ._transport_shm import ShmTransport
from ._transport_tcp import TcpTransport
from ._work import Work

BACKENDS = ("shm", "tcp", "mpi")
DEFAULT_TIMEOUT = 300.0
log = logging.getLogger("opstrata.comm")


class _State:
    def __init__(self) -> None:
        self.default: ProcessGroup | None = None
        self.groups: list[ProcessGroup] = []
        self.store: Store | None = None
        self.rank = -1
        self.world = 0
        self.next_gid = 1
        self.job = ""
        self.pids: list[int] = []
        self.hosts: list[str] = []
        self.backend = ""
        self.master_addr = "127.0.0.1"
        self.timeout = DEFAULT_TIMEOUT


_S = _State()


def _seconds(timeout: float | timedelta | None) -> float:
    if timeout is None:
        env = os.environ.get("OPSTRATA_COMM_TIMEOUT")
        return float(env) if env else DEFAULT_TIMEOUT
    t = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if t <= 0:
        raise ValueError(f"init_process_group: timeout must be positive, got {t}")
    return t


def _env_int(name: str, given: int | None) -> int:
    if given is not None:
        return int(given)
    raw = os.environ.get(name)
    if raw is None:
        raise ValueError(
            f"init_process_group: {name} is not set; pass it as an argument or launch with "
            "opstrata-launch / torchrun, which set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
        )
    return int(raw)


def _setup_debug_logging() -> None:
    if os.environ.get("OPSTRATA_COMM_DEBUG", "") not in ("", "0") and not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(h)
        log.setLevel(logging.DEBUG)


def init_process_group(
    backend: str = "shm",
    *,
    rank: int | None = None,
    world_size: int | None = None,
    init_method: str = "env://",
    timeout: float | timedelta | None = None,
    deterministic: bool = False,
) -> None:
    """Join the default process group (torch.distributed.init_process_group's shape).

    ``init_method`` is ``env://`` (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), ``tcp://host:port`` or
    ``file://path`` (a directory shared by the ranks, fresh per job). ``timeout`` bounds every wait.
    ``backend="mpi"`` takes rank and world size from MPI (run under ``mpiexec -n N``).
    """
    if _S.default is not None:
        raise RuntimeError("init_process_group: already initialised; call destroy_process_group() first")
    if backend not in BACKENDS:
        raise ValueError(f"init_process_group: unknown backend {backend!r}; expected one of {BACKENDS}")
    _setup_debug_logging()
    t = _seconds(timeout)
    if backend == "mpi":  # rank and world size from MPI (mpiexec); rank 0 may pick the store's address
        rank, world_size, init_method = mpi_rendezvous(rank, world_size, init_method, t)
    rank, world = _env_int("RANK", rank), _env_int("WORLD_SIZE", world_size)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(
            f"init_process_group: need 0 <= rank < world_size, got rank={rank} world_size={world}"
        )
    url = urlparse(init_method)
    if url.scheme == "env":
        addr = os.environ.get("MASTER_ADDR")
        port = os.environ.get("MASTER_PORT")
        if not addr or not port:
            raise ValueError(
                "init_process_group(init_method='env://'): MASTER_ADDR and MASTER_PORT must be set "
                f"(got {addr!r}, {port!r}); use opstrata-launch or set them to rank 0's host and a free port"
            )
        store: Store = TCPStore(addr, int(port), is_master=rank == 0, timeout=t)
    elif url.scheme == "tcp":
        if not url.hostname or not url.port:
            raise ValueError(
                f"init_process_group: init_method {init_method!r} must look like tcp://host:port"
            )
        addr = url.hostname
        store = TCPStore(addr, url.port, is_master=rank == 0, timeout=t)
    elif url.scheme == "file":
        addr = "127.0.0.1"
        store = FileStore(url.path, timeout=t)
    else:
        raise ValueError(
            f"init_process_group: init_method {init_method!r}: expected env://, tcp://host:port or file://path"
        )
    try:
        _rendezvous(store, rank, world, t)
        _S.master_addr, _S.backend, _S.timeout = addr, backend, t
        transport = _make_transport(backend, 0, list(range(world)), PrefixStore("g0/", store), t)
        _S.default = _group_class(backend)(
            0,
            list(range(world)),
            rank,
            transport,
            PrefixStore("g0/", store),
            backend=backend,
            timeout=t,
            deterministic=deterministic,
            job=_S.job,
        )
        _S.groups.append(_S.default)
        _tensor_parallel.install(_S.default)  # graph AllReduce nodes now reduce across these processes
    except BaseException:
        _reset(store)
        raise


def _rendezvous(store: Store, rank: int, world: int, t: float) -> None:
    _S.store, _S.rank, _S.world = store, rank, world
    if rank == 0:
        job = os.environ.get("OPSTRATA_COMM_JOB_ID") or uuid.uuid4().hex[:10]
        store.set("job_id", job.encode())
        store.set("world_size", str(world).encode())
    else:
        have = int(store.get("world_size", t, what=f"init_process_group (rank {rank})"))
        if have != world:
            raise ValueError(f"init_process_group: rank {rank} has world_size={world} but rank 0 has {have}")
    _S.job = store.get("job_id", t, what="init_process_group").decode()
    if store.add("joined", 1) > world:
        raise ValueError(
            f"init_process_group: more than world_size={world} ranks joined; make RANK unique per process, "
            "and with file:// use a fresh directory per job (this one may hold a previous job's keys)"
        )
    host = os.environ.get("OPSTRATA_COMM_HOST") or socket.gethostname()  # the override simulates hosts
    store.set(f"proc/{rank}", f"{os.getpid()}|{host}".encode())
    procs = [
        store.get(f"proc/{j}", t, what=f"init_process_group (rank {rank} waits for rank {j})")
        for j in range(world)
    ]
    _S.pids = [int(p.split(b"|")[0]) for p in procs]
    _S.hosts = [p.split(b"|", 1)[1].decode() for p in procs]


def _make_transport(backend: str, gid: int, ranks: list[int], store: Store, t: float) -> Transport:
    r = ranks.index(_S.rank)
    pids, hosts = [_S.pids[j] for j in ranks], [_S.hosts[j] for j in ranks]
    if backend == "shm":
        return ShmTransport(
            r, len(ranks), store, pids=pids, hosts=hosts, prefix=f"opst_{_S.job}_g{gid}", timeout=t
        )
    if backend == "mpi":
        return MpiTransport(r, len(ranks), store, pids=pids, hosts=hosts, members=ranks, gid=gid, timeout=t)
    return TcpTransport(
        r, len(ranks), store, pids=pids, hosts=hosts, gid=gid, master_addr=_S.master_addr, timeout=t
    )


def _group_class(backend: str) -> type[ProcessGroup]:
    return MpiProcessGroup if backend == "mpi" else ProcessGroup


def _reset(store: Store | None) -> None:
    _tensor_parallel.uninstall()
    for g in _S.groups:
        with contextlib.suppress(Exception):
            g.close()
    if store is not None:
        with contextlib.suppress(Exception):
            store.close()
    _S.__init__()  # type: ignore[misc]


def _default(what: str) -> ProcessGroup:
    if _S.default is None:
        raise RuntimeError(
            f"{what}: the default process group is not initialised; call init_process_group() first"
        )
    return _S.default


def _group(group: Any, what: str) -> ProcessGroup:
    if group is None:
        return _default(what)
    if group is NON_GROUP_MEMBER:
        raise ValueError(
            f"{what}: this rank is not a member of the group (new_group returned NON_GROUP_MEMBER)"
        )
    if not isinstance(group, ProcessGroup):
        raise TypeError(
            f"{what}: group must be a ProcessGroup from new_group() or None, got {type(group).__name__}"
        )
    return group


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Tear down ``group`` (or everything, with the default group): stop workers, close transports."""
    if group is not None and group is not _S.default:
        _tensor_parallel.forget(group)
        group.close()
        if group in _S.groups:
            _S.groups.remove(group)
        return
    if _S.default is None:
        return
    store, world, rank = _S.store, _S.world, _S.rank
    aborted = any(g.transport.aborted is not None for g in _S.groups)
    for g in _S.groups:
        with contextlib.suppress(Exception):
            g.close()
    if store is not None and not aborted and world > 1:
        # rank 0 hosts the store: keep it up until every rank said goodbye (bounded).
        with contextlib.suppress(CommError, OSError):
            store.add("destroyed", 1)
            if rank == 0 and isinstance(store, TCPStore):
                deadline = time.monotonic() + 5.0
                while int(store.try_get("destroyed") or b"0") < world and time.monotonic() < deadline:
                    time.sleep(0.005)
    _reset(store)


def is_initialized() -> bool:
    """True between init_process_group and destroy_process_group."""
    return _S.default is not None


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank in ``group`` (default: the world); -1 when not a member."""
    if group is NON_GROUP_MEMBER:
        return -1
    return _group(group, "get_rank").rank


def get_world_size(group: ProcessGroup | None = None) -> int:
    """Number of ranks in ``group`` (default: the world)."""
    return _group(group, "get_world_size").size


def get_backend(group: ProcessGroup | None = None) -> str:
    """The transport name of ``group``."""
    return _group(group, "get_backend").backend


def new_group(
    ranks: list[int] | None = None,
    *,
    timeout: float | timedelta | None = None,
    backend: str | None = None,
    deterministic: bool | None = None,
) -> ProcessGroup | Any:
    """Create a subgroup; every rank of the world must call it, in the same order (torch semantics)."""
    d = _default("new_group")
    members = sorted(set(range(_S.world) if ranks is None else ranks))
    if not members or any(not 0 <= r < _S.world for r in members):
        raise ValueError(f"new_group: ranks must be a non-empty subset of 0..{_S.world - 1}, got {ranks}")
    gid = _S.next_gid
    _S.next_gid += 1
    if _S.rank not in members:
        return NON_GROUP_MEMBER
    b = backend or _S.backend
    if b not in BACKENDS:
        raise ValueError(f"new_group: unknown backend {b!r}; expected one of {BACKENDS}")
    t = _S.timeout if timeout is None else _seconds(timeout)
    assert _S.store is not None
    store = PrefixStore(f"g{gid}/", _S.store)
    transport = _make_transport(b, gid, members, store, t)
    g = _group_class(b)(
        gid,
        members,
        _S.rank,
        transport,
        store,
        backend=b,
        timeout=t,
        deterministic=d.deterministic if deterministic is None else deterministic,
        job=_S.job,
    )
    _S.groups.append(g)
    return g


def all_reduce(
    x: np.ndarray,
    op: str = "sum",
    *,
    group: ProcessGroup | None = None,
    algorithm: str | None = None,
    async_op: bool = False,
    deterministic: bool | None = None,
) -> Work | None:
    """Reduce ``x`` across ranks in place (op: sum, avg, max, min, prod).

    >>> # in each of N ranks: x = np.full(4, rank, np.float32); all_reduce(x)  # x == sum(range(N))
    """
    return _group(group, "all_reduce").all_reduce(x, op, algorithm, async_op, deterministic)


def reduce(
    x: np.ndarray,
    dst: int,
    op: str = "sum",
    *,
    group: ProcessGroup | None = None,
    algorithm: str | None = None,
    async_op: bool = False,
    deterministic: bool | None = None,
) -> Work | None:
    """Reduce ``x`` into rank ``dst``'s ``x`` (other ranks' arrays are unchanged)."""
    return _group(group, "reduce").reduce(x, dst, op, algorithm, async_op, deterministic)


def broadcast(
    x: np.ndarray,
    src: int,
    *,
    group: ProcessGroup | None = None,
    algorithm: str | None = None,
    async_op: bool = False,
) -> Work | None:
    """Overwrite ``x`` on every rank with rank ``src``'s ``x``."""
    return _group(group, "broadcast").broadcast(x, src, algorithm, async_op)


def all_gather(
    out: list[np.ndarray] | np.ndarray,
    x: np.ndarray,
    *,
    group: ProcessGroup | None = None,
    algorithm: str | None = None,
    async_op: bool = False,
) -> Work | None:
    """Fill ``out`` (list of world_size arrays, or one array of world_size * x.size) with every rank's ``x``."""
    return _group(group, "all_gather").all_gather(out, x, algorithm, async_op)


def reduce_scatter(
    out: np.ndarray,
    x: list[np.ndarray] | np.ndarray,
    op: str = "sum",
    *,
    group: ProcessGroup | None = None,
    algorithm: str | None = None,
    async_op: bool = False,
    deterministic: bool | None = None,
) -> Work | None:
    """Reduce the world_size parts of ``x`` across ranks; rank r gets reduced part r in ``out``."""
    return _group(group, "reduce_scatter").reduce_scatter(out, x, op, algorithm, async_op, deterministic)


def all_to_all(
    out: list[np.ndarray] | np.ndarray,
    x: list[np.ndarray] | np.ndarray,
    *,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Work | None:
    """Send part j of ``x`` to rank j; receive rank j's part for this rank into part j of ``out``."""
    return _group(group, "all_to_all").all_to_all(out, x, async_op)


def send(x: np.ndarray, dst: int, *, group: ProcessGroup | None = None) -> None:
    """Send ``x`` to global rank ``dst``."""
    _group(group, "send").send(x, dst)


def recv(x: np.ndarray, src: int, *, group: ProcessGroup | None = None) -> None:
    """Receive into ``x`` from global rank ``src`` (dtype and shape must match the send)."""
    _group(group, "recv").recv(x, src)


def barrier(*, group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """Wait until every rank of ``group`` reached the barrier."""
    return _group(group, "barrier").barrier(async_op)
