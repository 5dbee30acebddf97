"""The graph IR: Values (typed, symbolic shapes), Nodes (op + attrs) and a Graph in schedule order.

Modelled on ONNX's GraphProto (same value-name wiring, ``""`` for an omitted optional input) but
mutable and numpy-native: initializers are arrays, attrs are plain Python/numpy values.
"""

from __future__ import annotations

import copy as _copy
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._errors import GraphError
from ._symbolic import Dim, Shape

__all__ = ["OPSTRATA_DOMAIN", "VALUE_KINDS", "Graph", "Node", "Value"]

#: Domain of opstrata's own (fused) op types, e.g. ``ai.opstrata::Linear``.
OPSTRATA_DOMAIN = "ai.opstrata"


#: What a Value holds (ONNX's TypeProto kinds): a tensor; a sequence of tensors; an optional tensor or
#: sequence (absent or present). Non-tensor values have the element dtype and ``shape`` None; at run
#: time a sequence is a 1-d object array of its tensors and an absent optional a 0-d object array
#: holding None (see opdefs/sequence.py); the memory planner leaves them to the per-run path.
VALUE_KINDS = ("tensor", "sequence", "optional_tensor", "optional_sequence")


@dataclass
class Value:
    """A named tensor: dtype (numpy, None = unknown) and shape (None = unknown rank); ``kind`` says
    when it is a sequence or optional instead (one of :data:`VALUE_KINDS`)."""

    name: str
    dtype: np.dtype | None = None
    shape: Shape | None = None
    kind: str = "tensor"

    def __post_init__(self) -> None:
        if self.dtype is not None:
            self.dtype = np.dtype(self.dtype)
        if self.shape is not None:
            self.shape = tuple(self.shape)

    @property
    def rank(self) -> int | None:
        """Number of dims, None when unknown."""
        return None if self.shape is None else len(self.shape)

    def type_str(self) -> str:
        """``float32[batch, 4]``; ``?`` for unknown parts."""
        dt = "?" if self.dtype is None else str(self.dtype)
        if self.kind != "tensor":
            return f"{self.kind}({dt})"
        if self.shape is None:
            return f"{dt}[...]"
        return f"{dt}[{', '.join('?' if d is None else str(d) for d in self.shape)}]"


def subgraphs(node: Node) -> list[tuple[str, Graph]]:
    """``(attribute name, Graph)`` of every subgraph a control-flow node (If, Loop, Scan) holds."""
    return [(k, v) for k, v in node.attrs.items() if isinstance(v, Graph)]


def free_values(graph: Graph) -> list[str]:
    """Names a (sub)graph reads but does not define: the outer-scope values a control-flow body captures.

    Nested bodies count through their node's inputs (a control-flow node lists its own captures there).
    """
    defined = set(graph.inputs) | set(graph.initializers) | {o for n in graph.nodes for o in n.outputs if o}
    free: dict[str, None] = {}
    for n in graph.nodes:
        for x in n.inputs:
            if x and x not in defined:
                free[x] = None
    for x in graph.outputs:
        if x and x not in defined:
            free[x] = None
    return list(free)


@dataclass(eq=False)
class Node:
    """One op application: ``outputs = op_type[attrs](inputs)``; ``""`` marks an omitted input.

    A control-flow node (If/Loop/Scan) holds its subgraphs as Graph-valued attrs; its inputs end with the
    outer values they read, bound position for position to the names in ``attrs["captures"]``.
    """

    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    domain: str = ""

    def __post_init__(self) -> None:
        self.inputs, self.outputs = list(self.inputs), list(self.outputs)

    def attr(self, key: str, default: Any = None) -> Any:
        """Attribute ``key`` or ``default``."""
        return self.attrs.get(key, default)

    @property
    def qualified_type(self) -> str:
        """``Conv`` for the ONNX domain, ``ai.opstrata::Linear`` otherwise."""
        return self.op_type if self.domain in ("", "ai.onnx") else f"{self.domain}::{self.op_type}"

    def __repr__(self) -> str:
        return f"Node({self.name!r}: {self.qualified_type}({', '.join(self.inputs)}) -> {', '.join(self.outputs)})"


