"""TCP transport: a full mesh of non-blocking sockets between the ranks of a group, progressed with select.

Rank r connects to every lower rank and accepts every higher one (a 8-byte handshake names the group and
rank). A closed socket (a killed peer) surfaces at once as ``CommPeerError``.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time

import numpy as np

from ._errors import CommError, CommPeerError, CommTimeoutError
from ._store import Store
from ._transport import Op, Transport

_HELLO = struct.Struct("!II")
_CHUNK = 1 << 20  # bytes per socket call / staged reduction


def _local_ip(master: str) -> str:
    """The address of the interface that routes to ``master`` (no packet is sent)."""
    if master in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


class TcpTransport(Transport):
    """Transport over TCP sockets (works across hosts)."""

    name = "tcp"

    def __init__(
        self,
        rank: int,
        size: int,
        store: Store,
        *,
        pids: list[int],
        hosts: list[str],
        gid: int,
        master_addr: str,
        timeout: float,
    ) -> None:
        super().__init__(rank, size, store, pids=pids, hosts=hosts)
        self.socks: dict[int, socket.socket] = {}
        self._what = "tcp"
        self._stage: dict[int, np.ndarray] = {}
        try:
            self._connect_all(gid, master_addr, timeout)
        except BaseException:
            self.close()
            raise

    def _connect_all(self, gid: int, master_addr: str, timeout: float) -> None:
        ip = _local_ip(master_addr)
        lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lst.bind(("0.0.0.0" if ip != "127.0.0.1" else ip, 0))
        lst.listen(self.size)
        self.store.set(f"tcp/{self.rank}", f"{ip}:{lst.getsockname()[1]}".encode())
        try:
            for j in range(self.rank):
                host, port = self.store.get(f"tcp/{j}", timeout, what="tcp setup").decode().rsplit(":", 1)
                self.socks[j] = self._dial(host, int(port), timeout, j)
                self.socks[j].sendall(_HELLO.pack(gid, self.rank))
            lst.settimeout(timeout)
            for _ in range(self.size - 1 - self.rank):
                try:
                    conn, _addr = lst.accept()
                except TimeoutError:
                    missing = [j for j in range(self.rank + 1, self.size) if j not in self.socks]
                    raise CommTimeoutError(
                        f"tcp setup: rank {self.rank} waited {timeout:.1f}s for ranks {missing} to connect"
                    ) from None
                conn.settimeout(timeout)
                g, peer = _HELLO.unpack(conn.recv(_HELLO.size, socket.MSG_WAITALL))
                if g != gid:
                    raise RuntimeError(
                        f"tcp setup: rank {peer} connected for group {g}, expected group {gid}"
                    )
                self.socks[peer] = conn
        finally:
            lst.close()
        for s in self.socks.values():
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
        self._by_fd = {s.fileno(): p for p, s in self.socks.items()}

    def _dial(self, host: str, port: int, timeout: float, peer: int) -> socket.socket:
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                return socket.create_connection((host, port), timeout=timeout)
            except OSError as e:  # transient: retry with backoff
                if time.monotonic() > deadline:
                    raise CommTimeoutError(
                        f"tcp setup: rank {self.rank} cannot connect to rank {peer} at {host}:{port} ({e})"
                    ) from e
                time.sleep(delay)
                delay = min(2 * delay, 0.5)

    def _peer_closed(self, o: Op, e: BaseException | None = None) -> CommError:
        # A peer that closed may itself have stopped because a third rank died: prefer that diagnosis.
        try:
            self.check_health(self._what, [o.peer], force=True)
        except CommError as first:
            return first
        err = CommPeerError(
            f"peer rank {o.peer} closed its connection while rank {self.rank} was "
            f"{'sending to' if o.send else 'receiving from'} it ({o.off}/{o.data.nbytes} B moved"
            f"{'; ' + str(e) if e else ''}); the peer died or exited. Look at rank {o.peer}'s output"
        )
        self.abort(err, origin=o.peer)
        return err

    def exchange(self, sends, recvs, *, what: str, deadline: float) -> None:
        """Record the collective's name for error messages, then exchange."""
        self._what = what
        super().exchange(sends, recvs, what=what, deadline=deadline)

    def _progress(self, ops: list[Op]) -> bool:
        moved = False
        for o in ops:
            if o.done:
                continue
            sock = self.socks[o.peer]
            try:
                if o.send:
                    while not o.done:
                        k = sock.send(o.data[o.off : o.off + _CHUNK])
                        o.off += k
                        moved = True
                elif o.fn is None:
                    while not o.done:
                        k = sock.recv_into(o.data[o.off :], min(_CHUNK, o.data.nbytes - o.off))
                        if k == 0:
                            raise self._peer_closed(o)
                        o.off += k
                        moved = True
                else:
                    moved |= self._recv_reduce(sock, o)
            except (BlockingIOError, InterruptedError):
                continue
            except CommError:
                raise
            except OSError as e:
                raise self._peer_closed(o, e) from e
        return moved

    def _recv_reduce(self, sock: socket.socket, o: Op) -> bool:
        isz = o.typed.itemsize
        stage = self._stage.get(o.peer)
        if stage is None:
            stage = self._stage[o.peer] = np.empty(_CHUNK, np.uint8)
        fill = o.extra.get("fill", 0)
        moved = False
        while not o.done:
            want = min(_CHUNK, o.data.nbytes - o.off)
            k = sock.recv_into(stage[fill:want], want - fill)
            if k == 0:
                raise self._peer_closed(o)
            moved = True
            fill += k
            o.extra["fill"] = fill
            if fill == want:
                o.fn(o.typed[o.off // isz : (o.off + want) // isz], stage[:want].view(o.typed.dtype))
                o.off += want
                fill = 0
                o.extra["fill"] = 0
        return moved

    def _idle(self, ops: list[Op], spins: int) -> None:
        rl = [self.socks[o.peer] for o in ops if not o.done and not o.send]
        wl = [self.socks[o.peer] for o in ops if not o.done and o.send]
        with contextlib.suppress(OSError, ValueError):
            select.select(rl, wl, [], 0.05)

    def close(self) -> None:
        """Close every socket."""
        for s in self.socks.values():
            with contextlib.suppress(OSError):
                s.close()
        self.socks = {}
