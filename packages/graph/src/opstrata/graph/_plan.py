"""Execution plans: ``compile(graph, level, device) -> Plan`` (optimised graph, kernel bindings with every
fallback listed, memory plan) and ``Plan.save`` / ``Plan.load`` (a versioned zip, written atomically)."""

from __future__ import annotations

import json
import os
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import opstrata.ops as ops

from ._errors import GraphError
from ._execute import KERNELS, run_graph
from ._ir import OPSTRATA_DOMAIN, Graph, Node
from ._memory import MemoryPlan, MemoryPlanner
from ._serialize import array_bytes, graph_from_json, graph_to_json
from .opdefs import (
    families as _families,  # noqa: F401  (loads every op definition)
    registry,
)
from .opdefs.fused_codegen import CODEGEN
from .passes.pipeline import PassReport, optimize

__all__ = ["FORMAT", "FORMAT_VERSION", "KernelBinding", "Plan", "compile", "kernels_of"]

FORMAT = "opstrata-plan"
#: Version of the saved-plan layout; Plan.load refuses any other.
FORMAT_VERSION = 1

_HOST = "host"
_COLLECTIVE = "collective"  # plans saved before AllReduce bound to ops' all_reduce carry this path
# IR op -> the opstrata.ops kernels its executor function calls ("" = none: metadata only); every
# OpDef publishes its ``uses`` here (opdefs/registry.py)
_OPS = registry.USES
_ACT_OPS = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu", "sigmoid": "sigmoid", "tanh": "tanh"}


@dataclass(frozen=True)
class KernelBinding:
    """The ops kernel one node runs on: ``path`` is native / decomposition / device:<name> / host /
    codegen (a FusedElementwise chain compiled by the ops code generator)."""

    node: str
    op_type: str
    kernel: str
    dtype: str
    path: str

    @property
    def is_fallback(self) -> bool:
        return self.path not in ("native", _HOST, _COLLECTIVE, CODEGEN)


def _key(r: Any) -> tuple:
    return (r.op, r.device, r.path, r.dtype, r.reason, r.via)


def kernels_of(node: Node, device: str | None = None) -> list[str]:
    """The opstrata.ops kernels (or ``"host"``) the executor calls for ``node`` on ``device``.

    A FusedElementwise node is one generated kernel (``"codegen"``) on ``cpu``; on other devices
    (``ref``, plugins) it runs step by step on that device's kernels, which are listed.
    """
    if node.domain == OPSTRATA_DOMAIN and node.op_type == "FusedElementwise":
        if (device or ops.get_default_device()) == "cpu":
            return [CODEGEN]
        return [k for op, _ in node.attrs["expr"] for k in _OPS[op].split()]
    if node.domain == OPSTRATA_DOMAIN and node.op_type == "FusedConv":
        conv = _OPS[node.qualified_type].split()
        if (device or ops.get_default_device()) == "cpu":
            return [*conv, CODEGEN]
        return conv + [k for op, _ in node.attrs["expr"] for k in _OPS[op].split()]
    names = _OPS.get(node.qualified_type)
    if names is None:
        raise GraphError(
            f"node '{node.name}' ({node.qualified_type})",
            "no opstrata.ops kernel is known for this op type",
            f"lower it to supported ops; supported: {', '.join(sorted(_OPS))}",
        )
    out = names.split()
    act = node.attrs.get("activation") if node.op_type == "Linear" else None
    if act:
        if act not in _ACT_OPS:
            raise GraphError(
                f"node '{node.name}' ({node.qualified_type})",
                f"unknown activation {act!r}",
                f"use one of {', '.join(sorted(_ACT_OPS))}, or leave 'activation' empty for none",
            )
        out.append(_ACT_OPS[act])
    return out


