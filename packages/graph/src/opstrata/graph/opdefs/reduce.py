"""Reductions and scans (ONNX operator spec): ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare
(from opset 18, ReduceSum 13, ONNX passes axes as an input: a constant one becomes the IR's ``axes``
attribute, one computed at run time stays the node's second input and the kernel reads it, an empty one
meaning every axis or, with noop_with_empty_axes, none), ArgMax and ArgMin (select_last_index too),
CumSum (axis likewise an attribute or a run-time input).

An empty reduction gives the ONNX identity: 0 for the sums, 1 for ReduceProd, -inf for the logs, and for
ReduceMax/ReduceMin the lowest/highest value of the dtype (-inf/inf for floats)."""

from __future__ import annotations

import numpy as np

import opstrata.ops as ops

from .._errors import GraphError
from .._ir import Node
from .._shape_rules import (
    RuleContext,
    TypeShape,
    float_dtype,
    reduce_shape,
)
from .._symbolic import Shape
from ..onnx.context import ImportContext
from ..onnx.export import _reduce as _export_reduce, register_export
from .common import Arr
from .registry import define

_PLAIN = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd")  # identity over no axes


def _import_reduce(ctx: ImportContext) -> None:
    axes_is_input = ctx.since >= 18 or (ctx.op_type == "ReduceSum" and ctx.since >= 13)
    if ctx.op_type not in ("ReduceMax", "ReduceMin"):
        _refuse_bool(ctx)
    keep, noop = int(ctx.attrs.get("keepdims", 1)), int(ctx.attrs.get("noop_with_empty_axes", 0))
    axes, runtime = ctx.ints_or_input(1) if axes_is_input else (ctx.attrs.get("axes"), [])
    if runtime:  # axes computed at run time: the node keeps the input and the kernel reads it
        attrs = {"keepdims": keep, "noop_with_empty_axes": noop}
        ctx.emit(ctx.op_type, ctx.inputs[:1] + runtime, ctx.outputs, attrs)
        return
    if not axes:
        if noop:
            if ctx.op_type in _PLAIN:
                ctx.emit("Identity", ctx.inputs[:1], ctx.outputs)
            else:  # no reduction, but the elementwise part stays (ReduceSumSquare acts as Square)
                attrs = {"axes": [], "keepdims": keep, "noop_with_empty_axes": 1}
                ctx.emit(ctx.op_type, ctx.inputs[:1], ctx.outputs, attrs)
            return
        axes = None
    ctx.emit(
        ctx.op_type,
        ctx.inputs[:1],
        ctx.outputs,
        {"axes": None if axes is None else list(axes), "keepdims": keep},
    )


def _refuse_bool(ctx: ImportContext) -> None:
    v = ctx.graph.values.get(ctx.input(0))
    if v is not None and v.dtype is not None and v.dtype == np.bool_:
        raise ctx.unsupported(
            f"{ctx.op_type} of a bool tensor is not in the ONNX spec; Cast it to int64 first"
        )


def _import_argmax(ctx: ImportContext) -> None:
    attrs = {"axis": int(ctx.attrs.get("axis", 0)), "keepdims": int(ctx.attrs.get("keepdims", 1))}
    attrs["select_last_index"] = int(ctx.attrs.get("select_last_index", 0))
    ctx.emit(ctx.op_type, ctx.inputs, ctx.outputs, attrs)


def _import_cumsum(ctx: ImportContext) -> None:
    axis, runtime = ctx.ints_or_input(1)
    if axis is not None and len(axis) != 1:
        raise ctx.unsupported(f"CumSum needs a one-element axis input, got {axis}")
    attrs = {"exclusive": int(ctx.attrs.get("exclusive", 0)), "reverse": int(ctx.attrs.get("reverse", 0))}
    if not runtime:  # a constant axis (0 when omitted) becomes the attribute; else the kernel reads it
        attrs["axis"] = axis[0] if axis else 0
    ctx.emit("CumSum", ctx.inputs[:1] + runtime, ctx.outputs, attrs)


