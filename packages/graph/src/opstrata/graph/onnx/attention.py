"""ONNX ``Attention``'s causal alignment on import: top-left in ONNX, bottom-right in opstrata.

Without a KV cache, ONNX ``is_causal`` lets query i see keys ``j <= i``; ``ai.opstrata::Attention``
(``causal=1``) lets it see ``j <= i + M - N`` (the decode-step convention). They agree when the query
and key lengths are provably equal; otherwise the import spells ONNX's mask out explicitly.
"""

from __future__ import annotations

import numpy as np

from .._ir import Graph, Node
from .._symbolic import dims_equal

__all__ = ["CAUSAL_TOP_LEFT", "resolve_causal"]

#: Attribute the importer sets on an Attention node whose ``causal=1`` came from ONNX ``is_causal``.
CAUSAL_TOP_LEFT = "_onnx_causal_top_left"


def _top_left_mask(g: Graph, node: Node) -> list[Node]:
    """Nodes computing ``keep[i, j] = j <= i`` (N, M) bool, combined with the node's own mask."""
    q, k = node.inputs[0], node.inputs[1]
    base = f"{node.name}/causal"
    zero, one = g.fresh_name(f"{base}_zero"), g.fresh_name(f"{base}_one")
    g.add_initializer(zero, np.array(0, np.int64))
    g.add_initializer(one, np.array(1, np.int64))
    names = {h: g.fresh_name(f"{base}_{h}") for h in "n1 m1 n m rows rows_col cols keep".split()}
    n = names
    new = [
        Node("Shape", [q], [n["n1"]], {"start": -2, "end": -1}, f"{base}/q_len"),
        Node("Shape", [k], [n["m1"]], {"start": -2, "end": -1}, f"{base}/k_len"),
        Node("Squeeze", [n["n1"]], [n["n"]], {"axes": [0]}, f"{base}/n"),
        Node("Squeeze", [n["m1"]], [n["m"]], {"axes": [0]}, f"{base}/m"),
        Node("Range", [zero, n["n"], one], [n["rows"]], {}, f"{base}/rows"),
        Node("Unsqueeze", [n["rows"]], [n["rows_col"]], {"axes": [1]}, f"{base}/rows_col"),
        Node("Range", [zero, n["m"], one], [n["cols"]], {}, f"{base}/cols"),
        Node("LessOrEqual", [n["cols"], n["rows_col"]], [n["keep"]], {}, f"{base}/keep"),
    ]
    mask = node.inputs[3] if len(node.inputs) > 3 else ""
    if not mask:
        node.inputs = [*node.inputs[:3], n["keep"]]
        return new
    out = g.fresh_name(f"{base}_mask")
    if g.values[mask].dtype == np.dtype(bool):
        new.append(Node("And", [mask, n["keep"]], [out], {}, f"{base}/and"))
    else:
        ninf = g.fresh_name(f"{base}_neg_inf")
        g.add_initializer(ninf, np.array(-np.inf, g.values[mask].dtype))
        new.append(Node("Where", [n["keep"], mask, ninf], [out], {}, f"{base}/where"))
    node.inputs = [*node.inputs[:3], out]
    return new


def resolve_causal(g: Graph) -> None:
    """Keep ``causal=1`` where N == M provably, else replace it by ONNX's explicit top-left mask (shapes inferred)."""
    for node in [n for n in g.nodes if CAUSAL_TOP_LEFT in n.attrs]:
        del node.attrs[CAUSAL_TOP_LEFT]
        q, k = (g.values[x].shape for x in node.inputs[:2])
        if q is not None and k is not None and len(q) == len(k) == 4 and dims_equal(q[2], k[2]):
            continue
        node.attrs["causal"] = 0
        g.replace_node(node, [*_top_left_mask(g, node), node])
