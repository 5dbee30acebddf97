"""Runs a compiled plan's schedule on opstrata.graph's kernel table, writing into arena views or allocator blocks.

The IR-op -> opstrata.ops map is opstrata.graph's ``KERNELS`` (one place). Binary arithmetic,
whose ops kernels take ``out=``, writes straight into its slot; every other result is copied in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

import opstrata.ops as ops
from opstrata.graph import EXECUTOR_KERNELS as KERNELS, Graph, KernelBinding, Node

from ._allocator import CachingAllocator
from ._arena import _RESHAPES, Arena
from ._blas import BLAS
from ._errors import ExecutionError, InvalidModel
from ._flops import node_flops
from ._into import into_kernel
from ._prepack import prepack_weights
from ._profiler import NodeEvent, Profiler

__all__ = ["Schedule"]

#: the stock kernels of the reshape-likes: a step is skipped only while its op still has one (not overridden)
_STOCK_VIEWS = {op: KERNELS.get(("", op)) for op in _RESHAPES}

_OUT_KERNELS: dict[str, Callable[..., np.ndarray]] = {
    "Add": ops.add, "Sub": ops.sub, "Mul": ops.mul, "Div": ops.div,
}  # fmt: skip


class _Step:
    """One node: its kernel, input/output slot indices, and the binary ``out=`` kernel when usable."""

    __slots__ = ("fallback", "fn", "frees", "ins", "into", "kernels", "node", "out_fn", "outs", "where")

    def __init__(self, node: Node, fn: Callable[..., list[Any]], ins: list[int], outs: list[int]) -> None:
        self.node, self.fn, self.ins, self.outs = node, fn, ins, outs
        self.where = f"node '{node.name}' ({node.qualified_type})"
        self.out_fn: Callable[..., np.ndarray] | None = None
        self.into = into_kernel(node)  # writes the arena view itself (arena mode; see _into)
        self.frees: list[int] = []  # slots whose last reader is this step (allocator mode)
        self.kernels: tuple[str, ...] = ()
        self.fallback = False


class Schedule:
    """The plan's nodes as slot-indexed steps; runs them in arena or allocator mode."""

    def __init__(self, graph: Graph, bindings: Sequence[KernelBinding], device: str) -> None:
        self.graph, self.device = graph, device
        names = list(graph.inputs) + list(graph.initializers)
        names += [o for n in graph.nodes for o in n.outputs if o and o not in names]
        self.slot = {name: i for i, name in enumerate(names)}
        self.template: list[Any] = [None] * len(names)
        for name, arr in graph.initializers.items():
            self.template[self.slot[name]] = arr
        prepack_weights(graph, self.template, self.slot)  # GEMM weights in the layout BLAS wants
        self.input_slots = [self.slot[x] for x in graph.inputs]
        self.output_slots = [self.slot[x] for x in graph.outputs]
        by_node: dict[str, list[KernelBinding]] = {}
        for b in bindings:
            by_node.setdefault(b.node, []).append(b)
        last: dict[int, int] = {}
        self.steps: list[_Step] = []
        for i, n in enumerate(graph.nodes):
            fn = KERNELS.get(("" if n.domain == "ai.onnx" else n.domain, n.op_type))
            if fn is None:
                raise InvalidModel(
                    f"node '{n.name}' ({n.qualified_type})", "the executor has no kernel for this op type",
                    "lower it to supported ops or recompile the plan",
                )  # fmt: skip
            st = _Step(
                n,
                fn,
                [self.slot[x] if x else -1 for x in n.inputs],
                [self.slot[o] if o else -1 for o in n.outputs],
            )
            st.out_fn = self._out_kernel(n)
            bs = by_node.get(n.name, [])
            st.kernels = tuple(b.kernel for b in bs if b.kernel) or ("host",)
            st.fallback = any(b.is_fallback for b in bs)
            for s in st.ins:
                if s >= 0:
                    last[s] = i
            self.steps.append(st)
        keep = set(self.output_slots) | set(self.input_slots) | {self.slot[x] for x in graph.initializers}
        for s, i in last.items():
            if s not in keep:
                self.steps[i].frees.append(s)

    def _out_kernel(self, n: Node) -> Callable[..., np.ndarray] | None:
        fn = _OUT_KERNELS.get(n.op_type) if n.domain in ("", "ai.onnx") else None
        if fn is None or len(n.inputs) != 2:
            return None
        dts = {self.graph.values[x].dtype for x in (*n.inputs, n.outputs[0]) if x in self.graph.values}
        if len(dts) != 1 or None in dts:
            return None
        dt = next(iter(dts))
        return fn if dt.kind == "f" or dt in ops.LOW_PRECISION_DTYPES else None

    # ------------------------------------------------------------------ one node

    def _fail(self, st: _Step, args: Sequence[Any], exc: BaseException) -> ExecutionError:
        shapes = ", ".join("None" if a is None else f"{np.dtype(a.dtype)}{list(np.shape(a))}" for a in args)
        return ExecutionError(
            st.where, f"kernel {'+'.join(st.kernels)} failed on inputs ({shapes}): {type(exc).__name__}: {exc}",
            "check the feeds against get_inputs(); if they are right, report the model and these shapes",
        )  # fmt: skip

    def _compute(self, st: _Step, args: list[Any]) -> list[Any]:
        try:
            return st.fn(st.node, args)
        except ExecutionError:
            raise
        except Exception as exc:
            raise self._fail(st, args, exc) from exc

    @staticmethod
    def _store(st: _Step, k: int, dst: np.ndarray, r: Any, arena: Arena | None) -> None:
        if not isinstance(r, np.ndarray):
            r = np.asarray(r)
        if r.shape != dst.shape or r.dtype != dst.dtype:
            raise ExecutionError(
                st.where, f"output {k} '{st.node.outputs[k]}' is {r.dtype}{list(r.shape)}, the plan expects "
                f"{dst.dtype}{list(dst.shape)}", "shape inference and the kernel disagree; report the model",
            )  # fmt: skip
        if arena is not None and arena.owns(r):
            ra, da = r.__array_interface__, dst.__array_interface__
            if ra["data"] == da["data"] and ra["strides"] == da["strides"]:
                return  # already in place (e.g. Clip without bounds on an in-place slot)
        np.copyto(dst, r)

    # ------------------------------------------------------------------ runs

    def alias_slots(self, arena: Arena) -> frozenset[int]:
        """Slots of the arena's view aliases (cached on the arena)."""
        got = arena._alias_slots
        if got is None:
            got = arena._alias_slots = frozenset(self.slot[v] for v in arena.aliases)
        return got

    def view_steps(self, arena: Arena, constants: frozenset[str] = frozenset()) -> frozenset[int]:
        """Steps of reshape-like nodes with a constant target whose output's arena view already is their
        input's bytes reshaped (the memory plan put both on one buffer): nothing to run (cached on the arena).

        The target is constant when it is an initializer or in ``constants`` (values the bound program
        computed once for this arena's input shapes: an exporter's Shape -> Concat target; not cached).
        The input must itself live in its arena view at run time: not a view of a feed or initializer
        kept as an alias, unless that alias's own step is skipped here (a chain of views on one buffer).
        """
        got = arena._view_steps if not constants else None
        if got is None:
            skipped: set[int] = set()
            in_view: set[str] = set()  # aliases whose value is their arena view (their step skipped)
            for i, st in enumerate(self.steps):
                n = st.node
                if not (n.domain in ("", "ai.onnx") and n.op_type in _RESHAPES and len(n.outputs) == 1):
                    continue
                if KERNELS.get(("", n.op_type)) is not _STOCK_VIEWS[n.op_type]:
                    continue  # a replaced kernel (a test, a user override) is called
                v, x = n.outputs[0], n.inputs[0]
                if (
                    v in arena.aliases and (x not in arena.aliases or x in in_view)
                    and all(not c or c in self.graph.initializers or c in constants for c in n.inputs[1:])
                    and arena.is_view_of(v, x)
                ):  # fmt: skip
                    skipped.add(i)
                    in_view.add(v)
            got = frozenset(skipped)
            if not constants:
                arena._view_steps = got
        return got

    def exec_arena(self, st: _Step, vals: list[Any], alias: frozenset[int], arena: Arena) -> list[Any]:
        """Run one step on the arena views in ``vals``; returns its arguments (for the profiler)."""
        args = [vals[i] if i >= 0 else None for i in st.ins]
        while args and args[-1] is None:
            args.pop()
        if st.out_fn is not None and len(args) == 2 and vals[st.outs[0]] is not None:
            try:
                st.out_fn(args[0], args[1], out=vals[st.outs[0]])
            except Exception as exc:
                raise self._fail(st, args, exc) from exc
            return args
        if st.into is not None and all(s >= 0 and vals[s] is not None for s in st.outs):
            try:
                st.into(args, [vals[s] for s in st.outs])
            except Exception as exc:
                raise self._fail(st, args, exc) from exc
            return args
        res = self._compute(st, args)
        for k, s in enumerate(st.outs):
            if s in alias:  # a checked view of its input's bytes (see view_aliases)
                dst = vals[s]
                r = res[k]
                if r.shape != dst.shape or r.dtype != dst.dtype:
                    self._store(st, k, dst, r, arena)  # raises the shape/dtype error
                vals[s] = r
            elif s >= 0 and k < len(res):
                if vals[s] is None:  # a dynamic value (shape depends on input values): not in the arena
                    r = np.asarray(res[k])
                    # a view of arena bytes (Expand/Reshape of a planned value) would see them reused
                    vals[s] = r.copy() if np.may_share_memory(r, arena.buffer) else r
                else:
                    self._store(st, k, vals[s], res[k], arena)
        return args

    def run_arena(
        self,
        vals: list[Any],
        arena: Arena,
        prof: Profiler | None,
        run_id: int,
        switch_at: Mapping[int, int] | None = None,
    ) -> None:
        """Execute every step in plan order; intermediates are the arena views already in ``vals``.

        ``switch_at``: step index -> BLAS thread count to set before it (small GEMMs, see _gemm_threads).
        """
        alias = self.alias_slots(arena)
        skip = self.view_steps(arena)
        if prof is None:
            for i, st in enumerate(self.steps):
                if switch_at and i in switch_at:
                    BLAS.set(switch_at[i])
                if i not in skip:
                    self.exec_arena(st, vals, alias, arena)
            return
        dynamic = set(arena.plan.dynamic)
        for i, st in enumerate(self.steps):
            if switch_at and i in switch_at:
                BLAS.set(switch_at[i])
            t0 = time.perf_counter_ns()
            if i in skip:  # recorded (as the near-zero cost it is) so the profile lists every node
                args = [vals[s] if s >= 0 else None for s in st.ins]
            else:
                args = self.exec_arena(st, vals, alias, arena)
            self._record(
                prof,
                st,
                args,
                vals,
                t0,
                run_id,
                dynamic=bool(dynamic) and not dynamic.isdisjoint(st.node.outputs),
            )

    def exec_alloc(
        self, st: _Step, vals: list[Any], held: dict[int, np.ndarray], alloc: CachingAllocator
    ) -> list[Any]:
        """Run one step with each result in a fresh allocator block (kept in ``held``); returns its args."""
        args = [vals[i] if i >= 0 else None for i in st.ins]
        while args and args[-1] is None:
            args.pop()
        if st.out_fn is not None and len(args) == 2:
            shape = np.broadcast_shapes(np.shape(args[0]), np.shape(args[1]))
            dst = held[st.outs[0]] = alloc.empty(shape, args[0].dtype)
            try:
                st.out_fn(args[0], args[1], out=dst)
            except Exception as exc:
                raise self._fail(st, args, exc) from exc
            vals[st.outs[0]] = dst
            return args
        res = self._compute(st, args)
        for k, s in enumerate(st.outs):
            if s >= 0 and k < len(res):
                r = np.asarray(res[k])
                if r.dtype.hasobject:  # strings, sequences, optionals: Python objects, not allocator bytes
                    vals[s] = r
                    continue
                dst = held[s] = alloc.empty(r.shape, r.dtype)
                np.copyto(dst, r)
                vals[s] = dst
        return args

    def run_allocator(
        self,
        vals: list[Any],
        alloc: CachingAllocator,
        prof: Profiler | None,
        run_id: int,
        switch_at: Mapping[int, int] | None = None,
    ) -> list[np.ndarray]:
        """Execute every step with each result in an allocator block, freed after its last reader.

        ``switch_at`` as in :meth:`run_arena`.
        """
        live: list[np.ndarray] = []  # blocks still held at the end (graph outputs), freed by the caller
        held: dict[int, np.ndarray] = {}
        try:
            for i, st in enumerate(self.steps):
                if switch_at and i in switch_at:
                    BLAS.set(switch_at[i])
                t0 = time.perf_counter_ns() if prof is not None else 0
                args = self.exec_alloc(st, vals, held, alloc)
                if prof is not None:
                    self._record(prof, st, args, vals, t0, run_id)
                for s in st.frees:
                    if s in held:
                        alloc.free(held.pop(s))
                        vals[s] = None
            live = list(held.values())
            held.clear()
            return live
        finally:
            for arr in held.values():  # an error mid-run: give every block back
                alloc.free(arr)

    def _record(
        self,
        prof: Profiler,
        st: _Step,
        args: list[Any],
        vals: list[Any],
        t0: int,
        run_id: int,
        stream: int = 0,
        *,
        dynamic: bool = False,
    ) -> None:
        dur = time.perf_counter_ns() - t0
        outs = [vals[s] if s >= 0 else None for s in st.outs]
        ins_s = tuple(None if a is None else tuple(np.shape(a)) for a in args)
        outs_s = tuple(None if o is None else tuple(np.shape(o)) for o in outs)
        moved = sum(int(getattr(a, "nbytes", 0)) for a in (*args, *outs) if a is not None)
        prof.events.append(
            NodeEvent(
                st.node.name, st.node.op_type, st.kernels, self.device, st.fallback, t0, dur,
                ins_s, outs_s, moved, node_flops(st.node, ins_s, outs_s), run_id, stream, dynamic,
            )
        )  # fmt: skip
