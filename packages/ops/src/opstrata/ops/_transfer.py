"""Moving a fallback's arrays between device memories: arguments over, results back, copies counted.

A call asked of a device with its own memory (``cuda``) that runs on a device of another memory
(``cpu``) gets host copies of its device arrays; its results are copied back, and an ``out=`` array is
filled in place. Containers (lists, tuples, dicts) are walked; other values pass unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ._devices import DeviceMemory

__all__ = ["Mover"]


class Mover:
    """Copies between a source memory and a target memory (None = host), counting bytes and time."""

    def __init__(self, src: DeviceMemory | None, dst: DeviceMemory | None) -> None:
        self.src, self.dst = src, dst
        self.nbytes = 0
        self.seconds = 0.0

    def _in(self, mem: DeviceMemory | None, x: Any) -> bool:
        return isinstance(x, np.ndarray) if mem is None else mem.is_array(x)

    def _host(self, mem: DeviceMemory | None, x: Any) -> np.ndarray:
        return x if mem is None else mem.to_host(x)

    def _move(self, x: Any, a: DeviceMemory | None, b: DeviceMemory | None) -> Any:
        """``x`` with every array of memory ``a`` replaced by a copy in memory ``b``."""
        if self._in(a, x):
            host = self._host(a, x)
            self.nbytes += host.nbytes
            return host if b is None else b.from_host(host)
        if isinstance(x, (list, tuple)):
            moved = [self._move(v, a, b) for v in x]
            return type(x)(moved) if not hasattr(x, "_fields") else type(x)(*moved)
        if isinstance(x, dict):
            return {k: self._move(v, a, b) for k, v in x.items()}
        return x

    def _timed(self, fn: Callable[[], Any]) -> Any:
        for mem in (self.src, self.dst):
            if mem is not None:
                mem.synchronize()
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            for mem in (self.src, self.dst):
                if mem is not None:
                    mem.synchronize()
            self.seconds += time.perf_counter() - t0

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``fn(*args, **kwargs)`` in the target memory, with its result in the source memory."""
        out = kwargs.get("out")
        kw = {k: v for k, v in kwargs.items() if k != "out"}
        a2, kw2 = self._timed(
            lambda: (self._move(args, self.src, self.dst), self._move(kw, self.src, self.dst))
        )
        if out is not None and self._in(self.src, out):
            kw2["out"] = self._timed(lambda: self._move(out, self.src, self.dst))
        elif out is not None:
            kw2["out"] = out
        got = fn(*a2, **kw2)
        if out is not None and self._in(self.src, out):
            host = self._host(self.dst, kw2["out"])

            def fill() -> Any:
                self.nbytes += host.nbytes
                if self.src is None:
                    np.copyto(out, host)
                else:
                    self.src.from_host(host, out=out)
                return out

            self._timed(fill)
            return out if got is kw2["out"] else self._timed(lambda: self._move(got, self.dst, self.src))
        return self._timed(lambda: self._move(got, self.dst, self.src))
