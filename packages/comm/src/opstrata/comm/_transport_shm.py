"""Shared-memory transport: one segment per rank holding a ring of slots per sender, with sequence counters.

Layout of rank r's segment: a 64-byte header (pid, abort code, failing rank, reporter) then, for each sender
j, a channel: write counter (bumped by j), read counter (bumped by r) on separate cache lines, and
``nslots`` slots of ``slot`` bytes. A sender copies a chunk into the next free slot of the receiver's
segment; the receiver reduces straight out of that slot into its buffer (no staging copy). Segments are
unlinked as soon as every rank has mapped them, so a killed rank leaks nothing in /dev/shm.

Waiting: a rank with nothing to move spins briefly, then raises its "sleeping" flag and blocks in select()
on a datagram socket in Linux's abstract namespace (nothing on disk to leak); a peer that publishes a chunk
or frees a slot sends it one byte when the flag is up. Blocking instead of polling leaves the cores to the
ranks that have work, which matters most when ranks outnumber cores. A short select timeout bounds the
cost of a wake-up lost to the flag/counter race, and keeps the liveness checks running.
"""

from __future__ import annotations

import _posixshmem  # the POSIX shm_open/shm_unlink binding behind multiprocessing.shared_memory
import contextlib
import os
import select
import socket
import sys
import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from ._store import Store
from ._transport import Op, Transport

_HDR = 64
_CH_HDR = 128
_SLEEPING = 4  # header word: 1 while this rank blocks on its wake-up socket
_SPINS = 64  # idle rounds of sched_yield before blocking
_BLOCK_S = 0.002  # longest block between re-checks (lost wake-up, liveness)


def _open(name: str, size: int = 0) -> shared_memory.SharedMemory:
    """Create (size > 0) or attach a segment without multiprocessing's resource tracker.

    We unlink segments ourselves, right after every rank mapped them; the tracker (shared by spawned
    children) would otherwise unlink a peer's segment at our exit or complain about unknown names.
    """
    register = resource_tracker.register
    resource_tracker.register = lambda *a, **k: None  # type: ignore[assignment]
    try:
        return shared_memory.SharedMemory(name=name, create=size > 0, size=size)
    finally:
        resource_tracker.register = register  # type: ignore[assignment]


def _unlink(name: str) -> None:
    """shm_unlink without the tracker bookkeeping of SharedMemory.unlink."""
    with contextlib.suppress(FileNotFoundError):
        _posixshmem.shm_unlink("/" + name.lstrip("/"))


