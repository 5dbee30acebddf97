"""InferenceSession: ONNX Runtime's call shape over a compiled opstrata plan, arena-backed runs."""

from __future__ import annotations

import contextlib
import difflib
import os
import tempfile
import threading
import time
import warnings
import weakref
import zipfile
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import opstrata.graph as og
import opstrata.ops as ops
from opstrata.graph import absent, is_absent, sequence_items, to_sequence

from ._allocator import CachingAllocator
from ._arena import Arena, view_aliases
from ._blas import BLAS
from ._bound import BoundProgram, bind_arena, merge_native, release, run_bound
from ._device_arena import DeviceArenaStats
from ._device_exec import DeviceProgram, HostNode
from ._errors import InvalidArgument, InvalidModel
from ._executor import Schedule
from ._gemm_threads import ThreadPlan, thread_plan, with_switches
from ._int8_kernels import warn_reference_int8_kernels
from ._options import SessionOptions
from ._profiler import Profiler
from ._providers import provider_option, resolve_device
from ._streams import (
    StreamPool,
    StreamProgram,
    assign_streams,
    slot_shapes_from_plan,
    step_costs,
    step_preds,
    stream_memory_plan,
)
from ._threads import ThreadSettings

__all__ = ["InferenceSession", "NodeArg"]

