"""Structural checks of a Graph: unique names, every use defined, acyclic, schedule order, annotations."""

from __future__ import annotations

import difflib
import heapq
from typing import TYPE_CHECKING

from ._errors import GraphError

if TYPE_CHECKING:
    from ._ir import Graph, Node

__all__ = ["find_cycle", "toposorted", "validate"]


def _deps(graph: Graph) -> tuple[dict[str, int], list[list[int]]]:
    produced = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs if o}
    preds = [sorted({produced[x] for x in n.inputs if x in produced}) for n in graph.nodes]
    return produced, preds


def find_cycle(graph: Graph) -> list[Node] | None:
    """A list of nodes forming a cycle (each feeds the next, the last feeds the first), or None."""
    _, preds = _deps(graph)
    state = [0] * len(graph.nodes)  # 0 new, 1 on stack, 2 done
    for root in range(len(graph.nodes)):
        if state[root]:
            continue
        stack: list[tuple[int, int]] = [(root, 0)]
        path: list[int] = []
        while stack:
            i, k = stack.pop()
            if k == 0:
                state[i] = 1
                path.append(i)
            if k < len(preds[i]):
                stack.append((i, k + 1))
                j = preds[i][k]
                if state[j] == 1:
                    cyc = path[path.index(j) :]
                    return [graph.nodes[c] for c in reversed(cyc)]
                if state[j] == 0:
                    stack.append((j, 0))
            else:
                state[i] = 2
                path.pop()
    return None


def _cycle_error(graph: Graph) -> GraphError:
    cyc = find_cycle(graph) or []
    chain = " -> ".join(f"'{n.name}' ({n.op_type})" for n in [*cyc, *cyc[:1]])
    return GraphError(
        f"graph '{graph.name}'",
        f"the nodes form a cycle: {chain}",
        "a dataflow graph must be acyclic; break the loop by removing or rewiring one of these nodes",
    )


def toposorted(graph: Graph) -> list[Node]:
    """Nodes in a topological order that keeps the current order wherever it is valid (stable Kahn)."""
    _, preds = _deps(graph)
    succs: list[list[int]] = [[] for _ in graph.nodes]
    indeg = [len(p) for p in preds]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    ready = [i for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for s in succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, s)
    if len(order) != len(graph.nodes):
        raise _cycle_error(graph)
    return [graph.nodes[i] for i in order]


def _suggest(name: str, known: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=3)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""


def _check_definitions(graph: Graph) -> set[str]:
    where = f"graph '{graph.name}'"
    defined: dict[str, str] = {}

    def define(name: str, by: str) -> None:
        if name in defined:
            raise GraphError(
                where,
                f"value '{name}' is defined twice: by {defined[name]} and by {by}",
                "every value must have exactly one producer (input, initializer or node output); rename one",
            )
        defined[name] = by

    for x in graph.inputs:
        define(x, "a graph input")
    for x in graph.initializers:
        define(x, "an initializer")
    seen_nodes: set[str] = set()
    for n in graph.nodes:
        if not n.name:
            raise GraphError(where, f"a {n.op_type} node has no name", "give every node a unique name")
        if n.name in seen_nodes:
            raise GraphError(
                where, f"two nodes are named '{n.name}'", "node names must be unique; rename one"
            )
        seen_nodes.add(n.name)
        for o in n.outputs:
            if o:
                define(o, f"node '{n.name}' ({n.op_type})")
    return set(defined)


def _inner_reader(node: Node, name: str) -> Node | None:
    """The node inside ``node``'s subgraphs (nested ones too) that reads the outer value ``name``."""
    from ._ir import free_values, subgraphs

    for _, g in subgraphs(node):
        if name not in free_values(g):
            continue
        for n in g.nodes:
            if name in n.inputs:
                return _inner_reader(n, name) or n
    return None


