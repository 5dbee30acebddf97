"""The transport interface every algorithm runs on: ``exchange`` progresses sends and receives together.

A transport moves raw bytes between ranks of one group, in FIFO order per (sender, receiver) pair. The
progress loop shared here polls with a short backoff, checks peer liveness every few hundred ms, and turns
every wait into a bounded one (``CommTimeoutError`` / ``CommPeerError``, never a silent hang).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ._errors import ABORT_CODES, CODE_OF, CommError, CommPeerError, CommTimeoutError
from ._heartbeat import Heartbeat
from ._store import Store

#: ``fn(out, incoming)`` reduces ``incoming`` into ``out`` in place; None means copy.
ReduceFn = Callable[[np.ndarray, np.ndarray], object]
Send = tuple[int, np.ndarray]
Recv = tuple[int, np.ndarray, "ReduceFn | None"]

_HEALTH_EVERY = 0.2  # seconds between liveness checks while blocked


def pid_alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie (a killed child its parent has not reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] not in (b"Z", b"X")
    except (OSError, ValueError):
        return True


@dataclass
class Op:
    """One pending send or receive of an exchange."""

    peer: int
    data: np.ndarray  # uint8 view of the bytes
    typed: np.ndarray  # the same memory in its dtype (receives reduce through it)
    fn: ReduceFn | None = None
    send: bool = True
    off: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """All bytes moved."""
        return self.off >= self.data.nbytes


def _as_bytes(a: np.ndarray) -> np.ndarray:
    if not a.flags.c_contiguous:
        raise ValueError("transport: buffers must be C-contiguous (np.ascontiguousarray(x))")
    return a.reshape(-1).view(np.uint8)


#: longest the abort path waits to leave its explanation in the store before raising the flags
ABORT_MSG_BOUND_S = 5.0


class Transport:
    """Moves bytes between the ranks ``0..size-1`` of one group."""

    name = "base"

    def __init__(self, rank: int, size: int, store: Store, *, pids: list[int], hosts: list[str]) -> None:
        self.rank, self.size, self.store = rank, size, store
        self.pids, self.hosts = pids, hosts
        self.local = [h == hosts[rank] for h in hosts]
        self._last_store_poll = 0.0
        self.aborted: CommError | None = None
        self.heartbeat: Heartbeat | None = None  # set by the ProcessGroup; checked while blocked

    # -- subclass hooks -------------------------------------------------------------------------------------
    def _progress(self, ops: list[Op]) -> bool:
        raise NotImplementedError

    def _idle(self, ops: list[Op], spins: int) -> None:
        time.sleep(0 if spins < 16 else min(1e-3, 2e-5 * 2 ** min(spins - 16, 6)))

    def _read_abort(self, force: bool = False) -> tuple[int, int, int] | None:
        """(code, origin, reporter) when another rank aborted the group."""
        now = time.monotonic()
        if now - self._last_store_poll < 1.0 and not force:
            return None
        self._last_store_poll = now
        try:
            with self._store_bound():
                raw = self.store.try_get("abort")
        except CommError:
            return None
        if raw is None:
            return None
        code, origin, reporter = (int(v) for v in raw.split(b"|")[:3])
        return code, origin, reporter

    def _write_abort(self, code: int, origin: int) -> None:
        return None

    def close(self) -> None:
        """Release sockets / shared memory."""

    # -- shared machinery -----------------------------------------------------------------------------------
    def exchange(self, sends: Sequence[Send], recvs: Sequence[Recv], *, what: str, deadline: float) -> None:
        """Send and receive concurrently; each receive copies (fn None) or reduces into its buffer."""
        if self.aborted is not None:
            raise type(self.aborted)(f"{what}: the group was aborted earlier: {self.aborted}")
        ops = [Op(p, _as_bytes(a), a.reshape(-1), None, True) for p, a in sends]
        ops += [Op(p, _as_bytes(a), a.reshape(-1), fn, False) for p, a, fn in recvs]
        spins = 0
        last_check = time.monotonic()
        while True:
            if self._progress(ops):
                spins = 0
                if all(o.done for o in ops):
                    return
                continue
            if all(o.done for o in ops):
                return
            spins += 1
            self._idle(ops, spins)
            now = time.monotonic()
            if now - last_check >= _HEALTH_EVERY:
                last_check = now
                self.check_health(what, [o.peer for o in ops if not o.done])
            if now > deadline:
                pend = [o for o in ops if not o.done]
                o = pend[0]
                direction = f"sending {o.data.nbytes} B to" if o.send else f"receiving {o.data.nbytes} B from"
                raise CommTimeoutError(
                    f"{what}: rank {self.rank} timed out {direction} peer rank {o.peer} "
                    f"({o.off}/{o.data.nbytes} B moved; pending peers {sorted({p.peer for p in pend})}); "
                    "the peer is slow, stuck in other code or calling a different collective. "
                    "Raise timeout= / OPSTRATA_COMM_TIMEOUT if it is just slow"
                )

    def _store_bound(self, without_heartbeat: float | None = None) -> contextlib.AbstractContextManager[None]:
        """Store requests of health checks and aborts: bounded by half the heartbeat timeout when it runs,
        so a frozen store host (rank 0) cannot stall them for the whole store timeout; without a heartbeat
        by ``without_heartbeat`` seconds (None: unbounded)."""
        if self.heartbeat is not None:
            return self.store.bounded(self.heartbeat.timeout / 2)
        if without_heartbeat is not None:
            return self.store.bounded(without_heartbeat)
        return contextlib.nullcontext()

    def check_heartbeat(self, what: str, waiting_on: Sequence[int]) -> None:
        """Raise ``CommPeerError`` (and abort the group) when a peer's heartbeat has been silent too long."""
        if self.heartbeat is not None and self.aborted is None:
            hb = self.heartbeat
            quiet = hb.silent()
            store_quiet = hb.store_quiet()
            if store_quiet > hb.timeout or (quiet is not None and store_quiet > 2 * hb.interval + 0.5):
                err = CommPeerError(
                    f"{what}: the store (hosted by rank 0 of the job) has not answered rank {self.rank}'s "
                    f"heartbeat for {store_quiet:.1f}s (limit OPSTRATA_COMM_HEARTBEAT_TIMEOUT={hb.timeout:g}s); "
                    f"rank {self.rank} was waiting on ranks {sorted(set(waiting_on))}. Rank 0 is frozen "
                    "(stopped, swapped out) or its host is unreachable: check rank 0's process and host"
                )
                self.abort(err, origin=0)
                raise err
            if quiet is not None:
                peer, secs = quiet
                err = CommPeerError(
                    f"{what}: peer rank {peer} sent no heartbeat for {secs:.1f}s (limit "
                    f"OPSTRATA_COMM_HEARTBEAT_TIMEOUT={self.heartbeat.timeout:g}s); rank {self.rank} was waiting "
                    f"on ranks {sorted(set(waiting_on))}. The peer is frozen (stopped, swapped out, holding the "
                    "GIL) or its host died without closing its sockets: check rank "
                    f"{peer}'s process and host, or raise OPSTRATA_COMM_HEARTBEAT_TIMEOUT if it is just busy"
                )
                self.abort(err, origin=peer)
                raise err

    def check_health(self, what: str, waiting_on: Sequence[int], force: bool = False) -> None:
        """Raise when another rank aborted the group, a peer's heartbeat stopped or a local peer process vanished."""
        self.check_heartbeat(what, waiting_on)
        got = self._read_abort(force)
        if got is not None:
            code, origin, reporter = got
            cls = ABORT_CODES.get(code, CommPeerError)
            detail = ""
            try:
                with self._store_bound():
                    raw = self.store.try_get("abort_msg") if reporter != self.rank else None
            except CommError:
                raw = None
            if raw:
                detail = ": " + raw.decode(errors="replace")
            self.aborted = cls(
                f"{what}: rank {self.rank} stops because rank {reporter} aborted the group "
                f"(failing rank {origin}){detail}"
            )
            raise self.aborted
        for peer in range(self.size):
            if peer != self.rank and self.local[peer] and not pid_alive(self.pids[peer]):
                err = CommPeerError(
                    f"{what}: peer rank {peer} (pid {self.pids[peer]}) died; rank {self.rank} was waiting on "
                    f"ranks {sorted(set(waiting_on))}. Look at rank {peer}'s output for its error"
                )
                self.abort(err, origin=peer)
                raise err

    def abort(self, err: CommError, origin: int) -> None:
        """Tell the other ranks this group failed (best effort: shared memory and the store)."""
        if self.aborted is not None:
            return
        self.aborted = err
        code = CODE_OF.get(type(err), 1)
        # the explanation goes to the store before any flag: a peer that sees the shared-memory flag at once
        # must find the message when it reads it; bounded even without a heartbeat, so the flag below never
        # waits long on a frozen store host
        try:
            with self._store_bound(ABORT_MSG_BOUND_S):
                self.store.set("abort_msg", str(err).encode())
        except (CommError, OSError):
            pass
        self._write_abort(code, origin)
        try:
            with self._store_bound():
                self.store.set("abort", f"{code}|{origin}|{self.rank}".encode())
        except (CommError, OSError):
            pass
