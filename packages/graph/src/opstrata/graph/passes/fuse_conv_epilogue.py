"""Conv + the elementwise work on its result -> one ``ai.opstrata::FusedConv`` (ONNX Runtime's FusedConv,
cuDNN's convolution-bias-activation): the activation (Relu, HardSwish, HardSigmoid, Clip, SiLU's
``x * sigmoid(x)``, ...) and a residual add run over the convolution's output in place while it is still
in cache, one step instead of two and no second buffer.

Runs after ``fuse_elementwise``: the epilogue is the Conv's sole reader when that is a FusedElementwise
chain or a single fusable elementwise node, and the result keeps the convolution's shape and dtype
(extra inputs broadcast to it). In the epilogue's expression ``x0`` is the convolution's result and
``x<i>`` the node's ``i``-th input after the Conv's own (``conv_inputs`` of them).
"""

from __future__ import annotations

from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .fuse_elementwise import _expression, _fusible
from .pattern import Matcher, is_onnx, replace_nodes

__all__ = ["fuse_conv_epilogue"]


def _epilogue(m: Matcher, user: Node, y: str) -> tuple[list[str], list[list], list[float]] | None:
    """The user's (inputs, steps, consts), or None when it is no elementwise epilogue of ``y``."""
    if user.domain == OPSTRATA_DOMAIN and user.op_type == "FusedElementwise":
        return list(user.inputs), [list(s) for s in user.attrs["expr"]], list(user.attrs.get("consts") or [])
    if _fusible(m, user):
        inputs, steps, consts, _ = _expression(m, [user])
        return inputs, steps, consts
    return None


def _remap(steps: list[list], inputs: list[str], y: str) -> tuple[list[list], list[str]]:
    """Refs renumbered so ``x0`` is ``y`` and the other inputs follow in order; returns (steps, extras)."""
    extras = [x for x in inputs if x != y]
    new = {f"x{i}": ("x0" if x == y else f"x{1 + extras.index(x)}") for i, x in enumerate(inputs)}
    return [[op, [new.get(r, r) for r in refs]] for op, refs in steps], extras


def fuse_conv_epilogue(graph: Graph) -> Graph:
    """Each float Conv whose sole reader is an elementwise epilogue of the same shape -> one FusedConv."""
    g = graph.copy()
    m = Matcher(g)
    for conv in list(g.nodes):
        if not is_onnx(conv, "Conv") or len(conv.outputs) != 1 or not 2 <= len(conv.inputs) <= 3:
            continue
        y = conv.outputs[0]
        dt, shape = m.dtype(y), m.shape(y)
        user = m.only_use(y)
        if user is None or dt is None or dt.kind != "f" or shape is None or len(user.outputs) != 1:
            continue
        epi = _epilogue(m, user, y)
        out = user.outputs[0]
        if epi is None or y not in epi[0] or m.shape(out) != shape or m.dtype(out) != dt:
            continue
        inputs, steps, consts = epi
        steps, extras = _remap(steps, inputs, y)
        conv_inputs = list(conv.inputs)
        if not conv_inputs[-1]:
            conv_inputs.pop()  # an absent bias
        if not all(conv_inputs):
            continue
        attrs = {**conv.attrs, "conv_inputs": len(conv_inputs), "expr": steps}
        if consts:
            attrs["consts"] = consts
        fused = Node(
            "FusedConv",
            [*conv_inputs, *extras],
            [out],
            attrs,
            g.fresh_node_name("FusedConv"),
            OPSTRATA_DOMAIN,
        )
        replace_nodes(g, [conv, user], [fused])
        m = Matcher(g)
    return g