class Graph:
    """A dataflow graph: ``.nodes`` in schedule order, ``.values`` by name, ``.initializers`` as arrays.

    >>> g = Graph("tiny")
    >>> _ = g.add_input("x", np.float32, ("batch", 4))
    >>> _ = g.add_node("Relu", ["x"], ["y"])
    >>> g.outputs.append("y")
    >>> print(g.dump().splitlines()[2].strip())
    %y: ?[...] = Relu(%x)  # Relu_0
    """

    def __init__(
        self,
        name: str = "graph",
        *,
        opset_imports: Mapping[str, int] | None = None,
    ) -> None:
        self.name = name
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.nodes: list[Node] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.values: dict[str, Value] = {}
        self.opset_imports: dict[str, int] = dict(opset_imports or {"": 17})
        self.doc_string = ""
        #: what the importer did to the model before the IR saw it (e.g. an opset conversion); the pass
        #: report repeats these lines
        self.import_notes: list[str] = []
        #: provenance kept by the passes: a value they removed -> the value now holding the same tensor
        #: (merged duplicates, removed Identity/no-op nodes, renames); see ``resolve_alias``
        self.aliases: dict[str, str] = {}
        #: provenance of fusions: a value now computed inside a fused node -> an output of that node
        self.fused_into: dict[str, str] = {}
        #: values the passes computed at compile time (constant folding); they became initializers
        self.folded: set[str] = set()

    # ------------------------------------------------------------------ building

    def value(self, name: str) -> Value:
        """The Value called ``name`` (GraphError when the graph has none)."""
        try:
            return self.values[name]
        except KeyError:
            raise GraphError(
                f"graph '{self.name}'", f"no value named '{name}'", "check the name against graph.values"
            ) from None

    def _ensure_value(self, name: str) -> Value:
        v = self.values.get(name)
        if v is None:
            v = self.values[name] = Value(name)
        return v

    def add_input(self, name: str, dtype: Any, shape: Sequence[Dim] | None) -> Value:
        """Declare a graph input with its dtype and (symbolic) shape."""
        v = self._ensure_value(name)
        v.dtype, v.shape = np.dtype(dtype), None if shape is None else tuple(shape)
        self.inputs.append(name)
        return v

    def add_initializer(self, name: str, array: Any) -> Value:
        """Add a constant tensor; its Value takes the array's dtype and shape."""
        arr = np.asarray(array)
        self.initializers[name] = arr
        v = self._ensure_value(name)
        v.dtype, v.shape = arr.dtype, tuple(arr.shape)
        return v

    def add_node(
        self,
        op_type: str,
        inputs: Sequence[str],
        outputs: Sequence[str],
        attrs: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        domain: str = "",
        index: int | None = None,
    ) -> Node:
        """Create a node (at the end of the schedule, or at ``index``) and register its output Values."""
        node = Node(op_type, list(inputs), list(outputs), dict(attrs or {}), name or "", domain)
        return self.insert_node(node, index)

    def insert_node(self, node: Node, index: int | None = None) -> Node:
        """Insert an existing Node; an empty name gets a fresh one."""
        if not node.name:
            node.name = self.fresh_node_name(node.op_type)
        for out in node.outputs:
            if out:
                self._ensure_value(out)
        if index is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(index, node)
        return node

    def remove_node(self, node: Node, *, drop_values: bool = True) -> None:
        """Remove ``node`` from the schedule (and its output Values unless something else uses them)."""
        self.nodes.remove(node)
        if drop_values:
            used = set(self.inputs) | set(self.outputs) | set(self.initializers)
            used.update(i for n in self.nodes for i in n.inputs)
            for out in node.outputs:
                if out and out not in used:
                    self.values.pop(out, None)

    def replace_node(self, old: Node, new: Sequence[Node]) -> list[Node]:
        """Put ``new`` nodes where ``old`` stood in the schedule and remove ``old`` (provenance recorded)."""
        idx = self.nodes.index(old)
        self.nodes.pop(idx)
        for k, n in enumerate(new):
            self.insert_node(n, idx + k)
        self.record_fusion([old], new)
        return list(new)

    def record_fusion(self, old: Iterable[Node], new: Sequence[Node]) -> None:
        """Note in ``fused_into`` that ``old`` nodes' outputs which ``new`` does not produce are now
        computed inside the last of ``new`` (a fusion), so tools can say where a vanished value went."""
        made = {o for n in new for o in n.outputs if o}
        target = next((o for n in reversed(new) for o in n.outputs if o), None)
        if target is None:
            return
        for n in old:
            for o in n.outputs:
                if o and o not in made:
                    self.fused_into[o] = target

    def resolve_alias(self, name: str) -> str:
        """The value that holds ``name``'s tensor after the passes (``name`` itself when it was not merged)."""
        seen = {name}
        while name in self.aliases and self.aliases[name] not in seen:
            name = self.aliases[name]
            seen.add(name)
        return name

    def resolve_fused(self, name: str) -> str | None:
        """The surviving output of the fused node that now computes ``name``; None when it was not fused."""
        seen, fused = {name}, False
        while name in self.fused_into or name in self.aliases:
            step_fused = name in self.fused_into
            nxt = self.fused_into[name] if step_fused else self.aliases[name]
            if nxt in seen:
                break
            fused, name = fused or step_fused, nxt
            seen.add(name)
        return name if fused else None

    def remove_initializer(self, name: str) -> None:
        """Drop an initializer and its Value."""
        self.initializers.pop(name)
        self.values.pop(name, None)

    # ------------------------------------------------------------------ names

    def _used_names(self) -> set[str]:
        names = set(self.values) | set(self.initializers) | set(self.inputs) | set(self.outputs)
        names.update(n.name for n in self.nodes)
        for n in self.nodes:
            names.update(n.outputs)
            names.update(n.inputs)
        return names

    def fresh_name(self, hint: str) -> str:
        """A value name starting with ``hint`` that the graph does not use yet."""
        used = self._used_names()
        if hint not in used:
            return hint
        for i in itertools.count(1):
            cand = f"{hint}_{i}"
            if cand not in used:
                return cand
        raise AssertionError  # pragma: no cover

    def fresh_node_name(self, op_type: str) -> str:
        """A node name ``<op_type>_<k>`` not used by any node."""
        used = {n.name for n in self.nodes}
        for i in itertools.count(len(self.nodes) if f"{op_type}_0" in used else 0):
            cand = f"{op_type}_{i}"
            if cand not in used:
                return cand
        raise AssertionError  # pragma: no cover

    def rename_value(self, old: str, new: str) -> None:
        """Rename a value everywhere: Values, initializers, graph inputs/outputs, node wiring."""
        if new in self.values and new != old:
            raise GraphError(
                f"graph '{self.name}'",
                f"cannot rename '{old}' to '{new}': '{new}' exists",
                "pick a fresh name",
            )
        if old in self.values:
            v = self.values.pop(old)
            v.name = new
            self.values[new] = v
        if old in self.initializers:
            self.initializers[new] = self.initializers.pop(old)
        self.inputs = [new if x == old else x for x in self.inputs]
        self.outputs = [new if x == old else x for x in self.outputs]
        for n in self.nodes:
            n.inputs = [new if x == old else x for x in n.inputs]
            n.outputs = [new if x == old else x for x in n.outputs]
        if new != old:
            self.aliases[old] = new

    def replace_uses(self, old: str, new: str, *, include_outputs: bool = True) -> int:
        """Make every consumer of ``old`` read ``new`` instead (recorded in ``aliases``); returns how many
        uses changed. The caller guarantees ``old`` and ``new`` hold the same tensor."""
        if new != old:
            self.aliases[old] = new
        count = 0
        for n in self.nodes:
            for k, x in enumerate(n.inputs):
                if x == old:
                    n.inputs[k] = new
                    count += 1
        if include_outputs:
            for k, x in enumerate(self.outputs):
                if x == old:
                    self.outputs[k] = new
                    count += 1
        return count

    # ------------------------------------------------------------------ maps

    def producers(self) -> dict[str, Node]:
        """Value name -> the node that produces it."""
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        """Value name -> the nodes that read it (in schedule order, a node once per value)."""
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for x in dict.fromkeys(n.inputs):
                if x:
                    out.setdefault(x, []).append(n)
        return out

    def producer(self, name: str) -> Node | None:
        """The node producing ``name`` (None for inputs, initializers and unknown names)."""
        for n in self.nodes:
            if name in n.outputs:
                return n
        return None

    def node(self, name: str) -> Node:
        """The node called ``name``."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise GraphError(f"graph '{self.name}'", f"no node named '{name}'", "check graph.nodes")

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def op_counts(self) -> dict[str, int]:
        """How many nodes of each (qualified) op type."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.qualified_type] = counts.get(n.qualified_type, 0) + 1
        return counts

    # ------------------------------------------------------------------ order, checks, text

    def toposort(self) -> None:
        """Reorder ``.nodes`` topologically, keeping the current order where it is already valid."""
        from ._validate import toposorted

        self.nodes = toposorted(self)

    def validate(self) -> None:
        """Raise GraphError on dangling values, cycles, duplicate names or type mismatches."""
        from ._validate import validate

        validate(self)

    def dump(self) -> str:
        """A readable listing: inputs, initializers, one node per line with shapes, outputs."""
        from ._dump import dump

        return dump(self)

    def to_dot(self) -> str:
        """Graphviz DOT source (render with ``dot -Tsvg``)."""
        from ._dump import to_dot

        return to_dot(self)

    def __str__(self) -> str:
        return self.dump()

    def __repr__(self) -> str:
        return (
            f"Graph({self.name!r}: {len(self.inputs)} inputs, {len(self.nodes)} nodes, "
            f"{len(self.initializers)} initializers, {len(self.outputs)} outputs)"
        )

    def copy(self) -> Graph:
        """A copy whose nodes, values and lists are new; initializer arrays are shared (treat as immutable)."""
        g = Graph(self.name, opset_imports=self.opset_imports)
        g.inputs, g.outputs = list(self.inputs), list(self.outputs)
        g.nodes = [
            Node(n.op_type, n.inputs, n.outputs, _copy.deepcopy(n.attrs), n.name, n.domain)
            for n in self.nodes
        ]
        g.initializers = dict(self.initializers)
        g.values = {k: Value(v.name, v.dtype, v.shape, v.kind) for k, v in self.values.items()}
        g.doc_string = self.doc_string
        g.import_notes = list(self.import_notes)
        g.aliases, g.fused_into, g.folded = dict(self.aliases), dict(self.fused_into), set(self.folded)
        return g

    def value_names(self) -> Iterable[str]:
        """Every value name in the graph."""
        return self.values.keys()
