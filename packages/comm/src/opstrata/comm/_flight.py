"""Flight recorder: the last N collectives of a group (op, seq, sizes, algorithm, state, times), dumped on failure.

The dump goes to ``$OPSTRATA_COMM_DUMP_DIR`` (default ``<tmp>/opstrata-comm-<job>``) as
``flight-<job>-g<gid>-rank<rank>.json``, written atomically, so a hang or crash explains itself afterwards.
"""

from __future__ import annotations

import collections
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass


def recorder_size() -> int:
    """Entries kept per group (``OPSTRATA_COMM_FLIGHT_RECORDER_SIZE``, default 256)."""
    raw = os.environ.get("OPSTRATA_COMM_FLIGHT_RECORDER_SIZE") or "256"
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"OPSTRATA_COMM_FLIGHT_RECORDER_SIZE={raw!r}: expected a positive number of entries")
    return n


@dataclass
class Entry:
    """One collective as the recorder saw it; ``state`` goes started -> done | failed."""

    op: str
    seq: int
    desc: str  # dtype, shape, op, root: what the desync header compares
    nbytes: int
    algorithm: str
    state: str = "started"
    start: float = 0.0  # wall clock (time.time) so dumps of different ranks line up
    end: float | None = None
    ms: float | None = None
    error: str = ""

    def __str__(self) -> str:
        line = f"{self.op} seq={self.seq} {self.desc} algo={self.algorithm} {self.state}"
        if self.ms is not None:
            line += f" {self.ms:.3f}ms"
        return line + (f": {self.error}" if self.error else "")


class FlightRecorder(collections.deque):
    """A bounded deque of :class:`Entry` that can dump itself to a JSON file."""

    def __init__(self, size: int | None = None) -> None:
        super().__init__(maxlen=size or recorder_size())

    def start(self, op: str, seq: int, desc: str, nbytes: int, algorithm: str) -> Entry:
        """Record a collective that begins now."""
        e = Entry(op, seq, desc, nbytes, algorithm, start=time.time())
        self.append(e)
        return e

    def dump(self, *, job: str, gid: int, rank: int, error: str) -> str:
        """Write every kept entry to the dump directory (temp + rename); return the file's path."""
        folder = os.environ.get("OPSTRATA_COMM_DUMP_DIR") or os.path.join(
            tempfile.gettempdir(), f"opstrata-comm-{job or 'nojob'}"
        )
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"flight-{job or 'nojob'}-g{gid}-rank{rank}.json")
        doc = {
            "job": job,
            "group": gid,
            "rank": rank,
            "pid": os.getpid(),
            "error": error,
            "dumped_at": time.time(),
            "capacity": self.maxlen,
            "entries": [asdict(e) for e in list(self)],
        }
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
        return path
