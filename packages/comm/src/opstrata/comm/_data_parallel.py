"""Data parallel: gradients averaged across ranks in size-bounded buckets that overlap the backward pass.

The scheme of PyTorch DDP (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data
Parallel Training"): parameters are packed, in *reverse* order of registration (the order backward
produces their gradients), into flat buckets of at most ``bucket_cap_mb``. Each gradient is copied into
its slot when it is ready; when a bucket's last gradient arrives the bucket is all-reduced with
``async_op=True``, so communication runs on the group's background thread while backward computes the
next layers. Buckets are launched strictly in bucket order (a bucket that fills early waits for the
ones before it), so every rank issues the same collectives in the same order whatever order its
gradients arrive in. :meth:`GradientBucketer.wait` ends the step with a bounded wait.
"""

from __future__ import annotations

import contextlib
import difflib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import opstrata.ops as ops

from ._errors import CommTimeoutError
from ._group import NON_GROUP_MEMBER, ProcessGroup
from ._work import Work

__all__ = ["Bucket", "GradientBucketer", "broadcast_parameters"]


@dataclass
class Bucket:
    """One flat buffer of same-dtype gradients: ``names`` in fill order, each at ``offsets[name]``."""

    index: int
    dtype: np.dtype
    names: list[str] = field(default_factory=list)
    offsets: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (start, stop) elements
    buffer: np.ndarray = field(default_factory=lambda: np.empty(0))
    pending: set[str] = field(default_factory=set)
    work: Work | None = None

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)