_ONNX_TYPES = {
    "float32": "float", "float64": "double", "float16": "float16", "bfloat16": "bfloat16", "int64": "int64",
    "int32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32",
    "uint64": "uint64", "bool": "bool", "float8_e4m3fn": "float8e4m3fn", "float8_e5m2": "float8e5m2",
    "object": "string",
}  # fmt: skip


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output as onnxruntime describes it: ``name``, ``shape`` (symbolic dims as str), ``type``."""

    name: str
    shape: list[int | str | None]
    type: str
    dtype: np.dtype | None = None


def _type_str(dt: np.dtype | None, kind: str = "tensor") -> str:
    t = (
        f"tensor({_ONNX_TYPES.get(np.dtype(dt).name, np.dtype(dt).name)})"
        if dt is not None
        else "tensor(undefined)"
    )
    if kind.endswith("sequence"):
        t = f"seq({t})"
    return f"optional({t})" if kind.startswith("optional") else t


def _output_value(x: Any, kind: str) -> Any:
    """A run result as onnxruntime hands it back: sequences as lists of arrays, absent optionals None."""
    if kind != "tensor" and is_absent(x):
        return None
    if kind.endswith("sequence"):
        return [np.array(t, copy=True) for t in sequence_items(x)]
    return np.array(x, copy=True)


def _load(model: Any, level: int, device: str) -> og.Plan:
    """A compiled Plan from any accepted model form (InvalidModel naming the problem otherwise)."""
    where = "InferenceSession(model)"
    try:
        if isinstance(model, og.Plan):
            plan = model
        elif isinstance(model, (str, os.PathLike)):
            p = Path(model)
            if not p.is_file():
                raise InvalidModel(where, f"no such file '{p}'", "check the path")
            plan = og.Plan.load(p) if zipfile.is_zipfile(p) else og.compile(og.from_onnx(p), level, device)
        elif isinstance(model, (bytes, bytearray)) and bytes(model[:4]) == b"PK\x03\x04":
            with tempfile.TemporaryDirectory() as d:  # Plan.load reads a file
                f = Path(d) / "model.plan"
                f.write_bytes(bytes(model))
                plan = og.Plan.load(f)
        elif isinstance(model, (bytes, bytearray, og.Graph)) or hasattr(model, "graph"):
            g = (
                model
                if isinstance(model, og.Graph)
                else og.from_onnx(bytes(model) if isinstance(model, bytearray) else model)
            )
            plan = og.compile(g, level, device)
        else:
            raise InvalidModel(
                where, f"expected a path, bytes, onnx.ModelProto, opstrata Graph or Plan, got {type(model).__name__}",
                "pass a model file path or onnx.load(path)",
            )  # fmt: skip
    except og.GraphError as exc:  # keep the graph layer's own fix when it has one (one "Fix:" per message)
        raise InvalidModel(
            where, f"{exc.where}: {exc.problem}",
            exc.fix or "check the model file (onnx.checker.check_model) or recompile the plan",
        ) from exc  # fmt: skip
    if plan.device != device:
        raise InvalidModel(
            where, f"the plan was compiled for device '{plan.device}', the session runs on '{device}'",
            f"pass device='{plan.device}' or recompile for '{device}'",
        )  # fmt: skip
    return plan


def _has_memory(device: str) -> bool:
    """True for a device computing in its own memory (cuda); ops before 0.4.68 has host devices only (or
    no ``record_fallback`` for the host nodes' audit)."""
    return hasattr(ops, "record_fallback") and ops.device_memory(device) is not None


class InferenceSession:
    """Run a model with the onnxruntime call shape: ``sess.run(output_names | None, feeds) -> list``.

    >>> from opstrata.graph.testing import mlp_model, random_feeds
    >>> sess = InferenceSession(mlp_model())
    >>> [o.shape for o in sess.run(None, random_feeds(mlp_model(), {"batch": 3}))]
    [(3, 8)]
    """

    def __init__(
        self,
        model: Any,
        sess_options: SessionOptions | None = None,
        *,
        device: str | None = None,
        providers: Sequence[Any] | None = None,
    ) -> None:
        opts = sess_options if sess_options is not None else SessionOptions()
        if not isinstance(opts, SessionOptions):
            raise InvalidArgument(
                "InferenceSession", f"sess_options must be SessionOptions, got {type(opts).__name__}"
            )
        self.options = opts.validate()
        device = resolve_device(device, providers)
        self.device = device
        #: intra-op / inter-op thread counts as resolved now (OPSTRATA_NUM_THREADS, physical cores)
        self.threads = ThreadSettings.resolve(opts.intra_op_num_threads, opts.inter_op_num_threads)
        BLAS.refresh_if_imported()  # a BLAS loaded since the last session (torch's, say) is limited too
        BLAS.claim()  # this thread controls the BLAS count (threadpoolctl lets one thread at a time)
        # a device with its own memory places nodes itself (DeviceProgram audits what runs on the host), so
        # the compile's per-kernel fallback check, which knows nothing of that placement, stays silent
        placing = ops.fallback_policy("allow") if _has_memory(device) else self._policy()
        with placing:
            self.plan = _load(model, opts.graph_optimization_level, device)
        self.graph = self.plan.graph
        warn_reference_int8_kernels(self.graph, device)  # a QDQ model without native int8 kernels: say so
        self.allocator = CachingAllocator(opts.memory_limit_bytes)
        #: a device with its own memory (cuda): its nodes run there, the rest on the host, counted. It needs
        #: no cpu Schedule (whose prepacked GEMM weights would be host copies the device never reads).
        self._device_program: DeviceProgram | None = None
        self._schedule: Schedule | None = None
        graphs = opts.enable_device_graph or provider_option(providers, device, "enable_cuda_graph")
        if _has_memory(device):
            self._device_program = DeviceProgram(
                self.graph, device, device_graph=graphs, graph_cache_size=opts.plan_cache_size,
                arena=opts.enable_mem_arena,
            )  # fmt: skip
            with self._policy():
                self._device_program.refuse_under_error_policy()
            blockers = self._device_program.capture_blockers() if graphs else []
            if blockers:
                more = f" and {len(blockers) - 4} more" if len(blockers) > 4 else ""
                raise InvalidArgument("InferenceSession", f"enable_device_graph: this plan cannot be recorded as one device graph: {'; '.join(blockers[:4])}{more}", "run without enable_device_graph (each node then launches from Python), or export the model with static shapes so its host nodes depend on shapes only")  # fmt: skip
        elif graphs:
            raise InvalidArgument("InferenceSession", f"enable_device_graph needs a device with its own memory that records graphs (cuda); '{device}' computes in host memory", "drop enable_device_graph, or run on device='cuda'")  # fmt: skip
        else:
            self._schedule = Schedule(self.graph, self.plan.bindings, device)
        # per input-shape signature: (arena or None = not plannable -> allocator, value template)
        self._programs: OrderedDict[tuple[tuple[int, ...], ...], tuple[Arena | None, list[Any]]] = (
            OrderedDict()
        )
        self._dtypes = {k: v.dtype for k, v in self.graph.values.items()}
        # arena runs without the profiler: each shape's steps bound once to zero-argument calls
        self._bound: dict[tuple[tuple[int, ...], ...], BoundProgram] = {}
        self._profiler = self._new_profiler() if opts.enable_profiling else None
        # per input-shape signature: the BLAS threads its runs start with and where they switch
        self._thread_plans: dict[tuple[tuple[int, ...], ...], ThreadPlan] = {}
        self._last_profiler: Profiler | None = None  # kept by end_profiling for profile_summary
        self._lock = threading.Lock()  # one arena per shape: concurrent runs take turns
        self._inputs = [self._arg(x) for x in self.graph.inputs]
        self._outputs = [self._arg(x) for x in self.graph.outputs]
        # feed fast path: (name, dtype or None) per input, and the shape signatures already validated
        self._feed_spec = [(a.name, a.dtype) for a in self._inputs]
        # sequence/optional values (Value.kind): fed and returned as onnxruntime does (lists, None)
        self._kinds = {x: self.graph.values[x].kind for x in (*self.graph.inputs, *self.graph.outputs)}
        self._plain_feeds = all(self._kinds[x] == "tensor" for x in self.graph.inputs)
        self._plain_outputs = all(self._kinds[x] == "tensor" for x in self.graph.outputs)
        self._checked_shapes: set[tuple[tuple[int, ...], ...]] = set()
        # num_streams > 1: worker threads (started on the first parallel run) and a program per shape
        self._pool: StreamPool | None = None
        self._stream_programs: dict[tuple[tuple[int, ...], ...], StreamProgram] = {}
        self._closed = False
        if self.threads.inter_op > 1 and self._schedule is not None:
            self._pool = StreamPool(self._schedule, self.threads.inter_op, opts.stream_timeout_s)
            self._preds = step_preds(self._schedule)
            # an unclosed, collected session still stops its workers (at exit, daemon workers just end)
            weakref.finalize(self, self._pool.close).atexit = False
        #: threads a kernel may split its own work over during a run (ops.intra_op_threads): the intra-op
        #: count, shared out among the streams when they run in parallel (nothing oversubscribes)
        self._kernel_threads = self.threads.per_stream if self._pool is not None else self.threads.intra_op

    # ------------------------------------------------------------------ metadata

    def _arg(self, name: str) -> NodeArg:
        v = self.graph.values[name]
        return NodeArg(
            name, list(v.shape) if v.shape is not None else [], _type_str(v.dtype, v.kind), v.dtype
        )

    def get_inputs(self) -> list[NodeArg]:
        """Graph inputs (name, shape with symbolic dims as strings, ``tensor(float)``-style type)."""
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        """Graph outputs, as :meth:`get_inputs`."""
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        """The device this session runs on (onnxruntime lists execution providers here)."""
        return [self.device]

    @property
    def arenas(self) -> dict[tuple[tuple[int, ...], ...], Arena | None]:
        """The arena of each input-shape signature seen so far (None: ran on the caching allocator)."""
        return {k: a for k, (a, _) in self._programs.items()}

    @property
    def device_arenas(self) -> dict[tuple[tuple[int, ...], ...], DeviceArenaStats]:
        """On a device with its own memory: each input-shape signature's device arena (one allocation laid
        out by the memory plan), as stats; empty elsewhere, and with device graphs (they own their memory)."""
        return {} if self._device_program is None else self._device_program.arenas()

    @property
    def device_folded_steps(self) -> dict[tuple[tuple[int, ...], ...], int]:
        """On a device with its own memory: per input-shape signature, how many shape-fixed host steps its
        eager runs skip (computed once, on the signature's first run); empty elsewhere."""
        return {} if self._device_program is None else self._device_program.folded_steps()

    # ------------------------------------------------------------------ run

    def thread_info(self) -> dict[str, Any]:
        """The session's thread settings and the BLAS libraries it limits (JSON-ready; in profiles too)."""
        return {**self.threads.as_dict(), "blas": BLAS.describe()}

    def _new_profiler(self) -> Profiler:
        prof = Profiler(self.options.profile_file_prefix)
        prof.metadata["threads"] = self.thread_info()
        return prof

    def _policy(self) -> contextlib.AbstractContextManager[Any]:
        p = self.options.fallback_policy
        return ops.fallback_policy(p) if p is not None else contextlib.nullcontext()

    def _check_feeds(self, feeds: Any) -> list[np.ndarray]:
        """The feeds as arrays in input order; a dict of arrays of a dtype and shape signature already
        validated skips the full checks (which name the input, the expected and the actual)."""
        if self._plain_feeds and type(feeds) is dict and len(feeds) == len(self._feed_spec):
            out = []
            for name, dt in self._feed_spec:
                x = feeds.get(name)
                if type(x) is not np.ndarray or (dt is not None and x.dtype != dt):
                    break
                out.append(x)
            else:
                if tuple(x.shape for x in out) in self._checked_shapes:
                    return out
        out = self._check_feeds_full(feeds)
        self._checked_shapes.add(tuple(x.shape for x in out))
        return out

    def _check_feeds_full(self, feeds: Any) -> list[np.ndarray]:
        where = f"InferenceSession.run('{self.graph.name}')"
        if not isinstance(feeds, Mapping):
            raise InvalidArgument(
                where, f"feeds must be a dict {{input name: array}}, got {type(feeds).__name__}"
            )
        names = [a.name for a in self._inputs]
        unknown = [k for k in feeds if k not in names]
        if unknown:
            hints = [f"'{k}' (did you mean '{m[0]}'?)" if (m := difflib.get_close_matches(str(k), names, 1)) else f"'{k}'" for k in unknown]  # fmt: skip
            raise InvalidArgument(where, f"unknown input name(s) {', '.join(hints)}; the model's inputs are {names}", "feed exactly the names of get_inputs()")  # fmt: skip
        missing = [x for x in names if x not in feeds]
        if missing:
            raise InvalidArgument(where, f"missing input(s) {missing}; the model's inputs are {names}", "feed a value for every input of get_inputs()")  # fmt: skip
        bound: dict[str, tuple[int, str]] = {}
        out = []
        for a in self._inputs:
            x = feeds[a.name]
            w = f"{where}: input '{a.name}'"
            kind = self._kinds[a.name]
            if kind != "tensor":
                out.append(self._nontensor_feed(x, a, kind, w))
                continue
            arr = x if isinstance(x, np.ndarray) else np.asarray(x)
            if a.dtype is not None and a.dtype.hasobject and arr.dtype.kind in "US":
                arr = arr.astype(object)  # string tensors: numpy str arrays are accepted as onnxruntime does
            if a.dtype is not None and arr.dtype != a.dtype:
                raise InvalidArgument(w, f"expected dtype {a.type} ({a.dtype}), got {arr.dtype}", f"pass x.astype(np.{a.dtype.name})")  # fmt: skip
            if len(a.shape) != arr.ndim:
                raise InvalidArgument(w, f"expected rank {len(a.shape)} shape {a.shape}, got shape {list(arr.shape)}", "reshape the feed to the input's rank")  # fmt: skip
            for i, (d, got) in enumerate(zip(a.shape, arr.shape, strict=True)):
                if isinstance(d, int) and d != got:
                    raise InvalidArgument(w, f"dim {i} must be {d} (shape {a.shape}), got shape {list(arr.shape)}", f"feed an array of shape {a.shape}")  # fmt: skip
                if isinstance(d, str) and d.isidentifier():
                    prev = bound.setdefault(d, (got, a.name))
                    if prev[0] != got:
                        raise InvalidArgument(w, f"symbolic dim '{d}' is {got} here but {prev[0]} in input '{prev[1]}' (shape {a.shape}, got {list(arr.shape)})", f"feed inputs that agree on '{d}'")  # fmt: skip
            out.append(arr)
        return out

    @staticmethod
    def _tensor_feed(x: Any, a: NodeArg, w: str) -> np.ndarray:
        arr = x if isinstance(x, np.ndarray) else np.asarray(x)
        if a.dtype is not None and a.dtype.hasobject and arr.dtype.kind in "US":
            arr = arr.astype(object)
        if a.dtype is not None and arr.dtype != a.dtype:
            raise InvalidArgument(w, f"expected elements of dtype {a.dtype}, got {arr.dtype}", f"pass arrays of np.{a.dtype.name}")  # fmt: skip
        return arr

    def _nontensor_feed(self, x: Any, a: NodeArg, kind: str, w: str) -> np.ndarray:
        """A sequence feed (list of arrays) or optional feed (None or the value) in its run-time form."""
        if kind.startswith("optional") and x is None:
            return absent()
        if kind.endswith("sequence"):
            if not isinstance(x, (list, tuple)):
                raise InvalidArgument(w, f"is {a.type}: expected a list of arrays, got {type(x).__name__}", "feed a list of numpy arrays")  # fmt: skip
            return to_sequence([self._tensor_feed(t, a, f"{w} element {i}") for i, t in enumerate(x)])
        return self._tensor_feed(x, a, w)

    def _output_slots(self, output_names: Sequence[str] | None) -> list[int]:
        names = [a.name for a in self._outputs]
        if output_names is None:
            return self._schedule.output_slots if self._schedule is not None else list(range(len(names)))
        if isinstance(output_names, str):
            raise InvalidArgument("InferenceSession.run", f"output_names must be a list of names, got the string {output_names!r}", f"pass [{output_names!r}]")  # fmt: skip
        bad = [n for n in output_names if n not in names]
        if bad:
            raise InvalidArgument("InferenceSession.run", f"unknown output name(s) {bad}; the model's outputs are {names}", "name outputs of get_outputs() or pass None for all")  # fmt: skip
        if self._schedule is None:  # a device session: positions among the outputs (names checked above)
            return [names.index(n) for n in output_names]
        return [self._schedule.slot[n] for n in output_names]

    def _program(self, key: tuple[tuple[int, ...], ...]) -> tuple[Arena | None, list[Any]]:
        prog = self._programs.get(key)
        if prog is not None:
            self._programs.move_to_end(key)
            return prog
        while len(self._programs) >= self.options.plan_cache_size:  # least recently used signature goes
            old, _ = self._programs.popitem(last=False)
            self._bound.pop(old, None)
            self._stream_programs.pop(old, None)
            self._thread_plans.pop(old, None)
            self.plan.forget_memory(dict(zip(self.graph.inputs, old, strict=True)))
        arena: Arena | None = None
        mp: og.MemoryPlan | None = None
        if self.options.enable_mem_arena:
            try:  # values whose shape depends on input values stay out of the arena (mp.dynamic)
                mp = self.plan.memory_for(dict(zip(self.graph.inputs, key, strict=True)), dynamic=True)
            except og.GraphError:  # no concrete shape at all: run on the caching allocator
                mp = None
            if mp is not None and mp.dynamic and self._pool is not None:
                mp = None  # stream programs lay out every value: the allocator runs them instead
        shapes = slot_shapes_from_plan(self._schedule, mp, key)
        parallel = False
        if self._pool is not None:  # streams: assign nodes once per shape, lay the arena out for it
            asg = assign_streams(self._preds, step_costs(self._schedule, shapes), self.threads.inter_op)
            if mp is not None:
                smp, aliases = stream_memory_plan(self.graph, self._schedule, mp, asg)
                arena = Arena(smp, self._dtypes, aliases)
            sprog = self._stream_programs[key] = StreamProgram(self._schedule, asg, arena)
            parallel = sprog.parallel
        elif mp is not None:
            arena = Arena(mp, self._dtypes, view_aliases(self.graph, mp))
        self._thread_plans[key] = thread_plan(self._schedule.steps, shapes, self.threads, parallel)
        vals = list(self._schedule.template)
        if arena is not None:  # every planned value is its arena view, fixed for this shape
            for name, view in arena.views.items():
                vals[self._schedule.slot[name]] = view
        prog = self._programs[key] = (arena, vals)
        return prog

    @property
    def stream_programs(self) -> dict[tuple[tuple[int, ...], ...], StreamProgram]:
        """With ``num_streams > 1``: the stream assignment and arena of each input-shape signature seen."""
        return dict(self._stream_programs)

    def close(self) -> None:
        """Stop the stream workers (joined within ``stream_timeout_s``); later runs raise. Idempotent."""
        with self._lock:
            self._closed = True
            stuck = self._pool.close() if self._pool is not None else []
        if stuck:
            warnings.warn(
                f"InferenceSession.close: stream worker(s) still inside a kernel after {self.options.stream_timeout_s:g} s "
                f"({'; '.join(stuck)}); they are daemon threads and stop when that kernel returns",
                RuntimeWarning,
                stacklevel=2,
            )

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None
    ) -> list[np.ndarray]:
        """Outputs named by ``output_names`` (None: all, in graph order) for ``input_feed`` {name: array}."""
        if run_options is not None:
            raise InvalidArgument("InferenceSession.run", "run_options is not supported yet", "pass None")
        feeds = self._check_feeds(input_feed)
        slots = self._output_slots(output_names)
        if self._device_program is not None:
            return self._run_device(output_names, dict(zip(self.graph.inputs, feeds, strict=True)), False)
        if not self._plain_outputs:
            names = self.graph.outputs if output_names is None else list(output_names)
            kinds = [self._kinds[n] for n in names]
            res = self._run(slots, feeds)
            return [_output_value(r, k) for r, k in zip(res, kinds, strict=True)]
        return self._run(slots, feeds)

    def run_on_device(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any]) -> list[Any]:
        """As :meth:`run` on a device session (``cuda``), with feeds that may already be device arrays (not
        copied) and outputs left on the device (CuPy arrays): onnxruntime's I/O binding, in one call."""
        if self._device_program is None:
            raise InvalidArgument("InferenceSession.run_on_device", f"device '{self.device}' computes in host memory", "use run()")  # fmt: skip
        names = [a.name for a in self._inputs]
        if not isinstance(input_feed, Mapping) or sorted(input_feed) != sorted(names):
            got = sorted(input_feed) if isinstance(input_feed, Mapping) else type(input_feed).__name__
            raise InvalidArgument("InferenceSession.run_on_device", f"feeds must name exactly the inputs {names}, got {got}", "feed every input of get_inputs()")  # fmt: skip
        self._output_slots(output_names)  # validates the names
        return self._run_device(output_names, dict(input_feed), True)

    def _run_device(
        self, output_names: Sequence[str] | None, feeds: dict[str, Any], on_device: bool
    ) -> list[Any]:
        names = list(self.graph.outputs) if output_names is None else list(output_names)
        with self._lock, self._policy():
            if self._closed:
                raise InvalidArgument(
                    "InferenceSession.run", "the session is closed", "create a new InferenceSession"
                )
            prof = self._profiler
            t0 = time.perf_counter_ns()
            out = self._device_program.run(feeds, names, on_device=on_device, prof=prof)  # type: ignore[union-attr]
            if prof is not None:
                prof.add_run(t0, time.perf_counter_ns() - t0)
            return out

    def device_fallbacks(self) -> list[HostNode]:
        """The nodes a device session runs on the host (empty on cpu), each with the reason: the per-run
        copies they cost are in ``opstrata.ops.fallback_report()``."""
        return [] if self._device_program is None else self._device_program.fallbacks()

    def host_nodes(self) -> list[HostNode]:
        """Every node a device session runs on the host: fallbacks and the integer / boolean shape work
        kept there by design (``HostNode.fallback`` tells them apart); empty on cpu."""
        return [] if self._device_program is None else list(self._device_program.host_nodes)

    def _run(self, slots: list[int], feeds: list[np.ndarray]) -> list[Any]:
        """One run with BLAS limited to the plan's thread count; the previous count is restored after it,
        also when a kernel raises."""
        key = tuple(f.shape for f in feeds)
        with self._lock, self._policy(), ops.device(self.device):
            if self._closed:
                raise InvalidArgument(
                    "InferenceSession.run", "the session is closed", "create a new InferenceSession"
                )
            t0 = time.perf_counter_ns()
            arena, template = self._program(key)
            tplan = self._thread_plans[key]
            saved = BLAS.enter(tplan.start)
            try:  # kernels that thread their own work (attention, int8 GEMM) follow the session's count
                with ops.intra_op_threads(self._kernel_threads):
                    return self._run_program(key, arena, template, tplan, slots, feeds, t0)
            finally:
                BLAS.exit(saved)

    def _run_program(
        self,
        key: tuple[tuple[int, ...], ...],
        arena: Arena | None,
        template: list[Any],
        tplan: ThreadPlan,
        slots: list[int],
        feeds: list[np.ndarray],
        t0: int,
    ) -> list[Any]:
        """Run one shape's program: bound calls, stream workers, arena or allocator steps."""
        sch = self._schedule
        prof = self._profiler
        run_id = len(prof.runs) if prof is not None else 0
        sprog = self._stream_programs.get(key) if self._pool is not None else None
        if arena is not None and prof is None and (sprog is None or not sprog.parallel):
            bound = self._bound.get(key)
            if bound is None or bound.generation != ops.registry_generation():
                bound = self._bound[key] = bind_arena(sch, arena, template, feeds)  # (re)resolve kernels
                bound.calls = with_switches(bound.calls, bound.index, tplan, BLAS.set)
                merge_native(bound)
            bvals = run_bound(sch, bound, feeds)
            try:
                return [np.array(bvals[s], copy=True) for s in slots]
            finally:
                release(bound)
        vals = list(template)
        for s, f in zip(sch.input_slots, feeds, strict=True):
            vals[s] = f
        if sprog is not None and sprog.parallel:
            held = self._pool.run(sprog, vals, prof, run_id, self.allocator)  # type: ignore[union-attr]
            try:
                result = [np.array(vals[s], copy=True) for s in slots]
            finally:
                for arr in held:
                    self.allocator.free(arr)
        elif arena is not None:
            sch.run_arena(vals, arena, prof, run_id, tplan.switch_at)
            result = [np.array(vals[s], copy=True) for s in slots]
        else:
            held = sch.run_allocator(vals, self.allocator, prof, run_id, tplan.switch_at)
            try:
                result = [np.array(vals[s], copy=True) for s in slots]
            finally:
                for arr in held:
                    self.allocator.free(arr)
        if prof is not None:
            prof.add_run(t0, time.perf_counter_ns() - t0, tplan.start)
        return result

    # ------------------------------------------------------------------ profiling

    def end_profiling(self, path: str | os.PathLike[str] | None = None) -> str:
        """Write the Chrome trace (Perfetto / chrome://tracing) and return its path; profiling stops."""
        if self._profiler is None:
            raise InvalidArgument("InferenceSession.end_profiling", "profiling is off", "create the session with SessionOptions(enable_profiling=True)")  # fmt: skip
        out = self._profiler.write(path)
        self._last_profiler, self._profiler = self._profiler, None
        return out

    @property
    def profiler(self) -> Profiler | None:
        """The current profile (or the last ended one); None when profiling is off."""
        return self._profiler or self._last_profiler

    def profile_summary(self, top: int = 10) -> str:
        """Hottest nodes and the share of time per op type, from the current (or last ended) profile."""
        prof = self._profiler or self._last_profiler
        if prof is None:
            raise InvalidArgument("InferenceSession.profile_summary", "profiling is off", "create the session with SessionOptions(enable_profiling=True)")  # fmt: skip
        return prof.summary(top)