def _reduce_axes(n: Node, ctx: RuleContext) -> tuple[list[int] | None, bool]:
    """(axes, known): the attribute, or the run-time axes input's contents when shape folding knows them
    (None: every axis, as an empty axes tensor means without noop_with_empty_axes)."""
    if len(n.inputs) < 2 or not n.inputs[1]:
        return n.attrs.get("axes"), True
    axes = ctx.static_ints(1)
    if axes is None:
        return None, False
    return (None if not axes and not n.attrs.get("noop_with_empty_axes", 0) else axes), True


def _runtime_reduce_shape(n: Node, ctx: RuleContext) -> Shape | None:
    """The output shape when the axes are known only at run time: with keepdims the rank stays (reduced
    dims unknown); without it, the rank is known when the axes tensor's length is."""
    x = ctx.shape(0)
    if x is None:
        return None
    if n.attrs.get("keepdims", 1):
        return tuple(1 if d == 1 else None for d in x)
    k = ctx.shape(1)
    if not k or not isinstance(k[0], int):
        return None
    if k[0] == 0:
        return tuple(x) if n.attrs.get("noop_with_empty_axes", 0) else ()
    return (None,) * (len(x) - k[0]) if k[0] <= len(x) else None


#: Integer dtypes ReduceMean takes (ONNX opset 18): ops.mean truncates toward zero, as onnxruntime does.
_INT_MEAN_DTYPES = ops.MEAN_INT_DTYPES


def _reduce_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = ctx.dtype(0)
    if n.op_type == "ReduceMean" and dt not in _INT_MEAN_DTYPES:
        dt = float_dtype(ctx)
    if dt is not None and dt == np.bool_ and n.op_type not in ("ReduceMax", "ReduceMin"):
        raise ctx.fail(f"{n.op_type} does not take bool input", "insert a Cast to int64")
    axes, known = _reduce_axes(n, ctx)
    if not known:
        return [(dt, _runtime_reduce_shape(n, ctx))]
    return [(dt, reduce_shape(ctx, ctx.shape(0), axes, bool(n.attrs.get("keepdims", 1))))]


def _argmax_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [
        (
            np.dtype(np.int64),
            reduce_shape(ctx, ctx.shape(0), [n.attrs.get("axis", 0)], bool(n.attrs.get("keepdims", 1))),
        )
    ]


def _cumsum_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    if "axis" in n.attrs:  # else a run-time input, checked by the kernel
        ctx.axis(n.attrs["axis"], ctx.rank(0))
    return [(ctx.dtype(0), ctx.shape(0))]


_REDUCE = {
    "ReduceSum": ops.sum, "ReduceMean": ops.mean, "ReduceMax": ops.max, "ReduceMin": ops.min,
    "ReduceProd": ops.prod, "ReduceL1": ops.reduce_l1, "ReduceL2": ops.reduce_l2,
    "ReduceLogSum": ops.reduce_log_sum, "ReduceLogSumExp": ops.reduce_log_sum_exp,
    "ReduceSumSquare": ops.reduce_sum_square,
}  # fmt: skip


def _empty_extreme(op_type: str, x: Arr, axes: tuple[int, ...] | None, keep: bool) -> Arr:
    """ReduceMax/ReduceMin over an empty set: the dtype's lowest/highest value (ONNX; -inf/inf for floats)."""
    dt = x.dtype
    if dt == np.bool_:
        fill: object = op_type == "ReduceMin"
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        fill = info.min if op_type == "ReduceMax" else info.max
    else:
        fill = -np.inf if op_type == "ReduceMax" else np.inf
    ax = range(x.ndim) if axes is None else [a % x.ndim for a in axes]
    shape = tuple(1 if i in ax else d for i, d in enumerate(x.shape) if keep or i not in ax)
    return np.full(shape, fill, dt)


