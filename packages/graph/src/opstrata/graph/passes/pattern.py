"""Small matching helpers shared by the rewrite passes: constants, single-use checks, producers."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from .._ir import Graph, Node
from ..opdefs import registry

__all__ = ["Matcher", "is_onnx"]


def fusable_unary() -> frozenset[str]:
    """Unary IR ops (ONNX domain) a FusedElementwise chain may hold: those with a codegen expression."""
    return registry.elementwise_ops("unary", codegen=True)


def fusable_binary() -> frozenset[str]:
    """Binary IR ops (ONNX domain) a FusedElementwise chain may hold (two-input Max / Min too)."""
    return registry.elementwise_ops("binary", "variadic", codegen=True)


def is_onnx(node: Node, *op_types: str) -> bool:
    """``node`` is an ONNX-domain op of one of ``op_types``."""
    return node.domain in ("", "ai.onnx") and node.op_type in op_types


class Matcher:
    """Read-only views of a graph (producers, consumers, constants) for pattern matching."""

    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.prod = graph.producers()
        self.cons = graph.consumers()
        self.outputs = set(graph.outputs)

    def producer(self, name: str, *op_types: str) -> Node | None:
        """The ONNX-domain node producing ``name`` when its op type is one of ``op_types``."""
        n = self.prod.get(name)
        return n if n is not None and is_onnx(n, *op_types) else None

    def const(self, name: str) -> np.ndarray | None:
        """The initializer array called ``name``, else None."""
        return self.g.initializers.get(name)

    def scalar(self, name: str) -> float | None:
        """The value of a one-element float/int initializer, else None."""
        a = self.const(name)
        return float(a.ravel()[0]) if a is not None and a.size == 1 else None

    def is_scalar(self, name: str, value: float, rtol: float = 1e-4) -> bool:
        """``name`` is a one-element constant close to ``value``."""
        s = self.scalar(name)
        return s is not None and bool(np.isclose(s, value, rtol=rtol, atol=0))

    def uses(self, name: str) -> list[Node]:
        """Consumers of ``name``."""
        return self.cons.get(name, [])

    def only_use(self, name: str) -> Node | None:
        """The sole consumer of ``name`` when it has exactly one and is no graph output."""
        c = self.cons.get(name, [])
        return c[0] if len(c) == 1 and name not in self.outputs else None

    def internal(self, nodes: Sequence[Node], keep: str) -> bool:
        """Every output of ``nodes`` except ``keep`` is consumed only inside ``nodes`` (safe to fuse)."""
        ids = {id(n) for n in nodes}
        for n in nodes:
            for out in n.outputs:
                if not out or out == keep:
                    continue
                if out in self.outputs or any(id(c) not in ids for c in self.cons.get(out, [])):
                    return False
        return True

    def other(self, node: Node, name: str) -> str | None:
        """The other input of a binary node given one input ``name``."""
        if len(node.inputs) != 2 or name not in node.inputs:
            return None
        return node.inputs[1] if node.inputs[0] == name else node.inputs[0]

    def shape(self, name: str) -> tuple | None:
        v = self.g.values.get(name)
        return None if v is None else v.shape

    def dtype(self, name: str) -> np.dtype | None:
        v = self.g.values.get(name)
        return None if v is None else v.dtype


def replace_nodes(graph: Graph, old: Iterable[Node], new: Sequence[Node]) -> None:
    """Remove ``old`` nodes and insert ``new`` where the last of ``old`` stood in the schedule."""
    old = list(old)
    ids = {id(n) for n in old}
    pos = max(i for i, n in enumerate(graph.nodes) if id(n) in ids)
    anchor = graph.nodes[pos]
    for n in old:
        if n is not anchor:
            graph.nodes.remove(n)
    graph.replace_node(anchor, new)
    graph.record_fusion(old, new)
    live = {o for n in graph.nodes for o in n.outputs} | set(graph.inputs) | set(graph.initializers)
    for n in old:
        for out in n.outputs:
            if out and out not in live:
                graph.values.pop(out, None)
