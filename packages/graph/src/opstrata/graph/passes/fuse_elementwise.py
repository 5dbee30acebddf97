"""Elementwise chains -> one ``ai.opstrata::FusedElementwise`` node holding the chain as an expression.

The expression is a list of steps ``[op, [refs]]``: ``op`` an elementwise ONNX op (Add Sub Mul Div
Pow, Exp Log Sqrt Tanh Erf Sigmoid Relu Neg Abs Reciprocal), each ref ``"x<i>"`` (the node's i-th
input), ``"t<j>"`` (step j's result) or ``"c<k>"`` (``consts[k]``, a one-element constant folded
into the expression); the node's output is the last step. On ``cpu`` the ops code generator
compiles the expression into one kernel (loop fusion as in XLA/TVM, see ``_fused_codegen``).

Groups are single-output DAGs: walking the schedule backwards, a fusible node joins the group of
its consumers when all of them are in one group and its value is no graph output, so a value read
by several members (``x`` in ``x * x * x``) is admitted; a value read outside becomes a group's
output (its root) instead.
"""

from __future__ import annotations

import numpy as np

from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .pattern import Matcher, fusable_binary, fusable_unary

__all__ = ["fuse_elementwise"]


def _fusible(m: Matcher, node: Node) -> bool:
    if (
        node.domain not in ("", "ai.onnx")
        or node.op_type not in fusable_unary() | fusable_binary()
        or len(node.outputs) != 1
    ):
        return False
    dt = m.dtype(node.outputs[0])
    return dt is not None and dt.kind == "f" and all(x and m.dtype(x) is not None for x in node.inputs)


def _groups(g: Graph, m: Matcher) -> list[list[Node]]:
    """Single-output groups of >= 2 fusible nodes of one dtype, members in schedule order."""
    group: dict[int, int] = {}  # id(node) -> id(its group's root)
    dtype: dict[int, object] = {}  # id(root) -> the group's dtype
    for node in reversed(g.nodes):
        if not _fusible(m, node):
            continue
        out = node.outputs[0]
        roots = {group.get(id(u)) for u in m.uses(out)}
        root = roots.pop() if len(roots) == 1 else None
        if root is not None and out not in m.outputs and dtype[root] == m.dtype(out):
            group[id(node)] = root
        else:
            group[id(node)] = id(node)
            dtype[id(node)] = m.dtype(out)
    members: dict[int, list[Node]] = {}
    for node in g.nodes:
        if id(node) in group:
            members.setdefault(group[id(node)], []).append(node)
    return [grp for grp in members.values() if len(grp) > 1]


def _foldable(m: Matcher, grp: list[Node]) -> set[str]:
    """One-element constants that can live in the expression (``consts``) instead of being inputs.

    Kept as inputs: a Pow base, and the operands of a step whose operands would all be constants
    (either would hide the step's dtype); and any constant of higher rank than the remaining inputs
    (a (1, 1) constant raises the result's rank).
    """
    names = {o for n in grp for o in n.outputs}
    ext = list(dict.fromkeys(x for n in grp for x in n.inputs if x not in names))
    small = {x for x in ext if (c := m.const(x)) is not None and c.size == 1}
    blocked: set[str] = set()
    for n in grp:
        if n.op_type == "Pow" and n.inputs[0] in small:
            blocked.add(n.inputs[0])
        if all(x in small for x in n.inputs):
            blocked.update(n.inputs)
    cand = small - blocked
    kept = [x for x in ext if x not in cand]
    shapes = [m.shape(x) for x in kept]
    if not kept:
        return set()
    rank = max(len(s) for s in shapes) if all(s is not None for s in shapes) else 0
    return {x for x in cand if m.const(x).ndim <= rank}  # type: ignore[union-attr]


def _expression(m: Matcher, grp: list[Node]) -> tuple[list[str], list[list], list[float], str]:
    """Inputs, steps, folded constants and output of a group (members in schedule order)."""
    step_of: dict[str, str] = {}
    inputs: list[str] = []
    consts: list[float] = []
    folded = _foldable(m, grp)
    const_ref: dict[str, str] = {}
    steps: list[list] = []
    for j, n in enumerate(grp):
        refs = []
        for x in n.inputs:
            if x in step_of:
                refs.append(step_of[x])
            elif x in folded:
                if x not in const_ref:
                    const_ref[x] = f"c{len(consts)}"
                    consts.append(float(np.asarray(m.const(x)).ravel()[0]))
                refs.append(const_ref[x])
            else:
                if x not in inputs:
                    inputs.append(x)
                refs.append(f"x{inputs.index(x)}")
        steps.append([n.op_type, refs])
        step_of[n.outputs[0]] = f"t{j}"
    return inputs, steps, consts, grp[-1].outputs[0]


def fuse_elementwise(graph: Graph) -> Graph:
    """Replace each single-output group of >= 2 fusible elementwise nodes by one FusedElementwise node."""
    g = graph.copy()
    m = Matcher(g)
    for grp in _groups(g, m):
        inputs, steps, consts, y = _expression(m, grp)
        attrs: dict = {"expr": steps}
        if consts:
            attrs["consts"] = consts
        fused = Node(
            "FusedElementwise", inputs, [y], attrs, g.fresh_node_name("FusedElementwise"), OPSTRATA_DOMAIN
        )
        last = grp[-1]
        g.record_fusion(grp[:-1], [fused])
        for n in grp[:-1]:
            g.nodes.remove(n)
        g.replace_node(last, [fused])
    return g
