"""A session's plan on a device with its own memory (cuda): nodes on the device, the rest on the host.

Values live where they were made. A device node gets its host inputs uploaded (initializers once, at
the first run; feeds and host results as needed); a host node gets host copies of its device inputs and
runs the graph's own kernel on ``cpu``. A host node that computes on floating-point tensors is a
fallback: audited through ``opstrata.ops.record_fallback`` with the bytes it moved and the time the
copies took, listed by :meth:`DeviceProgram.fallbacks`, and refused up front under the ``error``
policy. Integer and boolean nodes (shape arithmetic, index and mask building) run on the host by
design, as onnxruntime's CUDA provider places them, and are not fallbacks.

With ``device_graph`` (onnxruntime's ``enable_cuda_graph``) each input-shape signature runs eagerly once,
then its plan is recorded as one device graph (CUDA graph) and later runs only copy the feeds into the
graph's input buffers and replay it. Host nodes must then depend on shapes alone (they run once, while
recording); :meth:`DeviceProgram.capture_blockers` names those that do not, and the session refuses
them at creation. Index checks run on the device during replays and fail the run after it.

Eager runs keep each signature's intermediates in one device allocation (``_device_arena``: the kernels'
allocations traced once and laid out by the memory plan's packer) where the memory allows it, and
compute its shape-fixed host steps once (``_device_fold``: the exporters' shape subgraphs).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import opstrata.ops as ops
from opstrata.graph import EXECUTOR_KERNELS as KERNELS, Graph, Node

from ._device_arena import DeviceArena, DeviceArenaStats
from ._device_fold import Folded, fold, keep, static_steps
from ._device_graph import Recorded, c_order, capture_blockers, record, replay
from ._device_nodes import HOST_INPUTS, NODE_KERNELS, _attrs_ok, feed_valued, node_key, node_runs_on_device
from ._errors import ExecutionError, InvalidModel
from ._flops import node_flops
from ._profiler import NodeEvent, Profiler

__all__ = ["DeviceProgram", "HostNode"]


@dataclass(frozen=True)
class HostNode:
    """A node a device session runs on the host, and why."""

    node: str
    op_type: str
    dtype: str
    reason: str
    fallback: bool = True  # False: integer/boolean work kept on the host by design (shapes, masks)


def _shape_work(n: Node, graph: Graph) -> bool:
    """True for a node whose every input and output is a known integer or boolean tensor."""
    names = [x for x in (*n.inputs, *n.outputs) if x]
    dts = [graph.values[x].dtype if x in graph.values else None for x in names]
    return bool(dts) and all(d is not None and np.dtype(d).kind in "biu" for d in dts)


#: reshape-like nodes: views on any dtype, no kernel
_VIEWS = frozenset({("", "Reshape"), ("", "Flatten"), ("", "Squeeze"), ("", "Unsqueeze"), ("", "Identity")})


def _place(graph: Graph, device: str) -> list[tuple[bool, str]]:
    """(on the device, why not) per node: ``node_runs_on_device``, and integer views of the feeds' values
    (token ids reshaped for an embedding) on the device where only device nodes read them, so the ids go
    up once and no host node sits between the feed and the device (a device graph can then hold it)."""
    placed = [node_runs_on_device(n, graph, device) for n in graph.nodes]
    on_feeds = feed_valued(graph)
    readers: dict[str, list[tuple[int, int]]] = {}  # value -> (node index, input position) reading it
    for i, n in enumerate(graph.nodes):
        for k, x in enumerate(n.inputs):
            if x:
                readers.setdefault(x, []).append((i, k))
    outputs = set(graph.outputs)
    for i in reversed(range(len(graph.nodes))):  # consumers first: a chain of views moves together
        n = graph.nodes[i]
        if placed[i][0] or node_key(n) not in _VIEWS or not n.inputs or n.inputs[0] not in on_feeds:
            continue
        if _attrs_ok(n, graph):
            continue  # an attribute the device mapping does not take
        outs = [o for o in n.outputs if o]
        if outs and all(
            o not in outputs and readers.get(o) and all(
                placed[j][0] and k not in HOST_INPUTS.get(node_key(graph.nodes[j]), frozenset())
                for j, k in readers[o]
            )
            for o in outs
        ):  # fmt: skip
            placed[i] = (True, "")
    return placed


def _meta(args: list[Any], res: list[Any]) -> tuple[Any, Any, int]:
    """A profiled node's input shapes, output shapes and bytes touched (kept instead of its arrays)."""
    shape = lambda a: None if a is None else tuple(int(d) for d in a.shape)  # noqa: E731
    moved = sum(int(getattr(a, "nbytes", 0)) for a in (*args, *res) if a is not None)
    return tuple(shape(a) for a in args), tuple(shape(r) for r in res), moved


