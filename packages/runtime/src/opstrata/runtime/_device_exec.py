"""A session's plan on a device with its own memory (cuda): nodes on the device, the rest on the host.

Values live where they were made. A device node gets its host inputs uploaded (initializers once, at
the first run; feeds and host results as needed); a host node gets host copies of its device inputs and
runs the graph's own kernel on ``cpu``. A host node that computes on floating-point tensors is a
fallback: audited through ``opstrata.ops.record_fallback`` with the bytes it moved and the time the
copies took, listed by :meth:`DeviceProgram.fallbacks`, and refused up front under the ``error``
policy. Integer and boolean nodes (shape arithmetic, index and mask building) run on the host by
design, as onnxruntime's CUDA provider places them, and are not fallbacks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import opstrata.ops as ops
from opstrata.graph import EXECUTOR_KERNELS as KERNELS, Graph, Node

from ._device_nodes import HOST_INPUTS, NODE_KERNELS, node_key, node_runs_on_device
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


def _c_order(a: np.ndarray) -> np.ndarray:
    """``a`` in C order, keeping its shape (``np.ascontiguousarray`` turns a 0-d array into 1-d)."""
    return a if a.flags.c_contiguous else np.array(a, order="C")


class DeviceProgram:
    """The plan's nodes placed on ``device`` or the host; runs them with values in either memory."""

    def __init__(self, graph: Graph, device: str) -> None:
        mem = ops.device_memory(device)
        if mem is None:
            raise InvalidModel(
                "DeviceProgram", f"device '{device}' computes in host memory", "use the cpu executor"
            )
        self.graph, self.device, self.memory = graph, device, mem
        self.steps: list[tuple[Node, bool, Any]] = []
        self.host_nodes: list[HostNode] = []
        for n in graph.nodes:
            on_dev, why = node_runs_on_device(n, graph, device)
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
        last: dict[str, int] = {}
        for i, (n, _, _) in enumerate(self.steps):
            for x in n.inputs:
                if x:
                    last[x] = i
        keep = set(graph.outputs)
        self._frees = [
            [x for x, j in last.items() if j == i and x not in keep] for i in range(len(self.steps))
        ]

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

    # ------------------------------------------------------------------ moving values

    def _to_device(self, v: Any, moved: list[Any]) -> Any:
        if v is None or self.memory.is_array(v) or not isinstance(v, np.ndarray):
            return v
        t0 = time.perf_counter()
        d = self.memory.from_host(_c_order(v))
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
            d = self._uploaded[name] = self.memory.from_host(_c_order(self.graph.initializers[name]))
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
        device node reads them. With ``prof`` every node is timed between two device synchronisations (its
        copies included), so each event is that node's device time, at the cost of a sync per node.
        """
        run_id = len(prof.runs) if prof is not None else 0
        vals: dict[str, Any] = dict(feeds)
        inits = self.graph.initializers
        made_by: dict[str, int] = {}  # value -> index into host_nodes of the host node that made it
        tally = [[0, 0.0] for _ in self.host_nodes]
        hi = 0
        with ops.device(self.device):
            for i, (n, on_dev, fn) in enumerate(self.steps):
                host_pos = HOST_INPUTS.get(node_key(n), frozenset()) if on_dev else frozenset()
                metadata = on_dev and node_key(n) == (
                    "",
                    "Shape",
                )  # reads no device memory: no copy either way
                args = []
                for k, x in enumerate(n.inputs):
                    if not x:
                        args.append(None)
                        continue
                    if on_dev and k not in host_pos and not metadata:
                        if x in inits and x not in vals:
                            args.append(self._initializer(x))
                            continue
                        moved = tally[made_by[x]] if x in made_by else [0, 0.0]
                        v = vals[x] = self._to_device(vals[x], moved)  # uploaded once, then read there
                    else:
                        v = self._to_host(
                            vals[x] if x in vals else inits[x], tally[hi] if not on_dev else [0, 0.0]
                        )
                    args.append(v)
                while args and args[-1] is None:
                    args.pop()
                t0 = self._sync_ns() if prof is not None else 0
                res = self._call(n, on_dev, fn, args)
                if prof is not None:
                    self._record(prof, n, on_dev, args, res, t0, run_id, hi)
                for o, r in zip(n.outputs, res, strict=False):
                    if o:
                        vals[o] = r
                        if not on_dev:
                            made_by[o] = hi
                if not on_dev:
                    hi += 1
                for x in self._frees[i]:
                    vals.pop(x, None)
            for h, (nbytes, secs) in zip(self.host_nodes, tally, strict=True):
                if h.fallback:
                    ops.record_fallback(h.op_type, self.device, "device:cpu", h.dtype, h.reason,
                                    bytes_copied=nbytes, copy_seconds=secs)  # fmt: skip
        out = []
        for name in outputs:
            if name in inits and name not in vals:
                out.append(self._initializer(name) if on_device else np.array(inits[name], copy=True))
                continue
            v = vals[name]
            if on_device:
                out.append(self._to_device(v, [0, 0.0]))
            else:
                out.append(self.memory.to_host(v) if self.memory.is_array(v) else np.array(v, copy=True))
        return out

    def _sync_ns(self) -> int:
        self.memory.synchronize()
        return time.perf_counter_ns()

    def _record(
        self,
        prof: Profiler,
        n: Node,
        on_dev: bool,
        args: list[Any],
        res: list[Any],
        t0: int,
        run_id: int,
        hi: int,
    ) -> None:
        dur = self._sync_ns() - t0
        shape = lambda a: None if a is None else tuple(int(d) for d in a.shape)  # noqa: E731
        ins = tuple(shape(a) for a in args)
        outs = tuple(shape(r) for r in res)
        moved = sum(int(getattr(a, "nbytes", 0)) for a in (*args, *res) if a is not None)
        if on_dev:
            kernels, where, fell = NODE_KERNELS[node_key(n)][1] or ("view",), self.device, False
        else:
            kernels, where, fell = ("host",), "cpu", self.host_nodes[hi].fallback
        prof.events.append(
            NodeEvent(n.name, n.op_type, tuple(kernels), where, fell, t0, dur, ins, outs, moved,
                      node_flops(n, ins, outs), run_id)
        )  # fmt: skip

    def _call(self, n: Node, on_dev: bool, fn: Any, args: list[Any]) -> list[Any]:
        try:
            if on_dev:
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
