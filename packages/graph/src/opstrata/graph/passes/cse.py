"""Common subexpression elimination: nodes with the same op, attrs and inputs compute once.

Also merges initializers with equal dtype, shape and bytes, so that duplicated constants (the
``[0, 1]`` index tensors each reshape of an export carries) make their users equal too.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .._ir import Graph, Node
from ..opdefs import registry

__all__ = ["eliminate_common_subexpressions"]


def _key(node: Node) -> tuple:
    return (node.domain, node.op_type, tuple(node.inputs), len(node.outputs), _freeze(node.attrs))


def _freeze(v: object) -> object:
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.ndarray):
        return ("array", str(v.dtype), v.shape, v.tobytes())
    if isinstance(v, np.dtype):
        return ("dtype", str(v))
    if isinstance(v, Graph):  # a control-flow body: nodes with different bodies never merge
        return ("graph", id(v))
    return v


def _merge_initializers(g: Graph) -> None:
    seen: dict[tuple, str] = {}
    for name, arr in list(g.initializers.items()):
        if name in g.outputs or arr.nbytes > 1 << 16:  # small constants only: hashing weights costs time
            continue
        key = (str(arr.dtype), arr.shape, hashlib.sha1(arr.tobytes()).hexdigest())
        if key in seen:
            g.replace_uses(name, seen[key], include_outputs=False)
            g.remove_initializer(name)
        else:
            seen[key] = name


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """Keep the first of each set of identical nodes; later duplicates' consumers read its outputs."""
    g = graph.copy()
    _merge_initializers(g)
    seen: dict[tuple, Node] = {}
    for node in list(g.nodes):
        d = registry.lookup(node.op_type, node.domain)
        if d is not None and d.nondeterministic:
            continue  # two random draws are two samples, not one
        k = _key(node)
        first = seen.get(k)
        if first is None:
            seen[k] = node
            continue
        if any(o in g.outputs for o in node.outputs):
            continue
        for old, new in zip(node.outputs, first.outputs, strict=True):
            if old:
                g.replace_uses(old, new)
        g.remove_node(node)
        # consumers changed inputs: their keys change, so later duplicates of them are found too
    return g
