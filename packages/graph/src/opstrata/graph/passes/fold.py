"""Constant folding: a node whose inputs are all initializers is computed once and becomes one.

A control-flow node (If/Loop/Scan) folds only when its captured outer values are constant too (they are
among its inputs); its kernel then runs the subgraph, exactly as at run time.
"""

from __future__ import annotations

import numpy as np

from .._errors import GraphError
from .._execute import KERNELS
from .._ir import Graph, Node
from ..opdefs import registry
from .fuse_qdq import is_fusable_weight_dq
from .pattern import Matcher, is_onnx

__all__ = ["fold_constants"]

_SMALL = 1 << 20  # bytes: a folded output may always be this big
_GROWTH = 2  # ... or this many times its inputs (stops ConstantOfShape/Expand blowing up the model)


def _evaluate(node: Node, args: list[np.ndarray]) -> list[np.ndarray] | None:
    fn = KERNELS.get(("" if node.domain == "ai.onnx" else node.domain, node.op_type))
    if fn is None:
        return None
    try:
        return [np.asarray(r) for r in fn(node, list(args))]
    except Exception as exc:  # the node would fail the same way at run time: say so now
        own_fix = getattr(exc, "fix", None)  # an OpError's fix is the specific one: keep it, once
        text = str(exc).removesuffix(f". Fix: {own_fix}") if own_fix else str(exc)
        raise GraphError(
            f"node '{node.name}' ({node.qualified_type})",
            f"fails on its constant inputs {[a.shape for a in args]}: {text}",
            own_fix or "fix the constants or the node's attributes",
        ) from exc


def _nondeterministic(node: Node) -> bool:
    d = registry.lookup(node.op_type, node.domain)
    return d is not None and d.nondeterministic


def fold_constants(graph: Graph) -> Graph:
    """Replace every node computable from initializers by initializers holding its outputs.

    >>> import numpy as np; from opstrata.graph import Graph
    >>> g = Graph("t"); _ = g.add_initializer("a", np.ones(2, np.float32))
    >>> _ = g.add_node("Neg", ["a"], ["b"]); g.outputs.append("b")
    >>> fold_constants(g).initializers["b"].tolist()
    [-1.0, -1.0]
    """
    g = graph.copy()
    matcher = Matcher(g)  # for the QDQ weights fuse_qdq_matmul consumes (their consumers are never folded)
    for node in list(g.nodes):
        ins = [x for x in node.inputs if x]
        if not ins or not all(x in g.initializers for x in ins):
            continue
        if _nondeterministic(node):
            continue  # a random op draws anew every run
        if is_onnx(node, "DequantizeLinear") and is_fusable_weight_dq(matcher, node):
            continue  # an int8 weight the extended level multiplies as integers (as onnxruntime keeps DQ)
        if any(o in g.values and g.values[o].kind != "tensor" for o in node.outputs):
            continue  # sequences/optionals are no initializers (Value.kind)
        args = [g.initializers[x] if x else None for x in node.inputs]
        while args and args[-1] is None:
            args.pop()
        results = _evaluate(node, args)  # type: ignore[arg-type]
        if results is None:
            continue
        size_in = sum(g.initializers[x].nbytes for x in ins)
        if sum(r.nbytes for r in results) > max(_SMALL, _GROWTH * size_in):
            continue
        g.remove_node(node, drop_values=False)
        for name, arr in zip(node.outputs, results, strict=False):
            if name:
                g.add_initializer(name, arr)
                g.folded.add(name)
    return g
