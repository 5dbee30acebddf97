"""FLOP estimates per IR node from its input and output shapes (multiply-add = 2 FLOPs).

Matmul-like ops count 2*M*N*K; conv 2 * output elements * (C_in / groups * kH * kW); attention
4*B*H*N*M*D (scores and the weighted sum); normalisations and softmax ~5 FLOPs per element;
elementwise ops one per output element; data movement (reshape, transpose, gather, ...) zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from opstrata.graph import Node

__all__ = ["node_flops"]

Shape = tuple[int, ...]

_MOVE = frozenset(
    "Reshape Flatten Squeeze Unsqueeze Transpose Concat Split Slice Gather Expand Identity Shape Size "
    "Range ConstantOfShape Cast".split()
)
_PER_ELEM5 = frozenset(
    "LayerNormalization BatchNormalization Softmax LogSoftmax RMSNorm SkipLayerNorm SkipRMSNorm".split()
)


def _numel(s: Shape | None) -> int:
    return math.prod(s) if s is not None else 0


def node_flops(node: Node, ins: Sequence[Shape | None], outs: Sequence[Shape | None]) -> int:
    """Estimated FLOPs of one execution of ``node`` with these concrete shapes."""
    op = node.op_type
    out = _numel(outs[0]) if outs else 0
    if op in _MOVE:
        return 0
    if op == "MatMul" and ins[0]:
        return 2 * out * ins[0][-1]
    if op == "Gemm" and ins[0]:
        k = ins[0][0] if node.attrs.get("transA", 0) else ins[0][-1]
        return 2 * out * k + (out if len(ins) > 2 else 0)
    if op == "Linear" and ins[1]:
        return (
            2 * out * ins[1][1]
            + (out if len(ins) > 2 and ins[2] else 0)
            + (out if node.attrs.get("activation") else 0)
        )
    if op == "Conv" and ins[1]:
        return 2 * out * math.prod(ins[1][1:]) + (out if len(ins) > 2 and ins[2] else 0)
    if op == "FusedConv" and ins[1]:
        bias = out if node.attrs.get("conv_inputs") == 3 else 0
        return 2 * out * math.prod(ins[1][1:]) + bias + out * len(node.attrs.get("expr", ()))
    if op == "Attention" and ins[0] and ins[1] and len(ins[0]) == 4 and len(ins[1]) == 4:  # (B, H, N, D)
        b, h, n, d = ins[0]
        m = ins[1][2]
        return 4 * b * h * n * m * d + 5 * b * h * n * m  # QK^T, PV, softmax
    if op in _PER_ELEM5:
        return 5 * out + (out if op.startswith("Skip") else 0)
    if op == "FusedElementwise":
        return out * len(node.attrs.get("expr", ())) or out
    if op in ("MaxPool", "AveragePool"):
        return out * math.prod(node.attrs.get("kernel_shape") or (1,))
    if op.startswith("Reduce") or op in ("GlobalAveragePool", "GlobalMaxPool", "ArgMax", "CumSum"):
        return _numel(ins[0]) if ins else out
    return out  # elementwise: one per output element