def _check_uses(graph: Graph, defined: set[str]) -> None:
    where = f"graph '{graph.name}'"
    for n in graph.nodes:
        for x in n.inputs:
            if x and x not in defined:
                inner = _inner_reader(n, x)
                if inner is not None:  # a control-flow body reads a value no enclosing scope defines
                    raise GraphError(
                        f"node '{inner.name}' ({inner.op_type})",
                        f"input '{x}' is not defined in its subgraph or any enclosing graph"
                        f"{_suggest(x, defined)}",
                        f"define '{x}' in the subgraph or the graph around it, or wire the node to an existing value",
                    )
                raise GraphError(
                    f"node '{n.name}' ({n.op_type})",
                    f"input '{x}' is dangling: no node, graph input or initializer defines it{_suggest(x, defined)}",
                    f"add '{x}' as an initializer or graph input, or wire the node to an existing value",
                )
    for x in graph.outputs:
        if x not in defined:
            raise GraphError(
                where,
                f"graph output '{x}' is dangling: nothing defines it{_suggest(x, defined)}",
                "remove it from graph.outputs or add the node that computes it",
            )


def _check_order(graph: Graph) -> None:
    available = set(graph.inputs) | set(graph.initializers)
    for n in graph.nodes:
        for x in n.inputs:
            if x and x not in available:
                toposorted(graph)  # raises on a cycle
                raise GraphError(
                    f"node '{n.name}' ({n.op_type})",
                    f"reads '{x}' before the node that produces it runs: .nodes is not in schedule order",
                    "call graph.toposort()",
                )
        available.update(o for o in n.outputs if o)


def _check_annotations(graph: Graph) -> None:
    for name, v in graph.values.items():
        if v.name != name:
            raise GraphError(
                f"value '{name}'", f"is stored under '{name}' but named '{v.name}'", "use graph.rename_value"
            )
    for name, arr in graph.initializers.items():
        v = graph.values.get(name)
        if v is None:
            continue
        if v.dtype is not None and v.dtype != arr.dtype:
            raise GraphError(
                f"initializer '{name}'",
                f"type mismatch: its Value says {v.dtype} but the array is {arr.dtype}",
                "cast the array or fix the Value's dtype",
            )
        if v.shape is not None and tuple(v.shape) != arr.shape:
            raise GraphError(
                f"initializer '{name}'",
                f"shape mismatch: its Value says {v.shape} but the array is {arr.shape}",
                "reshape the array or fix the Value's shape",
            )
    for x in graph.inputs:
        v = graph.values.get(x)
        if v is None or v.dtype is None:
            raise GraphError(
                f"graph input '{x}'", "has no dtype", "declare it with graph.add_input(name, dtype, shape)"
            )


def _check_subgraphs(graph: Graph) -> None:
    """Each control-flow body: unique definitions, every read defined in it or captured, in schedule order.

    A body reads outer values by the names in its node's ``captures`` attribute (bound position for
    position to the node's trailing inputs, which the enclosing graph's checks cover).
    """
    from ._ir import free_values, subgraphs

    for n in graph.nodes:
        caps = set(n.attrs.get("captures", []))
        for attr, g in subgraphs(n):
            defined = _check_definitions(g)
            missing = [x for x in free_values(g) if x not in caps]
            if missing:
                inner = _inner_reader(n, missing[0])
                at = f"node '{inner.name}' ({inner.op_type})" if inner else f"node '{n.name}' ({n.op_type})"
                raise GraphError(
                    at,
                    f"input '{missing[0]}' is not defined in its subgraph '{attr}' or any enclosing graph "
                    f"(node '{n.name}' does not capture it)",
                    "wire the node to a value the subgraph defines, or capture the outer value "
                    "(attrs['captures'] plus a trailing node input)",
                )
            available = set(g.inputs) | set(g.initializers) | caps
            for m in g.nodes:
                for x in m.inputs:
                    if x and x not in available and x in defined:
                        raise GraphError(
                            f"node '{m.name}' ({m.op_type})",
                            f"reads '{x}' before the node that produces it runs: the subgraph is not in schedule order",
                            "toposort the subgraph",
                        )
                available.update(o for o in m.outputs if o)
            _check_subgraphs(g)


def validate(graph: Graph) -> None:
    """Raise GraphError on duplicate names, dangling values, cycles, bad order or mismatched annotations."""
    defined = _check_definitions(graph)
    _check_uses(graph, defined)
    _check_order(graph)
    _check_annotations(graph)
    _check_subgraphs(graph)
