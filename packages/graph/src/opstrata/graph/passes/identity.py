"""Identity removal: Identity nodes (and Casts to the same dtype) disappear; consumers read the source."""

from __future__ import annotations

from .._ir import Graph, Node
from .pattern import is_onnx

__all__ = ["remove_identities"]


def remove_identities(graph: Graph) -> Graph:
    """Rewire consumers of ``Identity(x)`` (or a no-op ``Cast``) to ``x``; graph outputs keep their names."""
    g = graph.copy()
    for node in list(g.nodes):
        if not (is_onnx(node, "Identity") or (is_onnx(node, "Cast") and _same_dtype(g, node))):
            continue
        src, out = node.inputs[0], node.outputs[0]
        if out not in g.outputs:
            g.replace_uses(out, src)
            g.remove_node(node)
            continue
        prod = g.producer(src)
        # a graph output must keep its name: rename the source instead, when that is safe
        if prod is None or src in g.outputs or src in g.inputs:
            continue
        g.remove_node(node)
        g.values.pop(out, None)
        g.rename_value(src, out)
    return g


def _same_dtype(g: Graph, node: Node) -> bool:
    v = g.values.get(node.inputs[0])
    return v is not None and v.dtype is not None and v.dtype == node.attrs.get("to")
