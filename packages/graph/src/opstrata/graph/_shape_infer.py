"""Shape and dtype inference over a Graph, with symbolic dims and propagation of shape-tensor contents.

Like ONNX's shape inference with data propagation: the int contents of small shape tensors
(``Shape -> Gather -> Concat -> Reshape``) are tracked symbolically so reshapes infer exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._errors import GraphError
from ._ir import Graph, Node, Value
from ._shape_rules import RuleContext
from ._symbolic import Dim, Shape, dim_div, dim_mul, dim_prod, dims_equal
from .opdefs import (
    families as _families,  # noqa: F401  (loads every op definition)
    registry,
)
from .opdefs.registry import RULES

__all__ = ["infer_shapes", "supported_ops"]

_MAX_KNOWN = 64  # shape tensors longer than this are not tracked


def supported_ops() -> list[str]:
    """Every op type of the IR vocabulary, ``domain::Op`` outside the ONNX domain."""
    return sorted(op if not dom else f"{dom}::{op}" for dom, op in RULES)


def _merge(node: Node, v: Value, dtype: np.dtype | None, shape: Shape | None) -> None:
    where = f"node '{node.name}' ({node.qualified_type})"
    if dtype is not None:
        if v.dtype is not None and v.dtype != dtype:
            raise GraphError(
                where,
                f"type mismatch: output '{v.name}' is annotated {v.dtype} but the op computes {dtype}",
                "fix the annotation (value_info / graph output type) or the inputs' dtypes",
            )
        v.dtype = np.dtype(dtype)
    if shape is None:
        return
    if v.shape is None:
        v.shape = tuple(shape)
        return
    if len(v.shape) != len(shape):
        raise GraphError(
            where,
            f"inconsistent shapes: output '{v.name}' is annotated with rank {len(v.shape)} {v.shape} "
            f"but the op computes rank {len(shape)} {tuple(shape)}",
            "fix the annotation or the producing op's inputs",
        )
    merged: list[Dim] = []
    for a, c in zip(v.shape, shape, strict=True):
        if isinstance(a, int) and isinstance(c, int) and a != c:
            raise GraphError(
                where,
                f"inconsistent shapes: output '{v.name}' is annotated {v.shape} but the op computes {tuple(shape)}",
                "fix the annotation or the producing op's inputs",
            )
        merged.append(c if isinstance(c, int) or a is None else a if isinstance(a, int) or c is None else c)
    v.shape = tuple(merged)


# --------------------------------------------------------------------------- shape-tensor contents


def _prop_shape(
    n: Node, ins: list[tuple[Dim, ...] | None], vals: list[Value | None]
) -> tuple[Dim, ...] | None:
    x = vals[0]
    if x is None or x.shape is None:
        return None
    r = len(x.shape)
    return tuple(x.shape[slice(n.attrs.get("start", 0), n.attrs.get("end", r))])


def _prop_gather(
    n: Node, ins: list[tuple[Dim, ...] | None], vals: list[Value | None]
) -> tuple[Dim, ...] | None:
    data, idx = ins[0], ins[1]
    if data is None or idx is None or n.attrs.get("axis", 0) != 0:
        return None
    if not all(isinstance(i, int) and -len(data) <= i < len(data) for i in idx):
        return None
    return tuple(data[i] for i in idx)  # type: ignore[index]


def _prop_concat(
    n: Node, ins: list[tuple[Dim, ...] | None], vals: list[Value | None]
) -> tuple[Dim, ...] | None:
    if any(i is None for i in ins):
        return None
    return tuple(d for i in ins for d in i)  # type: ignore[union-attr]


def _static_shape(v: Value | None) -> tuple[int, ...] | None:
    if v is None or v.shape is None or not all(isinstance(d, int) for d in v.shape):
        return None
    return tuple(v.shape)  # type: ignore[arg-type]


def _grid(flat: tuple[Dim, ...], shape: tuple[int, ...]) -> np.ndarray | None:
    """Tracked contents laid out in their tensor's (static) shape, as an object array."""
    if int(np.prod(shape)) != len(flat):
        return None
    a = np.empty(len(flat), dtype=object)
    a[:] = list(flat)
    return a.reshape(shape)


def _prop_slice(
    n: Node, ins: list[tuple[Dim, ...] | None], vals: list[Value | None]
) -> tuple[Dim, ...] | None:
    data = ins[0]
    if data is None or any(ins[i] is None for i in range(1, len(n.inputs)) if n.inputs[i]):
        return None
    clamp = lambda t: max(min(t, 2**62), -(2**62))  # noqa: E731
    shape = _static_shape(vals[0])
    if shape is not None and len(shape) > 1:  # TorchScript's F.pad: the (pairs, 2) pads reversed by rows
        grid = _grid(data, shape)
        starts, ends = ins[1], ins[2]
        axes = ins[3] if len(ins) > 3 and ins[3] else tuple(range(len(starts)))  # type: ignore[arg-type]
        steps = ins[4] if len(ins) > 4 and ins[4] else (1,) * len(starts)  # type: ignore[arg-type]
        parts = (starts, ends, axes, steps)
        if (
            grid is None
            or len({len(p) for p in parts}) != 1
            or not all(isinstance(t, int) for p in parts for t in p)
        ):  # type: ignore[union-attr]
            return None
        index = [slice(None)] * len(shape)
        for s, e, ax, st in zip(*parts, strict=True):  # type: ignore[call-overload]
            if not -len(shape) <= ax < len(shape) or st == 0:
                return None
            index[ax] = slice(clamp(s), clamp(e), st)
        return tuple(grid[tuple(index)].ravel().tolist())
    s, e = ins[1][0], ins[2][0]  # type: ignore[index]
    step = ins[4][0] if len(ins) > 4 and ins[4] else 1
    if not all(isinstance(t, int) for t in (s, e, step)):
        return None
    return data[slice(clamp(s), clamp(e), step)]  # type: ignore[arg-type]


