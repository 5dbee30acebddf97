"""Stream scheduler: N worker threads run a plan's independent nodes concurrently, in a static order.

Once per input-shape signature the scheduler

1. assigns every node to a stream by list scheduling (HEFT-style): nodes by decreasing upward rank
   (longest estimated path to the end), each placed on the stream where it would finish first,
   paying a hand-off cost for every input produced on another stream; costs come from the FLOP and
   byte estimates of :func:`node_flops`;
2. derives *happens-before* from the data edges plus each stream's program order, and lays out the
   arena so that two values share bytes only when every access of one happens before the first write
   of the other (greedy by size over that conflict relation). Reuse is then safe under any
   interleaving, with no extra memory events;
3. runs it: worker k executes stream k's nodes in order; before a node it waits on the completion
   event of each producer that ran on another stream (a per-run generation stamp plus the stream's
   condition variable: no busy wait; every wait gives up after ``stream_timeout_s`` without any node
   finishing).

numpy releases the GIL inside large kernels (BLAS, ufunc loops), so branches overlap on several
cores. Every node computes exactly what it computes in a sequential run, so results are bit-identical.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from opstrata.graph import Graph, MemoryPlan

from ._allocator import CachingAllocator
from ._arena import _RESHAPES, Arena
from ._errors import ExecutionError
from ._executor import Schedule
from ._flops import node_flops
from ._profiler import Profiler

__all__ = [
    "HANDOFF_NS",
    "MIN_GAIN",
    "StreamAssignment",
    "StreamPool",
    "StreamProgram",
    "assign_streams",
    "stream_memory_plan",
]

#: Cost model of list scheduling (rough host-CPU figures; only their ratios matter).
_NODE_NS = 4_000.0  # fixed cost of one node (Python dispatch, argument checks)
_FLOP_PER_NS = 20.0  # ~20 GFLOP/s on one core
_BYTE_PER_NS = 4.0  # ~4 GB/s of memory traffic on one core
#: Estimated cost of handing a value to another stream (condition variable wake-up + GIL hand-off).
HANDOFF_NS = 30_000.0
#: Streams are used only when the estimated makespan, plus handing the run to the workers and back,
#: beats the sequential sum of costs by this fraction; else the plan runs sequentially in the caller.
MIN_GAIN = 0.10
_IDLE_WAIT_S = 5.0  # an idle worker re-checks for shutdown this often (it is woken explicitly anyway)

Shape = tuple[int, ...]


# ----------------------------------------------------------------------------------- assignment


@dataclass(frozen=True)
class StreamAssignment:
    """Which stream runs each step, in what order, and which cross-stream events each step waits on."""

    order: tuple[tuple[int, ...], ...]  # per stream: step indices in execution order
    stream_of: tuple[int, ...]  # per step: its stream
    waits: tuple[tuple[int, ...], ...]  # per step: producers on other streams to wait for
    notify: tuple[tuple[int, ...], ...]  # per step: streams that wait for it
    ancestors: tuple[int, ...]  # per step: bit set of the steps that happen before it
    makespan_ns: float  # the cost model's estimate of one run

    @property
    def streams_used(self) -> int:
        """Streams that run at least one node."""
        return sum(1 for o in self.order if o)


def step_preds(schedule: Schedule) -> list[list[int]]:
    """Per step, the steps producing its inputs (data dependencies)."""
    producer: dict[int, int] = {}
    preds: list[list[int]] = []
    for i, st in enumerate(schedule.steps):
        preds.append(sorted({producer[s] for s in st.ins if s in producer}))
        for s in st.outs:
            if s >= 0:
                producer[s] = i
    return preds


def step_costs(schedule: Schedule, shapes: Sequence[Shape | None]) -> list[float]:
    """Estimated nanoseconds per step from its FLOPs and bytes at these per-slot shapes."""
    itemsize = {
        schedule.slot[n]: v.dtype.itemsize for n, v in schedule.graph.values.items() if v.dtype is not None
    }
    costs = []
    for st in schedule.steps:
        ins = [shapes[s] if s >= 0 else None for s in st.ins]
        outs = [shapes[s] if s >= 0 else None for s in st.outs]
        nbytes = sum(
            int(np.prod(shapes[s], dtype=np.int64)) * itemsize.get(s, 4)
            for s in (*st.ins, *st.outs)
            if s >= 0 and shapes[s] is not None
        )
        try:
            flops = node_flops(st.node, ins, outs)
        except (TypeError, IndexError, ValueError):  # an op the estimate cannot read: count its bytes only
            flops = 0
        costs.append(_NODE_NS + flops / _FLOP_PER_NS + nbytes / _BYTE_PER_NS)
    return costs


def assign_streams(
    preds: Sequence[Sequence[int]],
    costs: Sequence[float],
    num_streams: int,
    handoff_ns: float | None = None,
    min_gain: float | None = None,
) -> StreamAssignment:
    """List-schedule a DAG (steps in topological order) onto ``num_streams`` streams.

    Falls back to one stream when the estimated gain is below ``min_gain`` (default :data:`MIN_GAIN`).

    >>> a = assign_streams([[], [0], [0], [1, 2]], [1e3, 1e6, 1e6, 1e3], 2, handoff_ns=1e3)
    >>> sorted(a.stream_of[1:3])  # the two heavy independent steps land on different streams
    [0, 1]
    >>> assign_streams([[], [0], [0], [1, 2]], [1e3, 1e3, 1e3, 1e3], 2, handoff_ns=1e3).streams_used
    1
    """
    handoff = HANDOFF_NS if handoff_ns is None else handoff_ns
    gain = MIN_GAIN if min_gain is None else min_gain
    asg = _list_schedule(preds, costs, num_streams, handoff)
    if asg.streams_used > 1 and asg.makespan_ns + 2 * handoff >= (1.0 - gain) * sum(costs):
        one = _list_schedule(preds, costs, 1, handoff)  # everything on stream 0, the others idle
        asg = dataclasses.replace(one, order=one.order + ((),) * (num_streams - 1))
    return asg


def _list_schedule(
    preds: Sequence[Sequence[int]], costs: Sequence[float], num_streams: int, handoff_ns: float
) -> StreamAssignment:
    n = len(costs)
    succs: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    rank = [0.0] * n
    for i in range(n - 1, -1, -1):
        rank[i] = costs[i] + max((rank[j] for j in succs[i]), default=0.0)
    free = [0.0] * num_streams
    finish = [0.0] * n
    stream_of = [0] * n
    order: list[list[int]] = [[] for _ in range(num_streams)]
    anc = [0] * n
    last_on: list[int | None] = [None] * num_streams
    for i in sorted(range(n), key=lambda j: (-rank[j], j)):  # rank never grows along an edge: topological
        best_s, best_t = 0, float("inf")
        for s in range(num_streams):
            start = max(
                [free[s]] + [finish[p] + (handoff_ns if stream_of[p] != s else 0.0) for p in preds[i]]
            )
            if start + costs[i] < best_t:
                best_s, best_t = s, start + costs[i]
            if not order[s]:
                break  # every later stream is empty too: the same start, never better
        stream_of[i], finish[i], free[best_s] = best_s, best_t, best_t
        bits = 0
        prev = last_on[best_s]
        for p in (*preds[i], *(() if prev is None else (prev,))):
            bits |= anc[p] | (1 << p)
        anc[i] = bits
        order[best_s].append(i)
        last_on[best_s] = i
    pos = {i: k for o in order for k, i in enumerate(o)}
    waits: list[tuple[int, ...]] = []
    notify: list[set[int]] = [set() for _ in range(n)]
    for i in range(n):
        latest: dict[int, int] = {}  # per other stream, its last producer of ours (earlier ones are implied)
        for p in preds[i]:
            s = stream_of[p]
            if s != stream_of[i] and (s not in latest or pos[p] > pos[latest[s]]):
                latest[s] = p
        waits.append(tuple(sorted(latest.values())))
        for p in latest.values():
            notify[p].add(stream_of[i])
    return StreamAssignment(
        order=tuple(tuple(o) for o in order),
        stream_of=tuple(stream_of),
        waits=tuple(waits),
        notify=tuple(tuple(sorted(x)) for x in notify),
        ancestors=tuple(anc),
        makespan_ns=max(finish, default=0.0),
    )


# ----------------------------------------------------------------------------------- memory


class _Buffer(NamedTuple):
    """Bytes shared by a value, its views and its in-place successors."""

    size: int  # bytes (the largest member)
    root: int  # the step that first writes it
    access: int  # bit set of the steps that write or read it
    final: bool  # holds a graph output (lives to the end of the run)
    name: str  # the union-find root value


def stream_memory_plan(
    graph: Graph, schedule: Schedule, seq: MemoryPlan, asg: StreamAssignment
) -> tuple[MemoryPlan, set[str]]:
    """An arena layout valid under ``asg``'s concurrency, and the values kept as views of another's bytes.

    Buffers: each planned value, merged with the values that are views of it (reshape-likes, always
    kept uncopied here) and with in-place outputs of the sequential plan whose other readers all
    happen before the in-place writer. Buffer A may share bytes with B only when A holds no graph
    output and every access of A happens before B's first write (or the reverse).
    """
    names = {i: name for name, i in schedule.slot.items()}
    planned = seq.offsets
    parent = {v: v for v in planned}

    def find(v: str) -> str:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    writer: dict[str, int] = {}
    readers: dict[str, set[int]] = {v: set() for v in planned}
    for i, st in enumerate(schedule.steps):
        for s in st.outs:
            if s >= 0 and names[s] in planned:
                writer[names[s]] = i
        for s in st.ins:
            if s >= 0 and names[s] in readers:
                readers[names[s]].add(i)
    aliases: set[str] = set()
    external: set[str] = set()  # views of a feed or initializer: no arena bytes of their own
    for n in graph.nodes:
        if n.domain not in ("", "ai.onnx") or n.op_type not in _RESHAPES or len(n.outputs) != 1:
            continue
        o, x = n.outputs[0], n.inputs[0]
        if o not in planned:
            continue
        aliases.add(o)
        if x in planned and x not in external:
            parent[find(o)] = find(x)
        else:
            external.add(o)

    def members_of() -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for v in planned:
            if v not in external:
                groups.setdefault(find(v), []).append(v)
        return groups

    outputs = set(graph.outputs)
    inplace: dict[str, str] = {}
    for o, x in seq.inplace.items():
        if o in aliases or x in external or x not in planned:
            continue
        i = writer[o]
        group = members_of()[find(x)]
        acc = {writer[v] for v in group} | {r for v in group for r in readers[v]}
        acc.discard(i)
        if not outputs.intersection(group) and all(asg.ancestors[i] >> a & 1 for a in acc):
            parent[find(o)] = find(x)
            inplace[o] = x
    bufs = []
    for name, vs in members_of().items():
        access = 0
        for v in vs:
            access |= 1 << writer[v]
            for r in readers[v]:
                access |= 1 << r
        bufs.append(
            _Buffer(
                max(seq.sizes[v] for v in vs),
                min(writer[v] for v in vs),
                access,
                bool(outputs.intersection(vs)),
                name,
            )
        )

    def before(a: _Buffer, b: _Buffer) -> bool:  # every access of a happens before b is first written
        return not a.final and (a.access & ~asg.ancestors[b.root]) == 0

    offset: dict[str, int] = {}
    placed: list[_Buffer] = []
    for b in sorted(bufs, key=lambda b: (-b.size, b.root)):  # greedy by size over the conflict relation
        live = sorted((offset[p.name], p.size) for p in placed if not before(p, b) and not before(b, p))
        cand = 0
        for off, sz in live:
            if off - cand >= b.size:
                break
            cand = max(cand, off + sz)
        offset[b.name] = cand
        placed.append(b)
    offsets = {v: (0 if v in external else offset[find(v)]) for v in planned}
    arena = max([offset[b.name] + b.size for b in bufs] + [seq.sizes[v] for v in external] + [0])
    plan = dataclasses.replace(seq, offsets=offsets, inplace=inplace, arena_bytes=int(arena))
    return plan, aliases


# ----------------------------------------------------------------------------------- program


class StreamProgram:
    """One input-shape signature: its assignment, arena (None: allocator blocks) and per-step events."""

    def __init__(self, schedule: Schedule, asg: StreamAssignment, arena: Arena | None) -> None:
        self.asg, self.arena = asg, arena
        #: more than one stream has work (else the caller runs the plan sequentially, no hand-off)
        self.parallel = asg.streams_used > 1
        self.alias = schedule.alias_slots(arena) if arena is not None else frozenset()
        #: completion events: ``done[i] == generation`` once step i finished in that run
        self.done = [0] * len(schedule.steps)
        keep = set(schedule.output_slots) | set(schedule.input_slots)
        keep |= {schedule.slot[x] for x in schedule.graph.initializers}
        readers: dict[int, set[int]] = {}
        for i, st in enumerate(schedule.steps):
            for s in st.ins:
                if s >= 0 and s not in keep:
                    readers.setdefault(s, set()).add(i)
        #: allocator mode: slots each step releases one read of, and each slot's reader count
        self.release = [tuple(sorted(s for s in set(st.ins) if s in readers)) for st in schedule.steps]
        self.reader_count = [len(readers.get(s, ())) for s in range(len(schedule.template))]


def slot_shapes_from_plan(
    schedule: Schedule, mp: MemoryPlan | None, feeds: Sequence[Shape]
) -> list[Shape | None]:
    """Concrete shape per slot: the memory plan's, the feeds', the initializers'; else the graph's if static."""
    shapes: list[Shape | None] = [None] * len(schedule.template)
    for name, i in schedule.slot.items():
        v = schedule.graph.values.get(name)
        if v is not None and v.shape is not None and all(isinstance(d, int) for d in v.shape):
            shapes[i] = tuple(v.shape)  # type: ignore[arg-type]
    for name, arr in schedule.graph.initializers.items():
        shapes[schedule.slot[name]] = tuple(np.shape(arr))
    for s, shp in zip(schedule.input_slots, feeds, strict=True):
        shapes[s] = tuple(shp)
    if mp is not None:
        for name, shp in mp.shapes.items():
            shapes[schedule.slot[name]] = tuple(shp)
    return shapes


# ----------------------------------------------------------------------------------- workers


class _LockedAllocator:
    """The session's caching allocator behind a lock (streams allocate and free concurrently)."""

    def __init__(self, alloc: CachingAllocator) -> None:
        self.alloc, self.lock = alloc, threading.Lock()

    def empty(self, shape: Any, dtype: Any) -> np.ndarray:
        with self.lock:
            return self.alloc.empty(shape, dtype)


