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
"""

from __future__ import annotations

import numpy as np

from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .pattern import Matcher, is_onnx

__all__ = ["fuse_qdq_matmul", "is_fusable_weight_dq"]

_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))


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


def is_fusable_weight_dq(m: Matcher, dq: Node) -> bool:
    """A weight DequantizeLinear that :func:`fuse_qdq_matmul` will consume: constant folding keeps it."""
    user = m.only_use(dq.outputs[0])
    if user is None or not (is_onnx(user, "MatMul") or (is_onnx(user, "Gemm") and _gemm_ok(m, user))):
        return False
    if len(user.inputs) < 2 or user.inputs[1] != dq.outputs[0] or user.inputs[0] == dq.outputs[0]:
        return False
    transposed = is_onnx(user, "Gemm") and bool(user.attrs.get("transB", 0))
    return _weight(m, dq, transposed) is not None and _activation(m, user.inputs[0]) is not None


def _fuse(g: Graph, m: Matcher, node: Node) -> list[Node] | None:
    if len(node.inputs) < 2 or (is_onnx(node, "Gemm") and not _gemm_ok(m, node)):
        return None
    dq_w = m.producer(node.inputs[1], "DequantizeLinear")
    if dq_w is None or not is_fusable_weight_dq(m, dq_w):
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
    return [Node("QMatMul", ins, node.outputs, attrs, g.fresh_node_name("QMatMul"), OPSTRATA_DOMAIN)]


def fuse_qdq_matmul(graph: Graph) -> Graph:
    """``MatMul(DQ(a_q), DQ(W_q))`` and the Gemm form -> ``QMatMul(a_q, a_zp, W_q, W_zp)`` with attributes
    ``scale`` (a_scale * W_scale, scalar or per column) and the Gemm's ``bias``."""
    g = graph.copy()
    m = Matcher(g)
    for node in list(g.nodes):
        if not (is_onnx(node, "MatMul") or is_onnx(node, "Gemm")):
            continue
        new = _fuse(g, m, node)
        if new is not None:
            g.replace_node(node, new)
            m = Matcher(g)
    return g
