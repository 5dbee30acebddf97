"""Elementwise chains -> one ``ai.opstrata::FusedElementwise`` node holding the chain as an expression.

The expression is a list of steps ``[op, [refs]]``: ``op`` an elementwise ONNX op (Add Sub Mul Div
Pow, two-input Max Min, Exp Log Sqrt Tanh Erf Sigmoid Relu Neg Abs Reciprocal), each ref ``"x<i>"`` (the node's i-th
input), ``"t<j>"`` (step j's result) or ``"c<k>"`` (``consts[k]``, a one-element constant folded
into the expression); the node's output is the last step. The attribute activations HardSigmoid,
HardSwish, Clip (constant bounds) and LeakyRelu join as the steps their kernels compute
(:func:`activation_steps`), as MobileNet's and EfficientNet's exporters write them. On ``cpu`` the ops code generator
compiles the expression into one kernel (loop fusion as in XLA/TVM, see ``_fused_codegen``).

Groups are single-output DAGs: walking the schedule backwards, a fusible node joins the group of
its consumers when all of them are in one group and its value is no graph output, so a value read
by several members (``x`` in ``x * x * x``) is admitted; a value read outside becomes a group's
output (its root) instead. A node whose result is broadcast up by a consumer (a per-channel or
per-row value) does not join: inside the kernel it would be recomputed for every element.
"""

from __future__ import annotations

import numpy as np

from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .pattern import Matcher, fusable_binary, fusable_unary

__all__ = ["fuse_elementwise"]


def _fusible(m: Matcher, node: Node) -> bool:
    if node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return False
    if node.op_type in fusable_unary():
        arity = 1
    elif node.op_type in fusable_binary():
        arity = 2
    elif activation_steps(m, node) is not None:
        arity = 1
    else:
        return False
    data = node.inputs[:arity]
    if len(node.inputs) != arity and node.op_type not in _EXPANDED:
        return False
    dt = m.dtype(node.outputs[0])
    return dt is not None and dt.kind == "f" and all(x and m.dtype(x) is not None for x in data)


#: attribute activations written as steps of fusable ops (their own kernels run the same arithmetic)
_EXPANDED = frozenset({"HardSigmoid", "HardSwish", "Clip", "LeakyRelu"})


