"""Attention subgraph -> ``ai.opstrata::Attention`` (scaled dot-product attention, Vaswani et al. 2017).

Matches ``MatMul(Softmax(mask(scale(MatMul(q, kT)))), v)`` with, in the variants torch exports:
scale as ``Mul`` or ``Div`` by a constant (absent = 1.0); an additive float mask ``Add``; a
boolean ``Where(cond, -inf, s)`` / ``Where(keep, s, -inf)``; and causal masks built from
``Trilu`` over a ``(seq, seq)`` tensor (``Equal(Trilu(ones, upper=0), 0)``, ``Trilu(ones, upper=1, k=1)``,
``Not``/``Cast`` of those), which become ``causal=1``. ``kT`` given as a ``Transpose`` is undone.
"""

from __future__ import annotations

import numpy as np

from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .._symbolic import dims_equal
from .pattern import Matcher, replace_nodes

__all__ = ["fuse_attention"]

_NEG = -1e4  # a fill value at or below this is "masked" (torch uses -inf or finfo.min)


def _triangle(m: Matcher, name: str, depth: int = 0) -> tuple[str, list[Node]] | None:
    """``("keep", nodes)`` if ``name`` is nonzero exactly on/below the diagonal, ``("drop", nodes)`` above it."""
    n = m.prod.get(name)
    if n is None or n.domain != "" or depth > 4:
        return None
    if n.op_type == "Trilu":
        src = m.producer(n.inputs[0], "ConstantOfShape", "Expand")
        k = m.scalar(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else 0.0
        if src is not None and src.op_type == "Expand":  # torch's SDPA export: Expand(1.0, (L, S))
            val = m.const(src.inputs[0])
        else:
            val = src.attrs.get("value") if src is not None else None
        ones = val is not None and bool((val != 0).all())
        if not ones and (c := m.const(n.inputs[0])) is not None:
            ones = bool((c != 0).all())
        if not ones or k is None:
            return None
        extra = [src] if src is not None else []
        if n.attrs.get("upper", 1) == 0 and k == 0:
            return "keep", [n, *extra]
        if n.attrs.get("upper", 1) == 1 and k == 1:
            return "drop", [n, *extra]
        return None
    flip = {"keep": "drop", "drop": "keep"}
    if n.op_type == "Equal":
        for a, b in (n.inputs, n.inputs[::-1]):
            if m.is_scalar(b, 0.0) and (t := _triangle(m, a, depth + 1)) is not None:
                return flip[t[0]], [n, *t[1]]
    if n.op_type == "Not" and (t := _triangle(m, n.inputs[0], depth + 1)) is not None:
        return flip[t[0]], [n, *t[1]]
    if n.op_type == "Cast" and (t := _triangle(m, n.inputs[0], depth + 1)) is not None:
        return t[0], [n, *t[1]]
    return None


def _mask_ops(m: Matcher, s: str) -> tuple[str, dict, list[Node]] | None:
    """Walk back from the Softmax input over masks and scale to ``(raw scores, attrs + mask, nodes)``."""
    info: dict = {"causal": 0, "scale": None, "mask": None}
    nodes: list[Node] = []
    while True:
        n = m.prod.get(s)
        if n is None or n.domain != "":
            break
        if n.op_type == "Where" and info["scale"] is None and not info["causal"]:
            cond, a, b = n.inputs
            if (m.scalar(a) or 0) <= _NEG and m.scalar(a) is not None:
                tri, nxt = _triangle(m, cond), b
                want = "drop"
            elif (m.scalar(b) or 0) <= _NEG and m.scalar(b) is not None:
                tri, nxt = _triangle(m, cond), a
                want = "keep"
            else:
                break
            if tri is None or tri[0] != want or not _square_on_scores(m, cond, nxt):
                break
            info["causal"] = 1
            nodes += [n]
            s = nxt
        elif n.op_type == "Add" and info["scale"] is None:
            for a, b in (n.inputs, n.inputs[::-1]):
                same = _same(m.shape(a), m.shape(n.outputs[0]))  # the mask must not broadcast the scores up
                if not (same and _is_scores(m, a) and m.dtype(b) is not None and m.dtype(b).kind == "f"):
                    continue
                kind, mask = _additive(m, b, a)
                if kind == "causal" and not info["causal"]:
                    info["causal"] = 1
                elif kind != "causal" and info["mask"] is None:
                    info["mask"] = mask
                else:
                    continue
                s = a
                nodes.append(n)
                break
            else:
                break
        elif n.op_type in ("Mul", "Div") and info["scale"] is None:
            k = m.scalar(n.inputs[1])
            if k is None and n.op_type == "Mul":
                k, s_in = m.scalar(n.inputs[0]), n.inputs[1]
            else:
                s_in = n.inputs[0]
            if k is None or k == 0:
                break
            info["scale"] = k if n.op_type == "Mul" else 1.0 / k
            nodes.append(n)
            s = s_in
        else:
            break
    return s, info, nodes


def _additive(m: Matcher, mask: str, scores: str) -> tuple[str, str]:
    """How an additive mask reads: ``("causal", "")``, ``("bool", keep)`` or ``("float", mask)``.

    torch's ``scaled_dot_product_attention`` export writes ``Where(cond, 0, -inf)`` for a boolean
    mask and ``Where(Equal(Trilu(ones), 0), -inf, 0)`` for ``is_causal``.
    """
    w = m.producer(mask, "Where")
    if w is None:
        return "float", mask
    cond, a, b = w.inputs
    va, vb = m.scalar(a), m.scalar(b)
    if va is None or vb is None:
        return "float", mask
    if va <= _NEG and vb == 0:
        want = "drop"
    elif va == 0 and vb <= _NEG:
        want = "keep"
    else:
        return "float", mask
    tri = _triangle(m, cond)
    if tri is not None and tri[0] == want and _square_on_scores(m, cond, scores):
        return "causal", ""
    if want == "keep" and m.dtype(cond) == np.dtype(bool) and va == 0 and vb == -np.inf:
        return "bool", cond
    return "float", mask


def _prescaled(m: Matcher, name: str) -> tuple[str, float, Node] | None:
    """``(x, c, node)`` when ``name`` is ``Mul(x, c)`` with a scalar constant ``c``."""
    p = m.producer(name, "Mul")
    if p is None:
        return None
    for x, c in (p.inputs, p.inputs[::-1]):
        k = m.scalar(c)
        if k is not None and len(m.shape(x) or ()) == 4:
            return x, k, p
    return None


def _same(a: tuple | None, b: tuple | None) -> bool:
    return (
        a is not None
        and b is not None
        and len(a) == len(b)
        and all(x is not None and dims_equal(x, y) for x, y in zip(a, b, strict=True))
    )


def _is_scores(m: Matcher, name: str) -> bool:
    """``name`` traces back (through scale/mask ops) to a rank-4 MatMul."""
    for _ in range(4):
        n = m.prod.get(name)
        if n is None or n.domain != "":
            return False
        if n.op_type == "MatMul":
            return len(m.shape(name) or ()) == 4
        if n.op_type not in ("Mul", "Div", "Add", "Where"):
            return False
        name = n.inputs[2] if n.op_type == "Where" else n.inputs[0]
    return False


def _square_on_scores(m: Matcher, mask: str, scores: str) -> bool:
    """The causal mask is (N, M) with N == M for the scores (so top-left and bottom-right agree)."""
    ms, ss = m.shape(mask), m.shape(scores)
    if ms is None or ss is None or len(ms) < 2 or len(ss) != 4:
        return False
    return all(
        dims_equal(a, b) and a is not None for a, b in ((ms[-2], ss[2]), (ms[-1], ss[3]), (ss[2], ss[3]))
    )


def _untranspose_k(g: Graph, m: Matcher, kt: str, new: list[Node]) -> tuple[str, Node | None]:
    """``k`` (B, H, M, D) given ``kT`` (B, H, D, M): undo a Transpose, else insert one."""
    t = m.producer(kt, "Transpose")
    if t is not None and len(t.attrs.get("perm") or []) == 4:
        p = list(t.attrs["perm"])
        p[2], p[3] = p[3], p[2]
        if p == [0, 1, 2, 3]:
            return t.inputs[0], t
        name = g.fresh_name(f"{t.name}_k")
        new.append(Node("Transpose", [t.inputs[0]], [name], {"perm": p}, g.fresh_node_name("Transpose")))
        return name, t
    name = g.fresh_name(f"{kt}_k")
    new.append(Node("Transpose", [kt], [name], {"perm": [0, 1, 3, 2]}, g.fresh_node_name("Transpose")))
    return name, None


def fuse_attention(graph: Graph) -> Graph:
    """``MatMul(Softmax(mask(scale(q @ kT))), v)`` -> ``ai.opstrata::Attention(q, k, v, mask?)``."""
    g = graph.copy()
    done = True
    while done:
        done = False
        m = Matcher(g)
        for sm in g.nodes:
            if sm.domain != "" or sm.op_type != "Softmax" or len(m.shape(sm.outputs[0]) or ()) != 4:
                continue
            if sm.attrs.get("axis", -1) not in (-1, 3):
                continue
            pv = m.only_use(sm.outputs[0])
            if pv is None or pv.op_type != "MatMul" or pv.domain != "" or pv.inputs[0] != sm.outputs[0]:
                continue
            raw, info, mask_nodes = _mask_ops(m, sm.inputs[0])
            qk = m.producer(raw, "MatMul")
            v = pv.inputs[1]
            if qk is None or len(m.shape(qk.inputs[0]) or ()) != 4 or len(m.shape(v) or ()) != 4:
                continue
            q_in, kt_in, pre = qk.inputs[0], qk.inputs[1], []
            if info["scale"] is None:  # torch's SDPA export scales q and kT by sqrt(scale) each
                sq, sk = _prescaled(m, q_in), _prescaled(m, kt_in)
                if sq is not None and sk is not None:
                    info["scale"] = sq[1] * sk[1]
                    q_in, kt_in, pre = sq[0], sk[0], [sq[2], sk[2]]
            qs, kts, vs = m.shape(q_in), m.shape(kt_in), m.shape(v)
            if not (kts and _same(qs[:2], kts[:2]) and _same(qs[:2], vs[:2]) and _same(kts[3:], vs[2:3])):  # type: ignore[index]
                continue  # MatMul broadcasting over (B, H) that Attention does not do
            new: list[Node] = []
            k, kt_node = _untranspose_k(g, m, kt_in, new)
            chain = [*pre, qk, *mask_nodes, sm, pv]
            if kt_node is not None and m.only_use(kt_node.outputs[0]) in (qk, *pre):
                chain.insert(0, kt_node)
            if not m.internal(chain, pv.outputs[0]):
                continue
            ins = [q_in, k, v] + ([info["mask"]] if info["mask"] else [])
            attrs = {
                "causal": info["causal"],
                "scale": 1.0 if info["scale"] is None else float(info["scale"]),
            }
            new.append(
                Node(
                    "Attention", ins, [pv.outputs[0]], attrs, g.fresh_node_name("Attention"), OPSTRATA_DOMAIN
                )
            )
            replace_nodes(g, chain, new)
            done = True
            break
    return g