def _prop_transpose(
    n: Node, ins: list[tuple[Dim, ...] | None], vals: list[Value | None]
) -> tuple[Dim, ...] | None:
    shape = _static_shape(vals[0])
    if ins[0] is None or shape is None:
        return None
    grid = _grid(ins[0], shape)
    perm = n.attrs.get("perm") or list(reversed(range(len(shape))))
    if grid is None or sorted(perm) != list(range(len(shape))):
        return None
    return tuple(grid.transpose(perm).ravel().tolist())


def _arith(op: Callable[[Dim, Dim], Dim]) -> Callable[..., tuple[Dim, ...] | None]:
    def prop(n: Node, ins: list[tuple[Dim, ...] | None], vals: list[Value | None]) -> tuple[Dim, ...] | None:
        a, b = ins[0], ins[1]
        if a is None or b is None or (len(a) != len(b) and 1 not in (len(a), len(b))):
            return None
        m = max(len(a), len(b))
        a, b = (a * m if len(a) == 1 else a), (b * m if len(b) == 1 else b)
        return tuple(op(x, y) for x, y in zip(a, b, strict=True))

    return prop


def _add(a: Dim, b: Dim) -> Dim:
    return a + b if isinstance(a, int) and isinstance(b, int) else (a if b == 0 else b if a == 0 else None)


def _sub(a: Dim, b: Dim) -> Dim:
    return a - b if isinstance(a, int) and isinstance(b, int) else (a if b == 0 else None)


def _div(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int) and b:
        return int(a / b)  # ONNX integer Div truncates
    return dim_div(a, b)


def _mod(a: Dim, b: Dim) -> Dim:
    """ONNX integer Mod (fmod=0): the remainder takes the divisor's sign, as Python's ``%``."""
    return a % b if isinstance(a, int) and isinstance(b, int) and b else None


def _fmod(a: Dim, b: Dim) -> Dim:
    """Mod with fmod=1: the remainder takes the dividend's sign (C's fmod)."""
    if not (isinstance(a, int) and isinstance(b, int) and b):
        return None
    return abs(a) % abs(b) * (1 if a >= 0 else -1)


_prop_mod, _prop_fmod = _arith(_mod), _arith(_fmod)


