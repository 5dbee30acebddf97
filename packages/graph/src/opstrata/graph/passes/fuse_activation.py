"""Bias + activation -> one node: ``act(Linear(x, w, b))`` becomes ``Linear(..., activation=act)``
(a GEMM epilogue, as cuBLASLt and ONNX Runtime's FusedGemm do). A reshape between the two (GPT-2's
Conv1D runs its GEMM on a 2-D view and views the result back) does not stop it: an elementwise
activation commutes with a reshape, so it moves into the GEMM and the reshape stays. A bias-free
``MatMul`` by a constant 2-D weight (T5's and Llama's projections) becomes such a Linear too when an
activation follows it: the activation runs as the GEMM's epilogue instead of a pass of its own."""

from __future__ import annotations

from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .fuse_linear import transposed_weight
from .pattern import Matcher, is_onnx

__all__ = ["fuse_bias_activation"]


def _activation_of(node: Node) -> str | None:
    if is_onnx(node, "Relu", "Sigmoid", "Tanh"):
        return node.op_type.lower()
    if is_onnx(node, "Gelu"):
        return "gelu_tanh" if node.attrs.get("approximate", "none") == "tanh" else "gelu"
    return None


def _as_linear(g: Graph, m: Matcher, node: Node) -> Node | None:
    """A Linear (no bias) standing for ``MatMul(x, W)`` with a constant 2-D ``W`` and an input of rank
    >= 2 (the weight stored transposed, torch's layout); None for any other MatMul."""
    w = m.const(node.inputs[1]) if len(node.inputs) == 2 else None
    x_shape = m.shape(node.inputs[0])
    if w is None or w.ndim != 2 or x_shape is None or len(x_shape) < 2:
        return None
    wt = transposed_weight(g, node.inputs[1], w)
    return Node(
        "Linear", [node.inputs[0], wt], list(node.outputs), {}, g.fresh_node_name("Linear"), OPSTRATA_DOMAIN
    )


def _activation_after(m: Matcher, node: Node) -> tuple[Node | None, Node | None, str | None]:
    """(reshape or None, activation node, activation) reading ``node``'s sole output, or Nones."""
    act_node = m.only_use(node.outputs[0])
    reshape = None
    if act_node is not None and is_onnx(act_node, "Reshape") and act_node.inputs[0] == node.outputs[0]:
        reshape, act_node = act_node, m.only_use(act_node.outputs[0])
    act = _activation_of(act_node) if act_node is not None else None
    if act_node is None or not act or act_node.inputs[0] != (reshape or node).outputs[0]:
        return None, None, None
    return reshape, act_node, act


def fuse_bias_activation(graph: Graph) -> Graph:
    """``Relu/Gelu/Sigmoid/Tanh`` of a Linear's (or a constant-weight MatMul's) sole output, directly or
    through one Reshape that is the output's sole reader, folds into the Linear's ``activation``."""
    g = graph.copy()
    m = Matcher(g)
    for node in list(g.nodes):
        if is_onnx(node, "MatMul") and _activation_after(m, node)[1] is not None:
            lin = _as_linear(g, m, node)
            if lin is None:
                continue
            g.replace_node(node, [lin])
            node, m = lin, Matcher(g)
        if node.domain != OPSTRATA_DOMAIN or node.op_type != "Linear" or node.attrs.get("activation"):
            continue
        reshape, act_node, act = _activation_after(m, node)
        if act_node is None or not act:
            continue
        node.attrs["activation"] = act
        carrier = reshape or node  # the node whose output now is the activation's
        old = carrier.outputs[0]
        carrier.outputs[0] = act_node.outputs[0]
        g.remove_node(act_node)
        g.values.pop(old, None)
        g.fused_into[old] = carrier.outputs[0]
        m = Matcher(g)
    return g
