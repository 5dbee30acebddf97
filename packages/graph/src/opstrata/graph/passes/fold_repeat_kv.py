"""Grouped-query attention's ``repeat_kv`` folded into the attention node.

Llama-family code repeats each key / value head ``rep`` times before attention
(``k[:, :, None].expand(B, Hkv, rep, N, D).reshape(B, Hkv * rep, N, D)``), which torch.onnx exports as
Unsqueeze -> Expand -> Reshape: two full copies of K and V per layer. ``ai.opstrata::Attention`` takes
``Hkv < H`` key / value heads itself (query head ``h`` reads kv head ``h // rep``, the same pairing), so
the chain's input goes straight in. Both K and V fold, or neither (the kernel needs them alike).
"""

from __future__ import annotations

from .._ir import OPSTRATA_DOMAIN, Graph
from .._symbolic import dims_equal
from .pattern import Matcher

__all__ = ["fold_repeat_kv"]


def _repeated(m: Matcher, name: str) -> str | None:
    """``k`` when ``name`` is ``Reshape(Expand(Unsqueeze(k, [2])), (B, Hkv * rep, N, D))`` of a 4-D ``k``
    (shapes from inference: the Expand only replicates the new axis)."""
    resh = m.producer(name, "Reshape")
    exp = m.producer(resh.inputs[0], "Expand") if resh is not None else None
    unsq = m.producer(exp.inputs[0], "Unsqueeze") if exp is not None else None
    if unsq is None:
        return None
    axes = unsq.attrs.get("axes")
    if axes is None and len(unsq.inputs) > 1:
        c = m.const(unsq.inputs[1])
        axes = None if c is None else [int(a) for a in c.ravel()]
    k = unsq.inputs[0]
    sk, su, se, sr = (m.shape(v) for v in (k, unsq.outputs[0], exp.outputs[0], resh.outputs[0]))  # type: ignore[union-attr]
    if axes not in ([2], [-3]) or any(s is None for s in (sk, su, se, sr)):
        return None
    if len(sk) != 4 or len(se) != 5 or len(sr) != 4:  # type: ignore[arg-type]
        return None
    hkv, rep, h = sk[1], se[2], sr[1]  # type: ignore[index]
    if not all(isinstance(v, int) for v in (hkv, rep, h)) or h != hkv * rep or se[1] != hkv:  # type: ignore[index]
        return None
    same = [(sk[0], se[0]), (sk[0], sr[0]), (sk[2], se[3]), (sk[2], sr[2]), (sk[3], se[4]), (sk[3], sr[3])]  # type: ignore[index]
    return k if all(a is not None and b is not None and dims_equal(a, b) for a, b in same) else None


def _drop_unread(g: Graph, names: list[str]) -> None:
    """Remove the producers of ``names`` (and upstream, along the chain) that nothing reads any more."""
    while names:
        cons, prod = g.consumers(), g.producers()
        name = names.pop()
        n = prod.get(name)
        if n is None or cons.get(name) or name in g.outputs or any(cons.get(o) for o in n.outputs if o):
            continue
        g.nodes.remove(n)
        for o in n.outputs:
            g.values.pop(o, None)
        names.extend(i for i in n.inputs[:1] if i)


def fold_repeat_kv(graph: Graph) -> Graph:
    """``Attention(q, repeat_kv(k), repeat_kv(v), ...)`` -> ``Attention(q, k, v, ...)``; the repeat
    chains go when nothing else reads them."""
    g = graph.copy()
    m = Matcher(g)
    for node in g.nodes:
        if node.domain != OPSTRATA_DOMAIN or node.op_type != "Attention" or len(node.inputs) < 3:
            continue
        if node.attrs.get("bshd"):  # heads on axis 2: not the (B, H, N, D) chain matched here
            continue
        k, v = _repeated(m, node.inputs[1]), _repeated(m, node.inputs[2])
        if k is None or v is None:
            continue
        sk, sv = m.shape(k), m.shape(v)
        if sk is None or sv is None or sk[1] != sv[1]:
            continue
        old = node.inputs[1:3]
        node.inputs[1], node.inputs[2] = k, v
        _drop_unread(g, list(old))
        m = Matcher(g)
    return g
