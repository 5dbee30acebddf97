"""Sequence and optional ops (ONNX operator spec: SequenceConstruct/Empty/Insert/At/Erase/Length,
SplitToSequence, ConcatFromSequence, Optional, OptionalHasElement, OptionalGetElement).

IR form: a sequence or optional is a Value whose ``kind`` is ``sequence`` / ``optional_tensor`` /
``optional_sequence`` (the importers below set it), whose dtype is the element dtype and whose shape
is None. At run time a sequence is a 1-d numpy object array holding its tensors (:func:`to_sequence`)
and an absent optional a 0-d object array holding None (:func:`absent`); a present optional is its
value. numpy object arrays pass through the executor's per-run path unchanged, and the memory
planner never puts them in the arena. Kernels are host numpy code; SequenceMap runs its body with
control.py's ``run_subgraph`` (outer values the body reads are captured as trailing inputs, as If/Loop do).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._ir import Node, free_values
from .._shape_rules import RuleContext
from ..onnx.context import ImportContext
from ..onnx.export import ExportContext, export_subgraph, register_export
from ..onnx.types import dtype_from_onnx, tensor_type_of
from .common import Arr
from .registry import HOST, define

__all__ = ["absent", "feed_value", "is_absent", "sequence_items", "to_sequence"]


def to_sequence(items: Sequence[Any]) -> np.ndarray:
    """The run-time form of a sequence: a 1-d object array whose elements are the (numpy) tensors."""
    out = np.empty(len(items), dtype=object)
    for i, t in enumerate(items):
        out[i] = np.asarray(t)
    return out


def sequence_items(x: Any) -> list[np.ndarray]:
    """The tensors of a run-time sequence (also accepts a list)."""
    if isinstance(x, np.ndarray) and x.dtype == object and x.ndim == 1:
        return list(x)
    if isinstance(x, (list, tuple)):
        return [np.asarray(t) for t in x]
    raise TypeError(f"expected a sequence (1-d object array of tensors), got {type(x).__name__}")


def absent() -> np.ndarray:
    """The run-time form of an empty optional (a 0-d object array holding None)."""
    return np.array(None, dtype=object)


def is_absent(x: Any) -> bool:
    """True for an empty optional (None, or a 0-d object array holding None)."""
    return x is None or (isinstance(x, np.ndarray) and x.dtype == object and x.ndim == 0 and x.item() is None)


def feed_value(x: Any, kind: str) -> Any:
    """A sequence/optional given as onnxruntime takes it (list of arrays, None) in its run-time form."""
    if kind.startswith("optional") and (x is None or is_absent(x)):
        return absent()
    if kind.endswith("sequence"):
        return x if isinstance(x, np.ndarray) and x.dtype == object and x.ndim == 1 else to_sequence(list(x))
    return x if isinstance(x, np.ndarray) else np.asarray(x)


def _set_kind(ctx: ImportContext, name: str, kind: str, dtype: Any = None) -> None:
    v = ctx.graph.values[name]
    v.kind = kind
    if dtype is not None:
        v.dtype = np.dtype(dtype)


def _kind(ctx: ImportContext, name: str) -> str:
    v = ctx.graph.values.get(name)
    return v.kind if v is not None else "tensor"


def _seq_rule(n: Node, ctx: RuleContext) -> list:
    return [(ctx.dtype(0), None)]


def _tensor_rule(n: Node, ctx: RuleContext) -> list:
    return [(ctx.dtype(0), None)]


def _position(x: list[Arr], i: int, n_items: int, default: int, *, insert: bool = False) -> int:
    if len(x) <= i or x[i] is None:
        return default
    p = int(np.asarray(x[i]).reshape(-1)[0])
    hi = n_items if insert else n_items - 1
    if not -n_items <= p <= hi:
        raise IndexError(f"position {p} is out of range [{-n_items}, {hi}] for a sequence of {n_items}")
    return p + n_items if p < 0 else p


# --------------------------------------------------------------------------- sequences


def _import_seq(ctx: ImportContext) -> None:
    ctx.emit(ctx.op_type, ctx.inputs, ctx.outputs, dict(ctx.attrs))
    _set_kind(ctx, ctx.outputs[0], "sequence")


def _import_seq_empty(ctx: ImportContext) -> None:
    dt = dtype_from_onnx(ctx.attrs.get("dtype", 1), f"node '{ctx.name}'")
    ctx.emit("SequenceEmpty", [], ctx.outputs, {"dtype": dt})
    _set_kind(ctx, ctx.outputs[0], "sequence", dt)


def _run_seq_empty(n: Node, x: list[Arr]) -> list[Arr]:
    return [to_sequence([])]


def _seq_empty_rule(n: Node, ctx: RuleContext) -> list:
    return [(np.dtype(n.attrs["dtype"]), None)]


def _run_seq_construct(n: Node, x: list[Arr]) -> list[Arr]:
    return [to_sequence(x)]


def _run_seq_insert(n: Node, x: list[Arr]) -> list[Arr]:
    items = sequence_items(x[0])
    items.insert(_position(x, 2, len(items), len(items), insert=True), np.asarray(x[1]))
    return [to_sequence(items)]


def _run_seq_erase(n: Node, x: list[Arr]) -> list[Arr]:
    items = sequence_items(x[0])
    items.pop(_position(x, 1, len(items), len(items) - 1))
    return [to_sequence(items)]


def _run_seq_at(n: Node, x: list[Arr]) -> list[Arr]:
    items = sequence_items(x[0])
    return [items[_position(x, 1, len(items), 0)]]


def _run_seq_length(n: Node, x: list[Arr]) -> list[Arr]:
    return [np.array(len(sequence_items(x[0])), np.int64)]


def _import_split_to_seq(ctx: ImportContext) -> None:
    attrs = {"axis": int(ctx.attrs.get("axis", 0)), "keepdims": int(ctx.attrs.get("keepdims", 1))}
    ctx.emit("SplitToSequence", ctx.inputs, ctx.outputs, attrs)
    _set_kind(ctx, ctx.outputs[0], "sequence")


def _run_split_to_seq(n: Node, x: list[Arr]) -> list[Arr]:
    data = np.asarray(x[0])
    axis = int(n.attrs.get("axis", 0))
    axis = axis + data.ndim if axis < 0 else axis
    length = data.shape[axis]
    split = x[1] if len(x) > 1 else None
    if split is None:
        parts = np.split(data, length, axis=axis)
        if not n.attrs.get("keepdims", 1):
            parts = [np.squeeze(p, axis=axis) for p in parts]
        return [to_sequence(parts)]
    split = np.asarray(split)
    if split.ndim == 0:
        size = int(split)
        if size <= 0:
            raise ValueError(f"split must be positive, got {size}")
        cuts = list(range(size, length, size))
    else:
        sizes = [int(s) for s in split]
        if sum(sizes) != length or any(s < 0 for s in sizes):
            raise ValueError(f"split sizes {sizes} must be non-negative and sum to dim {axis} ({length})")
        cuts = list(np.cumsum(sizes)[:-1])
    return [to_sequence(np.split(data, cuts, axis=axis))]


def _run_concat_from_seq(n: Node, x: list[Arr]) -> list[Arr]:
    items = sequence_items(x[0])
    if not items:
        raise ValueError("ConcatFromSequence of an empty sequence")
    axis = int(n.attrs.get("axis", 0))
    if n.attrs.get("new_axis", 0):
        return [np.stack(items, axis=axis)]
    return [np.concatenate(items, axis=axis)]


# --------------------------------------------------------------------------- optionals


def _import_optional(ctx: ImportContext) -> None:
    if ctx.input(0):
        inner = _kind(ctx, ctx.input(0))
        kind = "optional_sequence" if inner == "sequence" else "optional_tensor"
        ctx.emit("Optional", ctx.inputs, ctx.outputs)
        _set_kind(ctx, ctx.outputs[0], kind)
        return
    tp = ctx.proto.attribute
    type_attr = next((a for a in tp if a.name == "type"), None)
    if type_attr is None:
        raise ctx.unsupported("Optional without an input needs the 'type' attribute")
    from ..onnx.types import kind_from_type, shape_from_type

    where = f"node '{ctx.name}' attribute 'type'"
    dtype, _ = shape_from_type(type_attr.tp, where)
    kind = kind_from_type(type_attr.tp, where)
    ctx.emit("Optional", [], ctx.outputs)
    _set_kind(ctx, ctx.outputs[0], f"optional_{kind}", dtype)


def _run_optional(n: Node, x: list[Arr]) -> list[Arr]:
    return [x[0] if x and x[0] is not None else absent()]


def _optional_rule(n: Node, ctx: RuleContext) -> list:
    return [(ctx.dtype(0) if n.inputs else None, None)]


def _import_has_element(ctx: ImportContext) -> None:
    ctx.emit("OptionalHasElement", ctx.inputs, ctx.outputs)


def _run_has_element(n: Node, x: list[Arr]) -> list[Arr]:
    return [np.array(bool(x) and not is_absent(x[0]))]


def _has_element_rule(n: Node, ctx: RuleContext) -> list:
    return [(np.dtype(bool), ())]


def _import_get_element(ctx: ImportContext) -> None:
    inner = _kind(ctx, ctx.input(0))
    ctx.emit("OptionalGetElement", ctx.inputs, ctx.outputs)
    if inner.endswith("sequence"):
        _set_kind(ctx, ctx.outputs[0], "sequence")


def _run_get_element(n: Node, x: list[Arr]) -> list[Arr]:
    if is_absent(x[0]):
        raise ValueError("OptionalGetElement of an empty optional")
    return [x[0]]


def _get_element_rule(n: Node, ctx: RuleContext) -> list:
    v = ctx.value(0)
    return [(ctx.dtype(0), v.shape if v is not None and v.kind == "tensor" else None)]


# --------------------------------------------------------------------------- SequenceMap


def _is_sequence(x: Any) -> bool:
    return (
        isinstance(x, np.ndarray)
        and x.dtype == object
        and x.ndim == 1
        and all(isinstance(e, np.ndarray) for e in x)
    )


def _import_seq_map(ctx: ImportContext) -> None:
    body = ctx.attrs["body"]
    if len(body.inputs) != len(ctx.inputs):
        raise ctx.unsupported(
            f"SequenceMap body takes {len(body.inputs)} inputs but the node has {len(ctx.inputs)}"
        )
    if len(body.outputs) != len(ctx.outputs):
        raise ctx.unsupported(
            f"SequenceMap body has {len(body.outputs)} outputs but the node has {len(ctx.outputs)}"
        )
    caps = free_values(body)
    seq = [_kind(ctx, x) == "sequence" for x in ctx.inputs]
    node = ctx.emit(
        "SequenceMap",
        [*ctx.inputs, *caps],
        ctx.outputs,
        {"body": body, "captures": caps, "sequence_inputs": seq},
    )
    node.inputs = [*ctx.inputs, *caps]
    for o in ctx.outputs:
        if o:
            _set_kind(ctx, o, "sequence")


def _seq_map_rule(n: Node, ctx: RuleContext) -> list:
    from .._shape_infer import infer_shapes

    body = n.attrs["body"]
    caps = list(n.attrs.get("captures", []))
    n_formal = len(n.inputs) - len(caps)
    for j, name in enumerate(body.inputs):
        v = body.values[name]
        outer = ctx.value(j)
        if v.dtype is None and outer is not None:
            v.dtype = outer.dtype
            if outer.kind == "tensor" and not n.attrs["sequence_inputs"][j]:
                v.shape = outer.shape
    for k, c in enumerate(caps):
        outer = ctx.value(n_formal + k)
        v = body.values.get(c) or body._ensure_value(c)
        if outer is not None:
            v.dtype, v.shape, v.kind = outer.dtype, outer.shape, outer.kind
    infer_shapes(body, reset=True)
    return [(body.values[o].dtype if o in body.values else None, None) for o in body.outputs]


def _run_seq_map(n: Node, x: list[Arr]) -> list[Arr]:
    from .control import run_subgraph

    body = n.attrs["body"]
    caps = list(n.attrs.get("captures", []))
    formal = x[: len(x) - len(caps)] if caps else x
    outer = dict(zip(caps, x[len(formal) :], strict=True))
    flags = list(n.attrs.get("sequence_inputs", []))
    is_seq = [
        bool(flags[j]) if j < len(flags) and flags[j] else _is_sequence(v) for j, v in enumerate(formal)
    ]
    items = [sequence_items(v) if s else v for v, s in zip(formal, is_seq, strict=True)]
    lengths = {len(v) for v, s in zip(items, is_seq, strict=True) if s}
    if len(lengths) > 1:
        raise ValueError(f"SequenceMap input sequences have different lengths {sorted(lengths)}")
    count = lengths.pop() if lengths else 0
    outs: list[list[Any]] = [[] for _ in body.outputs]
    where = f"node '{n.name}' (SequenceMap)"
    for i in range(count):
        feeds = {**outer}
        feeds.update(
            {name: (v[i] if s else v) for name, v, s in zip(body.inputs, items, is_seq, strict=True)}
        )
        for k, r in enumerate(run_subgraph(body, feeds, where)):
            outs[k].append(np.array(r, copy=True))
    return [to_sequence(o) for o in outs]


# --------------------------------------------------------------------------- export


def _export_seq_map(node: Node, ctx: ExportContext) -> None:
    """SequenceMap back to ONNX: captures leave the inputs (the body reads them by name again)."""
    caps = list(node.attrs.get("captures", []))
    n_formal = len(node.inputs) - len(caps)
    body = export_subgraph(node.attrs["body"], ctx, dict(zip(caps, node.inputs[n_formal:], strict=True)))
    ctx.emit("SequenceMap", node.inputs[:n_formal], node.outputs, body=body)


def _export_optional(node: Node, ctx: ExportContext) -> None:
    """Optional with no input needs its ``type`` attribute: rebuilt from the output Value."""
    if node.inputs:
        ctx.emit("Optional", node.inputs, node.outputs)
        return
    v = ctx.graph.value(node.outputs[0])
    inner = "sequence" if v.kind.endswith("sequence") else "tensor"
    tp = tensor_type_of(node.outputs[0], v.dtype, None, inner).type
    ctx.emit("Optional", [], node.outputs, type=tp)


define(
    "SequenceEmpty", attrs={"dtype": 1}, importer=_import_seq_empty, shape=_seq_empty_rule,
    kernel=_run_seq_empty, uses=(HOST,), dtypes="all", doc="an empty sequence of element dtype `dtype`",
)  # fmt: skip
define(
    "SequenceConstruct", importer=_import_seq, shape=_seq_rule, kernel=_run_seq_construct, uses=(HOST,),
    dtypes="all", doc="a sequence of the input tensors",
)  # fmt: skip
define(
    "SequenceInsert", importer=_import_seq, shape=_seq_rule, kernel=_run_seq_insert, uses=(HOST,),
    dtypes="all", doc="the sequence with a tensor inserted at `position` (default: the end)",
)  # fmt: skip
define(
    "SequenceErase", importer=_import_seq, shape=_seq_rule, kernel=_run_seq_erase, uses=(HOST,),
    dtypes="all", doc="the sequence without the tensor at `position` (default: the last)",
)  # fmt: skip
define(
    "SequenceAt", shape=_tensor_rule, kernel=_run_seq_at, uses=(HOST,), dtypes="all",
    doc="the tensor at `position` of a sequence",
)  # fmt: skip
define(
    "SequenceLength", shape=lambda n, ctx: [(np.dtype(np.int64), ())], kernel=_run_seq_length, uses=(HOST,),
    dtypes="all", doc="the number of tensors in a sequence (int64 scalar)",
)  # fmt: skip
define(
    "SplitToSequence", attrs={"axis": 0, "keepdims": 1}, importer=_import_split_to_seq, shape=_seq_rule,
    kernel=_run_split_to_seq, uses=(HOST,), dtypes="all", doc="a tensor split along `axis` into a sequence",
)  # fmt: skip
define(
    "ConcatFromSequence", attrs={"axis": 0, "new_axis": 0}, shape=_tensor_rule, kernel=_run_concat_from_seq,
    uses=(HOST,), dtypes="all", doc="a sequence's tensors concatenated (or stacked: `new_axis`) along `axis`",
)  # fmt: skip
define(
    "SequenceMap", importer=_import_seq_map, shape=_seq_map_rule, kernel=_run_seq_map, uses=(HOST,), dtypes="all",
    doc="runs the `body` subgraph on each element of the input sequences (tensor inputs passed whole)",
)  # fmt: skip
define(
    "Optional", importer=_import_optional, shape=_optional_rule, kernel=_run_optional, uses=(HOST,),
    dtypes="all", doc="an optional holding the input (or empty, typed by `type`)",
)  # fmt: skip
define(
    "OptionalHasElement", importer=_import_has_element, shape=_has_element_rule, kernel=_run_has_element,
    uses=(HOST,), dtypes="all", doc="bool scalar: the optional input is present and non-empty",
)  # fmt: skip
define(
    "OptionalGetElement", importer=_import_get_element, shape=_get_element_rule, kernel=_run_get_element,
    uses=(HOST,), dtypes="all", doc="the value inside an optional (an error when it is empty)",
)  # fmt: skip
register_export("SequenceMap", _export_seq_map)
register_export("Optional", _export_optional)
