"""Per-group liveness: a daemon thread publishes this rank's heartbeat through the store and watches its peers'.

A frozen peer (SIGSTOP, a host that died without closing its sockets) closes nothing and its pid may look
alive, so only its missing heartbeat gives it away. Waits read :meth:`Heartbeat.silent` (no I/O, a dict
lookup) and raise ``CommPeerError`` long before the collective timeout. Peers are judged by when this rank
last saw their counter change, on its own monotonic clock, so clock skew between hosts does not matter.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from ._store import Store

_CLOSED = b"closed"


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds (e.g. {default})") from None


def settings() -> tuple[float, float]:
    """(interval, timeout) in seconds from OPSTRATA_COMM_HEARTBEAT_INTERVAL / _TIMEOUT (defaults 1 s / 10 s)."""
    interval = _env_seconds("OPSTRATA_COMM_HEARTBEAT_INTERVAL", 1.0)
    timeout = _env_seconds("OPSTRATA_COMM_HEARTBEAT_TIMEOUT", 10.0)
    if interval > 0 and timeout <= 2 * interval:
        raise ValueError(
            f"OPSTRATA_COMM_HEARTBEAT_TIMEOUT={timeout}s must exceed twice OPSTRATA_COMM_HEARTBEAT_INTERVAL="
            f"{interval}s, or a live peer could look silent between two beats; raise the timeout"
        )
    return interval, timeout


class Heartbeat:
    """Beats ``hb/<rank>`` in ``store`` every ``interval`` s and records when each peer's counter last moved."""

    def __init__(
        self, store: Store, rank: int, size: int, *, interval: float, timeout: float, name: str
    ) -> None:
        self.store, self.rank, self.size = store, rank, size
        self.interval, self.timeout = interval, timeout
        now = time.monotonic()
        self._seen: dict[int, tuple[bytes | None, float]] = {p: (None, now) for p in range(size) if p != rank}
        self._store_ok = now  # when a whole round of store requests last succeeded
        self._stop = threading.Event()
        self._beats = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            # a store hiccup must not kill the thread (peers judge us); a frozen store host (rank 0) must not
            # hold it either: requests give up after half the timeout, so rank 0's counter goes stale
            with contextlib.suppress(Exception), self.store.bounded(self.timeout / 2):
                self._beats += 1
                self.store.set(f"hb/{self.rank}", str(self._beats).encode())
                for peer, (last, _t) in list(self._seen.items()):
                    got = self.store.try_get(f"hb/{peer}")
                    if got != last:
                        self._seen[peer] = (got, time.monotonic())
                self._store_ok = time.monotonic()
            if self._stop.wait(self.interval):
                return

    def store_quiet(self) -> float:
        """Seconds since this rank's last complete heartbeat round through the store.

        When the store host (rank 0 of the job) freezes, every peer's counter goes stale at once; a stale
        round tells that cause apart from one frozen peer (whose peers' rounds keep completing).
        """
        return time.monotonic() - self._store_ok

    def silent(self) -> tuple[int, float] | None:
        """(peer, seconds) of the peer silent longest beyond the timeout, or None when all beat recently."""
        now = time.monotonic()
        worst: tuple[int, float] | None = None
        for peer, (last, t) in list(self._seen.items()):
            if last == _CLOSED:
                continue  # it left the group on purpose; sockets / pids report what happens next
            quiet = now - t
            if quiet > self.timeout and (worst is None or quiet > worst[1]):
                worst = (peer, quiet)
        return worst

    def stop(self) -> None:
        """End the thread (bounded) and tell peers this rank left on purpose."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(self.interval + 1.0)
        with contextlib.suppress(Exception), self.store.bounded(self.timeout / 2):
            self.store.set(f"hb/{self.rank}", _CLOSED)