class _Run:
    """The state of one ``run`` shared by the workers: values, where results go, the first error."""

    __slots__ = (
        "alloc",
        "ctx",
        "error",
        "gen",
        "held",
        "lock",
        "prof",
        "prog",
        "remaining",
        "run_id",
        "stalled",
        "vals",
    )

    def __init__(self, prog: StreamProgram, vals: list[Any], prof: Profiler | None, run_id: int) -> None:
        self.prog, self.vals, self.prof, self.run_id = prog, vals, prof, run_id
        self.ctx = contextvars.copy_context()  # the caller's device / fallback policy, for every worker
        self.error: BaseException | None = None
        self.stalled = False
        self.lock = threading.Lock()
        self.gen = 0
        self.alloc: _LockedAllocator | None = None
        self.held: dict[int, np.ndarray] = {}
        self.remaining: list[int] = []


class StreamPool:
    """``num_streams`` daemon worker threads that execute a StreamProgram's streams concurrently."""

    def __init__(self, schedule: Schedule, num_streams: int, timeout_s: float) -> None:
        self.schedule, self.n, self.timeout = schedule, num_streams, float(timeout_s)
        self._conds = [threading.Condition() for _ in range(num_streams)]  # new run, or an awaited event
        self._idle = threading.Condition()  # a worker finished its part of a run
        self._gen = 0  # run generation; also the stamp of every completion event of that run
        self._job: _Run | None = None
        self._finished = [0] * num_streams  # the last generation each worker finished
        self._running: list[tuple[int, int] | None] = [None] * num_streams  # (step, start ns) per stream
        self._progress = [0] * num_streams  # nodes finished per stream (stall detection)
        self._threads: list[threading.Thread] = []
        self._closing = False

    # -------------------------------------------------------------- lifecycle

    @property
    def threads(self) -> list[threading.Thread]:
        """The live worker threads (empty before the first parallel run and after close)."""
        return list(self._threads)

    def _start(self) -> None:
        if self._closing:
            raise ExecutionError("StreamPool", "the session is closed", "create a new InferenceSession")
        if not self._threads:
            self._threads = [
                threading.Thread(target=self._serve, args=(k,), name=f"opstrata-stream-{k}", daemon=True)
                for k in range(self.n)
            ]
            for t in self._threads:
                t.start()

    def close(self) -> list[str]:
        """Stop and join the workers (each within the timeout); returns the nodes still stuck in a kernel."""
        self._closing = True
        for c in self._conds:
            with c:
                c.notify_all()
        deadline = time.monotonic() + self.timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [
            self.schedule.steps[r[0]].where for t, r in zip(self._threads, self._running, strict=False)
            if t.is_alive() and r is not None
        ]  # fmt: skip
        self._threads = []
        return stuck

    # -------------------------------------------------------------- one run (caller side)

    def run(
        self,
        prog: StreamProgram,
        vals: list[Any],
        prof: Profiler | None,
        run_id: int,
        alloc: CachingAllocator,
    ) -> list[np.ndarray]:
        """Execute ``prog`` on the workers; returns the allocator blocks still held (arena mode: none)."""
        self._start()
        self._await_idle()
        job = _Run(prog, vals, prof, run_id)
        if prog.arena is None:
            job.alloc = _LockedAllocator(alloc)
            job.remaining = list(prog.reader_count)
        self._gen += 1
        job.gen = self._gen
        self._job = job
        with self._idle:  # streams without nodes in this program have nothing to do: done already
            for k, order in enumerate(prog.asg.order):
                if not order:
                    self._finished[k] = job.gen
        for k, c in enumerate(self._conds):
            if prog.asg.order[k]:
                with c:
                    c.notify()
        self._await_idle(job)
        if job.error is not None:
            if not job.stalled:  # every worker has returned: give the blocks back
                for arr in job.held.values():
                    alloc.free(arr)
                job.held.clear()
            raise job.error
        return list(job.held.values())

    def _await_idle(self, job: _Run | None = None) -> None:
        """Wait until every worker finished the current generation; a stall (no node finishing) times out."""
        gen = self._gen
        stall: ExecutionError | None = None
        with self._idle:
            while any(f != gen for f in self._finished):
                before = sum(self._progress)
                if not self._idle.wait(self.timeout) and sum(self._progress) == before:
                    if all(f == gen for f in self._finished):
                        break
                    stall = self._stall_error(job is None)
                    break
        if stall is None:
            return
        if job is None:
            raise stall  # a kernel of an earlier, timed-out run is still writing: refuse to start
        self._fail(job, stall, stalled=True)

    def _stall_error(self, earlier: bool) -> ExecutionError:
        now = time.perf_counter_ns()
        busy = sorted(((now - r[1]) / 1e9, k, r[0]) for k, r in enumerate(self._running) if r is not None)
        fix = (
            "a kernel is blocked or slower than stream_timeout_s: raise SessionOptions(stream_timeout_s=...) "
            "or find what blocks it; the session cannot run again until that kernel returns"
        )
        if not busy:
            return ExecutionError(
                "stream scheduler", f"no node finished for {self.timeout:g} s (stream_timeout_s) and no kernel "
                "is running", "report the model: the streams wait on each other",
            )  # fmt: skip
        secs, k, i = busy[-1]
        what = "from an earlier run that timed out " if earlier else ""
        others = "; ".join(f"{self.schedule.steps[j].where} on stream {s}" for _, s, j in busy[:-1])
        return ExecutionError(
            self.schedule.steps[i].where,
            f"still running {what}on stream {k} after {secs:.2f} s: no node finished for {self.timeout:g} s "
            f"(stream_timeout_s){'; also running: ' + others if others else ''}",
            fix,
        )

    def _fail(self, job: _Run, exc: BaseException, stalled: bool = False) -> None:
        """Record the run's first error and wake every stream so the others stop."""
        with job.lock:
            if job.error is None:
                job.error = exc
            job.stalled = job.stalled or stalled  # a kernel may still be writing: keep its blocks
        for c in self._conds:
            with c:
                c.notify_all()
        with self._idle:
            self._idle.notify_all()

    # -------------------------------------------------------------- workers

    def _serve(self, k: int) -> None:
        cond, seen = self._conds[k], 0
        while True:
            with cond:
                while self._gen == seen and not self._closing:
                    cond.wait(_IDLE_WAIT_S)
                if self._closing:
                    return
                seen, job = self._gen, self._job
            try:
                if job is not None:
                    job.ctx.copy().run(self._run_stream, job, k)
            except BaseException as exc:
                self._fail(job, exc)  # type: ignore[arg-type]
            finally:
                with self._idle:
                    self._finished[k] = seen
                    self._idle.notify_all()

    def _run_stream(self, job: _Run, k: int) -> None:
        sch, prog, gen = self.schedule, job.prog, job.gen
        steps, done, waits, notify = sch.steps, prog.done, prog.asg.waits, prog.asg.notify
        arena, alias, vals, prof = prog.arena, prog.alias, job.vals, job.prof
        for i in prog.asg.order[k]:
            for p in waits[i]:
                if done[p] != gen and not self._await_event(job, k, p):
                    return
            if job.error is not None:
                return
            st = steps[i]
            t0 = time.perf_counter_ns()
            self._running[k] = (i, t0)
            try:
                if arena is not None:
                    args = sch.exec_arena(st, vals, alias, arena)
                else:
                    args = sch.exec_alloc(st, vals, job.held, job.alloc)  # type: ignore[arg-type]
                    self._release(job, i)
            except BaseException as exc:
                self._running[k] = None
                self._fail(job, exc)
                return
            self._running[k] = None
            if prof is not None:
                sch._record(prof, st, args, vals, t0, job.run_id, k)
                for p in waits[i]:
                    prof.flows.append((job.run_id, steps[p].node.name, st.node.name))
            done[i] = gen
            self._progress[k] += 1
            for t in notify[i]:
                c = self._conds[t]
                with c:
                    c.notify()

    def _await_event(self, job: _Run, k: int, p: int) -> bool:
        """Block until step ``p`` finished in this run; False when the run failed or stalled meanwhile."""
        done, gen, cond = job.prog.done, job.gen, self._conds[k]
        stall: ExecutionError | None = None
        with cond:
            while done[p] != gen and job.error is None:
                before = sum(self._progress)
                if not cond.wait(self.timeout) and done[p] != gen and sum(self._progress) == before:
                    stall = self._stall_error(False)
                    break
        if stall is not None:
            self._fail(job, stall, stalled=True)
        return done[p] == gen and job.error is None

    @staticmethod
    def _release(job: _Run, i: int) -> None:
        """Allocator mode: drop one read of each input of step ``i``; free a block after its last reader."""
        alloc = job.alloc
        assert alloc is not None
        with alloc.lock:
            for s in job.prog.release[i]:
                job.remaining[s] -= 1
                if job.remaining[s] == 0 and s in job.held:
                    alloc.alloc.free(job.held.pop(s))
                    job.vals[s] = None
