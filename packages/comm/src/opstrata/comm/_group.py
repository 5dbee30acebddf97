"""ProcessGroup: validates arrays, checks per-collective headers for desync, runs algorithms on the worker.

Every collective exchanges a small header (op, seq, dtype, shape, root, algorithm) with its ring
neighbours before any data moves; a mismatch aborts the group with ``CommDesyncError`` on every rank.
Low-precision floats (float16, bfloat16, float8) are reduced in float32 and written back once.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from opstrata import ops

from . import _algorithms as alg, _double_tree, _heartbeat, _tuning
from ._algorithms import Blocks, Ctx
from ._errors import CommDesyncError, CommError
from ._flight import FlightRecorder
from ._hierarchical import Hierarchy, Topology
from ._store import Store
from ._transport import Transport
from ._work import Work, Worker

log = logging.getLogger("opstrata.comm")
REDUCE_OPS = ("sum", "avg", "max", "min", "prod")
_HDR_BYTES = 256
_SHOWN = 12  # flight-recorder entries repeated in the log / error text (the file holds them all)


def _fn(op: str) -> Callable[[np.ndarray, np.ndarray], object]:
    ufunc = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}[op]
    return lambda out, inc: ufunc(out, inc, out=out)


def _check_array(x: Any, what: str, name: str = "x") -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(
            f"{what}: {name} must be a numpy array (collectives work in place), got {type(x).__name__}"
        )
    if x.dtype not in ops.ALL_DTYPES:
        raise TypeError(
            f"{what}: {name} has dtype {x.dtype}; expected one of {', '.join(str(d) for d in ops.ALL_DTYPES)}"
        )
    if not x.flags.c_contiguous or not x.flags.writeable:
        raise ValueError(
            f"{what}: {name} must be a writeable C-contiguous array to be updated in place, got "
            f"shape {x.shape} strides {x.strides}; pass np.ascontiguousarray(x) and copy the result back"
        )
    return x


def _check_op(op: str, dtype: np.dtype, what: str) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"{what}: unknown op {op!r}; expected one of {REDUCE_OPS}")
    if op == "avg" and dtype.kind not in "f" and dtype not in ops.LOW_PRECISION_DTYPES:
        raise ValueError(f"{what}: op='avg' needs a floating dtype, got {dtype}; use op='sum' and divide")


def _acc(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype in ops.LOW_PRECISION_DTYPES else dtype


def _parts(xs: Any, n: int, like: np.ndarray, what: str, name: str) -> list[np.ndarray] | np.ndarray:
    """A list of ``n`` arrays shaped like ``like``, or one array with ``n * like.size`` elements."""
    if isinstance(xs, (list, tuple)):
        if len(xs) != n:
            raise ValueError(f"{what}: {name} must hold world_size={n} arrays, got {len(xs)}")
        for i, a in enumerate(xs):
            _check_array(a, what, f"{name}[{i}]")
            if a.shape != like.shape or a.dtype != like.dtype:
                raise ValueError(
                    f"{what}: {name}[{i}] is {a.dtype}{list(a.shape)}, expected {like.dtype}{list(like.shape)}"
                )
        return list(xs)
    _check_array(xs, what, name)
    if xs.size != n * like.size or xs.dtype != like.dtype:
        raise ValueError(
            f"{what}: {name} is {xs.dtype}{list(xs.shape)} ({xs.size} elements), expected {like.dtype} with "
            f"world_size * {like.size} = {n * like.size} elements (or a list of {n} arrays)"
        )
    return xs


class ProcessGroup:
    """A set of ranks that run collectives together over one transport."""

    def __init__(
        self,
        gid: int,
        ranks: list[int],
        global_rank: int,
        transport: Transport,
        store: Store,
        *,
        backend: str,
        timeout: float,
        deterministic: bool = False,
        job: str = "",
    ) -> None:
        self.gid, self.ranks, self.global_rank = gid, ranks, global_rank
        self.rank, self.size = ranks.index(global_rank), len(ranks)
        self.transport, self.store, self.backend = transport, store, backend
        self.timeout, self.deterministic, self.job = timeout, deterministic, job
        self.seq = 0
        self._p2p_send: dict[int, int] = collections.defaultdict(int)
        self._p2p_recv: dict[int, int] = collections.defaultdict(int)
        self.recorder = FlightRecorder()
        self.topology = Topology(transport.hosts, self.rank)
        self.tuned = _tuning.shared_table(
            store, self.rank, timeout, f"process group {gid} set-up (rank {self.rank})"
        )
        self._hier: Hierarchy | None = None
        interval, hb_timeout = _heartbeat.settings()  # a bad setting raises before any thread starts
        self._worker = Worker(f"opstrata-comm-g{gid}")
        self._closed = False
        if self.size > 1 and interval > 0:
            transport.heartbeat = _heartbeat.Heartbeat(
                store,
                self.rank,
                self.size,
                interval=interval,
                timeout=hb_timeout,
                name=f"opstrata-comm-hb-g{gid}",
            )

    def __repr__(self) -> str:
        return f"ProcessGroup(gid={self.gid}, backend={self.backend!r}, ranks={self.ranks}, rank={self.rank})"

    def select(self, collective: str, nbytes: int, requested: str | None) -> tuple[str, str]:
        """(algorithm, reason) for a call on this group: override, topology, tuned thresholds, built-in table."""
        topo = self.topology
        return alg.select(
            collective,
            nbytes,
            self.size,
            requested,
            backend=self.backend,
            hosts=[topo.hosts.count(h) for h in topo.order],
            tuned=self.tuned,
        )

    def _hierarchy(self) -> Hierarchy:
        """The group's per-host shm level, made on first use (inside a collective every rank runs)."""
        if self._hier is None:
            job = getattr(self.store, "base", self.store).get("job_id", self.timeout).decode()
            self._hier = Hierarchy(self.transport, self.store, job=job, gid=self.gid, timeout=self.timeout)
        return self._hier

    def group_rank(self, global_rank: int, what: str) -> int:
        """Translate a global rank (torch convention for src/dst) into this group's rank."""
        if global_rank not in self.ranks:
            raise ValueError(f"{what}: rank {global_rank} is not in this group (ranks {self.ranks})")
        return self.ranks.index(global_rank)

    # -- execution ------------------------------------------------------------------------------------------
    def _run(
        self,
        name: str,
        desc: str,
        nbytes: int,
        algo: str,
        why: str,
        body: Callable[[Ctx], str],
        async_op: bool,
        check: bool = True,
    ) -> Work | None:
        if self._closed:
            raise RuntimeError(
                f"{name}: process group {self.gid} was destroyed; call init_process_group again"
            )
        seq = self.seq
        self.seq += 1
        what = f"{name} seq={seq} (group {self.gid}, rank {self.rank})"
        header = f"{name} seq={seq} {desc} algo={algo}"

        def task() -> None:
            t0 = time.perf_counter()
            c = Ctx(self.transport, what, time.monotonic() + self.timeout)
            entry = self.recorder.start(name, seq, desc, nbytes, algo)
            try:
                if check and self.size > 1:
                    self._check_header(c, header)
                note = body(c)
            except CommError as e:
                entry.state, entry.end, entry.error = "failed", time.time(), f"{type(e).__name__}: {e}"
                self.transport.abort(e, origin=self.rank)  # peers first: they stop waiting on us
                self._dump(e)
                raise
            ms = (time.perf_counter() - t0) * 1e3
            entry.state, entry.end, entry.ms = "done", time.time(), ms
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "[opstrata.comm rank %d] %s seq=%d algo=%s bytes=%d world=%d backend=%s time=%.3fms why=%s%s",
                    self.global_rank,
                    name,
                    seq,
                    algo,
                    nbytes,
                    self.size,
                    self.backend,
                    ms,
                    why,
                    f"; {note}" if note else "",
                )

        work = self._worker.submit(task, Work(what, self.timeout))
        if async_op:
            return work
        # each queued collective bounds its own waits by the timeout: budget for the whole backlog
        work.wait(self._worker.pending * self.timeout + 5.0)
        return None

    def _dump(self, e: CommError) -> None:
        """Write the flight recorder to a file, log its path and last entries, and name the path in ``e``."""
        try:
            path = self.recorder.dump(job=self.job, gid=self.gid, rank=self.global_rank, error=str(e))
            where = f"flight recorder ({len(self.recorder)} entries) written to {path}"
        except OSError as err:  # an unwritable dump dir must not hide the real error
            where = (
                f"flight recorder could not be written ({err}); set OPSTRATA_COMM_DUMP_DIR to a writable dir"
            )
        log.error(  # what this rank did just before the failure
            "[opstrata.comm rank %d] %s\n  %s\n  last collectives of group %d:\n    %s",
            self.global_rank,
            e,
            where,
            self.gid,
            "\n    ".join(str(x) for x in list(self.recorder)[-_SHOWN:]),
        )
        if e.args and isinstance(e.args[0], str) and where not in e.args[0]:
            e.args = (f"{e.args[0]}\n  {where}", *e.args[1:])

    def _check_header(self, c: Ctx, header: str) -> None:
        mine = np.zeros(_HDR_BYTES, np.uint8)
        raw = header.encode()[:_HDR_BYTES]
        mine[: len(raw)] = np.frombuffer(raw, np.uint8)
        theirs = np.empty_like(mine)
        right, left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        c.ex([(right, mine)], [(left, theirs, None)])
        if not np.array_equal(mine, theirs):
            other = theirs.tobytes().rstrip(b"\0").decode(errors="replace")
            raise CommDesyncError(
                f"{c.what}: desync: rank {self.rank} called [{header}] but rank {left} called [{other}] at the "
                "same point; every rank of the group must call the same collectives in the same order with "
                "the same shapes, dtypes, roots and algorithms"
            )

    def _log_fallback(self, name: str, requested: str) -> str:
        note = f"{requested} needs a power-of-two world, got {self.size}: ran ring instead"
        log.warning("[opstrata.comm rank %d] %s: %s", self.global_rank, name, note)
        return note

    # -- collectives -----------------------------------------------------------------------------------------
    def all_reduce(
        self, x: np.ndarray, op: str, algorithm: str | None, async_op: bool, deterministic: bool | None
    ):
        """In-place all-reduce."""
        _check_array(x, "all_reduce")
        _check_op(op, x.dtype, "all_reduce")
        det = self.deterministic if deterministic is None else deterministic
        algo, why = self.select("all_reduce", x.nbytes, algorithm)
        fn, acc, n = _fn(op), _acc(x.dtype), self.size

        def body(c: Ctx) -> str:
            flat = x.reshape(-1)
            work = flat if acc == x.dtype else flat.astype(acc)
            if n > 1 and algo == "hierarchical" and not det:
                note = self._hierarchy().all_reduce(c, work, fn)
            else:
                note = alg.all_reduce(c, work, fn, algo, det) if n > 1 else ""
            if op == "avg":
                np.divide(work, n, out=work, casting="unsafe")
            if work is not flat:
                flat[...] = work.astype(x.dtype)
            return note

        desc = f"op={op} dtype={x.dtype} shape={list(x.shape)} det={det}"
        return self._run("all_reduce", desc, x.nbytes, algo, why, body, async_op)

    def reduce(
        self,
        x: np.ndarray,
        dst: int,
        op: str,
        algorithm: str | None,
        async_op: bool,
        deterministic: bool | None,
    ):
        """Reduce into ``x`` on ``dst``; other ranks' ``x`` is left unchanged."""
        _check_array(x, "reduce")
        _check_op(op, x.dtype, "reduce")
        root = self.group_rank(dst, "reduce")
        det = self.deterministic if deterministic is None else deterministic
        algo, why = self.select("reduce", x.nbytes, algorithm)
        fn, acc, n, r = _fn(op), _acc(x.dtype), self.size, self.rank

        def body(c: Ctx) -> str:
            flat = x.reshape(-1)
            work = flat if (acc == x.dtype and r == root) else flat.astype(acc)
            if n > 1:
                if algo == "tree" and not det:
                    alg.tree_reduce(c, work, fn, root)
                elif algo == "double_tree" and not det:
                    _double_tree.plan(n, r, work, fn, root=root, up=True, down=False).run(c.ex)
                else:
                    blocks = Blocks(work, n)
                    (alg.rs_ring if algo == "ring" and not det else alg.rs_direct)(c, blocks, fn)
                    if r == root:
                        c.ex((), [(j, blocks[j], None) for j in range(n) if j != root])
                    else:
                        c.ex([(root, blocks[r])])
            if r == root:
                if op == "avg":
                    np.divide(work, n, out=work, casting="unsafe")
                if work is not flat:
                    flat[...] = work.astype(x.dtype)
            return "deterministic: rank-order fold at block owners" if det and n > 1 else ""

        desc = f"op={op} dst={dst} dtype={x.dtype} shape={list(x.shape)} det={det}"
        return self._run("reduce", desc, x.nbytes, algo, why, body, async_op)

    def broadcast(self, x: np.ndarray, src: int, algorithm: str | None, async_op: bool):
        """Copy ``x`` from ``src`` into every rank's ``x``."""
        _check_array(x, "broadcast")
        root = self.group_rank(src, "broadcast")
        algo, why = self.select("broadcast", x.nbytes, algorithm)

        def body(c: Ctx) -> str:
            if self.size == 1:
                return ""
            buf = x.reshape(-1)
            if algo == "hierarchical":
                return self._hierarchy().broadcast(c, buf, root)
            if algo == "double_tree":
                _double_tree.plan(self.size, self.rank, buf, None, root=root, up=False, down=True).run(c.ex)
            else:
                {"direct": alg.direct_broadcast, "tree": alg.tree_broadcast, "ring": alg.ring_broadcast}[
                    algo
                ](c, buf, root)
            return ""

        desc = f"src={src} dtype={x.dtype} shape={list(x.shape)}"
        return self._run("broadcast", desc, x.nbytes, algo, why, body, async_op)

    def all_gather(self, out: Any, x: np.ndarray, algorithm: str | None, async_op: bool):
        """Gather every rank's ``x`` into ``out`` (a list of arrays or one array of world_size * x.size)."""
        _check_array(x, "all_gather")
        outs = _parts(out, self.size, x, "all_gather", "out")
        algo, why = self.select("all_gather", x.nbytes * self.size, algorithm)
        n, r = self.size, self.rank

        def body(c: Ctx) -> str:
            flat = outs.reshape(-1) if isinstance(outs, np.ndarray) else np.empty(n * x.size, x.dtype)
            blocks = Blocks(flat, n)
            blocks[r][...] = x.reshape(-1)
            note = ""
            if n > 1:
                if algo == "direct":
                    alg.ag_direct(c, blocks)
                elif algo == "hierarchical":
                    note = self._hierarchy().all_gather(c, blocks)
                elif algo == "halving_doubling" and alg._pow2(n):
                    alg.ag_doubling(c, blocks)
                else:
                    note = self._log_fallback("all_gather", algo) if algo == "halving_doubling" else ""
                    alg.ag_ring(c, blocks)
            if isinstance(outs, list):
                for j, o in enumerate(outs):
                    o.reshape(-1)[...] = blocks[j]
            return note

        desc = f"dtype={x.dtype} shape={list(x.shape)}"
        return self._run("all_gather", desc, x.nbytes * n, algo, why, body, async_op)

    def reduce_scatter(
        self,
        out: np.ndarray,
        xs: Any,
        op: str,
        algorithm: str | None,
        async_op: bool,
        deterministic: bool | None,
    ):
        """Reduce ``xs`` (world_size parts) across ranks; rank r receives part r in ``out``."""
        _check_array(out, "reduce_scatter", "out")
        _check_op(op, out.dtype, "reduce_scatter")
        parts = _parts(xs, self.size, out, "reduce_scatter", "x")
        det = self.deterministic if deterministic is None else deterministic
        algo, why = self.select("reduce_scatter", out.nbytes * self.size, algorithm)
        fn, acc, n, r = _fn(op), _acc(out.dtype), self.size, self.rank

        def body(c: Ctx) -> str:
            src = parts if isinstance(parts, np.ndarray) else np.concatenate([p.reshape(-1) for p in parts])
            work = src.reshape(-1).astype(acc)  # a copy: the input is not modified
            blocks = Blocks(work, n)
            note = ""
            if n > 1:
                if det or algo == "direct":
                    alg.rs_direct(c, blocks, fn)
                elif algo == "halving_doubling" and alg._pow2(n):
                    alg.rs_halving(c, blocks, fn)
                else:
                    note = self._log_fallback("reduce_scatter", algo) if algo == "halving_doubling" else ""
                    alg.rs_ring(c, blocks, fn)
            mine = blocks[r]
            if op == "avg":
                np.divide(mine, n, out=mine, casting="unsafe")
            out.reshape(-1)[...] = mine.astype(out.dtype)
            return note

        desc = f"op={op} dtype={out.dtype} shape={list(out.shape)} det={det}"
        return self._run("reduce_scatter", desc, out.nbytes * n, algo, why, body, async_op)

    def all_to_all(self, out: Any, x: Any, async_op: bool):
        """Rank r sends part j of ``x`` to rank j and receives rank j's part r into part j of ``out``."""
        n, r = self.size, self.rank
        first = x[0] if isinstance(x, (list, tuple)) else None
        if first is None:
            _check_array(x, "all_to_all", "x")
            if x.size % n:
                raise ValueError(f"all_to_all: x has {x.size} elements, not divisible by world_size={n}")
            first = x.reshape(-1)[: x.size // n]
        ins = _parts(x, n, first, "all_to_all", "x")
        outs = _parts(out, n, first, "all_to_all", "out")
        algo, why = alg.select("all_to_all", first.nbytes * n, n, None)

        def body(c: Ctx) -> str:
            src = (
                Blocks(ins.reshape(-1), n)
                if isinstance(ins, np.ndarray)
                else [np.ascontiguousarray(a).reshape(-1) for a in ins]
            )
            dst = (
                Blocks(outs.reshape(-1), n) if isinstance(outs, np.ndarray) else [a.reshape(-1) for a in outs]
            )
            own = np.array(src[r], copy=True)
            c.ex([(j, src[j]) for j in range(n) if j != r], [(j, dst[j], None) for j in range(n) if j != r])
            dst[r][...] = own
            return ""

        desc = f"dtype={first.dtype} part={first.size}"
        return self._run("all_to_all", desc, first.nbytes * n, algo, why, body, async_op)

    def barrier(self, async_op: bool = False):
        """Block until every rank of the group reached the barrier."""
        n = self.size

        def body(c: Ctx) -> str:
            if n > 1:
                tok = np.zeros(n, np.uint8)
                alg.ag_direct(c, Blocks(tok, n))
            return ""

        return self._run("barrier", "", 0, "direct", "barrier is a one-round token exchange", body, async_op)

    def send(self, x: np.ndarray, dst: int) -> None:
        """Send ``x`` to global rank ``dst`` (blocks until the transport took all of it)."""
        _check_array(x, "send")
        peer = self.group_rank(dst, "send")
        if peer == self.rank:
            raise ValueError(f"send: dst={dst} is this rank; send to another rank")
        k = self._p2p_send[peer]
        self._p2p_send[peer] += 1
        hdr = f"p2p {self.global_rank}->{dst} #{k} dtype={x.dtype} shape={list(x.shape)}"

        def body(c: Ctx) -> str:
            raw = np.zeros(_HDR_BYTES, np.uint8)
            b = hdr.encode()[:_HDR_BYTES]
            raw[: len(b)] = np.frombuffer(b, np.uint8)
            c.ex([(peer, raw)])
            c.ex([(peer, x.reshape(-1))])
            return ""

        self._run("send", f"to={dst} #{k}", x.nbytes, "direct", "point-to-point", body, False, check=False)

    def recv(self, x: np.ndarray, src: int) -> None:
        """Receive into ``x`` from global rank ``src``."""
        _check_array(x, "recv")
        peer = self.group_rank(src, "recv")
        if peer == self.rank:
            raise ValueError(f"recv: src={src} is this rank; receive from another rank")
        k = self._p2p_recv[peer]
        self._p2p_recv[peer] += 1
        want = f"p2p {src}->{self.global_rank} #{k} dtype={x.dtype} shape={list(x.shape)}"

        def body(c: Ctx) -> str:
            raw = np.empty(_HDR_BYTES, np.uint8)
            c.ex((), [(peer, raw, None)])
            got = raw.tobytes().rstrip(b"\0").decode(errors="replace")
            if got != want:
                raise CommDesyncError(
                    f"{c.what}: recv expected [{want}] but rank {src} sent [{got}]; match send/recv shapes and dtypes"
                )
            c.ex((), [(peer, x.reshape(-1), None)])
            return ""

        self._run("recv", f"from={src} #{k}", x.nbytes, "direct", "point-to-point", body, False, check=False)

    def close(self) -> None:
        """Stop the worker and release the transport."""
        if self._closed:
            return
        self._closed = True
        self._worker.stop(self.timeout)
        if self.transport.heartbeat is not None:
            self.transport.heartbeat.stop()
        if self._hier is not None:
            self._hier.close()
        self.transport.close()


class _NonMember:
    """Returned by ``new_group`` on ranks outside the group (torch's GroupMember.NON_GROUP_MEMBER)."""

    def __repr__(self) -> str:
        return "NON_GROUP_MEMBER"


NON_GROUP_MEMBER: Any = _NonMember()
