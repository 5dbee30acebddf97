"""Fallback policy (``allow | warn | error``) and the audit of every fallback that happened.

A fallback is any call that does not run on its requested device's own kernel: a decomposition
into other ops on the same device, or a move to the next device of the chain (cpu -> ref). None is
silent: each is counted in :func:`fallback_report`, and the policy decides what else happens:

- ``allow``: count it;
- ``warn`` (default): count it and emit one :class:`FallbackWarning` per call;
- ``error``: raise :class:`FallbackError` with the audit line instead of running.

The policy comes from, first to last: ``with fallback_policy(...)`` (per thread/task),
``set_fallback_policy(...)``, the ``OPSTRATA_FALLBACK`` environment variable, then ``"warn"``.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import Any

from ._errors import FallbackError, FallbackWarning

__all__ = [
    "ENV_VAR",
    "POLICIES",
    "FallbackRecord",
    "FallbackReport",
    "fallback_policy",
    "fallback_report",
    "get_fallback_policy",
    "record_fallback",
    "reset_fallback_report",
    "set_fallback_policy",
]

POLICIES: tuple[str, ...] = ("allow", "warn", "error")
ENV_VAR = "OPSTRATA_FALLBACK"
DEFAULT_POLICY = "warn"

_global_policy: str | None = None  # set_fallback_policy(); None -> environment, then default
_ctx_policy: ContextVar[str | None] = ContextVar("opstrata_ops_fallback_policy", default=None)
#: (op, device, path, dtype, reason, via) -> [calls, bytes copied between memories, seconds copying]
_counts: dict[tuple[str, str, str, str, str, str], list[Any]] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class FallbackRecord:
    """One kind of fallback and how many calls took it."""

    op: str
    device: str  # the device the caller asked for
    path: str  # "decomposition" or "device:<name>"
    dtype: str  # dtype of the op's primary argument
    reason: str  # why the requested device's kernel did not run
    count: int  # calls that took this path since the last reset
    via: str = ""  # the op whose decomposition made this call, if any
    bytes_copied: int = 0  # arguments and results moved between device memories (cuda -> host -> cuda)
    copy_seconds: float = 0.0  # time those copies took: what the fallback cost beyond the slower kernel

    def line(self) -> str:
        """The audit line: ``softmax on cpu (float32) -> decomposition: <reason>``."""
        via = f" [inside decomposition of {self.via}]" if self.via else ""
        copied = (
            f" (copied {_fmt_bytes(self.bytes_copied)} in {self.copy_seconds * 1e3:.3f} ms)"
            if self.bytes_copied
            else ""
        )
        return f"{self.op} on {self.device} ({self.dtype}) -> {self.path}: {self.reason}{via}{copied}"


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class FallbackReport:
    """A snapshot of the audit: ``records`` as data, ``table()``/``str()`` as text."""

    records: list[FallbackRecord]

    @property
    def total(self) -> int:
        """Calls that fell back, over all records."""
        return sum(r.count for r in self.records)

    @property
    def bytes_copied(self) -> int:
        """Bytes moved between device memories by fallbacks, over all records."""
        return sum(r.bytes_copied for r in self.records)

    @property
    def copy_seconds(self) -> float:
        """Seconds spent on those copies, over all records."""
        return sum(r.copy_seconds for r in self.records)

    def count(self, op: str | None = None, *, device: str | None = None, path: str | None = None) -> int:
        """Calls that fell back, filtered by op, requested device and/or path."""
        return sum(
            r.count
            for r in self.records
            if (op is None or r.op == op)
            and (device is None or r.device == device)
            and (path is None or r.path == path)
        )

    def as_dicts(self) -> list[dict[str, Any]]:
        """Records as plain dicts (JSON-ready)."""
        return [asdict(r) for r in self.records]

    def table(self) -> str:
        """A fixed-width table, one row per record, most frequent first."""
        if not self.records:
            return "fallback report: no fallbacks recorded"
        copies = self.bytes_copied > 0  # the copy columns appear once a fallback crossed memories
        head = ("op", "device", "dtype", "path", "count", *(("copied", "copy ms") if copies else ()), "via")
        head = (*head, "reason")
        order = sorted(self.records, key=lambda r: (-r.count, r.op, r.device, r.dtype))
        rows = [
            (
                r.op,
                r.device,
                r.dtype,
                r.path,
                str(r.count),
                *((_fmt_bytes(r.bytes_copied), f"{r.copy_seconds * 1e3:.3f}") if copies else ()),
                r.via or "-",
                r.reason,
            )
            for r in order
        ]
        widths = [max(len(row[i]) for row in (head, *rows)) for i in range(len(head) - 1)]
        right = {4, 5, 6} if copies else {4}

        def fmt(row: tuple[str, ...]) -> str:
            cells = [
                c.rjust(w) if i in right else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=False))
            ]
            return "  ".join([*cells, row[-1]])

        title = f"fallback report: {self.total} call(s) fell back, {len(self.records)} kind(s)"
        if copies:
            title += f"; {_fmt_bytes(self.bytes_copied)} copied in {self.copy_seconds * 1e3:.3f} ms"
        return "\n".join([title, fmt(head), *(fmt(r) for r in rows)])

    def __str__(self) -> str:
        return self.table()

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[FallbackRecord]:
        return iter(self.records)


def _check_policy(policy: object, source: str) -> str:
    value = policy.strip().lower() if isinstance(policy, str) else policy
    if value not in POLICIES:
        raise ValueError(
            f"{source}: fallback policy must be one of {', '.join(POLICIES)}, got {policy!r}. "
            f"Fix: use 'warn' (default), 'allow' or 'error'"
        )
    return str(value)


def _env_policy() -> str:
    raw = os.environ.get(ENV_VAR)
    if raw is None or not raw.strip():
        return DEFAULT_POLICY
    return _check_policy(raw, f"environment variable {ENV_VAR}")


def get_fallback_policy() -> str:
    """The policy in force here: context manager, then ``set_fallback_policy``, env, ``"warn"``."""
    return _ctx_policy.get() or _global_policy or _env_policy()


def set_fallback_policy(policy: str | None) -> None:
    """Set the process-wide policy (``"allow" | "warn" | "error"``); None returns to env/default."""
    global _global_policy
    _global_policy = None if policy is None else _check_policy(policy, "set_fallback_policy")


@contextmanager
def fallback_policy(policy: str) -> Iterator[str]:
    """Use ``policy`` inside the block (per thread and asyncio task).

    >>> import opstrata.ops as ops
    >>> with ops.fallback_policy("error"):
    ...     ops.get_fallback_policy()
    'error'
    """
    token = _ctx_policy.set(_check_policy(policy, "fallback_policy"))
    try:
        yield policy
    finally:
        _ctx_policy.reset(token)


def fallback_report() -> FallbackReport:
    """Every fallback since the last reset, aggregated by (op, device, path, dtype, reason, via)."""
    with _lock:
        items = list(_counts.items())
    return FallbackReport(
        [FallbackRecord(o, d, p, t, r, n, v, b, sec) for (o, d, p, t, r, v), (n, b, sec) in items]
    )


def reset_fallback_report() -> None:
    """Forget all recorded fallbacks."""
    with _lock:
        _counts.clear()


Key = tuple[str, str, str, str, str, str]


def audit(op: str, device: str, path: str, dtype: str, reason: str, via: str = "") -> Key:
    """Apply the policy to one fallback about to run: raise, or count it (and warn); returns the
    record's key for :func:`record_copies`."""
    policy = get_fallback_policy()
    if policy == "error":
        rec = FallbackRecord(op, device, path, dtype, reason, 1, via)
        fix = f"register a {device!r} kernel for {op!r}"
        if path.startswith("device:"):
            fix += f", pass device={path.removeprefix('device:')!r}"
        fix += ", or allow it with opstrata.ops.fallback_policy('warn') or OPSTRATA_FALLBACK=warn"
        raise FallbackError(f"fallback refused (policy 'error'): {rec.line()}. Fix: {fix}", rec)
    key = (op, device, path, dtype, reason, via)
    with _lock:
        entry = _counts.get(key)
        if entry is None:
            _counts[key] = [1, 0, 0.0]
        else:
            entry[0] += 1
    if policy == "warn":
        line = FallbackRecord(op, device, path, dtype, reason, 1, via).line()
        # stacklevel 4: audit <- _run_fallback <- call <- the caller of call()
        warnings.warn(f"opstrata fallback: {line}", FallbackWarning, stacklevel=4)
    return key


def record_copies(key: Key, nbytes: int, seconds: float) -> None:
    """Add one fallback call's copies between device memories to its record."""
    with _lock:
        entry = _counts.setdefault(key, [0, 0, 0.0])
        entry[1] += int(nbytes)
        entry[2] += float(seconds)


def record_fallback(
    op: str,
    device: str,
    path: str,
    dtype: str,
    reason: str,
    *,
    bytes_copied: int = 0,
    copy_seconds: float = 0.0,
    via: str = "",
) -> None:
    """Audit a fallback taken outside :func:`call`: a runtime running a graph node on the host for a device
    (``path="device:cpu"``). The policy applies as for a call (``error`` raises :class:`FallbackError`)."""
    key = audit(op, device, path, dtype, reason, via)
    if bytes_copied or copy_seconds:
        record_copies(key, bytes_copied, copy_seconds)
