"""Elementwise chains -> one ``ai.opstrata::FusedElementwise`` node holding the chain as an expression.

The expression is a list of steps ``[op, [refs]]``: ``op`` an elementwise ONNX op (Add Sub Mul Div
Pow, Exp Log Sqrt Tanh Erf Sigmoid Relu Neg Abs Reciprocal), each ref ``"x<i>"`` (the node's i-th
input) or ``"t<j>"`` (step j's result); the node's output is the last step. The executor evaluates
it step by step; the ops code generator will compile it into one kernel (loop fusion as in XLA/TVM).
"""

from __future__ import annotations

from ._ir import OPSTRATA_DOMAIN, Graph, Node
from ._pattern import ELEMENTWISE_BINARY, ELEMENTWISE_UNARY, Matcher

__all__ = ["fuse_elementwise"]

_OPS = ELEMENTWISE_UNARY | ELEMENTWISE_BINARY


def _fusible(m: Matcher, node: Node) -> bool:
    if node.domain != "" or node.op_type not in _OPS or len(node.outputs) != 1:
        return False
    dt = m.dtype(node.outputs[0])
    return dt is not None and dt.kind == "f" and all(m.dtype(x) is not None for x in node.inputs)


def _groups(g: Graph, m: Matcher) -> list[list[Node]]:
    """Connected chains where every value passed inside is read only by the next member (union-find)."""
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for node in g.nodes:
        if not _fusible(m, node):
            continue
        parent[id(node)] = id(node)
        for x in dict.fromkeys(node.inputs):
            p = m.prod.get(x)
            if p is not None and id(p) in parent and m.only_use(x) is node:
                parent[find(id(p))] = find(id(node))
    groups: dict[int, list[Node]] = {}
    for node in g.nodes:
        if id(node) in parent:
            groups.setdefault(find(id(node)), []).append(node)
    return [grp for grp in groups.values() if len(grp) > 1]


def _expression(grp: list[Node]) -> tuple[list[str], list[list], str]:
    """Inputs, steps and output of a group (members in schedule order)."""
    step_of: dict[str, str] = {}
    inputs: list[str] = []
    steps: list[list] = []
    for j, n in enumerate(grp):
        refs = []
        for x in n.inputs:
            if x in step_of:
                refs.append(step_of[x])
            else:
                if x not in inputs:
                    inputs.append(x)
                refs.append(f"x{inputs.index(x)}")
        steps.append([n.op_type, refs])
        step_of[n.outputs[0]] = f"t{j}"
    return inputs, steps, grp[-1].outputs[0]


def fuse_elementwise(graph: Graph) -> Graph:
    """Replace each chain of >= 2 fusible elementwise nodes by one FusedElementwise node."""
    g = graph.copy()
    m = Matcher(g)
    for grp in _groups(g, m):
        order = {id(n): i for i, n in enumerate(g.nodes)}
        grp.sort(key=lambda n: order[id(n)])
        outs = {n.outputs[0] for n in grp}
        # only the last member's output may leave the group
        if any(o in g.outputs or any(c not in grp for c in m.uses(o)) for o in outs - {grp[-1].outputs[0]}):
            continue
        inputs, steps, y = _expression(grp)
        fused = Node(
            "FusedElementwise",
            inputs,
            [y],
            {"expr": steps},
            g.fresh_node_name("FusedElementwise"),
            OPSTRATA_DOMAIN,
        )
        last = grp[-1]
        for n in grp[:-1]:
            g.nodes.remove(n)
        g.replace_node(last, [fused])
    return g