def _equal(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return int(a == b)
    if (isinstance(a, int) and a < 0 and b is not None) or (isinstance(b, int) and b < 0 and a is not None):
        return 0  # a dim is never negative: torch.onnx's Equal(shape, -1) of an expand(-1, ...)
    return 1 if dims_equal(a, b) else None


def _prop_where(
    n: Node, ins: list[tuple[Dim, ...] | None], vals: list[Value | None]
) -> tuple[Dim, ...] | None:
    """Where(cond, x, y) over known 1-D values (broadcast from length 1): torch.onnx's
    ``Where(Equal(shape, -1), ones, shape)`` that resolves an ``expand(-1, ...)``."""
    if any(i is None for i in ins):
        return None
    c, x, y = ins  # type: ignore[misc]
    m = max(len(c), len(x), len(y))
    if any(len(t) not in (1, m) for t in (c, x, y)):
        return None
    c, x, y = ((t * m if len(t) == 1 else t) for t in (c, x, y))
    if not all(isinstance(v, int) for v in c):
        return None
    return tuple(a if k else b for k, a, b in zip(c, x, y, strict=True))


def _prop_constant_of_shape(
    n: Node, ins: list[tuple[Dim, ...] | None], vals: list[Value | None]
) -> tuple[Dim, ...] | None:
    """ConstantOfShape of a known length-1 shape ``[k]``: k copies of its (integer) value."""
    shape = ins[0]
    if shape is None or len(shape) != 1 or not isinstance(shape[0], int) or shape[0] > _MAX_KNOWN:
        return None
    value = n.attrs.get("value")
    v = np.asarray(value if value is not None else 0.0).ravel()
    if v.size != 1 or v.dtype.kind not in "iub":
        return None
    return (int(v[0]),) * shape[0]


_PROP: dict[str, Callable[..., tuple[Dim, ...] | None]] = {
    "Shape": _prop_shape,
    "Size": lambda n, ins, vals: None if not vals[0] or vals[0].shape is None else (dim_prod(vals[0].shape),),
    "Identity": lambda n, ins, vals: ins[0],
    "Cast": lambda n, ins, vals: ins[0] if np.dtype(n.attrs["to"]).kind in "iu" else None,
    "Unsqueeze": lambda n, ins, vals: ins[0],
    "Squeeze": lambda n, ins, vals: ins[0],
    "Reshape": lambda n, ins, vals: ins[0],  # only 1-D results are tracked: the values as they are
    "Gather": _prop_gather,
    "Concat": _prop_concat,
    "Slice": _prop_slice,
    "Add": _arith(_add),
    "Sub": _arith(_sub),
    "Mul": _arith(dim_mul),
    "Div": _arith(_div),
    "Max": _arith(lambda a, b: max(a, b) if isinstance(a, int) and isinstance(b, int) else None),
    "Min": _arith(lambda a, b: min(a, b) if isinstance(a, int) and isinstance(b, int) else None),
    "Mod": lambda n, ins, vals: (_prop_fmod if n.attrs.get("fmod", 0) else _prop_mod)(n, ins, vals),
    "Equal": _arith(_equal),
    "Where": _prop_where,
    "ConstantOfShape": _prop_constant_of_shape,
    "Transpose": _prop_transpose,
}
#: the ops above that know a tracked value's layout: the contents of a multi-dimensional value (static
#: shape, at most _MAX_KNOWN elements, kept flat in row-major order) go through these only, every other
#: op reads 1-D values
_ND_PROP = frozenset({"Reshape", "Identity", "Cast", "Unsqueeze", "Squeeze", "Slice", "Transpose"})


def _propagate(node: Node, graph: Graph, known: dict[str, tuple[Dim, ...]]) -> None:
    if node.domain not in ("", "ai.onnx") or node.op_type not in _PROP or len(node.outputs) != 1:
        return
    out = graph.values.get(node.outputs[0])
    if out is None or out.dtype is None or out.dtype.kind not in "iub" or out.shape is None:
        return  # bools as 0 / 1 (Equal feeding Where)
    ins = [known.get(x) if x else None for x in node.inputs]
    vals = [graph.values.get(x) if x else None for x in node.inputs]
    nd = len(out.shape) > 1 or any(
        k is not None and (v is None or v.shape is None or len(v.shape) > 1)
        for k, v in zip(ins, vals, strict=True)
    )
    if nd and (node.op_type not in _ND_PROP or _static_shape(out) is None):
        return  # a multi-dimensional value: only the layout-aware ops, and only with a static shape
    res = _PROP[node.op_type](node, ins, vals)
    if res is not None and len(res) <= _MAX_KNOWN:
        known[node.outputs[0]] = tuple(res)
        if len(out.shape) == 1 and out.shape[0] is None:
            out.shape = (len(res),)


def infer_shapes(graph: Graph, *, reset: bool = False) -> Graph:
    """Infer dtype and (symbolic) shape of every value in place; returns ``graph``.

    Annotations already on Values (from ONNX value_info) are checked against what the ops compute:
    a contradiction is a GraphError naming the node. ``reset=True`` first forgets the annotations of
    intermediate values (use it after a pass rewrote the graph).

    >>> from opstrata.graph import Graph
    >>> g = Graph("t"); _ = g.add_input("x", "float32", ("batch", 3, 4))
    >>> _ = g.add_initializer("s", np.array([0, -1], np.int64))
    >>> _ = g.add_node("Reshape", ["x", "s"], ["y"]); g.outputs.append("y")
    >>> infer_shapes(g).value("y").shape
    ('batch', 12)
    """
    if reset:
        keep = set(graph.inputs) | set(graph.initializers)
        for name, v in graph.values.items():
            if name not in keep:
                v.dtype, v.shape = None, None
    known: dict[str, tuple[Dim, ...]] = {}
    for name, arr in graph.initializers.items():
        if arr.dtype.kind in "iub" and arr.ndim <= 1 and arr.size <= _MAX_KNOWN:  # bools as 0 / 1
            known[name] = tuple(int(v) for v in arr.ravel())
    for node in graph.nodes:
        rule = rule_for(node.domain, node.op_type)
        if rule is None:
            raise GraphError(
                f"node '{node.name}' ({node.qualified_type})",
                "op type is not in the IR vocabulary: there is no shape rule for it",
                f"use a supported op ({', '.join(supported_ops())}) or register a rule",
            )
        vals = [graph.values.get(x) if x else None for x in node.inputs]
        results = rule(node, RuleContext(node, vals, known))
        for out, (dt, shape) in zip(node.outputs, results, strict=False):
            if out:
                v = graph.values.get(out)
                if v is None:
                    v = graph.values[out] = Value(out)
                _merge(node, v, dt, shape)
        _propagate(node, graph, known)
    return graph


def rule_for(domain: str, op_type: str) -> Callable[[Node, RuleContext], list] | None:
    """The shape rule of an IR op (``ai.onnx`` and ``""`` are the same domain)."""
    d = registry.lookup(op_type, domain)
    return None if d is None else d.shape
