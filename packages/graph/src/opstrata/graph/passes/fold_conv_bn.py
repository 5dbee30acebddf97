"""Conv + inference BatchNormalization -> one Conv with the normalization folded into its weight and bias
(ONNX Runtime's ConvBNFusion, what torch's exporters do in eval mode): ``w' = w * s``, ``b' = (b - mean) *
s + beta`` with ``s = gamma / sqrt(var + eps)`` per output channel, computed in float64 and stored in the
Conv's dtype. The result differs from the two-step form by rounding only (one multiply fewer).
"""

from __future__ import annotations

import numpy as np

from .._ir import Graph, Node
from .pattern import Matcher, is_onnx, replace_nodes

__all__ = ["fold_conv_batchnorm"]


def fold_conv_batchnorm(graph: Graph) -> Graph:
    """Each Conv (constant weight and bias) whose sole reader is an inference BatchNormalization with
    constant statistics becomes one Conv."""
    g = graph.copy()
    m = Matcher(g)
    for conv in list(g.nodes):
        if not is_onnx(conv, "Conv") or not 2 <= len(conv.inputs) <= 3 or len(conv.outputs) != 1:
            continue
        bn = m.only_use(conv.outputs[0])
        if bn is None or not is_onnx(bn, "BatchNormalization") or bn.attrs.get("training_mode", 0):
            continue
        if len(bn.outputs) != 1 or bn.inputs[0] != conv.outputs[0] or len(bn.inputs) != 5:
            continue
        w = m.const(conv.inputs[1])
        b = m.const(conv.inputs[2]) if len(conv.inputs) == 3 and conv.inputs[2] else None
        stats = [m.const(x) for x in bn.inputs[1:]]
        if w is None or w.dtype.kind != "f" or (len(conv.inputs) == 3 and conv.inputs[2] and b is None):
            continue
        o = w.shape[0]
        if any(s is None or s.shape != (o,) for s in stats):
            continue
        gamma, beta, mean, var = (s.astype(np.float64) for s in stats)  # type: ignore[union-attr]
        scale = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        w2 = (w.astype(np.float64) * scale.reshape(o, *[1] * (w.ndim - 1))).astype(w.dtype)
        b0 = np.zeros(o) if b is None else b.astype(np.float64)
        b2 = ((b0 - mean) * scale + beta).astype(w.dtype)
        wn, bname = g.fresh_name(f"{conv.inputs[1]}_bn"), g.fresh_name(f"{conv.name}_bn_bias")
        g.add_initializer(wn, w2)
        g.add_initializer(bname, b2)
        folded = Node("Conv", [conv.inputs[0], wn, bname], list(bn.outputs), dict(conv.attrs), conv.name)
        replace_nodes(g, [conv, bn], [folded])
        m = Matcher(g)
    return g
