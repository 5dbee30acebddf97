"""GELU (Hendrycks & Gimpel 2016) patterns -> ONNX ``Gelu``: the erf form and the tanh approximation.

erf:  ``x * 0.5 * (1 + erf(x / sqrt 2))`` (also ``x * (1/sqrt 2)``, and the 0.5 on either side);
tanh: ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` (``x^3`` as Pow or ``x*x*x``).
"""

from __future__ import annotations

import math

from .._ir import Graph, Node
from .pattern import Matcher, replace_nodes

__all__ = ["fuse_gelu"]


def _erf_arg(m: Matcher, erf: Node) -> tuple[str, list[Node]] | None:
    """``x`` when the Erf input is ``x / sqrt 2`` or ``x * (1 / sqrt 2)``."""
    p = m.producer(erf.inputs[0], "Div", "Mul")
    if p is None:
        return None
    if p.op_type == "Div" and m.is_scalar(p.inputs[1], math.sqrt(2.0)):
        return p.inputs[0], [p]
    if p.op_type == "Mul":
        for a, b in (p.inputs, p.inputs[::-1]):
            if m.is_scalar(b, 1 / math.sqrt(2.0)):
                return a, [p]
    return None


def _cube(m: Matcher, name: str) -> tuple[str, list[Node]] | None:
    p = m.producer(name, "Pow", "Mul")
    if p is None:
        return None
    if p.op_type == "Pow" and m.is_scalar(p.inputs[1], 3.0):
        return p.inputs[0], [p]
    if p.op_type == "Mul":  # (x * x) * x in either order
        for sq_name, x in (p.inputs, p.inputs[::-1]):
            sq = m.producer(sq_name, "Mul")
            if sq is not None and sq.inputs[0] == sq.inputs[1] == x:
                return x, [sq, p]
    return None


def _tanh_arg(m: Matcher, tanh: Node) -> tuple[str, list[Node]] | None:
    """``x`` when the Tanh input is ``sqrt(2/pi) * (x + 0.044715 * x^3)``."""
    outer = m.producer(tanh.inputs[0], "Mul")
    if outer is None:
        return None
    for inner_name, c in (outer.inputs, outer.inputs[::-1]):
        if not m.is_scalar(c, math.sqrt(2 / math.pi)):
            continue
        add = m.producer(inner_name, "Add")
        if add is None:
            continue
        for x, cubic_name in (add.inputs, add.inputs[::-1]):
            cm = m.producer(cubic_name, "Mul")
            if cm is None:
                continue
            for cube_name, k in (cm.inputs, cm.inputs[::-1]):
                cube = _cube(m, cube_name) if m.is_scalar(k, 0.044715) else None
                if cube is not None and cube[0] == x:
                    return x, [outer, add, cm, *cube[1]]
    return None


def _outer(m: Matcher, x: str, one_plus: str) -> tuple[str, list[Node]] | None:
    """The output of ``x * 0.5 * one_plus`` in any association, and its Mul nodes."""
    c1 = m.only_use(one_plus)
    if c1 is None or c1.op_type != "Mul" or c1.domain != "":
        return None
    o = m.other(c1, one_plus)
    if o is None:
        return None
    if o == x or m.is_scalar(o, 0.5):  # (x * a) * 0.5 or (a * 0.5) * x
        want_half = o == x
        c2 = m.only_use(c1.outputs[0])
        if c2 is None or c2.op_type != "Mul" or c2.domain != "":
            return None
        o2 = m.other(c2, c1.outputs[0])
        if o2 is not None and ((want_half and m.is_scalar(o2, 0.5)) or (not want_half and o2 == x)):
            return c2.outputs[0], [c1, c2]
        return None
    half = m.producer(o, "Mul")  # (x * 0.5) * a
    if half is not None and x in half.inputs and m.is_scalar(m.other(half, x) or "", 0.5):
        return c1.outputs[0], [half, c1]
    return None


def fuse_gelu(graph: Graph) -> Graph:
    """GELU erf / tanh subgraphs -> ``Gelu(x, approximate="none" | "tanh")``."""
    g = graph.copy()
    done = True
    while done:
        done = False
        m = Matcher(g)
        for node in g.nodes:
            if node.domain != "" or node.op_type not in ("Erf", "Tanh"):
                continue
            inner = _erf_arg(m, node) if node.op_type == "Erf" else _tanh_arg(m, node)
            add = m.only_use(node.outputs[0])
            if inner is None or add is None or add.op_type != "Add" or add.domain != "":
                continue
            if not m.is_scalar(m.other(add, node.outputs[0]) or "", 1.0):
                continue
            x = inner[0]
            outer = _outer(m, x, add.outputs[0])
            if outer is None:
                continue
            y, tail = outer
            chain = [*inner[1], node, add, *tail]
            if not m.internal(chain, y):
                continue
            approx = "none" if node.op_type == "Erf" else "tanh"
            replace_nodes(
                g, chain, [Node("Gelu", [x], [y], {"approximate": approx}, g.fresh_node_name("Gelu"))]
            )
            done = True
            break
    return g
