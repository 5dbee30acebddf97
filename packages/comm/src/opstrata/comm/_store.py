"""Rendezvous key-value stores: a TCP store hosted by rank 0 (like torch's TCPStore) and a FileStore.

Both offer ``set``, ``get`` (blocking with a timeout), ``try_get``, ``add`` and ``wait``; values are bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterable

from ._errors import CommPeerError, CommTimeoutError

_SET, _GET, _ADD, _PING = 1, 2, 3, 4
_REQ = struct.Struct(">BIQ")  # opcode, key length, value length
_REP = struct.Struct(">BQ")  # status (0 ok, 1 missing), value length


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("store connection closed")
        got += k
    return bytes(buf)


class Store:
    """Interface shared by the TCP and file stores."""

    timeout: float

    def set(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def try_get(self, key: str) -> bytes | None:
        raise NotImplementedError

    def add(self, key: str, amount: int) -> int:
        raise NotImplementedError

    def close(self) -> None:
        """Release the store's resources."""

    def bounded(self, seconds: float) -> contextlib.AbstractContextManager[None]:
        """Requests this thread makes inside the block give up after ``seconds`` (a frozen store host
        must not stall liveness checks and abort flags for the whole store timeout); local stores never block."""
        return contextlib.nullcontext()

    def get(self, key: str, timeout: float | None = None, *, what: str = "store.get") -> bytes:
        """Return the value of ``key``, waiting up to ``timeout`` seconds for another rank to set it."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        delay = 0.001
        while True:
            value = self.try_get(key)
            if value is not None:
                return value
            if time.monotonic() > deadline:
                raise CommTimeoutError(
                    f"{what}: key {key!r} was not set within {self.timeout if timeout is None else timeout:.1f}s; "
                    "another rank has not reached the rendezvous (check WORLD_SIZE and that every rank started)"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def wait(self, keys: Iterable[str], timeout: float | None = None, *, what: str = "store.wait") -> None:
        """Block until every key in ``keys`` is set."""
        for key in keys:
            self.get(key, timeout, what=what)

    def wait_count(self, key: str, count: int, timeout: float | None = None, *, what: str) -> None:
        """Block until the counter ``key`` (advanced by :meth:`add`) reaches ``count``."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        delay = 0.001
        while int(self.try_get(key) or b"0") < count:
            if time.monotonic() > deadline:
                have = int(self.try_get(key) or b"0")
                raise CommTimeoutError(
                    f"{what}: only {have} of {count} ranks arrived within {self.timeout:.1f}s; "
                    "a rank is missing or crashed during start-up"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: _Server = self.server  # type: ignore[assignment]
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                op, klen, vlen = _REQ.unpack(_recv_exact(sock, _REQ.size))
                key = _recv_exact(sock, klen).decode()
                value = _recv_exact(sock, vlen) if vlen else b""
                status, out = 0, b""
                with server.lock:
                    if op == _SET:
                        server.data[key] = value
                    elif op == _GET:
                        got = server.data.get(key)
                        status, out = (1, b"") if got is None else (0, got)
                    elif op == _ADD:
                        new = int(server.data.get(key, b"0")) + int(value)
                        server.data[key] = out = str(new).encode()
                sock.sendall(_REP.pack(status, len(out)) + out)
        except (ConnectionError, OSError):
            return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int]) -> None:
        super().__init__(addr, _Handler)
        self.data: dict[str, bytes] = {}
        self.lock = threading.Lock()


