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
from .context import SUBGRAPH_IMPORTER, ImportContext, tensor_array
from .types import kind_from_type, require_onnx, shape_from_type

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
        converted = version_converter.convert_version(model, MIN_OPSET)
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
    # onnx < 1.21's converter drops the types of sequence/optional graph inputs and outputs (the value's
    # type becomes empty); the converter renames nothing, so the original model's types are put back
    for new_values, old_values in (
        (converted.graph.input, model.graph.input),
        (converted.graph.output, model.graph.output),
    ):
        types = {v.name: v.type for v in old_values}
        for v in new_values:
            if v.type.WhichOneof("value") is None and types.get(v.name) is not None:
                v.type.CopyFrom(types[v.name])
    return converted


_SCAN8 = "ai.opstrata.scan8"  # the domain a Scan-8 node hides in while onnx.version_converter runs


def _hide_scan8(model: Any, where: str) -> Any:
    """A copy of an opset-8 model whose top-level Scan-8 nodes sit in a private domain (the converter passes
    them through; its Scan 8->9 adapter drops the batch axis) with their bodies converted to MIN_OPSET."""
    onnx = require_onnx()
    from onnx import version_converter

    m = onnx.ModelProto()
    m.CopyFrom(model)
    hidden = False
    for i, n in enumerate(m.graph.node):
        if n.op_type != "Scan" or n.domain not in ("", "ai.onnx"):
            continue
        label = f"node '{n.name or f'Scan_{i}'}' (Scan-8)"
        if n.input and n.input[0]:  # sequence_lens: left to the converter, which refuses it by name
            continue
        body = next(a for a in n.attribute if a.name == "body")
        bm = onnx.helper.make_model(body.g, opset_imports=[onnx.helper.make_opsetid("", 8)])
        try:
            converted = version_converter.convert_version(bm, MIN_OPSET).graph
        except Exception as exc:
            raise GraphError(
                where, f"{label}: its body cannot be converted to opset {MIN_OPSET}: {exc}"
            ) from None
        body.g.CopyFrom(converted)
        n.domain, hidden = _SCAN8, True
    if hidden:
        m.opset_import.append(onnx.helper.make_opsetid(_SCAN8, 1))
    return m


def _restore_scan8(model: Any) -> Any:
    """Each hidden Scan-8 node as its opset-13 meaning: a Loop over the batch axis running Scan-9 on each row."""
    onnx = require_onnx()
    oh = onnx.helper
    nodes = []
    for i, n in enumerate(model.graph.node):
        if n.domain != _SCAN8:
            nodes.append(n)
            continue
        p = f"{n.name or f'Scan_{i}'}"
        attrs = {a.name: a for a in n.attribute}
        m = int(attrs["num_scan_inputs"].i)
        ins = list(n.input[1:])
        dirs = list(attrs["directions"].ints) if "directions" in attrs else [0] * m
        zero = oh.make_tensor(f"{p}/zero", onnx.TensorProto.INT64, [], [0])
        nodes += [
            oh.make_node("Shape", [ins[-1]], [f"{p}/shape"], name=f"{p}/shape"),
            oh.make_node("Constant", [], [f"{p}/zero"], name=f"{p}/zero", value=zero),
            oh.make_node("Gather", [f"{p}/shape", f"{p}/zero"], [f"{p}/batch"], name=f"{p}/batch"),
        ]
        rows = [f"{p}/row{k}" for k in range(len(ins))]
        outs = [f"{p}/out{k}" for k in range(len(n.output))]
        body_nodes = [
            oh.make_node("Gather", [x, f"{p}/b"], [r], axis=0) for x, r in zip(ins, rows, strict=True)
        ]
        body_nodes.append(
            oh.make_node(
                "Scan", rows, outs, num_scan_inputs=m, scan_input_directions=dirs, body=attrs["body"].g
            )
        )
        body_nodes.append(oh.make_node("Identity", [f"{p}/c"], [f"{p}/c_out"]))
        b_in = [oh.make_tensor_value_info(f"{p}/b", onnx.TensorProto.INT64, []),
                oh.make_tensor_value_info(f"{p}/c", onnx.TensorProto.BOOL, [])]  # fmt: skip
        b_out = [oh.make_tensor_value_info(f"{p}/c_out", onnx.TensorProto.BOOL, [])]
        b_out += [oh.make_empty_tensor_value_info(o) for o in outs]
        loop_body = oh.make_graph(body_nodes, f"{p}/batch_loop", b_in, b_out)
        nodes.append(oh.make_node("Loop", [f"{p}/batch", ""], list(n.output), name=p, body=loop_body))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    keep = [o for o in model.opset_import if o.domain != _SCAN8]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    return model


