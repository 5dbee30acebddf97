"""Dead code elimination: drop nodes none of whose outputs reach a graph output, and unused initializers.

A control-flow node (If/Loop/Scan) lists the outer values its subgraphs read among its inputs (after its
ONNX inputs; ``attrs["captures"]``), so their producers and initializers stay alive; subgraphs themselves
are left as they are.
"""

from __future__ import annotations

from .._ir import Graph

__all__ = ["eliminate_dead_code"]


def eliminate_dead_code(graph: Graph) -> Graph:
    """Remove nodes whose outputs are never used, then initializers nobody reads."""
    g = graph.copy()
    needed = set(g.outputs)
    keep = []
    for node in reversed(g.nodes):
        if any(o in needed for o in node.outputs if o):
            keep.append(node)
            needed.update(x for x in node.inputs if x)
        else:
            for o in node.outputs:
                if o:
                    g.values.pop(o, None)
    g.nodes = keep[::-1]
    for name in [x for x in g.initializers if x not in needed]:
        g.remove_initializer(name)
    return g
