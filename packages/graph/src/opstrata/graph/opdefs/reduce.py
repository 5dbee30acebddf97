"""Reductions and scans (ONNX operator spec): ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare
(axes as attributes in the IR; from opset 18 ONNX passes them as a constant input), ArgMax and ArgMin
(select_last_index too), CumSum.

An empty reduction gives the ONNX identity: 0 for the sums, 1 for ReduceProd, -inf for the logs, and for
ReduceMax/ReduceMin the lowest/highest value of the dtype (-inf/inf for floats)."""

from __future__ import annotations

import numpy as np

import opstrata.ops as ops

from .._ir import Node
from .._shape_rules import (
    RuleContext,
    TypeShape,
    float_dtype,
    reduce_shape,
)
from ..onnx.context import ImportContext
from ..onnx.export import _reduce as _export_reduce, register_export
from .common import Arr
from .registry import define

_PLAIN = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd")  # identity over no axes


def _import_reduce(ctx: ImportContext) -> None:
    axes_is_input = ctx.since >= 18 or (ctx.op_type == "ReduceSum" and ctx.since >= 13)
    if ctx.op_type not in ("ReduceMax", "ReduceMin"):
        _refuse_bool(ctx)
    axes = ctx.const_ints(1, "axes") if axes_is_input else ctx.attrs.get("axes")
    keep = int(ctx.attrs.get("keepdims", 1))
    if not axes:
        if ctx.attrs.get("noop_with_empty_axes", 0):
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
    axis = ctx.const_ints(1, "axis")
    attrs = {"axis": axis[0] if axis else 0, "exclusive": int(ctx.attrs.get("exclusive", 0))}
    attrs["reverse"] = int(ctx.attrs.get("reverse", 0))
    ctx.emit("CumSum", ctx.inputs[:1], ctx.outputs, attrs)


def _reduce_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = float_dtype(ctx) if n.op_type == "ReduceMean" else ctx.dtype(0)
    if dt is not None and dt == np.bool_ and n.op_type not in ("ReduceMax", "ReduceMin"):
        raise ctx.fail(f"{n.op_type} does not take bool input", "insert a Cast to int64")
    return [(dt, reduce_shape(ctx, ctx.shape(0), n.attrs.get("axes"), bool(n.attrs.get("keepdims", 1))))]


def _argmax_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [
        (
            np.dtype(np.int64),
            reduce_shape(ctx, ctx.shape(0), [n.attrs.get("axis", 0)], bool(n.attrs.get("keepdims", 1))),
        )
    ]


def _cumsum_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
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


def _run_reduce(n: Node, x: list[Arr]) -> list[Arr]:
    axes = n.attrs.get("axes")
    ax = None if axes is None else tuple(axes)
    keep = bool(n.attrs.get("keepdims", 1))
    reduced = range(x[0].ndim) if ax is None else ax
    if n.op_type in ("ReduceMax", "ReduceMin") and any(x[0].shape[a] == 0 for a in reduced):
        return [_empty_extreme(n.op_type, x[0], ax, keep)]
    out = _REDUCE[n.op_type](x[0], axis=ax, keepdims=keep)
    return [np.asarray(out).astype(x[0].dtype, copy=False)]  # ONNX keeps the input dtype (ints too)


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
        x[0], axis=a["axis"], exclusive=bool(a.get("exclusive", 0)), reverse=bool(a.get("reverse", 0))
    )
    return [out.astype(x[0].dtype, copy=False)]


_REDUCE_KERNELS = {
    "ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min", "ReduceProd": "prod",
    "ReduceL1": "reduce_l1", "ReduceL2": "reduce_l2", "ReduceLogSum": "reduce_log_sum",
    "ReduceLogSumExp": "reduce_log_sum_exp", "ReduceSumSquare": "reduce_sum_square",
}  # fmt: skip
for _name, _fn in _REDUCE_KERNELS.items():
    _dts = (
        "float"
        if _name == "ReduceMean"
        else "numeric, bool"
        if _name in ("ReduceMax", "ReduceMin")
        else "numeric"
    )
    define(_name, importer=_import_reduce, shape=_reduce_rule, kernel=_run_reduce, uses=(_fn,), dtypes=_dts)
    register_export(_name, _export_reduce)  # axes back to an input from opset 18
define("ArgMax", importer=_import_argmax, shape=_argmax_rule, kernel=_run_argmax, uses=("argmax",))
define("ArgMin", importer=_import_argmax, shape=_argmax_rule, kernel=_run_argmax, uses=("argmin",))
define("CumSum", importer=_import_cumsum, shape=_cumsum_rule, kernel=_run_cumsum, uses=("cumsum",))