def _used_in(gp: Any) -> set[str]:
    """Names a GraphProto's outputs and nodes read, nested control-flow bodies included."""
    onnx = require_onnx()
    used = {o.name for o in gp.output}
    for n in gp.node:
        used.update(i for i in n.input if i)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                used |= _used_in(a.g)
    return used


def _used_names(model: Any) -> set[str]:
    return _used_in(model.graph)


def _import_subgraph(gp: Any, ctx: ImportContext, attr: str) -> Graph:
    """A GraphProto attribute (If branch, Loop/Scan body) as an IR Graph; its nodes are named
    ``<node>/<attr>/<inner node>``. Outer-scope values it reads stay free names (``free_values``)."""
    prefix, where = f"{ctx.name}/{attr}", f"node '{ctx.name}' ({ctx.op_type}) attribute '{attr}'"
    g = Graph(gp.name or attr, opset_imports=ctx.graph.opset_imports)
    g.doc_string = gp.doc_string
    if len(gp.sparse_initializer):
        raise GraphError(
            where, "the subgraph has sparse initializers, which are not supported", "store them dense"
        )
    for t in gp.initializer:
        g.add_initializer(t.name, tensor_array(t, f"{where}: initializer '{t.name}'"))
    for vi in gp.input:  # an untyped body input gets its type from the outer node (the op's shape rule)
        dtype, shape = shape_from_type(vi.type, f"{where}: input '{vi.name}'")
        v = g._ensure_value(vi.name)
        v.dtype, v.shape = dtype, shape
        if vi.type.WhichOneof("value") is not None:
            v.kind = kind_from_type(vi.type, f"{where}: input '{vi.name}'")
        g.inputs.append(vi.name)
    used = _used_in(gp)
    names: set[str] = set()
    for i, proto in enumerate(gp.node):
        name = f"{prefix}/{proto.name or f'{proto.op_type}_{i}'}"
        while name in names:
            name = f"{name}_{i}"
        names.add(name)
        _import_node(g, proto, name, ctx.opset, used)
    for vi in [*gp.value_info, *gp.output]:
        dtype, shape = shape_from_type(vi.type, f"{where}: value '{vi.name}'")
        v = g.values.get(vi.name)
        if v is not None and vi.name not in g.initializers:
            v.dtype = v.dtype if dtype is None else dtype
            v.shape = v.shape if shape is None else shape
    g.outputs = [o.name for o in gp.output]
    _check_definitions(g)
    g.nodes = toposorted(g)
    return g


SUBGRAPH_IMPORTER[:] = [_import_subgraph]


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
        graph.add_input(vi.name, dtype, shape).kind = kind_from_type(vi.type, f"graph input '{vi.name}'")
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
            if vi.type.WhichOneof("value") is not None:
                v.kind = kind_from_type(vi.type, f"value '{vi.name}'")
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
        scan8 = opset < 9 and any(n.op_type == "Scan" for n in m.graph.node)
        m = _convert(_hide_scan8(m, where) if scan8 else m, opset, where)
        if scan8:
            m = _restore_scan8(m)
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
