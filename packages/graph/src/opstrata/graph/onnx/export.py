"""ONNX back end: Graph -> ModelProto that passes ``onnx.checker.check_model(full_check=True)``.

Each IR op has an exporter (:func:`register_export`). The default writes the standard ONNX op,
moving canonical attributes back to inputs where the target opset wants them; an op without a
standard form in the target opset is written as a call to a model-local ONNX function whose body
is its decomposition (:func:`export_as_function`), so onnxruntime can run any exported graph.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._errors import GraphError
from .._ir import OPSTRATA_DOMAIN, Graph, Node, Value
from .._symbolic import Shape, dims_equal
from .types import dtype_to_onnx, require_onnx, tensor_from_array, tensor_type_of

__all__ = ["ExportContext", "export_as_function", "export_subgraph", "register_export", "to_onnx"]

ExportFn = Callable[[Node, "ExportContext"], None]
_EXPORTERS: dict[tuple[str, str], ExportFn] = {}
FUNCTION_DOMAIN = "ai.opstrata.functions"


def register_export(op_type: str, fn: ExportFn, *, domain: str = "") -> None:
    """Make ``fn(node, ctx)`` write IR nodes of ``domain::op_type`` (via ``ctx.emit``) on export."""
    _EXPORTERS[("" if domain == "ai.onnx" else domain, op_type)] = fn


def _attr_value(v: Any) -> Any:
    require_onnx()
    if isinstance(v, np.dtype):
        return dtype_to_onnx(v)
    if isinstance(v, np.ndarray):
        return tensor_from_array(v)
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple)):
        return [_attr_value(x) for x in v]
    return v


class ExportContext:
    """Where exporters write: ``emit`` nodes, ``const`` arrays, ``fresh`` names; knows the target opset."""

    def __init__(self, graph: Graph, opset: int, model: _ModelState, *, in_function: bool = False) -> None:
        self.graph, self.opset, self._model, self.in_function = graph, opset, model, in_function
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._names: Callable[[str], str] = model.fresh
        self.current: Node | None = None

    def fresh(self, hint: str) -> str:
        """A value name unused in the model."""
        return self._names(hint)

    def emit(
        self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], *, domain: str = "", **attrs: Any
    ) -> Any:
        """Append an ONNX node; attrs with value None are left out."""
        onnx = require_onnx()
        base = self.current.name if self.current is not None else op_type
        name = self._model.fresh_node(base)
        kw = {k: _attr_value(v) for k, v in attrs.items() if v is not None}
        node = onnx.helper.make_node(op_type, list(inputs), list(outputs), name=name, domain=domain, **kw)
        self._model.used.update(outputs)
        self.nodes.append(node)
        return node

    def const(self, array: Any, hint: str = "const") -> str:
        """A value holding ``array`` (an initializer, or a Constant node inside a function body)."""
        require_onnx()
        name = self.fresh(hint)
        arr = np.asarray(array)
        if self.in_function:
            self.emit("Constant", [], [name], value=arr)
        else:
            self.initializers.append(tensor_from_array(arr, name))
        return name

    def ints(self, values: Sequence[int], hint: str = "ints") -> str:
        """An int64 1-D constant."""
        return self.const(np.array(list(values), np.int64), hint)

    def scalar(self, value: float, like: str | np.dtype | None, hint: str = "scalar") -> str:
        """A 0-d constant in the dtype of value ``like`` (or that dtype)."""
        return self.const(np.array(value, dtype=self.dtype_of(like) if isinstance(like, str) else like), hint)

    def dtype_of(self, name: str) -> np.dtype:
        """Known dtype of a graph value (float32 when unknown)."""
        v = self.graph.values.get(name)
        return v.dtype if v is not None and v.dtype is not None else np.dtype(np.float32)

    def shape_of(self, name: str) -> Shape | None:
        """Known shape of a graph value."""
        v = self.graph.values.get(name)
        return None if v is None else v.shape

    def call_function(self, node: Node, body: ExportFn) -> None:
        """Write ``node`` as a call of a model-local function whose body ``body`` emits."""
        name = self._model.function_for(node, self, body)
        self.emit(name, [x for x in node.inputs if x], node.outputs, domain=FUNCTION_DOMAIN)


class _ModelState:
    """Names and functions shared by the graph and the function bodies of one export."""

    def __init__(self, graph: Graph, opset: int) -> None:
        self.graph, self.opset = graph, opset
        self.used = set(graph.values) | set(graph.initializers) | set(graph.inputs) | set(graph.outputs)
        self.node_names: set[str] = set()
        self.functions: dict[tuple[Any, ...], Any] = {}

    def fresh(self, hint: str) -> str:
        for i in itertools.count():
            cand = hint if i == 0 else f"{hint}_{i}"
            if cand not in self.used:
                self.used.add(cand)
                return cand
        raise AssertionError  # pragma: no cover

    def fresh_node(self, hint: str) -> str:
        for i in itertools.count():
            cand = hint if i == 0 else f"{hint}/{i}"
            if cand not in self.node_names:
                self.node_names.add(cand)
                return cand
        raise AssertionError  # pragma: no cover

    def function_for(self, node: Node, outer: ExportContext, body: ExportFn) -> str:
        onnx = require_onnx()
        vals = [outer.graph.values.get(x) for x in node.inputs]
        sig = tuple(
            (None, None) if v is None else (str(v.dtype), None if v.shape is None else len(v.shape))
            for v in vals
        )
        key = (
            node.domain,
            node.op_type,
            repr(sorted(node.attrs.items())),
            sig,
            tuple(bool(x) for x in node.inputs),
        )
        if key in self.functions:
            return self.functions[key].name
        fname = f"{node.op_type}_{len(self.functions)}"
        formal_in = [f"in{i}" if x else "" for i, x in enumerate(node.inputs)]
        formal_out = [f"out{i}" for i in range(len(node.outputs))]
        local = Graph(fname)
        for f, x in zip(formal_in, node.inputs, strict=True):
            if f and x in outer.graph.values:
                v = outer.graph.values[x]
                local.values[f] = type(v)(f, v.dtype, v.shape)
        inner = ExportContext(local, self.opset, _FunctionNames(self), in_function=True)
        fnode = Node(node.op_type, formal_in, formal_out, node.attrs, node.name, node.domain)
        inner.current = fnode
        body(fnode, inner)
        fp = onnx.helper.make_function(
            FUNCTION_DOMAIN, fname, [f for f in formal_in if f], formal_out, inner.nodes,
            [onnx.helper.make_opsetid("", self.opset)],
        )  # fmt: skip
        self.functions[key] = fp
        return fname


class _FunctionNames(_ModelState):
    """Fresh names inside one function body (its own namespace)."""

    def __init__(self, parent: _ModelState) -> None:
        self.used = {f"in{i}" for i in range(64)} | {f"out{i}" for i in range(64)}
        self.node_names = set()
        self.parent = parent

    def function_for(self, node: Node, outer: ExportContext, body: ExportFn) -> str:
        return self.parent.function_for(node, outer, body)


def export_as_function(decompose: ExportFn) -> ExportFn:
    """An exporter that writes a node as a model-local function whose body ``decompose`` emits."""

    def fn(node: Node, ctx: ExportContext) -> None:
        ctx.call_function(node, decompose)

    return fn


def export_standard_from(min_opset: int, decompose: ExportFn) -> ExportFn:
    """The standard ONNX op when the target opset has it (>= ``min_opset``), else a function."""

    def fn(node: Node, ctx: ExportContext) -> None:
        if ctx.opset >= min_opset:
            _default(node, ctx)
        else:
            ctx.call_function(node, decompose)

    return fn


# --------------------------------------------------------------------------- default and per-op exporters


def _default(node: Node, ctx: ExportContext) -> None:
    ctx.emit(node.op_type, node.inputs, node.outputs, domain=node.domain, **node.attrs)


def _reduce(node: Node, ctx: ExportContext) -> None:
    a = dict(node.attrs)
    axes = a.pop("axes", None)
    as_input = ctx.opset >= 18 or (node.op_type == "ReduceSum" and ctx.opset >= 13)
    runtime = node.inputs[1:2] if axes is None and len(node.inputs) > 1 and node.inputs[1] else []
    if runtime and not as_input:
        raise GraphError(
            f"node '{node.name}' ({node.op_type})",
            f"its axes are computed at run time, which opset {ctx.opset} cannot express (axes are an "
            "attribute there)",
            "export at opset 18 or later",
        )
    if as_input:
        ins = [node.inputs[0]] + ([ctx.ints(axes, "axes")] if axes is not None else runtime)
        ctx.emit(node.op_type, ins, node.outputs, **a)
    else:
        ctx.emit(node.op_type, node.inputs[:1], node.outputs, axes=axes, **a)


def _axes_input(node: Node, ctx: ExportContext) -> None:
    axes = node.attrs.get("axes")
    ins = [node.inputs[0]] + ([ctx.ints(axes, "axes")] if axes is not None else node.inputs[1:2])
    ctx.emit(node.op_type, ins, node.outputs)


def _split(node: Node, ctx: ExportContext) -> None:
    sizes = node.attrs.get("split")
    ins = [node.inputs[0]] + ([ctx.ints(sizes, "split")] if sizes is not None else node.inputs[1:2])
    n_out = len(node.outputs) if sizes is None and ctx.opset >= 18 else None
    ctx.emit("Split", ins, node.outputs, axis=node.attrs.get("axis", 0), num_outputs=n_out)


def _cumsum(node: Node, ctx: ExportContext) -> None:
    a = node.attrs
    axis = ctx.const(np.array(a["axis"], np.int64), "axis") if "axis" in a else node.inputs[1]
    ctx.emit(
        "CumSum",
        [node.inputs[0], axis],
        node.outputs,
        exclusive=a.get("exclusive", 0),
        reverse=a.get("reverse", 0),
    )


def _window(node: Node, ctx: ExportContext) -> None:
    a = dict(node.attrs)
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", ""):
        a.pop("pads", None)
    ctx.emit(node.op_type, node.inputs, node.outputs, **a)


def _layer_norm_body(node: Node, ctx: ExportContext) -> None:
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else ""
    y = _normalize(ctx, x, node.attrs.get("axis", -1), node.attrs.get("epsilon", 1e-5), center=True)
    out = node.outputs[0]
    ctx.emit("Mul", [y, w], [ctx.fresh("scaled") if b else out])
    if b:
        ctx.emit("Add", [ctx.nodes[-1].output[0], b], [out])


def _normalize(ctx: ExportContext, x: str, axis: int, eps: float, *, center: bool) -> str:
    rank = ctx.graph.values[x].rank if x in ctx.graph.values else None
    if axis >= 0 and rank is None:
        raise GraphError(
            f"export of '{x}'", f"normalisation over axis {axis} needs the input rank", "run infer_shapes"
        )
    axes = list(range(axis, 0)) if axis < 0 else [a - rank for a in range(axis, rank)]  # type: ignore[operator]
    mean_op = _reduce_mean(ctx)
    if center:
        mu, orig = mean_op(x, axes, "mean"), x
        x = ctx.fresh("centered")
        ctx.emit("Sub", [orig, mu], [x])
    sq = ctx.fresh("sq")
    ctx.emit("Mul", [x, x], [sq])
    var = mean_op(sq, axes, "var")
    ve = ctx.fresh("var_eps")
    ctx.emit("Add", [var, ctx.scalar(eps, x, "eps")], [ve])
    sd = ctx.fresh("std")
    ctx.emit("Sqrt", [ve], [sd])
    y = ctx.fresh("normed")
    ctx.emit("Div", [x, sd], [y])
    return y


def _reduce_mean(ctx: ExportContext) -> Callable[[str, list[int], str], str]:
    def mean(x: str, axes: list[int], hint: str) -> str:
        out = ctx.fresh(hint)
        if ctx.opset >= 18:
            ctx.emit("ReduceMean", [x, ctx.ints(axes, "axes")], [out], keepdims=1)
        else:
            ctx.emit("ReduceMean", [x], [out], axes=axes, keepdims=1)
        return out

    return mean


def _gelu_body(node: Node, ctx: ExportContext) -> None:
    x, out = node.inputs[0], node.outputs[0]
    t = ctx.fresh("t")
    if node.attrs.get("approximate", "none") == "tanh":  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        x3 = ctx.fresh("x3")
        ctx.emit("Mul", [x, x], [x3 + "_sq"])
        ctx.emit("Mul", [x3 + "_sq", x], [x3])
        inner = ctx.fresh("inner")
        ctx.emit("Mul", [x3, ctx.scalar(0.044715, x)], [inner + "_c"])
        ctx.emit("Add", [x, inner + "_c"], [inner + "_s"])
        ctx.emit("Mul", [inner + "_s", ctx.scalar(float(np.sqrt(2 / np.pi)), x)], [inner])
        ctx.emit("Tanh", [inner], [t])
    else:  # 0.5 x (1 + erf(x / sqrt(2)))
        ctx.emit("Div", [x, ctx.scalar(float(np.sqrt(2.0)), x)], [t + "_d"])
        ctx.emit("Erf", [t + "_d"], [t])
    ctx.emit("Add", [t, ctx.scalar(1.0, x)], [t + "_1p"])
    ctx.emit("Mul", [x, t + "_1p"], [t + "_x"])
    ctx.emit("Mul", [t + "_x", ctx.scalar(0.5, x)], [out])


def _linear_body(node: Node, ctx: ExportContext) -> None:
    x, w = node.inputs[:2]
    b = node.inputs[2] if len(node.inputs) > 2 else ""
    wt, out = ctx.fresh("w_t"), node.outputs[0]
    ctx.emit("Transpose", [w], [wt], perm=[1, 0])
    mm = ctx.fresh("mm") if b else out
    ctx.emit("MatMul", [x, wt], [mm])
    if b:
        ctx.emit("Add", [mm, b], [out])


def _rms_norm_body(node: Node, ctx: ExportContext) -> None:
    x = node.inputs[0]
    w = node.inputs[1] if len(node.inputs) > 1 else ""
    y = _normalize(ctx, x, node.attrs.get("axis", -1), node.attrs.get("epsilon", 1e-6), center=False)
    if w:
        ctx.emit("Mul", [y, w], [node.outputs[0]])
    else:
        ctx.emit("Identity", [y], [node.outputs[0]])


def _shape_slice(ctx: ExportContext, x: str, out: str, start: int, end: int | None = None) -> None:
    """``Shape(x)[start:end]`` (Shape's start/end attributes exist from opset 15)."""
    if ctx.opset >= 15:
        ctx.emit("Shape", [x], [out], start=start, end=end)
        return
    full = ctx.fresh("shape")
    ctx.emit("Shape", [x], [full])
    ends = [end if end is not None else 2**62]
    ctx.emit("Slice", [full, ctx.ints([start], "starts"), ctx.ints(ends, "ends")], [out])


def _repeat_kv_heads(ctx: ExportContext, x: str, heads: int) -> str:
    """(B, Hkv, M, D) -> (B, heads, M, D), each kv head repeated for its query-head group (GQA)."""
    s = ctx.shape_of(x)
    if s is None or len(s) != 4 or not isinstance(s[1], int) or not isinstance(s[3], int) or heads % s[1]:
        raise GraphError(
            f"export of attention input '{x}'", f"grouped-query attention needs static kv heads and head "
            f"size dividing {heads} query heads, got shape {s}", "run infer_shapes with static head counts",
        )  # fmt: skip
    u, e, r = ctx.fresh(f"{x}_u"), ctx.fresh(f"{x}_rep"), ctx.fresh(f"{x}_heads")
    ctx.emit("Unsqueeze", [x, ctx.ints([2], "axes")], [u])
    ctx.emit("Expand", [u, ctx.ints([1, 1, heads // s[1], 1, 1], "rep")], [e])
    ctx.emit("Reshape", [e, ctx.ints([0, heads, -1, s[3]], "shape")], [r])
    return r


def _attention_body(node: Node, ctx: ExportContext) -> None:
    q, k, v = node.inputs[:3]
    qs, ks = ctx.shape_of(q), ctx.shape_of(k)
    if qs is not None and ks is not None and isinstance(qs[1], int) and qs[1] != ks[1]:
        k, v = (_repeat_kv_heads(ctx, t, qs[1]) for t in (k, v))
    mask = node.inputs[3] if len(node.inputs) > 3 else ""
    kt, s = ctx.fresh("k_t"), ctx.fresh("scores")
    ctx.emit("Transpose", [k], [kt], perm=[0, 1, 3, 2])
    ctx.emit("MatMul", [q, kt], [s + "_raw"])
    scale = node.attrs.get("scale")
    if scale is None:  # 1 / sqrt(D) from q's last dim at run time
        d = ctx.fresh("d")
        _shape_slice(ctx, q, d + "_i", -1)
        ctx.emit("Cast", [d + "_i"], [d + "_f"], to=ctx.dtype_of(q))
        ctx.emit("Sqrt", [d + "_f"], [d])
        ctx.emit("Div", [s + "_raw", d], [s])
    else:
        ctx.emit("Mul", [s + "_raw", ctx.scalar(scale, q)], [s])
    neg = ctx.scalar(-np.inf, q, "neg_inf")
    if mask:
        m = ctx.fresh("masked")
        if ctx.dtype_of(mask) == np.dtype(bool):
            ctx.emit("Where", [mask, s, neg], [m])
        else:
            ctx.emit("Add", [s, mask], [m])
        s = m
    if node.attrs.get("causal"):  # keep key j <= i + M - N (bottom-right aligned); Range works at any opset
        n_len, m_len, axes0 = ctx.fresh("n"), ctx.fresh("m"), ctx.ints([0], "axes")
        _shape_slice(ctx, s, n_len + "_1d", -2, -1)
        _shape_slice(ctx, s, m_len + "_1d", -1)
        ctx.emit("Squeeze", [n_len + "_1d", axes0], [n_len])
        ctx.emit("Squeeze", [m_len + "_1d", axes0], [m_len])
        zero, one = ctx.const(np.array(0, np.int64), "zero"), ctx.const(np.array(1, np.int64), "one")
        rows, cols, keep = ctx.fresh("rows"), ctx.fresh("cols"), ctx.fresh("keep")
        ctx.emit("Range", [zero, n_len, one], [rows + "_1d"])
        ctx.emit("Unsqueeze", [rows + "_1d", ctx.ints([1], "axes")], [rows + "_col"])
        ctx.emit("Sub", [m_len, n_len], [rows + "_shift"])
        ctx.emit("Add", [rows + "_col", rows + "_shift"], [rows])
        ctx.emit("Range", [zero, m_len, one], [cols])
        ctx.emit("Greater", [cols, rows], [keep + "_not"])
        ctx.emit("Not", [keep + "_not"], [keep])
        c = ctx.fresh("causal")
        ctx.emit("Where", [keep, s, neg], [c])
        s = c
    p = ctx.fresh("probs")
    ctx.emit("Softmax", [s], [p], axis=-1)
    ctx.emit("MatMul", [p, v], [node.outputs[0]])


for _op in "ReduceSum ReduceMean ReduceMax ReduceMin".split():
    register_export(_op, _reduce)
for _op in ("Squeeze", "Unsqueeze"):
    register_export(_op, _axes_input)
for _op in ("Conv", "MaxPool", "AveragePool"):
    register_export(_op, _window)
register_export("Split", _split)
register_export("CumSum", _cumsum)
register_export("LayerNormalization", export_standard_from(17, _layer_norm_body))
register_export("Gelu", export_standard_from(20, _gelu_body))
register_export("Linear", export_as_function(_linear_body), domain=OPSTRATA_DOMAIN)


#: First opset with the standard ``Attention`` and ``RMSNormalization`` ops.
ATTENTION_OPSET = RMS_NORM_OPSET = 23
#: onnxruntime (1.32) broadcasts ``attn_mask`` over the query axis only from this opset's kernel on.
ATTENTION_MASK_BROADCAST_OPSET = 25


def _rms_norm_export(node: Node, ctx: ExportContext) -> None:
    """``RMSNormalization`` from opset 23 (it needs a scale input); else, or without a weight, a function."""
    if ctx.opset >= RMS_NORM_OPSET and len(node.inputs) > 1 and node.inputs[1]:
        a = node.attrs
        ctx.emit(
            "RMSNormalization", node.inputs[:2], node.outputs[:1],
            axis=a.get("axis", -1), epsilon=float(a.get("epsilon", 1e-6)),
        )  # fmt: skip
    else:
        ctx.call_function(node, _rms_norm_body)


def standard_attention_blocker(node: Node, ctx: ExportContext) -> str | None:
    """Why ``node`` cannot be the standard ONNX ``Attention`` at ``ctx.opset`` (None: it can).

    ONNX Attention's ``is_causal`` without a KV cache is top-left aligned (query i sees keys j <= i);
    opstrata's is bottom-right (j <= i + M - N): they agree only when N == M provably. onnxruntime
    1.32 rejects an ``attn_mask`` that broadcasts over the query axis below opset 25.
    """
    if ctx.opset < ATTENTION_OPSET:
        return f"opset {ctx.opset} < {ATTENTION_OPSET}"
    q, k, v = (ctx.shape_of(x) for x in node.inputs[:3])
    if any(s is None or len(s) != 4 for s in (q, k, v)):
        return "q/k/v are not known to be 4-D"
    if node.attrs.get("causal") and not dims_equal(q[2], k[2]):  # type: ignore[index]
        return f"causal with query length {q[2]} and key length {k[2]} not provably equal"  # type: ignore[index]
    mask = node.inputs[3] if len(node.inputs) > 3 else ""
    if mask:
        ms = ctx.shape_of(mask)
        if ctx.dtype_of(mask) not in (np.dtype(bool), ctx.dtype_of(node.inputs[0])):
            return f"mask dtype {ctx.dtype_of(mask)} is neither bool nor q's"
        if ctx.opset < ATTENTION_MASK_BROADCAST_OPSET and (
            ms is None or len(ms) < 2 or not dims_equal(ms[-2], q[2])  # type: ignore[index]
        ):
            return f"mask {ms} broadcasts over the query axis (onnxruntime needs opset >= 25 for that)"
    return None


_BSHD = [0, 2, 1, 3]


def _attention_bshd_export(node: Node, ctx: ExportContext) -> None:
    """An Attention reading some of q/k/v (and writing its result) as (B, S, H, D): Transposes around the
    (B, H, S, D) form, as the model had before the layout pass folded them in."""
    ins, outs = list(node.inputs), list(node.outputs)
    temp: list[str] = []
    for i in node.attrs.get("bshd") or []:
        t = ctx.fresh(f"{node.name}_bhsd{i}")
        ctx.emit("Transpose", [ins[i]], [t], perm=_BSHD)
        s = ctx.shape_of(ins[i])
        ctx.graph.values[t] = Value(
            t, ctx.dtype_of(ins[i]), None if s is None else tuple(s[j] for j in _BSHD)
        )
        ins[i] = t
        temp.append(t)
    if node.attrs.get("bshd_out"):
        outs[0] = ctx.fresh(f"{node.name}_y_bhsd")
    attrs = {k: v for k, v in node.attrs.items() if k not in ("bshd", "bshd_out")}
    try:
        _attention_export(Node("Attention", ins, outs, attrs, node.name, node.domain), ctx)
    finally:
        for t in temp:  # the graph's own values stay as they were
            ctx.graph.values.pop(t, None)
    if outs[0] != node.outputs[0]:
        ctx.emit("Transpose", [outs[0]], node.outputs[:1], perm=_BSHD)


def _attention_export(node: Node, ctx: ExportContext) -> None:
    """The standard ``Attention`` (opset >= 23) where it computes the same; else the function."""
    if node.attrs.get("bshd") or node.attrs.get("bshd_out"):
        _attention_bshd_export(node, ctx)
        return
    if standard_attention_blocker(node, ctx) is None:
        scale = node.attrs.get("scale")
        ctx.emit(
            "Attention", [x for x in node.inputs if x], node.outputs[:1],
            is_causal=int(bool(node.attrs.get("causal", 0))), scale=None if scale is None else float(scale),
        )  # fmt: skip
    else:
        ctx.call_function(node, _attention_body)


register_export("RMSNorm", _rms_norm_export, domain=OPSTRATA_DOMAIN)
register_export("Attention", _attention_export, domain=OPSTRATA_DOMAIN)


# --------------------------------------------------------------------------- driver


def _exporter(node: Node) -> ExportFn:
    dom = "" if node.domain == "ai.onnx" else node.domain
    fn = _EXPORTERS.get((dom, node.op_type))
    if fn is not None:
        return fn
    if dom == "":
        return _default
    raise GraphError(
        f"node '{node.name}' ({node.qualified_type})",
        "no ONNX exporter is registered for this op type",
        f"register_export('{node.op_type}', fn, domain='{node.domain}') writing its standard ONNX form "
        "or export_as_function(decomposition)",
    )


def export_subgraph(sub: Graph, outer: ExportContext, bound: dict[str, str]) -> Any:
    """A control-flow subgraph as a GraphProto attribute value, written with the outer export's names.

    ``bound`` maps the names the subgraph reads captured outer values by to the outer values' current
    names (a pass may have renamed them): an Identity inside the subgraph restores each renamed one.
    """
    onnx = require_onnx()
    ctx = ExportContext(sub, outer.opset, outer._model, in_function=outer.in_function)
    outer._model.used.update(sub.values, sub.initializers, sub.inputs)
    for inner, name in bound.items():
        if inner != name:
            ctx.emit("Identity", [name], [inner])
    for node in sub.nodes:
        ctx.current = node
        _exporter(node)(node, ctx)
    ctx.current = None
    produced = {o for n in ctx.nodes for o in n.output}
    outputs = []
    for out in sub.outputs:  # a subgraph output must be a node output: copy inputs, constants, outer values
        if out in produced:
            outputs.append(out)
            continue
        alias = ctx.fresh(f"{out}_out")
        ctx.emit("Identity", [out], [alias])
        outputs.append(alias)
    inits = [tensor_from_array(a, n) for n, a in sub.initializers.items()]

    def info(name: str, like: str) -> Any:
        v = sub.values.get(like)
        if v is None or v.dtype is None:
            return onnx.helper.make_empty_tensor_value_info(name)
        return tensor_type_of(name, v.dtype, v.shape, v.kind)

    return onnx.helper.make_graph(
        ctx.nodes, sub.name, [info(x, x) for x in sub.inputs],
        [info(a, o) for a, o in zip(outputs, sub.outputs, strict=True)], inits + ctx.initializers,
    )  # fmt: skip


def to_onnx(graph: Graph, *, opset: int | None = None, producer: str = "opstrata.graph") -> Any:
    """Export ``graph`` as an ONNX ModelProto (standard ops where the target opset has them, else functions).

    ``opset`` defaults to the graph's default-domain opset. Values need known dtypes (run
    :func:`infer_shapes` first; from_onnx does).
    """
    onnx = require_onnx()
    from .importer import MIN_OPSET

    target = (
        opset if opset is not None else graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 17))
    )
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= target <= newest:
        raise GraphError(
            "to_onnx", f"target opset {target} is outside {MIN_OPSET}..{newest}", "pass opset=17"
        )
    graph.validate()
    state = _ModelState(graph, target)
    ctx = ExportContext(graph, target, state)
    for x in graph.initializers:
        state.node_names.discard(x)
    for node in graph.nodes:
        ctx.current = node
        _exporter(node)(node, ctx)
    ctx.current = None
    outputs = list(graph.outputs)
    for i, out in enumerate(outputs):
        if out in graph.initializers:  # an ONNX graph output must be computed: copy the constant
            alias = state.fresh(out + "_const")
            ctx.initializers.append(tensor_from_array(graph.initializers[out], alias))
            ctx.emit("Identity", [alias], [out])
            outputs[i] = out
    inits = [
        tensor_from_array(arr, name) for name, arr in graph.initializers.items() if name not in graph.outputs
    ]

    def info(name: str) -> Any:
        v = graph.value(name)
        if v.dtype is None:
            raise GraphError(
                f"value '{name}'", "has no dtype, so it cannot be declared in ONNX", "run infer_shapes(graph)"
            )
        return tensor_type_of(name, v.dtype, v.shape, v.kind)

    boundary = set(graph.inputs) | set(outputs) | set(graph.initializers)
    value_info = [
        tensor_type_of(n, v.dtype, v.shape, v.kind)
        for n, v in graph.values.items()
        if n not in boundary and v.dtype is not None
    ]
    gp = onnx.helper.make_graph(
        ctx.nodes, graph.name, [info(x) for x in graph.inputs], [info(x) for x in outputs],
        inits + ctx.initializers, value_info=value_info,
    )  # fmt: skip
    opsets = [onnx.helper.make_opsetid("", target)]
    if state.functions:
        opsets.append(onnx.helper.make_opsetid(FUNCTION_DOMAIN, 1))
    ir = max(8, onnx.helper.find_min_ir_version_for(opsets[:1], ignore_unknown=True))
    model = onnx.helper.make_model(
        gp,
        opset_imports=opsets,
        functions=list(state.functions.values()),
        ir_version=ir,
        producer_name=producer,
    )
    model.doc_string = graph.doc_string
    return model
