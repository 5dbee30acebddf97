"""ONNX front end: ModelProto (opset 13..newest, older converted) -> Graph, one small importer per op type.

Models with an older default-domain opset are converted to opset 13 on import with
``onnx.version_converter`` (ONNX's own adapters, e.g. Softmax-11's axis flattening becomes
Flatten/Softmax-13/Reshape); the Graph records the conversion (``graph.import_notes``) and the pass
report prints it. A model the converter refuses is a GraphError naming the op and the opset.

Canonical IR forms (docs/graph.md): ONNX op names and attributes, except that axes/split lists that
newer opsets pass as inputs are always attributes, Constant becomes an initializer, Dropout becomes
Identity and Einsum becomes Transpose/MatMul/ReduceSum/(Un)Squeeze.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .._errors import GraphError, UnsupportedOpError
from .._ir import Graph
from .._shape_infer import infer_shapes
from .._validate import _check_annotations, _check_definitions, _check_uses, toposorted
from ..opdefs import (
    families as _families,  # noqa: F401  (loads every op definition)
    registry,
)
from .attention import CAUSAL_TOP_LEFT, resolve_causal
from .context import ImportContext, tensor_array
from .types import require_onnx, shape_from_type

__all__ = ["IMPORTERS", "MIN_OPSET", "from_onnx", "supported_onnx_ops"]

MIN_OPSET = 13


IMPORTERS = registry.IMPORTERS


def supported_onnx_ops() -> list[str]:
    """ONNX op types (default domain) that from_onnx imports."""
    return sorted(IMPORTERS)


# --------------------------------------------------------------------------- model loading


def _load(model: Any) -> Any:
    onnx = require_onnx()
    from google.protobuf.message import DecodeError

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        m = onnx.ModelProto()
        try:
            m.ParseFromString(bytes(model))
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise GraphError(
                "from_onnx(bytes)",
                f"the {len(model)} bytes are not a valid ONNX ModelProto ({exc})",
                "pass the bytes of an .onnx file (truncated or corrupted data cannot be parsed)",
            ) from None
        return m
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise GraphError(f"from_onnx('{path}')", "no such file", "check the path")
        try:
            return onnx.load(str(path), load_external_data=True)
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise GraphError(
                f"from_onnx('{path}')", f"not a valid ONNX model ({exc})", "re-export the model"
            ) from None
        except (OSError, onnx.checker.ValidationError) as exc:
            raise GraphError(
                f"from_onnx('{path}')",
                f"cannot read the model's external data: {exc}",
                "keep the external data files next to the .onnx file, as when it was saved",
            ) from None
    raise GraphError("from_onnx", f"expected a path, bytes or onnx.ModelProto, got {type(model).__name__}")


def _opset(model: Any, where: str) -> int:
    onnx = require_onnx()
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise GraphError(
            where,
            f"not an ONNX model (ir_version={model.ir_version}, graph {'present' if model.HasField('graph') else 'missing'})",
            "the data may be truncated, corrupted, or not an .onnx file",
        )
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    if "ai.onnx" not in opsets:
        raise GraphError(where, "the model imports no default-domain (ai.onnx) opset", "re-export the model")
    v, newest = opsets["ai.onnx"], onnx.defs.onnx_opset_version()
    if not 1 <= v <= newest:
        raise GraphError(
            where,
            f"opset {v} is outside the supported range 1..{newest} (older than {MIN_OPSET} is converted)",
            f"re-export the model with opset {MIN_OPSET}..{newest}",
        )
    return v


_NAMED_OP = re.compile(r"op_type:\s*(\w+)|\bfor (\w+)\b|adapt_([A-Za-z]+)_\d")


def _culprits(model: Any, opset: int, text: str) -> list[tuple[str, str]]:
    """(label, op) of the nodes the converter's message names, else of those whose op changed after ``opset``."""
    onnx = require_onnx()
    named = {g.lower() for groups in _NAMED_OP.findall(text) for g in groups if g}
    nodes = [
        (f"node '{n.name or f'{n.op_type}_{i}'}' ({n.op_type})", n.op_type)
        for i, n in enumerate(model.graph.node)
        if n.domain in ("", "ai.onnx")
    ]
    hits = [(label, op) for label, op in nodes if op.lower() in named]
    if hits:
        return hits
    changed = []
    for label, op in nodes:
        try:
            if onnx.defs.get_schema(op, MIN_OPSET, "").since_version > opset:
                changed.append((label, op))
        except onnx.defs.SchemaError:  # removed or unknown op: the converter cannot carry it either
            changed.append((label, op))
    return changed


def _convert(model: Any, opset: int, where: str) -> Any:
    """``model`` converted from ``opset`` to MIN_OPSET by onnx.version_converter (GraphError if refused)."""
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:  # the converter raises RuntimeError/InferenceError/ValueError with C++ text
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        text = text.rsplit("failed: ", 1)[-1].strip()  # drop the C++ file:line and assertion prefix
        nodes = _culprits(model, opset, text)
        at = f" at {', '.join(label for label, _ in nodes[:4])}" if nodes else ""
        raise GraphError(
            where,
            f"onnx.version_converter cannot convert opset {opset} to {MIN_OPSET}{at}: {text[:200]}",
            f"re-export the model with opset {MIN_OPSET} or newer"
            + (f", or rewrite {nodes[0][1]} in its opset-{MIN_OPSET} form" if nodes else ""),
        ) from None