class DeviceProgram:
    """The plan's nodes placed on ``device`` or the host; runs them with values in either memory."""

    def __init__(
        self,
        graph: Graph,
        device: str,
        *,
        device_graph: bool = False,
        graph_cache_size: int = 16,
        arena: bool = True,
    ) -> None:
        mem = ops.device_memory(device)
        if mem is None:
            raise InvalidModel(
                "DeviceProgram", f"device '{device}' computes in host memory", "use the cpu executor"
            )
        self.graph, self.device, self.memory = graph, device, mem
        self.steps: list[tuple[Node, bool, Any]] = []
        self.host_nodes: list[HostNode] = []
        placed = _place(graph, device)
        for n, (on_dev, why) in zip(graph.nodes, placed, strict=True):
            if on_dev:
                self.steps.append((n, True, NODE_KERNELS[node_key(n)][0]))
                continue
            fn = KERNELS.get(node_key(n))
            if fn is None:
                raise InvalidModel(f"node '{n.name}' ({n.qualified_type})", "the executor has no kernel for this op type", "lower it to supported ops or recompile the plan")  # fmt: skip
            dts = [graph.values[x].dtype for x in n.inputs if x and x in graph.values]
            dt = str(np.dtype(dts[0])) if dts and dts[0] is not None else "none"
            self.host_nodes.append(HostNode(n.name, n.qualified_type, dt, why, not _shape_work(n, graph)))
            self.steps.append((n, False, fn))
        self._uploaded: dict[str, Any] = {}  # initializer name -> its device copy (made once)
        #: per step: its index into host_nodes (-1: a device step)
        self._host_index: list[int] = []
        #: per step: the input positions a device kernel reads on the host, and whether it reads metadata only
        self._reads: list[tuple[frozenset[int], bool]] = []
        hosts = 0
        for n, on_dev, _ in self.steps:
            self._host_index.append(-1 if on_dev else hosts)
            hosts += not on_dev
            key = node_key(n)
            self._reads.append(
                (
                    HOST_INPUTS.get(key, frozenset()) if on_dev else frozenset(),
                    on_dev and key == ("", "Shape"),
                )
            )
        #: the whole plan as a run order: every step, each value dropped after its last reader
        self._every_step = fold(self, set(), {})
        #: record each signature's plan as a device graph after one eager run, and replay it
        self.device_graph = device_graph
        #: recorded signatures kept (least recently used dropped: each graph holds its own device memory)
        self.graph_cache_size = graph_cache_size
        self._seen: OrderedDict[tuple[tuple[int, ...], ...], None] = OrderedDict()  # run eagerly once
        self._recorded: OrderedDict[tuple[tuple[int, ...], ...], Recorded] = OrderedDict()
        #: eager runs: each signature's intermediates in one device allocation (``_device_arena``), where
        #: the memory lets an executor lay allocations out; kept for ``graph_cache_size`` signatures (LRU)
        self.arena = arena and getattr(mem, "allocations", None) is not None
        self._arenas: OrderedDict[tuple[tuple[int, ...], ...], DeviceArena] = OrderedDict()
        #: eager runs compute each signature's shape-fixed host steps once (``_device_fold``); False: every run
        self.fold_shapes = True
        self._folds: OrderedDict[tuple[tuple[int, ...], ...], Folded] = OrderedDict()

    def refuse_under_error_policy(self) -> None:
        """Raise ops' FallbackError naming every host node when the policy is ``error`` (at session creation)."""
        falls = self.fallbacks()
        if falls and ops.get_fallback_policy() == "error":
            lines = "; ".join(f"{h.node} ({h.op_type}, {h.dtype}): {h.reason}" for h in falls[:8])
            more = f" and {len(falls) - 8} more" if len(falls) > 8 else ""
            raise ops.FallbackError(
                f"fallback refused (policy 'error'): {len(falls)} node(s) of this model would run on the "
                f"host instead of {self.device}: {lines}{more}. Fix: register {self.device} kernels for them, or "
                "allow it with opstrata.ops.fallback_policy('warn') or OPSTRATA_FALLBACK=warn"
            )

    def capture_blockers(self) -> list[str]:
        """Why this plan cannot be recorded as one device graph (empty: it can); see ``_device_graph``."""
        return capture_blockers(self)

    def arenas(self) -> dict[tuple[tuple[int, ...], ...], DeviceArenaStats]:
        """The device arena of each input-shape signature run eagerly (kept ones), as stats."""
        return {sig: a.stats() for sig, a in self._arenas.items()}

    def recorded_signatures(self) -> list[tuple[tuple[int, ...], ...]]:
        """The input-shape signatures recorded as device graphs so far."""
        return list(self._recorded)

    # ------------------------------------------------------------------ moving values

    def _to_device(self, v: Any, moved: list[Any]) -> Any:
        if v is None or self.memory.is_array(v) or not isinstance(v, np.ndarray):
            return v
        t0 = time.perf_counter()
        d = self.memory.from_host(c_order(v))
        self.memory.synchronize()
        moved[0] += v.nbytes
        moved[1] += time.perf_counter() - t0
        return d

    def _to_host(self, v: Any, moved: list[Any]) -> Any:
        if v is None or not self.memory.is_array(v):
            return v
        t0 = time.perf_counter()
        h = self.memory.to_host(v)
        moved[0] += h.nbytes
        moved[1] += time.perf_counter() - t0
        return h

    def _initializer(self, name: str) -> Any:
        d = self._uploaded.get(name)
        if d is None:
            d = self._uploaded[name] = self.memory.from_host(c_order(self.graph.initializers[name]))
        return d

    # ------------------------------------------------------------------ a run

    def run(
        self,
        feeds: dict[str, Any],
        outputs: Sequence[str],
        *,
        on_device: bool = False,
        prof: Profiler | None = None,
    ) -> list[Any]:
        """Outputs named ``outputs`` for ``feeds`` (host or device arrays); host arrays unless ``on_device``.

        A host node's fallback cost is what it moved: its device inputs down, and its results up when a
        device node reads them. With ``prof`` every node is an event: timed by two marks on the device's
        queue (CUDA events; one sync per run) where the memory has them, else between two syncs. With
        ``device_graph`` (and no profiler) a signature's second run records the graph, later runs replay it.
        """
        sig = tuple(
            tuple(int(d) for d in np.shape(feeds[x])) if x in feeds else () for x in self.graph.inputs
        )
        if self.device_graph and prof is None:
            rec = self._recorded.get(sig)
            if rec is None and sig in self._seen:
                while len(self._recorded) >= self.graph_cache_size:
                    self._recorded.popitem(last=False)  # its graph and memory pool go with it
                rec = self._recorded[sig] = record(self, feeds)
            if rec is not None:
                self._recorded.move_to_end(sig)
                return replay(self, rec, feeds, outputs, on_device)
            self._seen[sig] = None
            while len(self._seen) > 4 * self.graph_cache_size:
                self._seen.popitem(last=False)
        arena = self._arena(sig) if self.arena and not self.device_graph else None
        alloc = arena.begin() if arena is not None else None
        folded = self._folds.get(sig) if prof is None and self.fold_shapes else None  # profiles: every node
        if folded is not None:
            self._folds.move_to_end(sig)
        collect = None
        if folded is None and prof is None and self.fold_shapes:  # a shape's first run: keep what it fixes
            shapes = {x: np.shape(feeds[x]) for x in self.graph.inputs if x in feeds}
            collect = (static_steps(self, shapes), {}, set())
        vals = self._execute(dict(feeds), prof=prof, alloc=alloc, folded=folded, collect=collect)
        if arena is not None:
            arena.end()  # the outputs are still held: what outlives the run is known
        if collect is not None:
            while len(self._folds) >= self.graph_cache_size:
                self._folds.popitem(last=False)
            self._folds[sig] = fold(self, collect[2], collect[1])
        return [self._output(vals, name, on_device) for name in outputs]

    def folded_steps(self) -> dict[tuple[tuple[int, ...], ...], int]:
        """Per input-shape signature run eagerly (kept ones): how many host steps its runs skip."""
        return {sig: f.skipped for sig, f in self._folds.items()}

    def _arena(self, sig: tuple[tuple[int, ...], ...]) -> DeviceArena:
        arena = self._arenas.get(sig)
        if arena is None:
            while len(self._arenas) >= self.graph_cache_size:
                self._arenas.popitem(last=False)  # its block goes when its last allocation does
            arena = self._arenas[sig] = DeviceArena(self.memory.allocations)  # type: ignore[arg-type]
        self._arenas.move_to_end(sig)
        return arena

    def _output(self, vals: dict[str, Any], name: str, on_device: bool) -> Any:
        inits = self.graph.initializers
        if name in inits and name not in vals:
            return self._initializer(name) if on_device else np.array(inits[name], copy=True)
        v = vals[name]
        if on_device:
            return self._to_device(v, [0, 0.0])
        return self.memory.to_host(v) if self.memory.is_array(v) else np.array(v, copy=True)

    def _execute(
        self,
        vals: dict[str, Any],
        *,
        prof: Profiler | None = None,
        hoisted: dict[str, Any] | None = None,
        recording: bool = False,
        alloc: Any = None,
        folded: Folded | None = None,
        collect: tuple[set[int], dict[str, Any], set[int]] | None = None,
    ) -> dict[str, Any]:
        """Run every step on ``vals`` (the feeds) and return the live values (the outputs among them).

        ``hoisted`` maps host-made values to their device copies: filled by the run before a recording
        (which uploads them), read by the recording (which may not copy anything up or down). ``alloc``
        serves the device kernels' allocations (a device arena's run); copies across memories are not its.
        ``folded`` skips the signature's shape-fixed steps (their results seeded, their device copies kept);
        ``collect`` = (static steps, kept results, steps kept) gathers them on the signature's first run.
        """
        run_id = len(prof.runs) if prof is not None else 0
        marks = prof is not None and getattr(self.memory, "mark", None) is not None
        pending: list[tuple[Any, ...]] = []  # device-timed events, resolved after the run's one sync
        inits = self.graph.initializers
        made_by: dict[str, int] = {}  # value -> index into host_nodes of the host node that made it
        tally = [[0, 0.0] for _ in self.host_nodes]
        checks = ops.capture_checks() if recording else None
        up: dict[str, Any] = {}  # host value -> its device copy, made for this run's device readers
        run = self._every_step if folded is None else folded
        order, frees = run.order, run.frees
        vals.update(run.values)
        with ops.device(self.device):
            run_t0 = time.perf_counter_ns()
            first = self.memory.mark() if marks else None  # type: ignore[misc]
            for pos, i in enumerate(order):
                n, on_dev, fn = self.steps[i]
                hi = self._host_index[i]
                host_pos, metadata = self._reads[i]  # metadata: Shape reads no device memory, no copy
                args = []
                for k, x in enumerate(n.inputs):
                    if not x:
                        args.append(None)
                        continue
                    if on_dev and k not in host_pos and not metadata:
                        if x in inits and x not in vals:
                            args.append(self._initializer(x))
                            continue
                        v = vals[x]
                        if not self.memory.is_array(v) and isinstance(v, np.ndarray):
                            d = up.get(x)  # a host value keeps its host copy for host readers
                            if d is None and folded is not None:
                                d = folded.uploads.get(x)  # a folded value's device copy, made once
                            if d is None and recording:
                                d = (hoisted or {}).get(x)
                                if d is None:
                                    raise ExecutionError(f"node '{n.name}' ({n.qualified_type})", f"its input '{x}' was made on the host and not uploaded before recording", "report the model: the device graph's preparation missed it")  # fmt: skip
                            elif d is None:
                                moved = tally[made_by[x]] if x in made_by else [0, 0.0]
                                d = self._to_device(v, moved)  # uploaded once per run, then read there
                                if hoisted is not None and x not in self.graph.inputs:
                                    hoisted[x] = d
                                if folded is not None and x in folded.values:
                                    folded.uploads[x] = d
                            v = up[x] = d
                    elif metadata:  # Shape reads the array's shape where it lives: nothing copied
                        v = vals[x] if x in vals else inits[x]
                    else:
                        v = vals[x] if x in vals else inits[x]
                        if recording and self.memory.is_array(v):
                            raise ExecutionError(f"node '{n.name}' ({n.qualified_type})", f"reads '{x}' from the device on the host while a device graph is recorded", "run the session without enable_device_graph")  # fmt: skip
                        v = self._to_host(v, tally[hi] if not on_dev else [0, 0.0])
                    args.append(v)
                while args and args[-1] is None:
                    args.pop()
                before = len(checks) if checks is not None else 0
                if prof is None:
                    res = self._call(n, on_dev, fn, args, alloc)
                elif marks and on_dev:  # events keep shapes, not arrays: lifetimes stay the plan's
                    m0 = self.memory.mark()  # type: ignore[misc]
                    res = self._call(n, on_dev, fn, args, alloc)
                    pending.append((n, on_dev, _meta(args, res), m0, self.memory.mark(), hi))  # type: ignore[misc]
                else:
                    t0 = self._sync_ns()
                    res = self._call(n, on_dev, fn, args, alloc)
                    pending.append((n, on_dev, _meta(args, res), t0, self._sync_ns() - t0, hi))
                if checks is not None:
                    for c in checks[before:]:
                        c.node = n.name
                for o, r in zip(n.outputs, res, strict=False):
                    if o:
                        vals[o] = r
                        if not on_dev:
                            made_by[o] = hi
                if collect is not None and i in collect[0] and keep(self, i, res, collect[1]):
                    collect[2].add(i)
                for x in frees[pos]:
                    vals.pop(x, None)
                    up.pop(x, None)
            if pending:  # events in node order; device marks read after the run's one sync
                if marks:
                    self.memory.synchronize()
                ms = self.memory.elapsed_ms
                for n, on_dev, meta, a, b, h in pending:
                    if marks and on_dev:  # a, b: marks on the device's queue
                        start, dur = run_t0 + int(ms(first, a) * 1e6), int(ms(a, b) * 1e6)  # type: ignore[misc]
                    else:  # a, b: host clock start and duration (between two syncs)
                        start, dur = a, b
                    self._record(prof, n, on_dev, meta, start, dur, run_id, h)  # type: ignore[arg-type]
            if not recording:
                for h, (nbytes, secs) in zip(self.host_nodes, tally, strict=True):
                    if h.fallback:
                        ops.record_fallback(h.op_type, self.device, "device:cpu", h.dtype, h.reason,
                                            bytes_copied=nbytes, copy_seconds=secs)  # fmt: skip
        return vals

    # ------------------------------------------------------------------ profiling and calls

    def _sync_ns(self) -> int:
        self.memory.synchronize()
        return time.perf_counter_ns()

    def _record(
        self,
        prof: Profiler,
        n: Node,
        on_dev: bool,
        meta: tuple[Any, Any, int],
        t0: int,
        dur: int,
        run_id: int,
        hi: int,
    ) -> None:
        ins, outs, moved = meta
        if on_dev:
            kernels, where, fell = NODE_KERNELS[node_key(n)][1] or ("view",), self.device, False
        else:
            kernels, where, fell = ("host",), "cpu", self.host_nodes[hi].fallback
        prof.events.append(
            NodeEvent(n.name, n.op_type, tuple(kernels), where, fell, t0, dur, ins, outs, moved,
                      node_flops(n, ins, outs), run_id)
        )  # fmt: skip

    def _call(self, n: Node, on_dev: bool, fn: Any, args: list[Any], alloc: Any = None) -> list[Any]:
        try:
            if on_dev:
                if alloc is not None:
                    with self.memory.allocations.route(alloc):  # type: ignore[union-attr]
                        return fn(n, args, self.device)
                return fn(n, args, self.device)
            with ops.device("cpu"):
                return fn(n, args)
        except Exception as exc:
            where = f"the {self.device} kernel" if on_dev else "the host kernel"
            raise ExecutionError(
                f"node '{n.name}' ({n.qualified_type})",
                f"{where} failed: {type(exc).__name__}: {exc}",
                "check the feeds against get_inputs(); if they are right, report the model and these shapes",
            ) from exc

    def fallbacks(self) -> list[HostNode]:
        """The floating-point nodes that run on the host, with the reason each is not on the device."""
        return [h for h in self.host_nodes if h.fallback]
