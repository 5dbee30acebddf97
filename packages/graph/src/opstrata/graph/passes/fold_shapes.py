"""Shape-subgraph folding: shape tensors whose contents shape inference knows become constants.

``Shape -> Gather -> Concat -> Reshape`` chains, as torch exports them, fold away: fully static
contents become an initializer; a Reshape target whose symbolic entries repeat the input's own
dims at the same position becomes a constant with ONNX's ``0`` (copy the dim) and one ``-1``.
"""

from __future__ import annotations

import numpy as np

from .._ir import Graph
from .._shape_infer import _MAX_KNOWN, _propagate, infer_shapes
from .._symbolic import Dim, dims_equal
from .pattern import is_onnx

__all__ = ["fold_shapes", "known_shape_tensors"]


def known_shape_tensors(graph: Graph) -> dict[str, tuple[Dim, ...]]:
    """Value name -> known (possibly symbolic) contents of every small int tensor (after infer_shapes)."""
    known: dict[str, tuple[Dim, ...]] = {}
    for name, arr in graph.initializers.items():
        if arr.dtype.kind in "iu" and arr.ndim <= 1 and arr.size <= _MAX_KNOWN:
            known[name] = tuple(int(v) for v in arr.ravel())
    for node in graph.nodes:
        _propagate(node, graph, known)
    return known


def _reshape_target(data_shape: tuple | None, target: tuple[Dim, ...]) -> list[int] | None:
    """Constant Reshape target equivalent to symbolic ``target`` (0 = copy dim, one -1), else None."""
    out: list[int] = []
    for i, t in enumerate(target):
        if isinstance(t, int):
            if t == 0 or t == -1:
                return None  # literal copy / infer markers: leave the model's own logic alone
            out.append(t)
        elif data_shape is not None and i < len(data_shape) and dims_equal(t, data_shape[i]):
            out.append(0)
        else:
            out.append(-1)
    return out if out.count(-1) <= 1 else None


def fold_shapes(graph: Graph) -> Graph:
    """Make statically known shape tensors initializers and symbolic Reshape targets constants."""
    g = graph.copy()
    infer_shapes(g)
    known = known_shape_tensors(g)
    for node in list(g.nodes):
        outs = [o for o in node.outputs if o]
        if len(outs) == 1 and outs[0] not in g.initializers and outs[0] in known:
            vals = known[outs[0]]
            v = g.values[outs[0]]
            if all(isinstance(d, int) for d in vals) and v.dtype is not None and v.shape is not None:
                arr = np.array(vals, v.dtype).reshape([len(vals)] if v.shape else [])
                g.remove_node(node, drop_values=False)
                g.add_initializer(outs[0], arr)
                g.folded.add(outs[0])
                continue
        if is_onnx(node, "Reshape") and not node.attrs.get("allowzero", 0):
            tgt = node.inputs[1]
            if tgt in g.initializers or tgt not in known:
                continue
            const = _reshape_target(g.values[node.inputs[0]].shape, known[tgt])
            if const is not None:
                name = g.fresh_name(f"{node.name}_shape")
                g.add_initializer(name, np.array(const, np.int64))
                node.inputs[1] = name
    return g