def _used_names(model: Any) -> set[str]:
    used = {o.name for o in model.graph.output}
    for n in model.graph.node:
        used.update(i for i in n.input if i)
    return used


def _import_node(graph: Graph, proto: Any, name: str, opset: int, used: set[str]) -> None:
    onnx = require_onnx()
    if proto.domain not in ("", "ai.onnx"):
        raise UnsupportedOpError(proto.op_type, proto.domain, opset, name, IMPORTERS)
    if proto.op_type not in IMPORTERS:
        raise UnsupportedOpError(proto.op_type, proto.domain, opset, name, IMPORTERS)
    try:
        since = onnx.defs.get_schema(proto.op_type, opset, "").since_version
    except onnx.defs.SchemaError:
        raise UnsupportedOpError(
            proto.op_type, proto.domain, opset, name, IMPORTERS,
            detail=f"op type '{proto.op_type}' does not exist in opset {opset}",
        ) from None  # fmt: skip
    ctx = ImportContext(graph, proto, name, opset, since, used)
    try:
        IMPORTERS[proto.op_type](ctx)
    except (KeyError, IndexError) as exc:
        raise GraphError(
            f"node '{name}' ({proto.op_type})",
            f"malformed node: missing attribute or input {exc}",
            "check the node against the ONNX operator spec",
        ) from None


def _graph_from_proto(model: Any, opset: int) -> Graph:
    gp = model.graph
    graph = Graph(gp.name or "graph", opset_imports={o.domain: o.version for o in model.opset_import})
    graph.doc_string = gp.doc_string
    if len(gp.sparse_initializer):
        raise GraphError(f"graph '{graph.name}'", "sparse initializers are not supported", "store them dense")
    for t in gp.initializer:
        graph.add_initializer(t.name, tensor_array(t, f"initializer '{t.name}'"))
    for vi in gp.input:
        if vi.name in graph.initializers:  # IR < 4 style: initializers listed as inputs
            continue
        dtype, shape = shape_from_type(vi.type, f"graph input '{vi.name}'")
        if dtype is None:
            raise GraphError(
                f"graph input '{vi.name}'", "has no element type", "give every input a tensor type"
            )
        graph.add_input(vi.name, dtype, shape)
    used = _used_names(model)
    names: set[str] = set()
    for i, proto in enumerate(gp.node):
        name = proto.name or f"{proto.op_type}_{i}"
        while name in names:
            name = f"{name}_{i}"
        names.add(name)
        _import_node(graph, proto, name, opset, used)
    for vi in [*gp.value_info, *gp.output]:
        dtype, shape = shape_from_type(vi.type, f"value '{vi.name}'")
        v = graph.values.get(vi.name)
        if v is not None and vi.name not in graph.initializers:
            v.dtype = v.dtype if dtype is None else dtype
            v.shape = v.shape if shape is None else shape
    graph.outputs = [o.name for o in gp.output]
    return graph


def from_onnx(model: str | os.PathLike[str] | bytes | Any, *, infer: bool = True) -> Graph:
    """Import an ONNX model (path, serialized bytes or ModelProto) as a validated, shape-inferred Graph.

    Opsets older than 13 are converted to 13 by onnx.version_converter first (``graph.import_notes``
    says so; the pass report prints it). Raises UnsupportedOpError (naming op, domain, opset, node and
    the supported ops) for an op the IR does not cover, and GraphError for malformed models or ones
    the converter refuses.

    >>> import onnx, onnx.helper as oh
    >>> m = oh.make_model(oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "g",
    ...     [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])],
    ...     [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]),
    ...     opset_imports=[oh.make_opsetid("", 17)])
    >>> from_onnx(m).value("y").type_str()
    'float32[batch, 4]'
    """
    onnx = require_onnx()
    m = _load(model)
    where = "from_onnx" if not isinstance(model, (str, os.PathLike)) else f"from_onnx('{model}')"
    opset = _opset(m, where)
    if len(m.functions):
        import onnx.inliner

        m = onnx.inliner.inline_local_functions(m)
    notes: list[str] = []
    if opset < MIN_OPSET:
        m = _convert(m, opset, where)
        notes.append(f"converted opset {opset} -> {MIN_OPSET} on import")
        opset = MIN_OPSET
    graph = _graph_from_proto(m, opset)
    graph.import_notes = notes  # read by optimize() into the PassReport
    defined = _check_definitions(graph)
    _check_uses(graph, defined)
    graph.nodes = toposorted(graph)
    _check_annotations(graph)
    graph.opset_imports = {("" if d == "ai.onnx" else d): v for d, v in graph.opset_imports.items()}
    if any(CAUSAL_TOP_LEFT in n.attrs for n in graph.nodes):
        infer_shapes(graph)  # resolve_causal compares the query and key lengths
        resolve_causal(graph)
    if infer:
        infer_shapes(graph)
    return graph
