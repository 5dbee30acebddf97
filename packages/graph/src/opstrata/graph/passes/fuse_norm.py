"""Decomposed normalisations -> fused nodes: LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019).

Matches the ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div(/Mul/Add) chain torch exports for
``nn.LayerNorm`` (also with ``x*x`` for the square and ``x * Reciprocal(std)`` for the division),
and ``x / sqrt(mean(x^2) + eps) (* w)`` for RMSNorm. LayerNorm becomes ONNX
``LayerNormalization``; RMSNorm becomes ``ai.opstrata::RMSNorm``.
"""

from __future__ import annotations

import numpy as np

from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .pattern import Matcher, replace_nodes

__all__ = ["fuse_layer_norm", "fuse_rms_norm"]


def _trailing_axis(m: Matcher, reduce: Node, x: str) -> int | None:
    """Negative start axis when ``reduce`` is a keepdims mean over the trailing axes of ``x``."""
    shape = m.shape(x)
    axes = reduce.attrs.get("axes")
    if shape is None or axes is None or not reduce.attrs.get("keepdims", 1):
        return None
    r = len(shape)
    norm = sorted(a % r for a in axes)
    if norm != list(range(r - len(norm), r)):
        return None
    return -len(norm)


def _square_of(m: Matcher, name: str) -> tuple[Node, str] | None:
    """``(node, x)`` when ``name`` is ``Pow(x, 2)`` or ``Mul(x, x)``."""
    p = m.producer(name, "Pow", "Mul")
    if p is None:
        return None
    if p.op_type == "Pow" and m.is_scalar(p.inputs[1], 2.0):
        return p, p.inputs[0]
    if p.op_type == "Mul" and p.inputs[0] == p.inputs[1]:
        return p, p.inputs[0]
    return None


def _rsqrt_denominator(m: Matcher, node: Node) -> tuple[str, str, list[Node]] | None:
    """For ``Div(x, sd)``, ``Mul(x, Reciprocal(sd))`` or ``Mul(x, Div(1, sd))``: ``(x, sd, [extra nodes])``."""
    if node.op_type == "Div" and len(node.inputs) == 2:
        return node.inputs[0], node.inputs[1], []
    if node.op_type == "Mul":
        for a, b in (node.inputs, node.inputs[::-1]):
            rec = m.producer(b, "Reciprocal")
            if rec is not None:
                return a, rec.inputs[0], [rec]
            one_over = m.producer(b, "Div")  # torch.rsqrt as the TorchScript exporter writes it: 1 / sqrt(.)
            if one_over is not None and m.is_scalar(one_over.inputs[0], 1.0):
                return a, one_over.inputs[1], [one_over]
    return None


def _variance(m: Matcher, sd: str, x: str) -> tuple[float, Node, list[Node]] | None:
    """For ``sd = Sqrt(Add(ReduceMean(square(x)), eps))``: ``(eps, mean node, nodes)``."""
    sq = m.producer(sd, "Sqrt")
    add = sq and m.producer(sq.inputs[0], "Add")
    if add is None:
        return None
    for v, e in (add.inputs, add.inputs[::-1]):
        eps, mean = m.scalar(e), m.producer(v, "ReduceMean")
        if eps is None or mean is None:
            continue
        sqr = _square_of(m, mean.inputs[0])
        if sqr is not None and sqr[1] == x:
            return eps, mean, [sq, add, mean, sqr[0]]
    return None


def _affine(
    m: Matcher, y: str, norm_shape: tuple, *, bias: bool
) -> tuple[str, np.ndarray | None, np.ndarray | None, list[Node]]:
    """Absorb a following ``Mul(y, gamma)`` (and ``Add(., beta)``) with constants of the normalised shape."""
    nodes: list[Node] = []
    gamma = beta = None
    mul = m.only_use(y)
    if mul is not None and mul.op_type == "Mul" and mul.domain == "":
        c = m.const(m.other(mul, y) or "")
        if c is not None and _fits(c, norm_shape):
            gamma, y = np.broadcast_to(c, norm_shape).copy(), mul.outputs[0]
            nodes.append(mul)
    add = m.only_use(y) if bias else None
    if add is not None and add.op_type == "Add" and add.domain == "":
        c = m.const(m.other(add, y) or "")
        if c is not None and _fits(c, norm_shape):
            beta, y = np.broadcast_to(c, norm_shape).copy(), add.outputs[0]
            nodes.append(add)
    return y, gamma, beta, nodes


