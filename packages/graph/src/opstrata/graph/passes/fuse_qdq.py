"""QDQ MatMul / Gemm -> ``ai.opstrata::QMatMul``: integer GEMM on the quantized values, then one scale.

A QDQ model (QuantizeLinear / DequantizeLinear around float ops, as onnxruntime's and opstrata.quant's
quantizers write it) computes ``DQ(a_q) @ DQ(W_q)`` in float. Like onnxruntime's QDQ selectors, this
pass runs the product on the integers instead: ``(a_q - a_zp) @ (W_q - W_zp)`` exactly in int32
(``opstrata.ops.matmul_integer``, which opstrata.quant backs with a native int8 GEMM), times
``a_scale * W_scale`` (per tensor or per output column), plus the Gemm bias. The result equals the QDQ
graph up to float32 rounding (it is closer to the exact product than the float path).

Matched: a per-tensor int8/uint8 ``DequantizeLinear`` feeding input A, and a constant 2-D int8/uint8
weight with a per-tensor or per-output-column ``DequantizeLinear`` (no blocks) feeding input B of a
``MatMul`` or of a ``Gemm`` with transA=0, alpha=beta=1 and a constant bias. Constant folding leaves
such weight dequantizations alone (:func:`is_fusable_weight_dq`) so this pass still sees them.

``drop_relu_before_quantize`` removes a ``Relu`` whose only reader is a ``QuantizeLinear`` with a positive
scale and the lowest code as zero point (onnxruntime's ReluQuantFusion): saturation does the Relu's job,
with the same codes for every input (NaN and -inf included).

``fuse_qdq_conv`` does the same for ``Conv(DQ(x_q), DQ(W_q)[, bias])`` -> ``ai.opstrata::QConv``: the exact
int32 convolution (``opstrata.ops.qconv``, native in opstrata.quant), scaled per output channel.
``fuse_qconv_quantize`` then folds the QuantizeLinear that reads a QConv's result (through a residual Add,
a Relu, a HardSwish or a constant Clip) into it (``ai.opstrata::QConvQuantize``, onnxruntime's QLinearConv with the activation fused):
the float tensor between them is never written.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

import opstrata.ops as ops

from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .pattern import Matcher, is_onnx, replace_nodes

__all__ = [
    "drop_relu_before_quantize",
    "fuse_dequant_matmul",
    "fuse_dynamic_qmatmul",
    "fuse_qconv_quantize",
    "fuse_qdq_conv",
    "fuse_qdq_matmul",
    "is_fusable_weight_dq",
]

_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))
#: what a matcher returns: (the nodes it replaces, the nodes that replace them)
Rewrite = tuple[list[Node], list[Node]]


def _dq_parts(m: Matcher, dq: Node) -> tuple[str, np.ndarray, np.ndarray | None] | None:
    """(quantized input, scale, zero point) of a DequantizeLinear without blocks, constants required for
    the scale and zero point."""
    if not is_onnx(dq, "DequantizeLinear") or dq.attrs.get("block_size", 0):
        return None
    scale = m.const(dq.inputs[1])
    zp = m.const(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] else None
    if scale is None or scale.dtype != np.float32 or (len(dq.inputs) > 2 and dq.inputs[2] and zp is None):
        return None
    if dq.attrs.get("output_dtype"):
        return None
    return dq.inputs[0], scale, zp


def _weight(
    m: Matcher, dq: Node, transposed: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """The constant (K, N) int8/uint8 weight, its scale and zero point as per-column (N,) or scalar."""
    parts = _dq_parts(m, dq)
    if parts is None:
        return None
    name, scale, zp = parts
    w = m.const(name)
    if w is None or w.ndim != 2 or w.dtype not in _INT8:
        return None
    out_axis = 0 if transposed else 1  # the output-column axis of the stored weight
    if scale.size > 1:
        axis = dq.attrs.get("axis", 1) % 2
        if axis != out_axis or scale.shape != (w.shape[out_axis],):
            return None
    if zp is not None and zp.size > 1 and zp.shape != (w.shape[out_axis],):
        return None
    if transposed:
        w = np.ascontiguousarray(w.T)
    return w, scale.reshape(-1), None if zp is None else zp.reshape(-1)


def _activation(m: Matcher, name: str) -> tuple[str, np.ndarray, np.ndarray | None] | None:
    """The quantized activation behind a per-tensor DequantizeLinear producing ``name``."""
    dq = m.producer(name, "DequantizeLinear")
    parts = _dq_parts(m, dq) if dq is not None else None
    if parts is None:
        return None
    q, scale, zp = parts
    dtype = m.g.values[q].dtype if q in m.g.values else None
    if scale.size != 1 or (zp is not None and zp.size != 1) or dtype not in _INT8:
        return None
    return q, scale, zp


def _gemm_ok(m: Matcher, node: Node) -> bool:
    a = node.attrs
    if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
        return False
    return len(node.inputs) < 3 or not node.inputs[2] or m.const(node.inputs[2]) is not None


def _conv_weight(m: Matcher, dq: Node) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """The constant (M, C/groups, *kernel) int8/uint8 conv weight, its scale and zero point (scalar or one
    per output channel, axis 0)."""
    parts = _dq_parts(m, dq)
    if parts is None:
        return None
    name, scale, zp = parts
    w = m.const(name)
    if w is None or w.ndim < 3 or w.dtype not in _INT8:
        return None
    for v in (scale, zp):
        if (
            v is not None
            and v.size > 1
            and (dq.attrs.get("axis", 1) % w.ndim != 0 or v.shape != (w.shape[0],))
        ):
            return None
    return w, scale.reshape(-1), None if zp is None else zp.reshape(-1)


def _conv_ok(m: Matcher, node: Node) -> bool:
    bias_ok = len(node.inputs) < 3 or not node.inputs[2] or m.const(node.inputs[2]) is not None
    return bias_ok and node.attrs.get("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET")


#: weight dtypes of weight-only quantization (by name: int4/uint4 are ml_dtypes' types)
_WONLY = ("int8", "uint8", "int4", "uint4")


def _wonly_weight(m: Matcher, dq: Node) -> bool:
    """A constant (K, N) int8/uint8/int4/uint4 weight behind a DequantizeLinear per tensor, per column (axis
    1) or in blocks along K (axis 0): the layouts ``ops.dequant_matmul`` takes."""
    if not is_onnx(dq, "DequantizeLinear") or dq.attrs.get("output_dtype"):
        return False
    w, scale = m.const(dq.inputs[0]), m.const(dq.inputs[1])
    zp = m.const(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] else None
    if w is None or scale is None or w.ndim != 2 or w.dtype.name not in _WONLY or scale.dtype != np.float32:
        return False
    if len(dq.inputs) > 2 and dq.inputs[2] and (zp is None or zp.dtype != w.dtype or zp.shape != scale.shape):
        return False
    k, n = w.shape
    bs, axis = int(dq.attrs.get("block_size", 0) or 0), int(dq.attrs.get("axis", 1)) % 2
    if scale.size == 1:
        return True
    if bs:
        return axis == 0 and scale.shape == (-(-k // bs), n)
    return axis == 1 and scale.shape == (n,)


def _weight_only_user(m: Matcher, dq: Node) -> Node | None:
    """The MatMul that multiplies a float activation by this weight-only DequantizeLinear (its sole use)."""
    user = m.only_use(dq.outputs[0])
    if (
        user is None
        or not is_onnx(user, "MatMul")
        or len(user.inputs) != 2
        or user.inputs[1] != dq.outputs[0]
    ):
        return None
    if user.inputs[0] == dq.outputs[0] or m.producer(user.inputs[0], "DequantizeLinear") is not None:
        return None  # a QDQ product: fuse_qdq_matmul's
    return user if _wonly_weight(m, dq) else None


def is_fusable_weight_dq(m: Matcher, dq: Node) -> bool:
    """A weight DequantizeLinear that :func:`fuse_qdq_matmul`, :func:`fuse_qdq_conv` or
    :func:`fuse_dequant_matmul` will consume: constant folding keeps it."""
    return _weight_only_user(m, dq) is not None or _qdq_fusable(m, dq)


def _qdq_fusable(m: Matcher, dq: Node) -> bool:
    """A weight DequantizeLinear that :func:`fuse_qdq_matmul` or :func:`fuse_qdq_conv` will consume."""
    user = m.only_use(dq.outputs[0])
    if user is not None and is_onnx(user, "Conv") and _conv_ok(m, user):
        if len(user.inputs) < 2 or user.inputs[1] != dq.outputs[0] or user.inputs[0] == dq.outputs[0]:
            return False
        return _conv_weight(m, dq) is not None and _activation(m, user.inputs[0]) is not None
    if user is None or not (is_onnx(user, "MatMul") or (is_onnx(user, "Gemm") and _gemm_ok(m, user))):
        return False
    if len(user.inputs) < 2 or user.inputs[1] != dq.outputs[0] or user.inputs[0] == dq.outputs[0]:
        return False
    transposed = is_onnx(user, "Gemm") and bool(user.attrs.get("transB", 0))
    return _weight(m, dq, transposed) is not None and _activation(m, user.inputs[0]) is not None


def _fuse(g: Graph, m: Matcher, node: Node) -> Rewrite | None:
    if len(node.inputs) < 2 or (is_onnx(node, "Gemm") and not _gemm_ok(m, node)):
        return None
    dq_w = m.producer(node.inputs[1], "DequantizeLinear")
    if dq_w is None or not _qdq_fusable(m, dq_w):
        return None
    transposed = is_onnx(node, "Gemm") and bool(node.attrs.get("transB", 0))
    w, w_scale, w_zp = _weight(m, dq_w, transposed)  # type: ignore[misc]
    a_q, a_scale, a_zp = _activation(m, node.inputs[0])  # type: ignore[misc]
    base = node.name or "qmatmul"

    def const(suffix: str, value: np.ndarray) -> str:
        name = g.fresh_name(f"{base}_{suffix}")
        g.add_initializer(name, value)
        return name

    zero_a = np.zeros((), m.g.values[a_q].dtype)
    ins = [
        a_q,
        const("a_zero_point", a_zp.reshape(()) if a_zp is not None else zero_a),
        const("w_int", w),
        const("w_zero_point", w_zp if w_zp is not None else np.zeros((), w.dtype)),
    ]
    # the float factors are attributes: the node's inputs stay integers, so its kernels bind as int8 ones
    scale = (a_scale.reshape(()).astype(np.float64) * w_scale.astype(np.float64)).astype(np.float32)
    attrs: dict[str, np.ndarray] = {"scale": scale}
    if is_onnx(node, "Gemm") and len(node.inputs) > 2 and node.inputs[2]:
        attrs["bias"] = np.asarray(m.const(node.inputs[2]), np.float32)
    return [node], [Node("QMatMul", ins, node.outputs, attrs, g.fresh_node_name("QMatMul"), OPSTRATA_DOMAIN)]


def _fuse_conv(g: Graph, m: Matcher, node: Node) -> Rewrite | None:
    if len(node.inputs) < 2 or not _conv_ok(m, node):
        return None
    dq_w = m.producer(node.inputs[1], "DequantizeLinear")
    if dq_w is None or not _qdq_fusable(m, dq_w):
        return None
    w, w_scale, w_zp = _conv_weight(m, dq_w)  # type: ignore[misc]
    x_q, x_scale, x_zp = _activation(m, node.inputs[0])  # type: ignore[misc]
    base = node.name or "qconv"

    def const(suffix: str, value: np.ndarray) -> str:
        name = g.fresh_name(f"{base}_{suffix}")
        g.add_initializer(name, value)
        return name

    ins = [
        x_q,
        const("x_zero_point", x_zp.reshape(()) if x_zp is not None else np.zeros((), m.g.values[x_q].dtype)),
        const("w_int", w),
        const("w_zero_point", w_zp if w_zp is not None else np.zeros((), w.dtype)),
    ]
    attrs = dict(node.attrs)
    attrs["scale"] = (x_scale.reshape(()).astype(np.float64) * w_scale.astype(np.float64)).astype(np.float32)
    if len(node.inputs) > 2 and node.inputs[2]:
        attrs["bias"] = np.asarray(m.const(node.inputs[2]), np.float32)
    return [node], [Node("QConv", ins, node.outputs, attrs, g.fresh_node_name("QConv"), OPSTRATA_DOMAIN)]


def _rewrite_each(
    graph: Graph,
    op_types: tuple[str, ...],
    match: Callable[[Graph, Matcher, Node], Rewrite | None],
    domain: str = "",
) -> Graph:
    """A copy of ``graph`` in which every node of ``op_types`` (ONNX's, or of ``domain``) that ``match``
    turns into (the nodes it replaces, the new nodes) is rewritten; the matcher is rebuilt after each."""
    g = graph.copy()
    m = Matcher(g)
    for node in list(g.nodes):
        if node not in g.nodes:
            continue
        if not (node.domain == domain and node.op_type in op_types if domain else is_onnx(node, *op_types)):
            continue
        found = match(g, m, node)
        if found is not None:
            replace_nodes(g, *found)
            m = Matcher(g)
    return g


def fuse_qdq_conv(graph: Graph) -> Graph:
    """``Conv(DQ(x_q), DQ(W_q)[, bias])`` -> ``QConv(x_q, x_zp, W_q, W_zp)`` with the Conv's window
    attributes, ``scale`` (x_scale * W_scale, scalar or per output channel) and ``bias``."""
    return _rewrite_each(graph, ("Conv",), _fuse_conv)


#: the activation ops between a QConv and its QuantizeLinear that QConvQuantize applies (ONNX op -> name)
_QCONV_ACTIVATIONS = {"Relu": "relu", "HardSwish": "hardswish", "Clip": "clip"}


def _clip_bounds(m: Matcher, clip: Node) -> tuple[float, float] | None:
    """A float32 Clip's constant bounds (its inputs, opset 11 on; absent: infinite), or None when a bound is
    computed, not a float32 scalar, given as an attribute (opset < 11), or the installed ops has no clip
    activation."""
    if "clip" not in getattr(ops, "QCONV_ACTIVATIONS", ()) or "min" in clip.attrs or "max" in clip.attrs:
        return None
    bounds = []
    for i, default in ((1, -np.inf), (2, np.inf)):
        name = clip.inputs[i] if len(clip.inputs) > i else ""
        if not name:
            bounds.append(default)
            continue
        c = m.const(name)
        if c is None or c.size != 1 or c.dtype != np.float32 or np.isnan(c).any():
            return None
        bounds.append(float(c.reshape(())))
    return bounds[0], bounds[1]


def _scalar_quantize(m: Matcher, q: Node) -> bool:
    """A QuantizeLinear to int8/uint8 with a constant float32 scalar scale and zero point, no blocks."""
    if len(q.inputs) < 3 or not q.inputs[2] or {"block_size", "output_dtype", "precision"} & set(q.attrs):
        return False
    scale, zp = m.const(q.inputs[1]), m.const(q.inputs[2])
    return (
        scale is not None and scale.dtype == np.float32 and scale.size == 1
        and zp is not None and zp.dtype in _INT8 and zp.size == 1
    )  # fmt: skip


def _takes_residual() -> bool:
    """The installed ``ops.qconv_quantize`` adds a residual (opstrata-ops >= 0.4.65)."""
    return "residual" in inspect.signature(ops.qconv_quantize).parameters


def _qconv_into_quantize(g: Graph, m: Matcher, qconv: Node) -> Rewrite | None:
    if len(qconv.inputs) != 4 or len(qconv.outputs) != 1 or "scale" not in qconv.attrs:
        return None
    y = qconv.outputs[0]
    user, add, act, residual = m.only_use(y), None, None, None
    if user is not None and is_onnx(user, "Add") and len(user.outputs) == 1 and _takes_residual():
        residual = m.other(user, y)  # a residual connection: the sum has the convolution's shape and dtype
        if residual is None or residual == y or m.shape(residual) is None or m.shape(residual) != m.shape(y):
            return None
        if m.dtype(residual) != np.float32 or m.shape(user.outputs[0]) != m.shape(y):
            return None
        add, user = user, m.only_use(user.outputs[0])
    bounds = None
    if user is not None and is_onnx(user, *_QCONV_ACTIVATIONS) and len(user.outputs) == 1:
        if user.op_type == "Clip":
            bounds = _clip_bounds(m, user)
            if bounds is None:
                return None
        act, user = user, m.only_use(user.outputs[0])
    if user is None or not is_onnx(user, "QuantizeLinear") or not _scalar_quantize(m, user):
        return None
    if user.inputs[0] != (act or add or qconv).outputs[0] or m.dtype(user.inputs[0]) != np.float32:
        return None
    attrs = dict(qconv.attrs)
    attrs["activation"] = "none" if act is None else _QCONV_ACTIVATIONS[act.op_type]
    if bounds is not None:
        attrs["alpha"], attrs["beta"] = bounds
    inputs = [*qconv.inputs, user.inputs[1], user.inputs[2]] + ([residual] if residual else [])
    fused = Node("QConvQuantize", inputs, list(user.outputs), attrs, g.fresh_node_name("QConvQuantize"),
                 OPSTRATA_DOMAIN)  # fmt: skip
    return [n for n in (qconv, add, act, user) if n is not None], [fused]


def fuse_qconv_quantize(graph: Graph) -> Graph:
    """``QuantizeLinear(act(QConv(...) [+ r]), y_scale, y_zp)`` (act: none, Relu, HardSwish or a Clip with
    constant bounds; r: a float32
    residual of the same shape; per-tensor int8/uint8 codes) -> ``QConvQuantize(..., y_scale, y_zp[, r])``
    where the float results have no other reader:
    the same codes (``ops.qconv_quantize``, opstrata-ops >= 0.4.64), no float tensor in between."""
    if not hasattr(ops, "qconv_quantize"):  # an older opstrata-ops: nothing runs the fused node
        return graph.copy()
    return _rewrite_each(graph, ("QConv",), _qconv_into_quantize, OPSTRATA_DOMAIN)


def _saturating_quantize(m: Matcher, q: Node) -> bool:
    """A QuantizeLinear with a positive constant scale and the lowest code as zero point: every x <= 0
    (-inf included) rounds to <= 0 and saturates to the zero point, which is Q(0)."""
    if len(q.inputs) < 2:
        return False
    scale = m.const(q.inputs[1])
    if scale is None or scale.dtype.kind != "f" or scale.size == 0 or not bool(np.all(scale > 0)):
        return False
    if len(q.inputs) > 2 and q.inputs[2]:
        zp = m.const(q.inputs[2])
        if zp is None or zp.dtype.kind not in "iu" or zp.dtype.itemsize > 2:
            return False  # a computed zero point, or float8 / int32 codes
        return zp.size > 0 and bool(np.all(zp == np.iinfo(zp.dtype).min))
    return not q.attrs.get("output_dtype")  # another code type with zero point 0: not its lowest code


def _relu_into_quantize(g: Graph, m: Matcher, relu: Node) -> Rewrite | None:
    # Q(Relu(x)) = Q(x) for a saturating Q: Relu passes x > 0 and NaN through and sends x <= 0 to 0, whose
    # code every x <= 0 gets anyway. Through a MaxPool as well (Q(MaxPool(Relu(x))) = Q(Relu(MaxPool(x)))
    # = Q(MaxPool(x)): Relu is monotone and keeps NaN where it is; 0 and -0 have the same code).
    user = m.only_use(relu.outputs[0])
    pool = None
    if user is not None and is_onnx(user, "MaxPool") and len([o for o in user.outputs if o]) == 1:
        pool, user = user, m.only_use(user.outputs[0])
    if user is None or not is_onnx(user, "QuantizeLinear") or not _saturating_quantize(m, user):
        return None
    if user.inputs[0] != (pool or relu).outputs[0]:
        return None
    if pool is not None:
        moved = Node(pool.op_type, [relu.inputs[0], *pool.inputs[1:]], pool.outputs, dict(pool.attrs), pool.name,
                     pool.domain)  # fmt: skip
        return [relu, pool], [moved]
    fused = Node(
        "QuantizeLinear",
        [relu.inputs[0], *user.inputs[1:]],
        user.outputs,
        dict(user.attrs),
        user.name,
        user.domain,
    )
    return [relu, user], [fused]


def drop_relu_before_quantize(graph: Graph) -> Graph:
    """``QuantizeLinear(Relu(x), scale > 0, zero_point = the lowest code)`` -> ``QuantizeLinear(x, ...)``
    where the Relu's output has no other reader: the same codes, one pass over the tensor fewer; likewise
    ``QuantizeLinear(MaxPool(Relu(x)))`` -> ``QuantizeLinear(MaxPool(x))`` (a CNN's stem)."""
    return _rewrite_each(graph, ("Relu",), _relu_into_quantize)


def fuse_dequant_matmul(graph: Graph) -> Graph:
    """``MatMul(x, DequantizeLinear(W_q))`` with a float activation (weight-only quantization: int8/uint8/
    int4/uint4 per tensor, per column or in opset-21 blocks along K) -> ``ai.opstrata::DequantMatMul(x,
    W_q, scale[, zero_point])`` with ``axis`` and ``block_size``: ``ops.dequant_matmul``, which
    opstrata.quant backs with a kernel that keeps W in 4/8 bits and dequantizes tiles on the fly."""
    return _rewrite_each(graph, ("DequantizeLinear",), _fuse_weight_only)


def _fuse_weight_only(g: Graph, m: Matcher, dq: Node) -> Rewrite | None:
    user = _weight_only_user(m, dq)
    if user is None:
        return None
    attrs = {"axis": int(dq.attrs.get("axis", 1)), "block_size": int(dq.attrs.get("block_size", 0) or 0)}
    ins = [user.inputs[0], *[x for x in dq.inputs if x]]
    name = g.fresh_node_name("DequantMatMul")
    return [dq, user], [Node("DequantMatMul", ins, user.outputs, attrs, name, OPSTRATA_DOMAIN)]


def fuse_qdq_matmul(graph: Graph) -> Graph:
    """``MatMul(DQ(a_q), DQ(W_q))`` and the Gemm form -> ``QMatMul(a_q, a_zp, W_q, W_zp)`` with attributes
    ``scale`` (a_scale * W_scale, scalar or per column) and the Gemm's ``bias``."""
    return _rewrite_each(graph, ("MatMul", "Gemm"), _fuse)


# --------------------------------------------------------------------------- dynamic quantization


def _only(m: Matcher, name: str, op: str) -> Node | None:
    """The sole consumer of ``name`` when it is an ONNX ``op`` node."""
    user = m.only_use(name)
    return user if user is not None and is_onnx(user, op) else None


def _other(node: Node, name: str) -> str:
    """The input of a two-input ``node`` that is not ``name``."""
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def _scale_of(m: Matcher, mul: Node, a_scale: str) -> np.ndarray | None:
    """The constant weight scale in ``Mul(a_scale, w_scale)`` (either order): scalar or per column."""
    if not is_onnx(mul, "Mul") or a_scale not in mul.inputs:
        return None
    other = mul.inputs[1] if mul.inputs[0] == a_scale else mul.inputs[0]
    w_scale = m.const(other)
    return w_scale if w_scale is not None and w_scale.dtype == np.float32 and w_scale.ndim <= 1 else None


def _int_weight(m: Matcher, mi: Node) -> tuple[np.ndarray | None, int] | None:
    """(W_q's constant zero point or None, N) when MatMulInteger ``mi`` multiplies by a constant 2-D
    int8/uint8 weight whose zero point (if any) is constant, per tensor or per column."""
    w = m.const(mi.inputs[1])
    has_zp = len(mi.inputs) > 3 and bool(mi.inputs[3])
    w_zp = m.const(mi.inputs[3]) if has_zp else None
    if w is None or w.ndim != 2 or w.dtype not in _INT8 or (has_zp and w_zp is None):
        return None
    n = w.shape[1]
    if w_zp is not None and (w_zp.dtype != w.dtype or w_zp.size not in (1, n) or w_zp.ndim > 1):
        return None
    return w_zp, n


def _dynamic_node(
    g: Graph, m: Matcher, x: str, mi: Node, chain: list[Node], w_scale: np.ndarray, n: int, **attrs: Any
) -> Rewrite:
    """``DynamicQMatMul(x, W_q[, W_zp])`` replacing ``chain`` (MatMulInteger .. the scaling Mul), with the
    bias of a following ``Add`` of a constant (N,) folded in."""
    last = chain[-1]
    attrs["w_scale"] = w_scale.reshape(-1) if w_scale.size > 1 else w_scale.reshape(())
    add = _only(m, last.outputs[0], "Add")
    if add is not None:
        bias = m.const(_other(add, last.outputs[0]))
        if bias is not None and bias.dtype == np.float32 and bias.shape == (n,):
            attrs["bias"] = bias
            chain, last = [*chain, add], add
    ins = [x, mi.inputs[1]] + ([mi.inputs[3]] if len(mi.inputs) > 3 and mi.inputs[3] else [])
    name = g.fresh_node_name("DynamicQMatMul")
    return chain, [Node("DynamicQMatMul", ins, last.outputs, attrs, name, OPSTRATA_DOMAIN)]


def _float_cast(m: Matcher, mi: Node) -> Node | None:
    """The sole consumer of MatMulInteger ``mi``'s int32 result when it is a Cast to float32."""
    cast = _only(m, mi.outputs[0], "Cast")
    return cast if cast is not None and cast.attrs.get("to") == np.dtype(np.float32) else None


def _fuse_dynamic(g: Graph, m: Matcher, mi: Node) -> Rewrite | None:
    """DynamicQuantizeLinear(x) -> MatMulInteger(x_q, W_q, x_zp[, W_zp]) -> Cast(float) -> Mul(x_scale *
    W_scale) [-> Add(bias)] as (the nodes it replaces, [DynamicQMatMul])."""
    if len(mi.inputs) < 3 or not mi.inputs[2]:
        return None
    dql = m.producer(mi.inputs[0], "DynamicQuantizeLinear")
    if dql is None or dql.outputs[0] != mi.inputs[0] or dql.outputs[2] != mi.inputs[2]:
        return None
    weight = _int_weight(m, mi)
    cast = _float_cast(m, mi) if weight is not None else None
    mul = _only(m, cast.outputs[0], "Mul") if cast is not None else None
    if weight is None or cast is None or mul is None:
        return None
    smul = m.producer(_other(mul, cast.outputs[0]), "Mul")
    w_scale = _scale_of(m, smul, dql.outputs[1]) if smul is not None else None
    if w_scale is None or w_scale.size not in (1, weight[1]):
        return None
    return _dynamic_node(g, m, dql.inputs[0], mi, [mi, cast, mul], w_scale, weight[1])


#: float32's smallest normal: the floor of a per-token scale (``opstrata.ops.TOKEN_SCALE_MIN``)
_TOKEN_SCALE_MIN = float(np.finfo(np.float32).tiny)


def _is_const(m: Matcher, name: str, value: float) -> bool:
    v = m.scalar(name)
    return v is not None and np.float32(v) == np.float32(value)


def _token_quantized(m: Matcher, q_name: str) -> tuple[str, str] | None:
    """(x, scale) when ``q_name`` is per-token symmetric int8 quantization of x as opstrata.quant writes it:
    ``Cast<int8>(Clip(Round(Div(x, s)), -127, 127))`` with ``s = Max(Div(ReduceMax(Abs(x), axes=[-1],
    keepdims=1), 127), FLT_MIN)``."""
    cast = m.producer(q_name, "Cast")
    if cast is None or cast.attrs.get("to") != np.dtype(np.int8):
        return None
    clip = m.producer(cast.inputs[0], "Clip")
    if (
        clip is None
        or len(clip.inputs) != 3
        or not (_is_const(m, clip.inputs[1], -127) and _is_const(m, clip.inputs[2], 127))
    ):
        return None
    rnd = m.producer(clip.inputs[0], "Round")
    div = m.producer(rnd.inputs[0], "Div") if rnd is not None else None
    if div is None:
        return None
    x, s = div.inputs[0], div.inputs[1]
    mx = m.producer(s, "Max")
    if mx is None or len(mx.inputs) != 2:
        return None
    t = next((i for i in mx.inputs if not _is_const(m, i, _TOKEN_SCALE_MIN)), None)
    if t is None or _other(mx, t) == t or not _is_const(m, _other(mx, t), _TOKEN_SCALE_MIN):
        return None
    d127 = m.producer(t, "Div")
    if d127 is None or not _is_const(m, d127.inputs[1], 127):
        return None
    red = m.producer(d127.inputs[0], "ReduceMax")
    if red is None or red.attrs.get("keepdims", 1) != 1 or list(red.attrs.get("axes") or []) != [-1]:
        return None
    ab = m.producer(red.inputs[0], "Abs")
    if ab is None or ab.inputs[0] != x:
        return None
    return x, s


def _fuse_token(g: Graph, m: Matcher, mi: Node) -> Rewrite | None:
    """Per-token: Cast<int8>(quantized x) -> MatMulInteger(x_q, W_q[, 0][, W_zp]) -> Cast(float) -> Mul(s)
    -> Mul(W_scale) [-> Add(bias)] as (the nodes it replaces, [DynamicQMatMul(per_token=1)])."""
    found = _token_quantized(m, mi.inputs[0])
    if found is None:
        return None
    x, s = found
    if len(mi.inputs) > 2 and mi.inputs[2]:
        zp = m.const(mi.inputs[2])
        if zp is None or zp.size != 1 or int(zp.reshape(())) != 0:
            return None
    weight = _int_weight(m, mi)
    cast = _float_cast(m, mi) if weight is not None else None
    mul_s = _only(m, cast.outputs[0], "Mul") if cast is not None else None
    if weight is None or cast is None or mul_s is None or _other(mul_s, cast.outputs[0]) != s:
        return None
    mul_w = _only(m, mul_s.outputs[0], "Mul")
    w_scale = m.const(_other(mul_w, mul_s.outputs[0])) if mul_w is not None else None
    if (
        w_scale is None
        or w_scale.dtype != np.float32
        or w_scale.ndim > 1
        or w_scale.size not in (1, weight[1])
    ):
        return None
    return _dynamic_node(g, m, x, mi, [mi, cast, mul_s, mul_w], w_scale, weight[1], per_token=1)


def fuse_dynamic_qmatmul(graph: Graph) -> Graph:
    """Dynamic quantization as onnxruntime's and opstrata.quant's quantize_dynamic write it
    (DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul by x_scale * W_scale, an optional bias Add)
    -> ``ai.opstrata::DynamicQMatMul(x, W_q[, W_zp])`` with attributes ``w_scale`` and ``bias``: one kernel
    quantizes x, multiplies in int32 and scales (opstrata.quant backs it natively). A DynamicQuantizeLinear
    shared by several MatMulIntegers (Q, K and V) becomes one quantization per fused node; unused, it is
    removed with the scale Muls by dead-code elimination. The per-token form opstrata.quant writes
    (``quantize_dynamic(per_token=True)``: symmetric int8 per row through Abs / ReduceMax / Div / Max /
    Round / Clip / Cast, ``MatMulInteger``, then ``Mul(s)`` and ``Mul(W_scale)``) fuses to the same node
    with ``per_token=1``."""
    return _rewrite_each(
        graph, ("MatMulInteger",), lambda g, m, n: _fuse_dynamic(g, m, n) or _fuse_token(g, m, n)
    )