def activation_steps(m: Matcher, node: Node) -> list[tuple[str, list[str | float]]] | None:
    """``HardSigmoid`` / ``HardSwish`` / ``Clip`` (constant bounds) / ``LeakyRelu`` (0 <= alpha <= 1) as
    steps over ``"x"`` (the node's data input), ``"t<j>"`` (step j) and float constants, in the order
    of the ops kernels (``hard_sigmoid``: ``clip(x * alpha + beta, 0, 1)``; ``hard_swish``: that with
    alpha 1/6, beta 1/2, times x); None for any other node or a form with no such expansion."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in _EXPANDED:
        return None
    a = node.attrs
    if node.op_type in ("HardSigmoid", "HardSwish"):
        alpha, beta = (
            (a.get("alpha", 0.2), a.get("beta", 0.5)) if node.op_type == "HardSigmoid" else (1 / 6, 0.5)
        )
        steps: list[tuple[str, list[str | float]]] = [
            ("Mul", ["x", float(alpha)]), ("Add", ["t0", float(beta)]), ("Max", ["t1", 0.0]), ("Min", ["t2", 1.0]),
        ]  # fmt: skip
        return [*steps, ("Mul", ["t3", "x"])] if node.op_type == "HardSwish" else steps
    if node.op_type == "Clip":
        bounds = list(node.inputs[1:3])
        values = [m.scalar(x) if x else None for x in bounds]
        if len(node.inputs) > 3 or any(x and v is None for x, v in zip(bounds, values, strict=True)):
            return None  # a bound computed at run time
        steps, ref = [], "x"
        for op, v in zip(("Max", "Min"), values + [None] * (2 - len(values)), strict=True):
            if v is not None:
                steps.append((op, [ref, float(v)]))
                ref = f"t{len(steps) - 1}"
        return steps or [("Max", ["x", float("-inf")])]
    alpha = float(a.get("alpha", 0.01))  # LeakyRelu: max(x, alpha x) equals it for 0 <= alpha <= 1
    return [("Mul", ["x", alpha]), ("Max", ["x", "t0"])] if 0.0 <= alpha <= 1.0 else None


def _groups(g: Graph, m: Matcher) -> list[list[Node]]:
    """Single-output groups of >= 2 fusible nodes of one dtype (or one attribute activation), members in
    schedule order."""
    group: dict[int, int] = {}  # id(node) -> id(its group's root)
    dtype: dict[int, object] = {}  # id(root) -> the group's dtype
    for node in reversed(g.nodes):
        if not _fusible(m, node):
            continue
        out = node.outputs[0]
        roots = {group.get(id(u)) for u in m.uses(out)}
        root = roots.pop() if len(roots) == 1 else None
        if root is not None and any(_broadcasts_up(m, out, u.outputs[0]) for u in m.uses(out)):
            root = None  # computed once per element of the bigger result it would be repeated for
        if root is not None and out not in m.outputs and dtype[root] == m.dtype(out):
            group[id(node)] = root
        else:
            group[id(node)] = id(node)
            dtype[id(node)] = m.dtype(out)
    members: dict[int, list[Node]] = {}
    for node in g.nodes:
        if id(node) in group:
            members.setdefault(group[id(node)], []).append(node)
    # a lone attribute activation is a chain of several steps itself: one generated kernel beats its op's
    return [grp for grp in members.values() if len(grp) > 1 or grp[0].op_type in _EXPANDED]


#: a node is kept out of a group that would repeat its work at least this many times per element
REPEAT_LIMIT = 8


def _broadcasts_up(m: Matcher, small: str, big: str) -> bool:
    """Whether ``small`` is broadcast up to ``big``'s shape by at least :data:`REPEAT_LIMIT` times (the
    product of ``big``'s known dims where ``small`` has 1 or none): fused into ``big``'s kernel its work
    would be redone for every element it is broadcast to (EfficientNet's squeeze-excitation Sigmoid on
    (N, C, 1, 1) feeding a Mul over (N, C, H, W)), so it stays a node of its own on its own elements.
    A symbolic dim counts as 1; unknown shapes: False."""
    a, b = m.shape(small), m.shape(big)
    if a is None or b is None or len(a) > len(b):
        return False
    padded = (1,) * (len(b) - len(a)) + tuple(a)
    repeat = 1
    for x, y in zip(padded, b, strict=True):
        if x == 1 and isinstance(y, (int, np.integer)) and y > 1:
            repeat *= int(y)
    return repeat >= REPEAT_LIMIT


def _foldable(m: Matcher, grp: list[Node]) -> set[str]:
    """One-element constants that can live in the expression (``consts``) instead of being inputs.

    Kept as inputs: a Pow base, and the operands of a step whose operands would all be constants
    (either would hide the step's dtype); and any constant of higher rank than the remaining inputs
    (a (1, 1) constant raises the result's rank).
    """
    names = {o for n in grp for o in n.outputs}
    ext = list(dict.fromkeys(x for n in grp for x in _data(n) if x not in names))
    small = {x for x in ext if (c := m.const(x)) is not None and c.size == 1}
    blocked: set[str] = set()
    for n in grp:
        if n.op_type == "Pow" and n.inputs[0] in small:
            blocked.add(n.inputs[0])
        if all(x in small for x in _data(n)):
            blocked.update(_data(n))
    cand = small - blocked
    kept = [x for x in ext if x not in cand]
    shapes = [m.shape(x) for x in kept]
    if not kept:
        return set()
    rank = max(len(s) for s in shapes) if all(s is not None for s in shapes) else 0
    return {x for x in cand if m.const(x).ndim <= rank}  # type: ignore[union-attr]


def _data(n: Node) -> list[str]:
    """The inputs a member reads as data (an expanded activation's bounds are constants of its steps)."""
    return n.inputs[:1] if n.op_type in _EXPANDED else n.inputs


def _expression(m: Matcher, grp: list[Node]) -> tuple[list[str], list[list], list[float], str]:
    """Inputs, steps, folded constants and output of a group (members in schedule order)."""
    step_of: dict[str, str] = {}
    inputs: list[str] = []
    consts: list[float] = []
    folded = _foldable(m, grp)
    const_ref: dict[str, str] = {}
    steps: list[list] = []

    def const(value: float, key: str) -> str:
        if key not in const_ref:
            const_ref[key] = f"c{len(consts)}"
            consts.append(value)
        return const_ref[key]

    def ref(x: str) -> str:
        if x in step_of:
            return step_of[x]
        if x in folded:
            return const(float(np.asarray(m.const(x)).ravel()[0]), x)
        if x not in inputs:
            inputs.append(x)
        return f"x{inputs.index(x)}"

    for n in grp:
        expansion = activation_steps(m, n)
        if expansion is None:
            steps.append([n.op_type, [ref(x) for x in n.inputs]])
        else:
            base = len(steps)
            for op, args in expansion:
                refs = [
                    ref(n.inputs[0]) if a == "x" else f"t{base + int(a[1:])}" if isinstance(a, str)
                    else const(a, f"={float(a).hex()}")
                    for a in args
                ]  # fmt: skip
                steps.append([op, refs])
        step_of[n.outputs[0]] = f"t{len(steps) - 1}"
    return inputs, steps, consts, grp[-1].outputs[0]


def fuse_elementwise(graph: Graph) -> Graph:
    """Replace each single-output group of >= 2 fusible elementwise nodes (or a lone HardSwish /
    HardSigmoid / Clip / LeakyRelu, several steps itself) by one FusedElementwise node."""
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