def _fits(c: np.ndarray, norm_shape: tuple) -> bool:
    if c.ndim > len(norm_shape):
        return False
    try:
        return np.broadcast_shapes(c.shape, norm_shape) == norm_shape
    except ValueError:
        return False


def _norm_shape(m: Matcher, x: str, axis: int) -> tuple | None:
    s = m.shape(x)
    if s is None or not all(isinstance(d, int) for d in s[axis:]):
        return None
    return tuple(s[axis:])


def fuse_layer_norm(graph: Graph) -> Graph:
    """Decomposed LayerNorm chains -> ``LayerNormalization(x, gamma, beta, axis, epsilon)``."""
    g = graph.copy()
    done = True
    while done:  # one match per scan: the matcher's maps go stale after a rewrite
        done = False
        m = Matcher(g)
        for node in g.nodes:
            if node.domain != "" or node.op_type not in ("Div", "Mul"):
                continue
            r = _rsqrt_denominator(m, node)
            sub = r and m.producer(r[0], "Sub")
            if sub is None:
                continue
            x, mu = sub.inputs
            mean = m.producer(mu, "ReduceMean")
            if mean is None or mean.inputs[0] != x:
                continue
            var = _variance(m, r[1], sub.outputs[0])
            axis = _trailing_axis(m, mean, x)
            if var is None or axis is None or _trailing_axis(m, var[1], sub.outputs[0]) != axis:
                continue
            norm_shape = _norm_shape(m, x, axis)
            dt = m.dtype(x)
            if norm_shape is None or dt is None:
                continue
            y, gamma, beta, aff = _affine(m, node.outputs[0], norm_shape, bias=True)
            chain = [mean, sub, *var[2], *r[2], node, *aff]
            if not m.internal(chain, y):
                continue
            gname = g.fresh_name(f"{node.name}_gamma")
            g.add_initializer(gname, (gamma if gamma is not None else np.ones(norm_shape)).astype(dt))
            ins = [x, gname]
            if beta is not None:
                bname = g.fresh_name(f"{node.name}_beta")
                g.add_initializer(bname, beta.astype(dt))
                ins.append(bname)
            ln = Node(
                "LayerNormalization",
                ins,
                [y],
                {"axis": axis, "epsilon": var[0]},
                g.fresh_node_name("LayerNorm"),
            )
            replace_nodes(g, chain, [ln])
            done = True
            break
    return g


def fuse_rms_norm(graph: Graph) -> Graph:
    """``x / sqrt(mean(x^2) + eps) (* w)`` -> ``ai.opstrata::RMSNorm(x, w, axis, epsilon)``."""
    g = graph.copy()
    done = True
    while done:
        done = False
        m = Matcher(g)
        for node in g.nodes:
            if node.domain != "" or node.op_type not in ("Div", "Mul"):
                continue
            r = _rsqrt_denominator(m, node)
            if r is None:
                continue
            x = r[0]
            var = _variance(m, r[1], x)
            axis = var and _trailing_axis(m, var[1], x)
            if var is None or axis is None:
                continue
            norm_shape = _norm_shape(m, x, axis)
            dt = m.dtype(x)
            if norm_shape is None or dt is None:
                continue
            y, w, _, aff = _affine(m, node.outputs[0], norm_shape, bias=False)
            chain = [*var[2], *r[2], node, *aff]
            if not m.internal(chain, y):
                continue
            ins = [x]
            if w is not None:
                wname = g.fresh_name(f"{node.name}_weight")
                g.add_initializer(wname, w.astype(dt))
                ins.append(wname)
            rms = Node(
                "RMSNorm",
                ins,
                [y],
                {"axis": axis, "epsilon": var[0]},
                g.fresh_node_name("RMSNorm"),
                OPSTRATA_DOMAIN,
            )
            replace_nodes(g, chain, [rms])
            done = True
            break
    return g
