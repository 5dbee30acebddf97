"""Conv + inference BatchNormalization -> one Conv with the normalization folded into its weight and bias
(ONNX Runtime's ConvBNFusion, what torch's exporters do in eval mode): ``w' = w * s``, ``b' = (b - mean) *
s + beta`` with ``s = gamma / sqrt(var + eps)`` per output channel, computed in float64 and stored in the
Conv's dtype. The result differs from the two-step form by rounding only (one multiply fewer).

A BatchNormalization with no Conv to fold into (DenseNet's pre-activation normalization of a Concat,
a normalization after a pooling) becomes ``Mul(x, s) + t`` with ``t = beta - mean * s`` per channel, as
ONNX Runtime's kernel computes it: two elementwise nodes that the elementwise fusion joins with the
activation after them into one pass over the tensor.
"""

from __future__ import annotations

import numpy as np

from .._ir import Graph, Node, Value
from .pattern import Matcher, is_onnx, replace_nodes

__all__ = ["batchnorm_to_affine", "fold_conv_batchnorm"]


def _inference_bn(m: Matcher, bn: Node) -> list[np.ndarray] | None:
    """gamma, beta, mean, var of an inference BatchNormalization with one output and constant (C,)
    statistics; None for any other node."""
    if not is_onnx(bn, "BatchNormalization") or bn.attrs.get("training_mode", 0):
        return None
    if len(bn.outputs) != 1 or len(bn.inputs) != 5:
        return None
    stats = [m.const(x) for x in bn.inputs[1:]]
    if any(s is None or s.ndim != 1 or s.dtype.kind != "f" for s in stats):
        return None
    c = stats[0].shape[0]  # type: ignore[union-attr]
    if any(s.shape != (c,) for s in stats):  # type: ignore[union-attr]
        return None
    return stats  # type: ignore[return-value]


def _scale(bn: Node, stats: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(s, beta, mean) in float64, ``s = gamma / sqrt(var + eps)`` per channel."""
    gamma, beta, mean, var = (x.astype(np.float64) for x in stats)
    return gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5))), beta, mean


def fold_conv_batchnorm(graph: Graph) -> Graph:
    """Each Conv (constant weight and bias) whose sole reader is an inference BatchNormalization with
    constant statistics becomes one Conv."""
    g = graph.copy()
    m = Matcher(g)
    for conv in list(g.nodes):
        if not is_onnx(conv, "Conv") or not 2 <= len(conv.inputs) <= 3 or len(conv.outputs) != 1:
            continue
        bn = m.only_use(conv.outputs[0])
        stats = _inference_bn(m, bn) if bn is not None and bn.inputs[0] == conv.outputs[0] else None
        if bn is None or stats is None:
            continue
        w = m.const(conv.inputs[1])
        b = m.const(conv.inputs[2]) if len(conv.inputs) == 3 and conv.inputs[2] else None
        if w is None or w.dtype.kind != "f" or (len(conv.inputs) == 3 and conv.inputs[2] and b is None):
            continue
        o = w.shape[0]
        if stats[0].shape != (o,):
            continue
        scale, beta, mean = _scale(bn, stats)
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


def batchnorm_to_affine(graph: Graph) -> Graph:
    """Each inference BatchNormalization left (constant statistics, input of known rank >= 2 and C
    channels) becomes ``Add(Mul(x, s), t)`` with per-channel constants of x's dtype, shaped (C, 1, ...)
    to broadcast over the spatial axes."""
    g = graph.copy()
    m = Matcher(g)
    for bn in list(g.nodes):
        stats = _inference_bn(m, bn)
        shape = m.shape(bn.inputs[0]) if stats is not None else None
        if stats is None or shape is None or len(shape) < 2 or shape[1] != stats[0].shape[0]:
            continue
        dtype = g.values[bn.inputs[0]].dtype if bn.inputs[0] in g.values else None
        if dtype is None or np.dtype(dtype).kind != "f":
            continue
        scale, beta, mean = _scale(bn, stats)
        bcast = (stats[0].shape[0], *[1] * (len(shape) - 2))
        s_name, t_name = g.fresh_name(f"{bn.name}_scale"), g.fresh_name(f"{bn.name}_shift")
        g.add_initializer(s_name, scale.reshape(bcast).astype(dtype))
        g.add_initializer(t_name, (beta - mean * scale).reshape(bcast).astype(dtype))
        scaled = g.fresh_name(f"{bn.outputs[0]}_scaled")
        mul = Node("Mul", [bn.inputs[0], s_name], [scaled], {}, g.fresh_node_name(f"{bn.name}_mul"))
        add = Node("Add", [scaled, t_name], list(bn.outputs), {}, g.fresh_node_name(f"{bn.name}_add"))
        g.replace_node(bn, [mul, add])
        g.values[scaled] = Value(scaled, dtype, shape)
        m = Matcher(g)
    return g
