"""Residual Add + norm -> one node (ONNX Runtime's SkipLayerNormalization): ``y = norm(x + skip)``.

The sum stays available as a second output when later residuals read it (pre-LN transformers).
"""

from __future__ import annotations

from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .._symbolic import dims_equal
from .pattern import Matcher, is_onnx

__all__ = ["fuse_skip_norm"]


def _same_shape(m: Matcher, a: str, b: str) -> bool:
    sa, sb = m.shape(a), m.shape(b)
    return (
        sa is not None and sb is not None and len(sa) == len(sb)
        and all(x is not None and dims_equal(x, y) for x, y in zip(sa, sb, strict=True))
    )  # fmt: skip


def fuse_skip_norm(graph: Graph) -> Graph:
    """``LayerNormalization(Add(x, skip))`` / ``RMSNorm(Add(x, skip))`` -> ``SkipLayerNorm`` / ``SkipRMSNorm``."""
    g = graph.copy()
    m = Matcher(g)
    for node in list(g.nodes):
        is_ln = is_onnx(node, "LayerNormalization") and len(node.outputs) == 1
        is_rms = node.domain == OPSTRATA_DOMAIN and node.op_type == "RMSNorm"
        if not (is_ln or is_rms):
            continue
        add = m.producer(node.inputs[0], "Add")
        if add is None or any(x in g.initializers for x in add.inputs) or not _same_shape(m, *add.inputs):
            continue
        s = add.outputs[0]
        others = [c for c in m.uses(s) if c is not node] or s in g.outputs
        outs = [node.outputs[0]] + ([s] if others else [])
        op = "SkipLayerNorm" if is_ln else "SkipRMSNorm"
        attrs = {
            "axis": node.attrs.get("axis", -1),
            "epsilon": node.attrs.get("epsilon", 1e-5 if is_ln else 1e-6),
        }
        fused = Node(op, [*add.inputs, *node.inputs[1:]], outs, attrs, g.fresh_node_name(op), OPSTRATA_DOMAIN)
        # the fused node stands where the Add stood, so later readers of the sum still follow it;
        # a gamma/beta computed between the Add and the norm puts it at the norm instead (if still valid)
        late = any(
            p is not None and g.nodes.index(p) > g.nodes.index(add)
            for p in (m.prod.get(x) for x in node.inputs[1:] if x)
        )
        if late and any(c is not node and g.nodes.index(c) < g.nodes.index(node) for c in m.uses(s)):
            continue
        anchor = node if late else add
        g.record_fusion([add if late else node], [fused])
        g.nodes.remove(add if late else node)
        g.replace_node(anchor, [fused])
        m = Matcher(g)
    return g