def _primary_dtype(g: Graph, node: Node) -> np.dtype | None:
    """The dtype the node's ops kernels dispatch on: its OpDef's ``dispatch_input``, else the first float
    input's, else the first input's."""
    d = registry.lookup(node.op_type, node.domain)
    i = None if d is None else d.dispatch_input
    if i is not None and i < len(node.inputs) and node.inputs[i] in g.values:
        return g.values[node.inputs[i]].dtype
    dts = [g.values[x].dtype for x in node.inputs if x and x in g.values and g.values[x].dtype is not None]
    floats = [d for d in dts if d.kind == "f" or d.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")]
    return (floats or dts or [None])[0]


def _bind(g: Graph, device: str) -> list[KernelBinding]:
    out = []
    for n in g.nodes:
        if KERNELS.get(("" if n.domain == "ai.onnx" else n.domain, n.op_type)) is None:
            raise GraphError(
                f"node '{n.name}' ({n.qualified_type})", "the executor has no implementation for this op type",
                "lower it to supported ops before compiling",
            )  # fmt: skip
        dt = _primary_dtype(g, n)
        for k in kernels_of(n, device):
            if k == CODEGEN:
                out.append(KernelBinding(n.name, n.qualified_type, k, str(dt), k))
                continue
            if k == _HOST or (n.op_type == "Div" and dt is not None and dt.kind in "iu"):
                out.append(KernelBinding(n.name, n.qualified_type, k, str(dt), _HOST))
                continue
            try:
                path = ops.dispatch_path(k, device, dt)
            except (ops.NoKernelError, ops.UnknownOpError) as exc:
                raise GraphError(
                    f"node '{n.name}' ({n.qualified_type})",
                    f"no opstrata.ops kernel '{k}' for device '{device}' and dtype {dt}: {exc}",
                    "compile for another device, cast the input, or register a kernel",
                ) from exc
            out.append(KernelBinding(n.name, n.qualified_type, k, str(dt), path))
    return out


def _static_shapes(g: Graph) -> dict[str, tuple[int, ...]] | None:
    shapes = {}
    for x in g.inputs:
        s = g.values[x].shape
        if s is None or not all(isinstance(d, int) for d in s):
            return None
        shapes[x] = tuple(int(d) for d in s)  # type: ignore[arg-type]
    return shapes


class Plan:
    """A compiled graph: ``.graph`` (optimised), ``.report``, ``.bindings`` / ``.fallbacks``, ``.memory``."""

    def __init__(
        self,
        graph: Graph,
        report: PassReport,
        *,
        level: int,
        device: str,
        bindings: list[KernelBinding],
        input_shapes: dict[str, tuple[int, ...]] | None = None,
        memory: MemoryPlan | None = None,
    ) -> None:
        self.graph, self.report, self.level, self.device = graph, report, level, device
        self.bindings = bindings
        #: Audit lines of fallbacks the ops layer recorded while this plan ran (see ``run``).
        self.runtime_fallbacks: list[str] = []
        self.input_shapes = input_shapes
        self._planner = MemoryPlanner(graph)
        if memory is None and input_shapes is not None:
            memory = self._planner.for_shapes(input_shapes, dynamic=True)  # data-dependent values: per run
        elif memory is not None and input_shapes is not None:
            self._planner.seed(input_shapes, memory)
        self.memory = memory

    @property
    def fallbacks(self) -> list[KernelBinding]:
        """Bindings whose kernel is not native on ``device`` (decomposition or another device)."""
        return [b for b in self.bindings if b.is_fallback]

    def forget_memory(self, input_shapes: Mapping[str, Sequence[int]]) -> None:
        """Drop the cached memory plan of these input shapes (a session's bounded plan cache evicts it)."""
        self._planner.forget(input_shapes)

    def memory_for(self, input_shapes: Mapping[str, Sequence[int]], *, dynamic: bool = False) -> MemoryPlan:
        """The memory plan at these input shapes (planned on first use, then cached); with ``dynamic``
        values whose shape depends on input values are left to the allocator (``MemoryPlan.dynamic``)."""
        return self._planner.for_shapes(input_shapes, dynamic=dynamic)

    def run(self, feeds: Mapping[str, Any], *, outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Execute on ``feeds`` (with run_graph; the runtime package will use the arena)."""
        before = {_key(r): r.count for r in ops.fallback_report().records}
        out = run_graph(self.graph, feeds, self.device, outputs=outputs)
        for r in ops.fallback_report().records:  # what the ops audit saw during this run
            if r.count > before.get(_key(r), 0) and r.line() not in self.runtime_fallbacks:
                self.runtime_fallbacks.append(r.line())
        values = self.graph.values
        tensors = {k: v for k, v in feeds.items() if k not in values or values[k].kind == "tensor"}
        # plans (and caches) this shape; values whose shape depends on input values, strings, sequences
        # and optionals stay out of the arena (MemoryPlan.dynamic)
        self.memory_for({k: np.shape(v) for k, v in tensors.items()}, dynamic=True)
        return out

    def summary(self) -> str:
        """Level, device, node counts, fallbacks and the memory headline."""
        lines = [
            f"plan '{self.graph.name}': level {self.level}, device {self.device}, "
            f"{self.report.nodes_before} -> {len(self.graph)} nodes, {len(self.fallbacks)} fallbacks",
        ]
        lines += [
            f"  fallback: node '{b.node}' ({b.op_type}) {b.kernel} {b.dtype} -> {b.path}"
            for b in self.fallbacks
        ]
        lines.append(
            f"  memory: {self.memory.summary() if self.memory else 'symbolic shapes: planned per shape on run'}"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    # ------------------------------------------------------------------ save / load

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the plan to ``path`` atomically (a temp file then rename); returns the path."""
        path = Path(path)
        from . import __version__
        from .onnx.export import to_onnx

        tensors: dict[str, bytes] = {}

        def put(name: str, a: np.ndarray) -> str:
            entry = f"tensors/{len(tensors)}.bin"
            tensors[entry] = array_bytes(a)
            return entry

        meta = {
            "format": FORMAT, "version": FORMAT_VERSION, "opstrata_graph": __version__,
            "level": self.level, "device": self.device, "report": self.report.to_dict(),
            "bindings": [asdict(b) for b in self.bindings],
            "input_shapes": None if self.input_shapes is None else {k: list(v) for k, v in self.input_shapes.items()},
            "memory": None if self.memory is None else self.memory.to_dict(),
        }  # fmt: skip
        graph_json = graph_to_json(self.graph, put)
        try:  # the ONNX export rides along for inspection with other tools; needs the [onnx] extra
            onnx_bytes: bytes | None = to_onnx(self.graph).SerializeToString()
        except ImportError:
            onnx_bytes = None
        meta["has_onnx"] = onnx_bytes is not None

        def write(f: Any) -> None:
            with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as z:
                z.writestr("format.json", json.dumps({"format": FORMAT, "version": FORMAT_VERSION}))
                z.writestr("plan.json", json.dumps(meta))
                z.writestr("graph.json", json.dumps(graph_json))
                for entry, data in tensors.items():
                    z.writestr(entry, data)
                if onnx_bytes is not None:
                    z.writestr("graph.onnx", onnx_bytes)

        ops.atomic_write(path, write)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Read a plan written by :meth:`save` (GraphError naming the file when corrupt or of another version)."""
        path = Path(path)
        where = f"Plan.load('{path}')"
        fix = "recompile with opstrata.graph.compile(...) and save again"
        if not path.is_file():
            raise GraphError(where, "no such file", "check the path")
        try:
            with zipfile.ZipFile(path) as z:
                fmt = json.loads(z.read("format.json"))
                if not isinstance(fmt, dict) or fmt.get("format") != FORMAT:
                    raise GraphError(where, f"not an opstrata plan (format {fmt!r})", fix)
                if fmt.get("version") != FORMAT_VERSION:
                    raise GraphError(
                        where,
                        f"plan format version {fmt.get('version')!r}, this opstrata-graph reads version {FORMAT_VERSION}",
                        fix,
                    )
                meta = json.loads(z.read("plan.json"))
                graph = graph_from_json(json.loads(z.read("graph.json")), z.read)
        except GraphError:
            raise
        except (zipfile.BadZipFile, KeyError, ValueError, TypeError, EOFError, OSError) as exc:
            raise GraphError(
                where, f"corrupt or truncated plan file: {type(exc).__name__}: {exc}", fix
            ) from exc
        try:
            graph.validate()
            from ._shape_infer import infer_shapes

            infer_shapes(graph)
        except GraphError as exc:
            raise GraphError(where, f"the saved graph is inconsistent: {exc}", fix) from exc
        try:
            shapes = meta.get("input_shapes")
            return cls(
                graph,
                PassReport.from_dict(meta["report"]),
                level=meta["level"],
                device=meta["device"],
                bindings=[KernelBinding(**b) for b in meta["bindings"]],
                input_shapes=None if shapes is None else {k: tuple(v) for k, v in shapes.items()},
                memory=None if meta["memory"] is None else MemoryPlan.from_dict(meta["memory"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise GraphError(
                where, f"corrupt plan metadata (plan.json): {type(exc).__name__}: {exc}", fix
            ) from exc


def compile(
    graph: Graph | Any,
    level: int = 2,
    device: str = "cpu",
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> Plan:
    """Optimise ``graph`` at ``level``, bind every node to an ops kernel on ``device``, plan memory.

    ``graph`` may also be anything ``from_onnx`` reads. Memory is planned now for ``input_shapes``
    or static input shapes, else per concrete shape on first ``run``. Fallbacks follow the ops
    policy: listed in ``plan.fallbacks`` always, a warning under ``"warn"``, an error under ``"error"``.

    >>> import opstrata.graph as og
    >>> from opstrata.graph.testing import mlp_model
    >>> plan = og.compile(og.from_onnx(mlp_model()), level=2, input_shapes={"x": (4, 16)})
    >>> plan.fallbacks, plan.memory.arena_bytes <= plan.memory.no_reuse_bytes
    ([], True)
    """
    if not isinstance(graph, Graph):
        if isinstance(graph, (bytes, str, os.PathLike)) or hasattr(graph, "graph"):
            from .onnx.importer import from_onnx

            graph = from_onnx(graph)
        else:
            raise GraphError(
                "compile", f"expected an opstrata.graph.Graph (or an ONNX model), got {type(graph).__name__}",
                "pass og.from_onnx(model)",
            )  # fmt: skip
    if not isinstance(device, str) or device not in ops.list_devices():
        raise GraphError("compile", f"unknown device {device!r}", f"use one of {ops.list_devices()}")
    graph.validate()
    opt, report = optimize(graph, level)
    bindings = _bind(opt, device)
    shapes = None
    if input_shapes is not None:
        unknown = sorted(set(input_shapes) - set(opt.inputs))
        missing = [x for x in opt.inputs if x not in input_shapes]
        if unknown or missing:
            raise GraphError(
                "compile", f"input_shapes names unknown inputs {unknown} / misses inputs {missing}",
                f"give a shape for exactly the inputs {opt.inputs}",
            )  # fmt: skip
        shapes = {k: tuple(int(d) for d in input_shapes[k]) for k in opt.inputs}
    else:
        shapes = _static_shapes(opt)
    plan = Plan(opt, report, level=level, device=device, bindings=bindings, input_shapes=shapes)
    if plan.fallbacks:
        policy = ops.get_fallback_policy()
        msg = "; ".join(
            f"node '{b.node}' ({b.op_type}): {b.kernel} {b.dtype} -> {b.path}" for b in plan.fallbacks
        )
        if policy == "error":
            raise GraphError(
                "compile",
                f"kernels would fall back on device '{device}': {msg}",
                "register native kernels or set the fallback policy to 'warn'",
            )
        if policy == "warn":
            warnings.warn(
                f"compile: kernels fall back on device '{device}': {msg}", ops.FallbackWarning, stacklevel=2
            )
    return plan
