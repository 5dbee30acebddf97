"""Errors raised by opstrata.runtime: each names the thing, the expected, the actual and the fix."""

from __future__ import annotations

__all__ = ["ExecutionError", "InvalidArgument", "InvalidModel", "OutOfMemoryError", "RuntimeFailure"]


class RuntimeFailure(Exception):
    """Base of opstrata.runtime errors: ``where: problem. Fix: fix``."""

    def __init__(self, where: str, problem: str, fix: str | None = None) -> None:
        self.where, self.problem, self.fix = where, problem, fix
        super().__init__(f"{where}: {problem}" + (f". Fix: {fix}" if fix else ""))


class InvalidArgument(RuntimeFailure, ValueError):
    """A bad argument to a session call: feed names, shapes, dtypes, output names, options."""


class InvalidModel(RuntimeFailure, ValueError):
    """A model or plan that cannot be loaded or compiled (corrupt file, unsupported op, ...)."""


class ExecutionError(RuntimeFailure, RuntimeError):
    """A kernel failed (or returned the wrong shape) while a session ran; names the node."""


class OutOfMemoryError(RuntimeFailure, MemoryError):
    """The caching allocator cannot satisfy a request within its capacity limit."""
