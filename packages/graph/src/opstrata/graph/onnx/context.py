"""What an ONNX op's importer sees (:class:`ImportContext`) and the attribute/tensor decoding it uses.

Importers live with their op in ``opstrata.graph.opdefs``; this module is the toolkit they share,
kept below both the op definitions and the ``from_onnx`` driver so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .._errors import GraphError, UnsupportedOpError
from .._ir import Graph, Node
from ..opdefs import registry
from .types import array_from_tensor, dtype_from_onnx, require_onnx

__all__ = ["ImportContext", "Importer", "importer", "passthrough", "tensor_array"]

IMPORTERS = registry.IMPORTERS


class ImportContext:
    """What an importer sees: the ONNX node, its parsed attrs, opset info, constants, and ``emit``."""

    def __init__(self, graph: Graph, proto: Any, name: str, opset: int, since: int, used: set[str]) -> None:
        self.graph, self.proto, self.name, self.opset, self.since, self._used = (
            graph,
            proto,
            name,
            opset,
            since,
            used,
        )
        self.op_type = proto.op_type
        self.inputs = list(proto.input)
        self.outputs = list(proto.output)
        while self.outputs and not self.outputs[-1]:
            self.outputs.pop()
        self.attrs = {a.name: _attr_value(a, self) for a in proto.attribute}
        self._emitted = 0

    def unsupported(self, detail: str) -> UnsupportedOpError:
        """An UnsupportedOpError for a form of this op that opstrata does not handle."""
        return UnsupportedOpError(self.op_type, self.proto.domain, self.opset, self.name, IMPORTERS, detail)

    def input(self, i: int) -> str:
        """Name of input ``i`` (``""`` when omitted)."""
        return self.inputs[i] if i < len(self.inputs) else ""

    def const(self, i: int) -> np.ndarray | None:
        """The constant array at input ``i`` (initializer or Constant output), else None."""
        return self.graph.initializers.get(self.input(i)) if self.input(i) else None

    def const_ints(self, i: int, what: str) -> list[int] | None:
        """Input ``i`` as a list of ints (None when omitted); UnsupportedOpError when it is computed."""
        if not self.input(i):
            return None
        arr = self.const(i)
        if arr is None:
            raise self.unsupported(
                f"{self.op_type} with {what} computed at run time ('{self.input(i)}') is not supported; "
                f"{what} must be an initializer or Constant"
            )
        return [int(v) for v in np.asarray(arr).ravel()]

    def ints_or_input(self, i: int) -> tuple[list[int] | None, list[str]]:
        """Input ``i`` for an op that takes it either way: ``(ints, [])`` when constant, ``(None, [name])``
        when computed at run time (the IR node keeps it as an input), ``(None, [])`` when omitted."""
        if not self.input(i):
            return None, []
        arr = self.const(i)
        if arr is None:
            return None, [self.input(i)]
        return [int(v) for v in np.asarray(arr).ravel()], []

    def is_used(self, k: int) -> bool:
        """True when output ``k`` exists and something reads it."""
        return k < len(self.outputs) and bool(self.outputs[k]) and self.outputs[k] in self._used

    def fresh(self, hint: str) -> str:
        """A new value name derived from this node's name."""
        return self.graph.fresh_name(f"{self.name}/{hint}")

    def emit(
        self,
        op_type: str,
        inputs: list[str],
        outputs: list[str],
        attrs: dict[str, Any] | None = None,
        domain: str = "",
    ) -> Node:
        """Append an IR node (the first keeps the ONNX node's name, later ones get suffixes)."""
        name = self.name if self._emitted == 0 else f"{self.name}/{op_type}_{self._emitted}"
        self._emitted += 1
        while inputs and not inputs[-1]:
            inputs = inputs[:-1]
        return self.graph.add_node(op_type, inputs, outputs, attrs or {}, name=name, domain=domain)


#: ``[fn(graph_proto, ctx, attr_name) -> Graph]``: imports a subgraph attribute; set by onnx.importer
#: (which owns the node-import machinery; a list avoids an import cycle, like registry._PASSTHROUGH)
SUBGRAPH_IMPORTER: list[Callable[[Any, ImportContext, str], Graph]] = []


def _attr_value(a: Any, ctx: ImportContext) -> Any:
    onnx = require_onnx()
    if a.type == onnx.AttributeProto.GRAPHS:
        raise ctx.unsupported(f"attribute '{a.name}' holds a list of subgraphs, which no supported op takes")
    if a.type == onnx.AttributeProto.GRAPH:  # a control-flow body (If/Loop/Scan): imported recursively
        return SUBGRAPH_IMPORTER[0](a.g, ctx, a.name)
    if a.type == onnx.AttributeProto.SPARSE_TENSOR:
        raise ctx.unsupported(f"attribute '{a.name}' holds a sparse tensor; sparse tensors are not supported")
    if a.type == onnx.AttributeProto.TENSOR:
        return tensor_array(a.t, f"node '{ctx.name}' attribute '{a.name}'")
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode() for x in v]
    return v


def tensor_array(t: Any, where: str) -> np.ndarray:
    onnx = require_onnx()
    if t.data_location == onnx.TensorProto.EXTERNAL and not t.HasField("raw_data"):
        loc = {e.key: e.value for e in t.external_data}.get("location", "?")
        raise GraphError(
            where,
            f"tensor '{t.name}' keeps its data in an external file ('{loc}') that was not loaded",
            "pass the .onnx file path to from_onnx so the file next to it is read, or call "
            "onnx.load_external_data_for_model(model, base_dir) first",
        )
    dtype_from_onnx(t.data_type, where)
    try:
        arr = array_from_tensor(t)
    except Exception as exc:
        raise GraphError(
            where, f"tensor '{t.name}' cannot be decoded: {exc}", "the model file may be corrupt"
        ) from exc
    expected = int(np.prod(list(t.dims))) if len(t.dims) else 1
    if arr.size != expected:  # pragma: no cover - numpy_helper raises first in practice
        raise GraphError(where, f"tensor '{t.name}' has {arr.size} values for dims {list(t.dims)}")
    return np.array(arr)  # own, writable copy


Importer = Callable[[ImportContext], None]


def importer(names: str) -> Callable[[Importer], Importer]:
    """Register ``fn`` as the importer of the (space-separated) ONNX op types."""

    def deco(fn: Importer) -> Importer:
        for n in names.split():
            IMPORTERS[n] = fn
        return fn

    return deco


def passthrough(defaults: Mapping[str, Any] | None = None) -> Importer:
    """The importer of an op whose IR form is the ONNX node with attribute defaults filled in."""

    def imp(ctx: ImportContext) -> None:
        ctx.emit(ctx.op_type, ctx.inputs, ctx.outputs, {**(defaults or {}), **ctx.attrs})

    return imp


registry._PASSTHROUGH[:] = [passthrough]
