"""Transpose folding: consecutive Transposes compose, identity Transposes vanish, and a Transpose of a
2-D weight feeding MatMul folds into ``ai.opstrata::Linear`` (which reads ``w`` as ``(out, in)``)."""

from __future__ import annotations

from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .pattern import Matcher

__all__ = ["fold_transposes"]


def fold_transposes(graph: Graph) -> Graph:
    """Compose ``Transpose(Transpose(x))``, drop identity perms, ``MatMul(x, Transpose(w))`` -> ``Linear(x, w)``."""
    g = graph.copy()
    m = Matcher(g)
    for node in list(g.nodes):
        if node.domain != "":
            continue
        if node.op_type == "Transpose" and node.attrs.get("perm") is not None:
            src = m.producer(node.inputs[0], "Transpose")
            perm = list(node.attrs["perm"])
            if src is not None and src.attrs.get("perm") is not None:
                inner = list(src.attrs["perm"])
                node.inputs[0], perm = src.inputs[0], [inner[p] for p in perm]
                node.attrs["perm"] = perm
                m = Matcher(g)
            if perm == list(range(len(perm))) and node.outputs[0] not in g.outputs:
                g.replace_uses(node.outputs[0], node.inputs[0])
                g.remove_node(node)
                m = Matcher(g)
        elif node.op_type == "MatMul":
            t = m.producer(node.inputs[1], "Transpose")
            x_shape = m.shape(node.inputs[0])
            if (
                t is None
                or list(t.attrs.get("perm") or [1, 0]) != [1, 0]
                or len(m.shape(t.inputs[0]) or ()) != 2
            ):
                continue
            if x_shape is None or len(x_shape) < 2:
                continue
            lin = Node(
                "Linear",
                [node.inputs[0], t.inputs[0]],
                node.outputs,
                {},
                g.fresh_node_name("Linear"),
                OPSTRATA_DOMAIN,
            )
            g.replace_node(node, [lin])
            m = Matcher(g)
    return g
