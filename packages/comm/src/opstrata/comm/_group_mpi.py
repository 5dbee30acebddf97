"""Process groups on the ``mpi`` backend: opstrata's algorithms over MPI p2p, or MPI's own collectives.

``algorithm="native"`` (per call, or ``OPSTRATA_COMM_ALGO=native`` for every collective) runs MPI's
nonblocking collective (``MPI_Iallreduce``, ``MPI_Ibcast``, ...) instead of an opstrata algorithm, for
comparison. It keeps everything else: argument checks, the desync header, low-precision floats reduced in
float32, ``async_op``, the flight recorder and the group's timeout (the request is polled, never waited on).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ._algorithms import Ctx
from ._group import ProcessGroup, _acc, _check_array, _check_op, _parts
from ._transport_mpi import MpiTransport

NATIVE = "native"
_WHY = "algorithm='native': MPI's own {call} (for comparison with opstrata's algorithms)"


def wants_native(algorithm: str | None) -> bool:
    """True when this call asks for MPI's own collective (per call, else OPSTRATA_COMM_ALGO)."""
    return (algorithm or os.environ.get("OPSTRATA_COMM_ALGO") or None) == NATIVE


class MpiProcessGroup(ProcessGroup):
    """A ProcessGroup over :class:`MpiTransport` that can also call MPI's native collectives."""

    transport: MpiTransport

    def _mpi_op(self, op: str, dtype: np.dtype) -> Any:
        MPI = self.transport.MPI
        if dtype == np.bool_:  # numpy's add / multiply / max / min on bool are or / and / or / and
            return {"sum": MPI.LOR, "avg": MPI.LOR, "max": MPI.LOR, "min": MPI.LAND, "prod": MPI.LAND}[op]
        return {"sum": MPI.SUM, "avg": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}[op]

    def _typed(self, a: np.ndarray, count: int | None = None) -> list:
        """``a`` as an MPI buffer of a predefined type (MPI's reductions are not defined on derived types)."""
        MPI, code = self.transport.MPI, a.dtype.char
        dt = MPI.Datatype.fromcode(code) if hasattr(MPI.Datatype, "fromcode") else MPI._typedict[code]
        return [a, a.size if count is None else count, dt]

    def _bytes(self, a: np.ndarray) -> list:
        return [a.reshape(-1).view(np.uint8), self.transport.MPI.BYTE]

    def _no_det(self, name: str, deterministic: bool | None) -> None:
        if deterministic or (deterministic is None and self.deterministic):
            raise ValueError(
                f"{name}: algorithm='native' cannot be deterministic: MPI does not fix the order in which it "
                "sums contributions. Drop deterministic=True for this call or use an opstrata algorithm"
            )

    def _native(self, name: str, call: str, desc: str, nbytes: int, start, async_op: bool):
        """Run ``start(MPI) -> (request, buffers, finish)`` as collective ``name`` through the group's worker."""

        def body(c: Ctx) -> str:
            req, bufs, finish = start(self.transport.MPI)
            self.transport.wait([req], bufs, what=c.what, deadline=c.deadline, call=call)
            if finish is not None:
                finish()
            return f"native {call}"

        why = _WHY.format(call=call)
        return self._run(name, desc, nbytes, NATIVE, why, body, async_op)

    # -- collectives ---------------------------------------------------------------------------------------------
    def all_reduce(self, x, op, algorithm, async_op, deterministic):
        """In-place all-reduce; MPI_Iallreduce when native."""
        if not wants_native(algorithm):
            return super().all_reduce(x, op, algorithm, async_op, deterministic)
        _check_array(x, "all_reduce")
        _check_op(op, x.dtype, "all_reduce")
        self._no_det("all_reduce", deterministic)
        acc, n = _acc(x.dtype), self.size

        def start(MPI):
            flat = x.reshape(-1)
            work = flat if acc == x.dtype else flat.astype(acc)

            def finish() -> None:
                if op == "avg":
                    np.divide(work, n, out=work, casting="unsafe")
                if work is not flat:
                    flat[...] = work.astype(x.dtype)

            req = self.transport.comm.Iallreduce(MPI.IN_PLACE, self._typed(work), self._mpi_op(op, acc))
            return req, work, finish

        desc = f"op={op} dtype={x.dtype} shape={list(x.shape)} det=False"
        return self._native("all_reduce", "MPI_Iallreduce", desc, x.nbytes, start, async_op)

    def reduce(self, x, dst, op, algorithm, async_op, deterministic):
        """Reduce into ``x`` on ``dst``; MPI_Ireduce when native."""
        if not wants_native(algorithm):
            return super().reduce(x, dst, op, algorithm, async_op, deterministic)
        _check_array(x, "reduce")
        _check_op(op, x.dtype, "reduce")
        root = self.group_rank(dst, "reduce")
        self._no_det("reduce", deterministic)
        acc, n, r = _acc(x.dtype), self.size, self.rank

        def start(MPI):
            flat = x.reshape(-1)
            work = flat if (acc == x.dtype and r == root) else flat.astype(acc)
            mop = self._mpi_op(op, acc)
            if r == root:
                req = self.transport.comm.Ireduce(MPI.IN_PLACE, self._typed(work), mop, root)
            else:
                req = self.transport.comm.Ireduce(self._typed(work), None, mop, root)

            def finish() -> None:
                if r != root:
                    return
                if op == "avg":
                    np.divide(work, n, out=work, casting="unsafe")
                if work is not flat:
                    flat[...] = work.astype(x.dtype)

            return req, work, finish

        desc = f"op={op} dst={dst} dtype={x.dtype} shape={list(x.shape)} det=False"
        return self._native("reduce", "MPI_Ireduce", desc, x.nbytes, start, async_op)

    def broadcast(self, x, src, algorithm, async_op):
        """Copy ``x`` from ``src`` to every rank; MPI_Ibcast when native."""
        if not wants_native(algorithm):
            return super().broadcast(x, src, algorithm, async_op)
        _check_array(x, "broadcast")
        root = self.group_rank(src, "broadcast")

        def start(MPI):
            return self.transport.comm.Ibcast(self._bytes(x), root), x, None

        desc = f"src={src} dtype={x.dtype} shape={list(x.shape)}"
        return self._native("broadcast", "MPI_Ibcast", desc, x.nbytes, start, async_op)

    def all_gather(self, out, x, algorithm, async_op):
        """Gather every rank's ``x`` into ``out``; MPI_Iallgather when native."""
        if not wants_native(algorithm):
            return super().all_gather(out, x, algorithm, async_op)
        _check_array(x, "all_gather")
        outs = _parts(out, self.size, x, "all_gather", "out")
        n = self.size

        def start(MPI):
            flat = outs.reshape(-1) if isinstance(outs, np.ndarray) else np.empty(n * x.size, x.dtype)
            req = self.transport.comm.Iallgather(self._bytes(x), self._bytes(flat))

            def finish() -> None:
                if isinstance(outs, list):
                    for j, o in enumerate(outs):
                        o.reshape(-1)[...] = flat[j * x.size : (j + 1) * x.size]

            return req, (x, flat), finish

        desc = f"dtype={x.dtype} shape={list(x.shape)}"
        return self._native("all_gather", "MPI_Iallgather", desc, x.nbytes * n, start, async_op)

    def reduce_scatter(self, out, xs, op, algorithm, async_op, deterministic):
        """Reduce ``xs`` across ranks, rank r keeps part r; MPI_Ireduce_scatter_block when native."""
        if not wants_native(algorithm):
            return super().reduce_scatter(out, xs, op, algorithm, async_op, deterministic)
        _check_array(out, "reduce_scatter", "out")
        _check_op(op, out.dtype, "reduce_scatter")
        parts = _parts(xs, self.size, out, "reduce_scatter", "x")
        self._no_det("reduce_scatter", deterministic)
        acc, n = _acc(out.dtype), self.size

        def start(MPI):
            src = parts if isinstance(parts, np.ndarray) else np.concatenate([p.reshape(-1) for p in parts])
            work = src.reshape(-1).astype(acc)  # a copy: the input is not modified
            mine = np.empty(out.size, acc)
            req = self.transport.comm.Ireduce_scatter_block(
                self._typed(work, mine.size), self._typed(mine), self._mpi_op(op, acc)
            )

            def finish() -> None:
                if op == "avg":
                    np.divide(mine, n, out=mine, casting="unsafe")
                out.reshape(-1)[...] = mine.astype(out.dtype)

            return req, (work, mine), finish

        desc = f"op={op} dtype={out.dtype} shape={list(out.shape)} det=False"
        return self._native(
            "reduce_scatter", "MPI_Ireduce_scatter_block", desc, out.nbytes * n, start, async_op
        )

    def all_to_all(self, out, x, async_op, algorithm: str | None = None):
        """Exchange part j of ``x`` with rank j; MPI_Ialltoall when native (OPSTRATA_COMM_ALGO or algorithm=)."""
        if not wants_native(algorithm):
            return super().all_to_all(out, x, async_op)
        n = self.size
        first = x[0] if isinstance(x, (list, tuple)) else None
        if first is None:
            _check_array(x, "all_to_all", "x")
            if x.size % n:
                raise ValueError(f"all_to_all: x has {x.size} elements, not divisible by world_size={n}")
            first = x.reshape(-1)[: x.size // n]
        ins = _parts(x, n, first, "all_to_all", "x")
        outs = _parts(out, n, first, "all_to_all", "out")

        def start(MPI):
            src = ins if isinstance(ins, np.ndarray) else np.concatenate([a.reshape(-1) for a in ins])
            dst = outs if isinstance(outs, np.ndarray) else np.empty(n * first.size, first.dtype)
            req = self.transport.comm.Ialltoall(self._bytes(src), self._bytes(dst))

            def finish() -> None:
                if isinstance(outs, list):
                    flat = dst.reshape(-1)
                    for j, o in enumerate(outs):
                        o.reshape(-1)[...] = flat[j * first.size : (j + 1) * first.size]

            return req, (src, dst), finish

        desc = f"dtype={first.dtype} part={first.size}"
        return self._native("all_to_all", "MPI_Ialltoall", desc, first.nbytes * n, start, async_op)

    def barrier(self, async_op: bool = False, algorithm: str | None = None):
        """Wait for every rank; MPI_Ibarrier when native (OPSTRATA_COMM_ALGO or algorithm=)."""
        if not wants_native(algorithm):
            return super().barrier(async_op)

        def start(MPI):
            return self.transport.comm.Ibarrier(), None, None

        return self._native("barrier", "MPI_Ibarrier", "", 0, start, async_op)
