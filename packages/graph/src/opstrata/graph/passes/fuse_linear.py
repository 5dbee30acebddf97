"""MatMul + Add and Gemm -> ``ai.opstrata::Linear(x, w (out, in), b)`` (torch's ``nn.Linear`` layout).

A constant ``(in, out)`` MatMul weight is stored transposed once at compile time (as ONNX Runtime
pre-packs weights); a following ``Add`` of a constant ``(out,)`` bias becomes the bias input.
"""

from __future__ import annotations

import numpy as np

from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .pattern import Matcher, is_onnx

__all__ = ["fuse_linear"]


def _bias(m: Matcher, y: str, out: int) -> tuple[Node, np.ndarray] | None:
    add = m.only_use(y)
    if add is None or not is_onnx(add, "Add"):
        return None
    c = m.const(m.other(add, y) or "")
    if (
        c is None
        or c.size != out
        or c.shape[-1:] != (out,)
        or (c.ndim > 1 and len(m.shape(y) or ()) < c.ndim)
    ):
        return None
    return add, c.reshape(out)


def transposed_weight(g: Graph, name: str, w: np.ndarray) -> str:
    """A new initializer holding the ``(in, out)`` weight ``w`` (initializer ``name``) as ``(out, in)``,
    the layout a Linear reads; returns its name."""
    wt = g.fresh_name(f"{name}_t")
    g.add_initializer(wt, np.ascontiguousarray(w.T))
    return wt


def _gemm(g: Graph, m: Matcher, node: Node) -> list[Node] | None:
    a = node.attrs
    if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
        return None
    w = node.inputs[1]
    if not a.get("transB", 0):
        c = m.const(w)
        if c is None:
            return None
        w = transposed_weight(g, w, c)
    ins = [node.inputs[0], w]
    if len(node.inputs) > 2 and node.inputs[2]:
        c = m.const(node.inputs[2])
        out = (m.shape(w) or (None,))[0]
        if c is None or out is None or c.size != out:
            return None
        b = g.fresh_name(f"{node.inputs[2]}_bias")
        g.add_initializer(b, c.reshape(out))
        ins.append(b)
    return [Node("Linear", ins, node.outputs, {}, g.fresh_node_name("Linear"), OPSTRATA_DOMAIN)]


def fuse_linear(graph: Graph) -> Graph:
    """``MatMul(x, W) [+ b]``, ``Linear(x, w) + b`` and ``Gemm`` -> ``Linear``."""
    g = graph.copy()
    m = Matcher(g)
    for node in list(g.nodes):
        if is_onnx(node, "Gemm"):
            new = _gemm(g, m, node)
            if new is not None:
                g.replace_node(node, new)
                m = Matcher(g)
            continue
        is_lin = node.domain == OPSTRATA_DOMAIN and node.op_type == "Linear" and len(node.inputs) == 2
        if not (is_onnx(node, "MatMul") or is_lin):
            continue
        x_shape = m.shape(node.inputs[0])
        if x_shape is None or len(x_shape) < 2:
            continue
        if is_lin:
            w, out = node.inputs[1], (m.shape(node.inputs[1]) or (None,))[0]
        else:
            c = m.const(node.inputs[1])
            if c is None or c.ndim != 2:
                continue
            w, out = None, c.shape[1]
        bias = _bias(m, node.outputs[0], out) if isinstance(out, int) else None
        if not is_lin and bias is None:
            continue  # a bare MatMul gains nothing here (fuse_bias_activation takes one an activation follows)
        if w is None:
            w = transposed_weight(g, node.inputs[1], m.const(node.inputs[1]))  # type: ignore[arg-type]
        ins = [node.inputs[0], w]
        y = node.outputs[0]
        if bias is not None:
            b = g.fresh_name(f"{node.name}_bias")
            g.add_initializer(b, bias[1])
            ins.append(b)
            y = bias[0].outputs[0]
            g.remove_node(bias[0])
        lin = Node("Linear", ins, [y], {}, g.fresh_node_name("Linear"), OPSTRATA_DOMAIN)
        g.replace_node(node, [lin])
        m = Matcher(g)
    return g