class TCPStore(Store):
    """Key-value store served by ``is_master`` on ``host:port``; every rank (master included) is a client."""

    def __init__(self, host: str, port: int, *, is_master: bool, timeout: float = 300.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._server: _Server | None = None
        if is_master:
            try:
                self._server = _Server(("" if host in ("", "0.0.0.0") else host, port))
            except OSError as e:
                raise RuntimeError(
                    f"TCPStore: rank 0 cannot listen on {host}:{port} ({e}); pick a free MASTER_PORT "
                    "or stop the process that holds it"
                ) from e
            self.port = self._server.server_address[1]
            threading.Thread(target=self._server.serve_forever, name="opstrata-store", daemon=True).start()
        self._lock = threading.Lock()
        self._bound = threading.local()  # per-thread request limit set by ``bounded``
        self._dead: str | None = None  # set once the store host is known gone: later requests fail at once
        self._sock: socket.socket | None = self._connect()

    def _connect(self, limit: float | None = None) -> socket.socket:
        limit = self.timeout if limit is None else limit
        deadline = time.monotonic() + limit
        delay = 0.01
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=limit)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except OSError as e:  # transient while rank 0 starts: retry with backoff
                if time.monotonic() > deadline:
                    raise CommTimeoutError(
                        f"TCPStore: cannot connect to rank 0 at {self.host}:{self.port} within "
                        f"{limit:.1f}s ({e}); check MASTER_ADDR/MASTER_PORT and that rank 0 started"
                    ) from e
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    @contextlib.contextmanager
    def bounded(self, seconds: float):  # type: ignore[override]
        """Requests this thread makes inside the block give up after ``seconds`` with ``CommTimeoutError``."""
        prev = getattr(self._bound, "limit", None)
        self._bound.limit = seconds
        try:
            yield
        finally:
            self._bound.limit = prev

    def _request(self, op: int, key: str, value: bytes = b"") -> tuple[int, bytes]:
        k = key.encode()
        limit = getattr(self._bound, "limit", None)
        wait = self.timeout if limit is None else limit
        if not self._lock.acquire(timeout=wait):
            raise CommTimeoutError(
                f"TCPStore at {self.host}:{self.port}: request for {key!r} waited {wait:.1f}s behind another "
                "thread's request; rank 0 (the store host) is not answering — frozen or overloaded"
            )
        try:
            if self._dead is not None:
                raise CommPeerError(self._dead)
            if self._sock is None:  # dropped after a timed-out request (its reply could still arrive): one
                # fresh attempt, no retry loop — a refused connection now means the host is gone, not starting
                self._sock = socket.create_connection((self.host, self.port), timeout=wait)
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock.settimeout(wait)
            self._sock.sendall(_REQ.pack(op, len(k), len(value)) + k + value)
            status, n = _REP.unpack(_recv_exact(self._sock, _REP.size))
            return status, (_recv_exact(self._sock, n) if n else b"")
        except TimeoutError as e:
            self._drop()
            raise CommTimeoutError(
                f"TCPStore at {self.host}:{self.port}: no reply to the request for {key!r} within {wait:.1f}s; "
                "rank 0 (the store host) is frozen, overloaded or its host is unreachable"
            ) from e
        except OSError as e:
            self._drop()
            self._dead = (
                f"TCPStore at {self.host}:{self.port} (hosted by rank 0) is unreachable ({e}); "
                "rank 0 has probably exited or died"
            )
            raise CommPeerError(self._dead) from e
        finally:
            self._lock.release()

    def _drop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value``."""
        self._request(_SET, key, value)

    def try_get(self, key: str) -> bytes | None:
        """Return the value of ``key`` or None when unset."""
        status, value = self._request(_GET, key)
        return None if status else value

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer at ``key`` and return the new value."""
        return int(self._request(_ADD, key, str(amount).encode())[1])

    def close(self) -> None:
        """Close the client socket and stop the server (on the master)."""
        self._drop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class FileStore(Store):
    """Store in a directory shared by the ranks (``file://path``); one file per key, writes are atomic."""

    def __init__(self, path: str, *, timeout: float = 300.0) -> None:
        self.path, self.timeout = path, timeout
        os.makedirs(path, exist_ok=True)
        self._lockfile = os.path.join(path, ".lock")

    def _file(self, key: str) -> str:
        return os.path.join(self.path, hashlib.sha1(key.encode()).hexdigest())

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value`` (write to a temp file, then rename)."""
        tmp = f"{self._file(key)}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as f:
            f.write(value)
        os.replace(tmp, self._file(key))

    def try_get(self, key: str) -> bytes | None:
        """Return the value of ``key`` or None when unset."""
        try:
            with open(self._file(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer at ``key`` (under an flock) and return it."""
        with open(self._lockfile, "a+") as lf:
            fcntl.flock(lf, fcntl.LOCK_EX)
            try:
                new = int(self.try_get(key) or b"0") + amount
                self.set(key, str(new).encode())
                return new
            finally:
                fcntl.flock(lf, fcntl.LOCK_UN)


class PrefixStore(Store):
    """View of a store whose keys are prefixed (one namespace per process group)."""

    def __init__(self, prefix: str, base: Store) -> None:
        self.prefix, self.base, self.timeout = prefix, base, base.timeout

    def set(self, key: str, value: bytes) -> None:
        """Set the prefixed key."""
        self.base.set(self.prefix + key, value)

    def try_get(self, key: str) -> bytes | None:
        """Get the prefixed key or None."""
        return self.base.try_get(self.prefix + key)

    def add(self, key: str, amount: int) -> int:
        """Add to the prefixed counter."""
        return self.base.add(self.prefix + key, amount)

    def bounded(self, seconds: float) -> contextlib.AbstractContextManager[None]:
        """The base store's bounded requests."""
        return self.base.bounded(seconds)
