"""Rotary embedding as exporters write it -> one ``ai.opstrata::RotaryHalf`` node.

Llama / GPT-NeoX code applies RoPE as ``x * cos + rotate_half(x) * sin`` with
``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])``; torch.onnx exports that as two Slices, a Neg, a
Concat, two Muls and an Add per query / key tensor (seven nodes, each a pass over the head tensor).
The fused node computes exactly that expression (no assumption that cos's halves agree), so its result
is the graph's to the bit.
"""

from __future__ import annotations

import numpy as np

from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .pattern import Matcher, is_onnx, replace_nodes

__all__ = ["fuse_rotary"]

_INT64_MAX = np.iinfo(np.int64).max


def _slice_of(m: Matcher, name: str) -> tuple[str, int, int] | None:
    """``(x, start, end)`` when ``name`` is ``Slice(x)`` over the last axis with step 1 (end clipped to
    the last dim; constant starts/ends/axes)."""
    n = m.producer(name, "Slice")
    if n is None or len(n.inputs) < 4 or m.only_use(name) is None:
        return None
    x = n.inputs[0]
    shape = m.shape(x)
    if shape is None or not shape or not isinstance(shape[-1], int):
        return None
    consts = [m.const(c) if c else None for c in n.inputs[1:5]]
    starts, ends, axes = consts[:3]
    steps = consts[3] if len(consts) > 3 else None
    if any(c is None or c.size != 1 for c in (starts, ends, axes)) or (steps is not None and steps.size != 1):
        return None
    if int(axes.ravel()[0]) not in (-1, len(shape) - 1) or (steps is not None and int(steps.ravel()[0]) != 1):
        return None
    d = shape[-1]
    start, end = int(starts.ravel()[0]), int(ends.ravel()[0])
    start, end = (start + d if start < 0 else start), (end + d if end < 0 else min(end, d, _INT64_MAX))
    return x, start, end


def _rotate_half_of(m: Matcher, name: str) -> tuple[str, list[Node]] | None:
    """``(x, nodes)`` when ``name`` is ``Concat(Neg(x[..., h:]), x[..., :h], axis=-1)`` with D = 2h."""
    cat = m.producer(name, "Concat")
    if cat is None or len(cat.inputs) != 2 or m.only_use(name) is None:
        return None
    neg = m.producer(cat.inputs[0], "Neg")
    if neg is None or m.only_use(cat.inputs[0]) is None:
        return None
    hi, lo = _slice_of(m, neg.inputs[0]), _slice_of(m, cat.inputs[1])
    if hi is None or lo is None or hi[0] != lo[0]:
        return None
    x = hi[0]
    d = m.shape(x)[-1]  # type: ignore[index]
    if int(cat.attrs.get("axis", 0)) not in (-1, len(m.shape(x)) - 1) or d % 2:  # type: ignore[arg-type]
        return None
    if (lo[1], lo[2], hi[1], hi[2]) != (0, d // 2, d // 2, d):
        return None
    return x, [m.prod[cat.inputs[1]], m.prod[neg.inputs[0]], neg, cat]


def _broadcasts_to(m: Matcher, t: str, x: str) -> bool:
    st, sx = m.shape(t), m.shape(x)
    if st is None or sx is None or len(st) > len(sx):
        return False
    return all(a == 1 or a == b for a, b in zip(st[::-1], sx[::-1], strict=False))


def fuse_rotary(graph: Graph) -> Graph:
    """``Add(Mul(x, cos), Mul(rotate_half(x), sin))`` -> ``RotaryHalf(x, cos, sin)`` (either operand order)."""
    g = graph.copy()
    m = Matcher(g)
    for add in list(g.nodes):
        if not is_onnx(add, "Add") or len(add.inputs) != 2:
            continue
        for i in (0, 1):
            a, b = m.producer(add.inputs[i], "Mul"), m.producer(add.inputs[1 - i], "Mul")
            if a is None or b is None or a is b:
                continue
            if m.only_use(add.inputs[i]) is None or m.only_use(add.inputs[1 - i]) is None:
                continue
            found = None
            for j in (0, 1):  # b = rotate_half(x) * sin
                rot = _rotate_half_of(m, b.inputs[j])
                if rot is not None:
                    found = rot, b.inputs[1 - j]
                    break
            if found is None:
                continue
            (x, rot_nodes), sin = found
            if x not in a.inputs:
                continue
            cos = a.inputs[1] if a.inputs[0] == x else a.inputs[0]
            dts = {m.dtype(v) for v in (x, cos, sin)}
            if len(dts) != 1 or None in dts or not all(_broadcasts_to(m, t, x) for t in (cos, sin)):
                continue
            if not np.issubdtype(next(iter(dts)), np.floating):  # type: ignore[arg-type]
                continue
            old = [*rot_nodes, a, b, add]
            if not m.internal(old, add.outputs[0]):
                continue
            fused = Node(
                "RotaryHalf",
                [x, cos, sin],
                [add.outputs[0]],
                {},
                g.fresh_node_name("RotaryHalf"),
                OPSTRATA_DOMAIN,
            )
            replace_nodes(g, old, [fused])
            m = Matcher(g)
            break
    return g