def _run_axes(n: Node, x: list[Arr]) -> tuple[int, ...] | None:
    """The axes to reduce: the attribute, or the run-time input (empty: every axis, or none at all with
    noop_with_empty_axes); GraphError when one is out of range or repeated."""
    if len(x) < 2 or x[1] is None:
        axes = n.attrs.get("axes")
        return None if axes is None else tuple(axes)
    ax = tuple(int(a) for a in np.asarray(x[1]).ravel())
    if not ax:
        return () if n.attrs.get("noop_with_empty_axes", 0) else None
    r = x[0].ndim
    if any(not -r <= a < r for a in ax) or len({a % r for a in ax}) != len(ax):
        raise GraphError(
            f"node '{n.name}' ({n.op_type})",
            f"axes {list(ax)} must be distinct axes of the rank-{r} input",
            f"use values in -{r}..{r - 1}",
        )
    return ax


def _run_reduce(n: Node, x: list[Arr]) -> list[Arr]:
    ax = _run_axes(n, x)
    keep = bool(n.attrs.get("keepdims", 1))
    if ax == () and n.op_type in _PLAIN:  # noop_with_empty_axes: the input unchanged
        return [x[0].copy()]
    reduced = range(x[0].ndim) if ax is None else ax
    if n.op_type in ("ReduceMax", "ReduceMin") and any(x[0].shape[a] == 0 for a in reduced):
        return [_empty_extreme(n.op_type, x[0], ax, keep)]
    out = _REDUCE[n.op_type](x[0], axis=ax, keepdims=keep)
    return [np.asarray(out).astype(x[0].dtype, copy=False)]  # ONNX keeps the input dtype (ints too)


def scan_axis(n: Node, x: list[Arr]) -> int:
    """CumSum/CumProd's axis: the attribute, or the one-element run-time input."""
    if len(x) < 2 or x[1] is None:
        return int(n.attrs["axis"])
    a = np.asarray(x[1]).ravel()
    if a.size != 1:
        raise GraphError(f"node '{n.name}' ({n.op_type})", f"axis must hold one value, got {a.tolist()}")
    return int(a[0])


def _run_argmax(n: Node, x: list[Arr]) -> list[Arr]:
    axis, keep = n.attrs.get("axis", 0), bool(n.attrs.get("keepdims", 1))
    last = n.attrs.get("select_last_index", 0)
    if n.op_type == "ArgMin":
        return [ops.argmin(x[0], axis=axis, keepdims=keep, select_last_index=bool(last))]
    if not last:
        return [np.asarray(ops.argmax(x[0], axis=axis, keepdims=keep))]
    ax = axis % x[0].ndim  # the last maximum: the first one of the reversed axis, counted from the end
    first = np.asarray(ops.argmax(np.flip(x[0], ax), axis=ax, keepdims=keep))
    return [(x[0].shape[ax] - 1 - first).astype(np.int64)]


def _run_cumsum(n: Node, x: list[Arr]) -> list[Arr]:
    a = n.attrs
    out = ops.cumsum(
        x[0], axis=scan_axis(n, x), exclusive=bool(a.get("exclusive", 0)), reverse=bool(a.get("reverse", 0))
    )
    return [out.astype(x[0].dtype, copy=False)]


_REDUCE_KERNELS = {
    "ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min", "ReduceProd": "prod",
    "ReduceL1": "reduce_l1", "ReduceL2": "reduce_l2", "ReduceLogSum": "reduce_log_sum",
    "ReduceLogSumExp": "reduce_log_sum_exp", "ReduceSumSquare": "reduce_sum_square",
}  # fmt: skip
for _name, _fn in _REDUCE_KERNELS.items():
    _dts = (
        "float, int32, int64, uint32, uint64"
        if _name == "ReduceMean"
        else "numeric, bool"
        if _name in ("ReduceMax", "ReduceMin")
        else "numeric"
    )
    define(
        _name, importer=_import_reduce, shape=_reduce_rule, kernel=_run_reduce, uses=(_fn,), dtypes=_dts,
        layout="reduce",
    )  # fmt: skip
    register_export(_name, _export_reduce)  # axes back to an input from opset 18
define("ArgMax", importer=_import_argmax, shape=_argmax_rule, kernel=_run_argmax, uses=("argmax",))
define("ArgMin", importer=_import_argmax, shape=_argmax_rule, kernel=_run_argmax, uses=("argmin",))
define("CumSum", importer=_import_cumsum, shape=_cumsum_rule, kernel=_run_cumsum, uses=("cumsum",))
