"""Recording device work for replay (CUDA graphs): kernels that never read the device back while recorded.

A captured graph replays the recorded kernels on new data without Python; nothing recorded may copy
device memory to the host (a sync is illegal during a CUDA stream capture, and its answer would be
baked in). A kernel that checks its data eagerly (embedding / gather index bounds) therefore defers the
check while :func:`capturing` is active: it clamps the indices on the device and appends a
:class:`DeferredCheck` whose ``flag`` (a device boolean the graph rewrites on every replay) the caller
reads once after each replay, naming the op and the bound that failed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["DeferredCheck", "DeviceGraph", "capture_checks", "capturing"]


class DeviceGraph(Protocol):
    """What ``DeviceMemory.capture(fn)`` returns: fn's result (device arrays the replays rewrite) and replay."""

    result: Any

    def replay(self) -> None:
        """Run the recorded work again, in order, on the same buffers (queued; sync to read results)."""


@dataclass
class DeferredCheck:
    """A data check a kernel could not make while recorded: ``flag`` is true on the device when it failed."""

    op: str
    input: str
    expected: str
    flag: Any  # a 0-d boolean device array, rewritten by each replay
    node: str = ""  # filled by the executor: the graph node whose kernel made the check

    def message(self) -> str:
        """The failure as an OpError-style sentence (the values themselves were not read back)."""
        where = f"node '{self.node}' ({self.op})" if self.node else self.op
        return (
            f"{where}: input '{self.input}' expected {self.expected}, found values outside it during a "
            "replayed device graph (the indices were clamped)"
        )


_CHECKS: ContextVar[list[DeferredCheck] | None] = ContextVar("opstrata_capture_checks", default=None)


@contextmanager
def capturing() -> Iterator[list[DeferredCheck]]:
    """While active, kernels record work for replay: no device-to-host reads, data checks deferred."""
    checks: list[DeferredCheck] = []
    token = _CHECKS.set(checks)
    try:
        yield checks
    finally:
        _CHECKS.reset(token)


def capture_checks() -> list[DeferredCheck] | None:
    """The active capture's deferred checks (append to it), or None when kernels may check eagerly."""
    return _CHECKS.get()