def _named(params: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> list[tuple[str, np.ndarray]]:
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    out: list[tuple[str, np.ndarray]] = []
    seen: set[str] = set()
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError(
                f"GradientBucketer: params must map names to arrays (a dict or (name, array) pairs), got {item!r}"
            )
        name, p = item
        if name in seen:
            raise ValueError(f"GradientBucketer: parameter name {name!r} appears twice; names must be unique")
        if not isinstance(p, np.ndarray):
            raise TypeError(
                f"GradientBucketer: parameter {name!r} must be a numpy array, got {type(p).__name__}"
            )
        seen.add(name)
        out.append((name, p))
    if not out:
        raise ValueError("GradientBucketer: no parameters given")
    return out


class GradientBucketer:
    """Average gradients across a group in async buckets as backward produces them (DDP's reducer).

    ``params`` lists the model's parameters in forward (registration) order; buckets are filled in
    reverse. Per step: call :meth:`add_grad` for every parameter as its gradient is ready, then
    :meth:`wait`, which returns the averaged gradients (views into the bucket buffers, valid until the
    next step's ``add_grad``). ``overlap=False`` holds every bucket back until :meth:`wait` (all-reduce
    after backward: same buckets, no overlap — the baseline of ``benchmarks/bench_overlap.py``).

    >>> # b = GradientBucketer({"w1": w1, "b1": b1, "w2": w2}, bucket_cap_mb=25)
    >>> # b.add_grad("w2", dw2); ...; grads = b.wait(timeout=60)   # grads["w1"] is the rank average
    """

    def __init__(
        self,
        params: Mapping[str, Any] | Iterable[tuple[str, Any]],
        *,
        bucket_cap_mb: float = 25.0,
        group: ProcessGroup | None = None,
        op: str = "avg",
        overlap: bool = True,
    ) -> None:
        if (
            isinstance(bucket_cap_mb, bool)
            or not isinstance(bucket_cap_mb, (int, float))
            or not bucket_cap_mb > 0
        ):
            raise ValueError(
                f"GradientBucketer: bucket_cap_mb must be a positive number, got {bucket_cap_mb!r}"
            )
        if op not in ("avg", "sum"):
            raise ValueError(f"GradientBucketer: op must be 'avg' or 'sum' (gradient reduction), got {op!r}")
        if group is NON_GROUP_MEMBER:
            raise ValueError(
                "GradientBucketer: this rank is not a member of the group (new_group returned NON_GROUP_MEMBER)"
            )
        self.op, self._group, self.overlap = op, group, bool(overlap)
        self.cap_bytes = int(bucket_cap_mb * 1024 * 1024)
        named = _named(params)
        self.shapes = {n: tuple(p.shape) for n, p in named}
        self.dtypes = {n: p.dtype for n, p in named}
        self.buckets: list[Bucket] = []
        cur: Bucket | None = None
        size = 0
        for name, p in reversed(named):  # backward produces the last layer's gradients first
            if p.dtype not in ops.FLOAT_DTYPES:
                raise TypeError(
                    f"GradientBucketer: parameter {name!r} has dtype {p.dtype}; gradients need a float dtype"
                )
            if (
                cur is None
                or cur.dtype != p.dtype
                or (cur.names and (size + p.size) * p.itemsize > self.cap_bytes)
            ):
                if cur is not None:
                    cur.buffer = np.zeros(size, cur.dtype)
                cur, size = Bucket(len(self.buckets), p.dtype), 0
                self.buckets.append(cur)
            cur.names.append(name)
            cur.offsets[name] = (size, size + p.size)
            size += p.size
        assert cur is not None
        cur.buffer = np.zeros(size, cur.dtype)
        self._bucket_of = {n: b for b in self.buckets for n in b.names}
        self._next_launch = 0
        self._reset()

    # ------------------------------------------------------------------ one step

    def _reset(self) -> None:
        for b in self.buckets:
            b.pending, b.work = set(b.names), None
        self._next_launch = 0

    @property
    def launched(self) -> int:
        """How many buckets of this step have been handed to the group's background thread."""
        return self._next_launch

    def add_grad(self, name: str, grad: Any) -> None:
        """Copy parameter ``name``'s gradient into its bucket; launch every bucket that is now complete."""
        b = self._bucket_of.get(name)
        if b is None:
            close = difflib.get_close_matches(str(name), list(self._bucket_of), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise KeyError(
                f"GradientBucketer.add_grad: unknown parameter {name!r}{hint} (the bucketer was built with "
                f"{len(self._bucket_of)} parameters; pass every trained parameter to GradientBucketer(params))"
            )
        if name not in b.pending:
            raise ValueError(
                f"GradientBucketer.add_grad: parameter {name!r} already has a gradient this step; accumulate "
                "micro-batch gradients yourself and add each parameter once per step, then call wait()"
            )
        g = np.asarray(grad)
        if g.shape != self.shapes[name] or g.dtype != self.dtypes[name]:
            raise ValueError(
                f"GradientBucketer.add_grad: gradient of {name!r} is {g.dtype}{list(g.shape)}, expected the "
                f"parameter's {self.dtypes[name]}{list(self.shapes[name])}; cast or reshape it "
                f"(e.g. grad.astype(np.{self.dtypes[name]}))"
            )
        lo, hi = b.offsets[name]
        b.buffer[lo:hi] = g.reshape(-1)
        b.pending.discard(name)
        if self.overlap:
            self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next_launch < len(self.buckets) and not self.buckets[self._next_launch].pending:
            self._launch(self.buckets[self._next_launch])
            self._next_launch += 1

    def _launch(self, b: Bucket) -> None:
        from . import _api

        group = _api._group(self._group, "GradientBucketer")
        b.work = group.all_reduce(b.buffer, self.op, None, True, None)

    def wait(self, timeout: float | None = None) -> dict[str, np.ndarray]:
        """Finish the step: wait (at most ``timeout`` s in total) for every bucket; return the reduced grads.

        Every parameter must have had :meth:`add_grad` this step (give unused parameters zeros).
        """
        missing = [n for b in self.buckets for n in b.names if n in b.pending]
        if missing:
            for b in self.buckets:  # let the buckets already launched finish before their buffers are reused
                if b.work is not None:
                    with contextlib.suppress(Exception):
                        b.work.wait(timeout)
            self._reset()
            raise ValueError(
                f"GradientBucketer.wait: no gradient this step for {len(missing)} parameter(s) "
                f"{missing[:8]}{' ...' if len(missing) > 8 else ''}; every rank must add every parameter's "
                "gradient each step (add zeros for parameters the batch did not use), or collectives desync"
            )
        self._launch_ready()  # with overlap=False nothing went out yet
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            for b in self.buckets:
                assert b.work is not None
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    b.work.wait(left)
                except CommTimeoutError as exc:
                    names = ", ".join(b.names[:4]) + (" ..." if len(b.names) > 4 else "")
                    raise CommTimeoutError(
                        f"GradientBucketer.wait: bucket {b.index} of {len(self.buckets)} ({b.nbytes} bytes: {names}) "
                        f"was not reduced within {timeout} s: {exc}"
                    ) from exc
        finally:
            self._reset()
        return {n: self.grad(n) for n in self.shapes}

    def grad(self, name: str) -> np.ndarray:
        """Parameter ``name``'s slot in its bucket (the reduced gradient after :meth:`wait`)."""
        b = self._bucket_of[name]
        lo, hi = b.offsets[name]
        return b.buffer[lo:hi].reshape(self.shapes[name])

    def __repr__(self) -> str:
        sizes = ", ".join(f"{len(b.names)} params/{b.nbytes} B" for b in self.buckets)
        return f"GradientBucketer({len(self.shapes)} params in {len(self.buckets)} buckets: {sizes})"


def broadcast_parameters(
    params: Mapping[str, np.ndarray], src: int = 0, *, group: ProcessGroup | None = None
) -> None:
    """Overwrite every rank's parameters with rank ``src``'s (in name order), so replicas start identical."""
    from . import _api

    for name in sorted(params):
        p = params[name]
        if not isinstance(p, np.ndarray):
            raise TypeError(
                f"broadcast_parameters: parameter {name!r} must be a numpy array, got {type(p).__name__}"
            )
        _api.broadcast(p, src, group=group)
