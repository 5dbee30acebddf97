"""ONNX front end: ModelProto (opset 13..newest) -> Graph, one small importer per ONNX op type.

Canonical IR forms (docs/graph.md): ONNX op names and attributes, except that axes/split lists that
newer opsets pass as inputs are always attributes, Constant becomes an initializer, Dropout becomes
Identity and Einsum becomes Transpose/MatMul/ReduceSum/(Un)Squeeze.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import GraphError, UnsupportedOpError
from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .._shape_infer import infer_shapes
from .._validate import _check_annotations, _check_definitions, _check_uses, toposorted
from .attention import CAUSAL_TOP_LEFT, resolve_causal
from .types import dtype_from_onnx, require_onnx, shape_from_type

__all__ = ["IMPORTERS", "MIN_OPSET", "from_onnx", "supported_onnx_ops"]

MIN_OPSET = 13


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


def _attr_value(a: Any, ctx: ImportContext) -> Any:
    onnx = require_onnx()
    if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise ctx.unsupported(f"attribute '{a.name}' holds a subgraph; control flow is not supported")
    if a.type == onnx.AttributeProto.SPARSE_TENSOR:
        raise ctx.unsupported(f"attribute '{a.name}' holds a sparse tensor; sparse tensors are not supported")
    if a.type == onnx.AttributeProto.TENSOR:
        return _tensor_array(a.t, f"node '{ctx.name}' attribute '{a.name}'")
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode() for x in v]
    return v


def _tensor_array(t: Any, where: str) -> np.ndarray:
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
        arr = onnx.numpy_helper.to_array(t)
    except Exception as exc:
        raise GraphError(
            where, f"tensor '{t.name}' cannot be decoded: {exc}", "the model file may be corrupt"
        ) from exc
    expected = int(np.prod(list(t.dims))) if len(t.dims) else 1
    if arr.size != expected:  # pragma: no cover - numpy_helper raises first in practice
        raise GraphError(where, f"tensor '{t.name}' has {arr.size} values for dims {list(t.dims)}")
    return np.array(arr)  # own, writable copy


# --------------------------------------------------------------------------- importers

Importer = Callable[[ImportContext], None]
IMPORTERS: dict[str, Importer] = {}


def importer(names: str) -> Callable[[Importer], Importer]:
    """Register ``fn`` as the importer of the (space-separated) ONNX op types."""

    def deco(fn: Importer) -> Importer:
        for n in names.split():
            IMPORTERS[n] = fn
        return fn

    return deco


def _passthrough(defaults: dict[str, Any] | None = None) -> Importer:
    def imp(ctx: ImportContext) -> None:
        ctx.emit(ctx.op_type, ctx.inputs, ctx.outputs, {**(defaults or {}), **ctx.attrs})

    return imp


for _names, _defaults in {
    "Add Sub Mul Div Pow Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor Not": None,
    "Exp Log Sqrt Tanh Erf Sigmoid Relu Neg Abs Reciprocal Where MatMul Identity": None,
    "Expand Range Size Reshape Slice Clip GlobalAveragePool GlobalMaxPool Concat": None,
    "Softmax LogSoftmax": {"axis": -1},
    "Gather": {"axis": 0},
    "Flatten": {"axis": 1},
    "Trilu": {"upper": 1},
    "Gemm": {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0},
    "Gelu": {"approximate": "none"},
}.items():
    for _n in _names.split():
        IMPORTERS[_n] = _passthrough(_defaults)


@importer("Shape")
def _shape(ctx: ImportContext) -> None:
    ctx.emit("Shape", ctx.inputs, ctx.outputs, {k: v for k, v in ctx.attrs.items() if k in ("start", "end")})


@importer("Transpose")
def _transpose(ctx: ImportContext) -> None:
    ctx.emit(
        "Transpose", ctx.inputs, ctx.outputs, {"perm": list(ctx.attrs["perm"])} if "perm" in ctx.attrs else {}
    )


@importer("Max Min Sum")
def _variadic(ctx: ImportContext) -> None:
    ctx.emit("Identity" if len(ctx.inputs) == 1 else ctx.op_type, ctx.inputs, ctx.outputs)


@importer("Constant")
def _constant(ctx: ImportContext) -> None:
    a = ctx.attrs
    if "value" in a:
        arr = a["value"]
    elif "value_float" in a:
        arr = np.array(a["value_float"], np.float32)
    elif "value_floats" in a:
        arr = np.array(a["value_floats"], np.float32)
    elif "value_int" in a:
        arr = np.array(a["value_int"], np.int64)
    elif "value_ints" in a:
        arr = np.array(a["value_ints"], np.int64)
    else:
        raise ctx.unsupported(f"Constant with attribute(s) {sorted(a)} is not supported (strings/sparse)")
    ctx.graph.add_initializer(ctx.outputs[0], np.asarray(arr))


@importer("Dropout")
def _dropout(ctx: ImportContext) -> None:
    training = ctx.const(2) if ctx.input(2) else None
    if ctx.input(2) and (training is None or bool(np.asarray(training))):
        raise ctx.unsupported("Dropout in training mode is not supported (inference only)")
    ctx.emit("Identity", [ctx.input(0)], [ctx.outputs[0]])
    if ctx.is_used(1):  # inference mask: all True
        shape = ctx.fresh("shape")
        ctx.emit("Shape", [ctx.input(0)], [shape])
        ctx.emit("ConstantOfShape", [shape], [ctx.outputs[1]], {"value": np.array([True])})


@importer("Cast")
def _cast(ctx: ImportContext) -> None:
    to = dtype_from_onnx(ctx.attrs["to"], f"node '{ctx.name}'")
    attrs: dict[str, Any] = {"to": to}
    if to.name in ("float8_e4m3fn", "float8_e5m2") and ctx.attrs.get("saturate", 1):  # ONNX default: clamp
        attrs["saturate"] = 1
    ctx.emit("Cast", ctx.inputs, ctx.outputs, attrs)


def _window_attrs(ctx: ImportContext, nd: int | None, pool: bool) -> dict[str, Any]:
    a = ctx.attrs
    auto = a.get("auto_pad", "NOTSET")
    if nd is not None and nd != 2:
        raise ctx.unsupported(f"{ctx.op_type} with {nd} spatial dims is not supported (only 2-D, NCHW)")
    out: dict[str, Any] = {}
    if "kernel_shape" in a:
        out["kernel_shape"] = list(a["kernel_shape"])
    if nd is not None:
        out["strides"] = list(a.get("strides", [1] * nd))
        out["pads"] = list(a.get("pads", [0] * 2 * nd))
        out["dilations"] = list(a.get("dilations", [1] * nd))
    out["auto_pad"] = auto
    if pool:
        out["ceil_mode"] = int(a.get("ceil_mode", 0))
    return out


@importer("Conv")
def _conv(ctx: ImportContext) -> None:
    w = ctx.const(1)
    ks = ctx.attrs.get("kernel_shape")
    nd = len(ks) if ks is not None else (w.ndim - 2 if w is not None else None)
    attrs = _window_attrs(ctx, nd, pool=False)
    if "kernel_shape" not in attrs and w is not None:
        attrs["kernel_shape"] = list(w.shape[2:])
    attrs["group"] = int(ctx.attrs.get("group", 1))
    ctx.emit("Conv", ctx.inputs, ctx.outputs, attrs)


@importer("MaxPool")
def _max_pool(ctx: ImportContext) -> None:
    if ctx.is_used(1):
        raise ctx.unsupported("MaxPool's Indices output is not supported")
    attrs = _window_attrs(ctx, len(ctx.attrs["kernel_shape"]), pool=True)
    ctx.emit("MaxPool", ctx.inputs[:1], ctx.outputs[:1], attrs)


@importer("AveragePool")
def _avg_pool(ctx: ImportContext) -> None:
    attrs = _window_attrs(ctx, len(ctx.attrs["kernel_shape"]), pool=True)
    if any(d != 1 for d in attrs["dilations"]):
        raise ctx.unsupported("AveragePool with dilations != 1 is not supported")
    del attrs["dilations"]
    attrs["count_include_pad"] = int(ctx.attrs.get("count_include_pad", 0))
    ctx.emit("AveragePool", ctx.inputs, ctx.outputs, attrs)


@importer("BatchNormalization")
def _batch_norm(ctx: ImportContext) -> None:
    if ctx.attrs.get("training_mode", 0) or any(ctx.is_used(k) for k in (1, 2, 3, 4)):
        raise ctx.unsupported("BatchNormalization in training mode (running-stat outputs) is not supported")
    ctx.emit(
        "BatchNormalization", ctx.inputs, ctx.outputs[:1], {"epsilon": float(ctx.attrs.get("epsilon", 1e-5))}
    )


@importer("LayerNormalization")
def _layer_norm(ctx: ImportContext) -> None:
    if ctx.is_used(1) or ctx.is_used(2):
        raise ctx.unsupported("LayerNormalization's Mean / InvStdDev outputs are not supported")
    attrs = {"axis": int(ctx.attrs.get("axis", -1)), "epsilon": float(ctx.attrs.get("epsilon", 1e-5))}
    ctx.emit("LayerNormalization", ctx.inputs, ctx.outputs[:1], attrs)


@importer("RMSNormalization")
def _rms_normalization(ctx: ImportContext) -> None:
    if int(ctx.attrs.get("stash_type", 1)) != 1:
        raise ctx.unsupported(
            f"RMSNormalization with stash_type={ctx.attrs['stash_type']} is not supported; opstrata "
            "computes the statistics in float32 (stash_type=1)"
        )
    attrs = {"axis": int(ctx.attrs.get("axis", -1)), "epsilon": float(ctx.attrs.get("epsilon", 1e-5))}
    ctx.emit("RMSNorm", ctx.inputs[:2], ctx.outputs[:1], attrs, domain=OPSTRATA_DOMAIN)


#: Attention attributes whose non-default values opstrata's fused attention has no equivalent for.
_ATTENTION_DEFAULTS = {"softcap": 0.0, "left_window_size": -1, "right_window_size": -1}


@importer("Attention")
def _attention(ctx: ImportContext) -> None:
    """4-D ONNX Attention -> ``ai.opstrata::Attention``; causal is marked for :func:`resolve_causal`."""
    extra = [n for i, n in enumerate(("past_key", "past_value", "nonpad_kv_seqlen"), 4) if ctx.input(i)]
    if extra:
        raise ctx.unsupported(
            f"Attention with {', '.join(extra)} (a KV cache inside the op) is not supported"
        )
    if any(ctx.is_used(k) for k in (1, 2, 3)):
        raise ctx.unsupported(
            "Attention's present_key / present_value / qk_matmul_output outputs are not supported"
        )
    odd = {k: ctx.attrs[k] for k, d in _ATTENTION_DEFAULTS.items() if k in ctx.attrs and ctx.attrs[k] != d}
    heads = (ctx.attrs.get("q_num_heads"), ctx.attrs.get("kv_num_heads"))
    if (heads[0] is None) != (heads[1] is None):
        odd["q_num_heads/kv_num_heads"] = "only one of the two given"
    if "softmax_precision" in ctx.attrs and ctx.attrs["softmax_precision"] != 1:
        odd["softmax_precision"] = ctx.attrs["softmax_precision"]
    if odd:
        raise ctx.unsupported(
            f"Attention with {odd} is not supported; opstrata reads 4-D (B, H, S, D) q/k/v with "
            "is_causal, scale and attn_mask"
        )
    attrs: dict[str, Any] = {"causal": int(ctx.attrs.get("is_causal", 0))}
    if "scale" in ctx.attrs:
        attrs["scale"] = float(ctx.attrs["scale"])
    if attrs["causal"]:
        attrs[CAUSAL_TOP_LEFT] = 1
    if heads[0] is None:
        ctx.emit("Attention", ctx.inputs[:4], ctx.outputs[:1], attrs, domain=OPSTRATA_DOMAIN)
        return
    # 3-D (B, S, H*D) inputs: split heads, attend, merge (what the ONNX spec's function does)
    q_heads, kv_heads = heads
    qkv = [
        _split_heads(ctx, x, h, t)
        for x, h, t in zip(ctx.inputs[:3], (q_heads, kv_heads, kv_heads), "qkv", strict=True)
    ]
    y4 = ctx.fresh("y_heads")
    ctx.emit("Attention", [*qkv, *ctx.inputs[3:4]], [y4], attrs, domain=OPSTRATA_DOMAIN)
    yt = ctx.fresh("y_bshd")
    ctx.emit("Transpose", [y4], [yt], {"perm": [0, 2, 1, 3]})
    ctx.emit("Reshape", [yt, _ints(ctx, [0, 0, -1], "merge")], ctx.outputs[:1])


def _ints(ctx: ImportContext, values: list[int], hint: str) -> str:
    name = ctx.fresh(hint)
    ctx.graph.add_initializer(name, np.array(values, np.int64))
    return name


def _split_heads(ctx: ImportContext, x: str, heads: int, hint: str) -> str:
    """(B, S, heads*D) -> (B, heads, S, D)."""
    r, t = ctx.fresh(f"{hint}_bshd"), ctx.fresh(f"{hint}_bhsd")
    ctx.emit("Reshape", [x, _ints(ctx, [0, 0, int(heads), -1], f"{hint}_shape")], [r])
    ctx.emit("Transpose", [r], [t], {"perm": [0, 2, 1, 3]})
    return t


@importer("ReduceSum ReduceMean ReduceMax ReduceMin")
def _reduce(ctx: ImportContext) -> None:
    axes_is_input = ctx.since >= 18 or (ctx.op_type == "ReduceSum" and ctx.since >= 13)
    axes = ctx.const_ints(1, "axes") if axes_is_input else ctx.attrs.get("axes")
    keep = int(ctx.attrs.get("keepdims", 1))
    if not axes:
        if ctx.attrs.get("noop_with_empty_axes", 0):
            ctx.emit("Identity", ctx.inputs[:1], ctx.outputs)
            return
        axes = None
    ctx.emit(
        ctx.op_type,
        ctx.inputs[:1],
        ctx.outputs,
        {"axes": None if axes is None else list(axes), "keepdims": keep},
    )


@importer("ArgMax")
def _argmax(ctx: ImportContext) -> None:
    if ctx.attrs.get("select_last_index", 0):
        raise ctx.unsupported("ArgMax with select_last_index=1 is not supported")
    attrs = {"axis": int(ctx.attrs.get("axis", 0)), "keepdims": int(ctx.attrs.get("keepdims", 1))}
    ctx.emit("ArgMax", ctx.inputs, ctx.outputs, attrs)


@importer("Squeeze")
def _squeeze(ctx: ImportContext) -> None:
    ctx.emit("Squeeze", ctx.inputs[:1], ctx.outputs, {"axes": ctx.const_ints(1, "axes")})


@importer("Unsqueeze")
def _unsqueeze(ctx: ImportContext) -> None:
    ctx.emit("Unsqueeze", ctx.inputs[:1], ctx.outputs, {"axes": ctx.const_ints(1, "axes")})


@importer("Split")
def _split(ctx: ImportContext) -> None:
    sizes = ctx.const_ints(1, "split")
    n = ctx.attrs.get("num_outputs")
    if n is not None and n != len(ctx.outputs):
        raise GraphError(
            f"node '{ctx.name}' (Split)", f"num_outputs={n} but the node has {len(ctx.outputs)} outputs"
        )
    if sizes is not None and len(sizes) != len(ctx.outputs):
        raise GraphError(
            f"node '{ctx.name}' (Split)", f"{len(sizes)} split sizes for {len(ctx.outputs)} outputs"
        )
    ctx.emit("Split", ctx.inputs[:1], ctx.outputs, {"axis": int(ctx.attrs.get("axis", 0)), "split": sizes})


@importer("CumSum")
def _cumsum(ctx: ImportContext) -> None:
    axis = ctx.const_ints(1, "axis")
    attrs = {"axis": axis[0] if axis else 0, "exclusive": int(ctx.attrs.get("exclusive", 0))}
    attrs["reverse"] = int(ctx.attrs.get("reverse", 0))
    ctx.emit("CumSum", ctx.inputs[:1], ctx.outputs, attrs)


@importer("ConstantOfShape")
def _constant_of_shape(ctx: ImportContext) -> None:
    value = ctx.attrs.get("value", np.zeros(1, np.float32))
    ctx.emit("ConstantOfShape", ctx.inputs, ctx.outputs, {"value": np.asarray(value).reshape(1)})


@importer("Einsum")
def _einsum(ctx: ImportContext) -> None:
    from .einsum import import_einsum

    import_einsum(ctx)


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
    if not MIN_OPSET <= v <= newest:
        raise GraphError(
            where,
            f"opset {v} is outside the supported range {MIN_OPSET}..{newest}",
            "convert it: onnx.version_converter.convert_version(model, 17)",
        )
    return v


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
        graph.add_initializer(t.name, _tensor_array(t, f"initializer '{t.name}'"))
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

    Raises UnsupportedOpError (naming op, domain, opset, node and the supported ops) for an op the
    IR does not cover, and GraphError for malformed models.

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
    graph = _graph_from_proto(m, opset)
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
