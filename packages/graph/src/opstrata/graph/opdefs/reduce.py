"""Reductions and scans: ReduceSum/Mean/Max/Min (axes as attributes in the IR), ArgMax, CumSum."""

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
from .common import Arr
from .registry import define


def _import_reduce(ctx: ImportContext) -> None:
    axes_is_input = ctx.since >= 18 or (ctx.op_type == "ReduceSum" and ctx.since >= 13)
    axes = ctx.const_ints(1, "axes") if axes_is_input else ctx.attrs.get("axes")
    keep = int(ctx.attrs.get("keepdims", 1))
    if not axes:
        if ctx.attrs.get("noop_with_empty_axes", 0):
            ctx.emit("Identity", ctx.inputs[:1], ctx.outputs)
            return
        axes = None
    ctx.emit(
        ctx.op_type,
        ctx.inputs[:1],
        ctx.outputs,
        {"axes": None if axes is None else list(axes), "keepdims": keep},
    )


def _import_argmax(ctx: ImportContext) -> None:
    if ctx.attrs.get("select_last_index", 0):
        raise ctx.unsupported("ArgMax with select_last_index=1 is not supported")
    attrs = {"axis": int(ctx.attrs.get("axis", 0)), "keepdims": int(ctx.attrs.get("keepdims", 1))}
    ctx.emit("ArgMax", ctx.inputs, ctx.outputs, attrs)


def _import_cumsum(ctx: ImportContext) -> None:
    axis = ctx.const_ints(1, "axis")
    attrs = {"axis": axis[0] if axis else 0, "exclusive": int(ctx.attrs.get("exclusive", 0))}
    attrs["reverse"] = int(ctx.attrs.get("reverse", 0))
    ctx.emit("CumSum", ctx.inputs[:1], ctx.outputs, attrs)


def _reduce_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = float_dtype(ctx) if n.op_type == "ReduceMean" else ctx.dtype(0)
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


_REDUCE = {"ReduceSum": ops.sum, "ReduceMean": ops.mean, "ReduceMax": ops.max, "ReduceMin": ops.min}


def _run_reduce(n: Node, x: list[Arr]) -> list[Arr]:
    axes = n.attrs.get("axes")
    out = _REDUCE[n.op_type](
        x[0], axis=None if axes is None else tuple(axes), keepdims=bool(n.attrs.get("keepdims", 1))
    )
    return [np.asarray(out).astype(x[0].dtype, copy=False)]  # ONNX keeps the input dtype (ints too)


def _run_argmax(n: Node, x: list[Arr]) -> list[Arr]:
    return [
        np.asarray(ops.argmax(x[0], axis=n.attrs.get("axis", 0), keepdims=bool(n.attrs.get("keepdims", 1))))
    ]


def _run_cumsum(n: Node, x: list[Arr]) -> list[Arr]:
    a = n.attrs
    out = ops.cumsum(
        x[0], axis=a["axis"], exclusive=bool(a.get("exclusive", 0)), reverse=bool(a.get("reverse", 0))
    )
    return [out.astype(x[0].dtype, copy=False)]


for _name, _fn in {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min"}.items():
    define(_name, importer=_import_reduce, shape=_reduce_rule, kernel=_run_reduce, uses=(_fn,))
define("ArgMax", importer=_import_argmax, shape=_argmax_rule, kernel=_run_argmax, uses=("argmax",))
define("CumSum", importer=_import_cumsum, shape=_cumsum_rule, kernel=_run_cumsum, uses=("cumsum",))