class ShmTransport(Transport):
    """Transport over POSIX shared memory between processes of one host."""

    name = "shm"

    def __init__(
        self,
        rank: int,
        size: int,
        store: Store,
        *,
        pids: list[int],
        hosts: list[str],
        prefix: str,
        timeout: float,
        slot: int | None = None,
        nslots: int = 4,
    ) -> None:
        super().__init__(rank, size, store, pids=pids, hosts=hosts)
        if not all(self.local):
            raise ValueError(
                f"backend 'shm' needs every rank on one host, got hosts {sorted(set(hosts))}; use backend='tcp'"
            )
        env_slot = os.environ.get("OPSTRATA_COMM_SHM_SLOT")
        slot = int(env_slot) if env_slot else (slot or (1 << 20 if size <= 4 else 1 << 18))
        self.slot, self.nslots = (slot + 63) // 64 * 64, nslots
        ch = _CH_HDR + self.nslots * self.slot
        name = f"{prefix}r{rank}"
        try:
            self._own: shared_memory.SharedMemory | None = _open(name, _HDR + size * ch)
        except FileExistsError:
            raise RuntimeError(
                f"shm: segment /dev/shm/{name} already exists; a previous job with the same job id left it "
                f"behind. Remove it (rm /dev/shm/{prefix}*) or set a fresh OPSTRATA_COMM_JOB_ID"
            ) from None
        self._unlinked = False
        self._maps: dict[int, shared_memory.SharedMemory] = {}
        self._wake_addr = [f"\0{prefix}r{j}w".encode() for j in range(size)]
        self._wake: socket.socket | None = None
        if sys.platform.startswith("linux"):  # abstract socket names are Linux-only; elsewhere: poll
            self._wake = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                self._wake.bind(self._wake_addr[rank])
                self._wake.setblocking(False)
            except OSError:
                self._wake.close()
                self._wake = None
        try:
            self._setup(name, ch, timeout)
        except BaseException:
            self.close()
            raise

    def _setup(self, name: str, ch: int, timeout: float) -> None:
        own = self._own
        assert own is not None
        self._hdr = np.frombuffer(own.buf, np.int64, 8, 0)
        self._hdr[0] = os.getpid()
        self.store.set(f"shm/{self.rank}", name.encode())
        for j in range(self.size):
            if j != self.rank:
                peer = self.store.get(
                    f"shm/{j}", timeout, what=f"shm setup (rank {self.rank} waits for rank {j})"
                )
                shm = _open(peer.decode())
                self._maps[j] = shm
        self.store.add("shm_attached", 1)
        self.store.wait_count("shm_attached", self.size, timeout, what=f"shm setup on rank {self.rank}")
        _unlink(name)  # every rank has mapped it: nothing can leak from here on
        self._unlinked = True
        self._in_w, self._in_r, self._in_d = {}, {}, {}
        self._out_w, self._out_r, self._out_d = {}, {}, {}
        self._peer_hdr = {}
        for j, shm in self._maps.items():
            base = _HDR + j * ch  # channel j->me in my segment
            self._in_w[j] = np.frombuffer(own.buf, np.int64, 1, base)
            self._in_r[j] = np.frombuffer(own.buf, np.int64, 1, base + 64)
            self._in_d[j] = np.frombuffer(own.buf, np.uint8, self.nslots * self.slot, base + _CH_HDR)
            base = _HDR + self.rank * ch  # channel me->j in j's segment
            self._out_w[j] = np.frombuffer(shm.buf, np.int64, 1, base)
            self._out_r[j] = np.frombuffer(shm.buf, np.int64, 1, base + 64)
            self._out_d[j] = np.frombuffer(shm.buf, np.uint8, self.nslots * self.slot, base + _CH_HDR)
            self._peer_hdr[j] = np.frombuffer(shm.buf, np.int64, 8, 0)

    def _progress(self, ops: list[Op]) -> bool:
        moved = False
        S, K = self.slot, self.nslots
        touched = []
        for o in ops:
            n = o.data.nbytes
            if o.off >= n:
                continue
            before = o.off
            if o.send:
                w, r, d = self._out_w[o.peer], self._out_r[o.peer], self._out_d[o.peer]
                wv = int(w[0])
                while o.off < n and wv - int(r[0]) < K:
                    k = min(S, n - o.off)
                    s = (wv % K) * S
                    d[s : s + k] = o.data[o.off : o.off + k]
                    o.off += k
                    wv += 1
                    w[0] = wv  # publish after the copy (x86 stores are ordered)
                    moved = True
            else:
                w, r, d = self._in_w[o.peer], self._in_r[o.peer], self._in_d[o.peer]
                rv = int(r[0])
                while o.off < n and int(w[0]) > rv:
                    k = min(S, n - o.off)
                    s = (rv % K) * S
                    if o.fn is None:
                        o.data[o.off : o.off + k] = d[s : s + k]
                    else:
                        isz = o.typed.itemsize
                        o.fn(o.typed[o.off // isz : (o.off + k) // isz], d[s : s + k].view(o.typed.dtype))
                    o.off += k
                    rv += 1
                    r[0] = rv
                    moved = True
            if o.off != before:
                touched.append(o.peer)
        for p in touched:  # wake peers blocked waiting for this chunk or for this free slot
            if self._peer_hdr[p][_SLEEPING]:
                self._wake_peer(p)
        return moved

    def _wake_peer(self, peer: int) -> None:
        if self._wake is not None:
            with contextlib.suppress(OSError):  # full queue (already woken) or peer gone
                self._wake.sendto(b"w", self._wake_addr[peer])

    def _idle(self, ops: list[Op], spins: int) -> None:
        if spins < _SPINS or self._wake is None:
            time.sleep(0 if spins < _SPINS else min(1e-3, 2e-5 * 2 ** min(spins - _SPINS, 6)))
            return
        self._hdr[_SLEEPING] = 1
        try:
            if self._progress(ops):  # a chunk arrived between the last check and raising the flag
                return
            with contextlib.suppress(OSError, ValueError):
                select.select([self._wake], [], [], _BLOCK_S)
            with contextlib.suppress(OSError):
                while self._wake.recv(64):
                    pass
        finally:
            self._hdr[_SLEEPING] = 0

    def _read_abort(self, force: bool = False) -> tuple[int, int, int] | None:
        if self._own is None or int(self._hdr[1]) == 0:
            return None
        return int(self._hdr[1]), int(self._hdr[2]) - 1, int(self._hdr[3]) - 1

    def _write_abort(self, code: int, origin: int) -> None:
        for h in [*self._peer_hdr.values()]:
            if int(h[1]) == 0:
                h[2], h[3] = origin + 1, self.rank + 1
                h[1] = code

    def close(self) -> None:
        """Drop the mappings; unlink this rank's segment if setup did not get that far."""
        own, self._own = self._own, None
        for attr in ("_hdr", "_in_w", "_in_r", "_in_d", "_out_w", "_out_r", "_out_d", "_peer_hdr"):
            self.__dict__.pop(attr, None)
        if own is not None and not self._unlinked:
            _unlink(own.name)
            self._unlinked = True
        if self._wake is not None:
            self._wake.close()
            self._wake = None
        for shm in [own, *self._maps.values()]:
            if shm is not None:
                with contextlib.suppress(BufferError, OSError):
                    shm.close()
        self._maps = {}
