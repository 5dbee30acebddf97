"""Bias + activation -> one node: ``act(Linear(x, w, b))`` becomes ``Linear(..., activation=act)``
(a GEMM epilogue, as cuBLASLt and ONNX Runtime's FusedGemm do). A reshape between the two (GPT-2's
Conv1D runs its GEMM on a 2-D view and views the result back) does not stop it: an elementwise
activation commutes with a reshape, so it moves into the GEMM and the reshape stays."""

from __future__ import annotations

from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .pattern import Matcher, is_onnx

__all__ = ["fuse_bias_activation"]


def _activation_of(node: Node) -> str | None:
    if is_onnx(node, "Relu", "Sigmoid", "Tanh"):
        return node.op_type.lower()
    if is_onnx(node, "Gelu"):
        return "gelu_tanh" if node.attrs.get("approximate", "none") == "tanh" else "gelu"
    return None


def fuse_bias_activation(graph: Graph) -> Graph:
    """``Relu/Gelu/Sigmoid/Tanh`` of a Linear's sole output (directly, or through one Reshape that is the
    output's sole reader) folds into the Linear's ``activation``."""
    g = graph.copy()
    m = Matcher(g)
    for node in list(g.nodes):
        if node.domain != OPSTRATA_DOMAIN or node.op_type != "Linear" or node.attrs.get("activation"):
            continue
        act_node = m.only_use(node.outputs[0])
        reshape = None
        if act_node is not None and is_onnx(act_node, "Reshape") and act_node.inputs[0] == node.outputs[0]:
            reshape, act_node = act_node, m.only_use(act_node.outputs[0])
        act = _activation_of(act_node) if act_node is not None else None
        if act_node is None or not act or act_node.inputs[0] != (reshape or node).outputs[0]:
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
