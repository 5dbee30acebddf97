"""Math ops of the ONNX operator specification: trigonometric and hyperbolic functions, Ceil/Floor/Round,
Sign, Mod, BitShift, Bitwise*, IsNaN/IsInf, Det, Mean (variadic) and CumProd (a constant axis input
becomes an attribute in the IR, one computed at run time stays an input; written back as an input on export).

Simple ops are one row each; the executor kernel is one opstrata.ops call. None has a codegen
expression (the generator has no trig, rounding or bitwise ops), so none joins a FusedElementwise chain.
"""

from __future__ import annotations

import numpy as np

import opstrata.ops as ops

from .._ir import Node
from .._shape_rules import RuleContext, TypeShape, bcast, binary, float_dtype, unary_float, unary_num
from ..onnx.context import ImportContext
from ..onnx.export import ExportContext, register_export
from .common import Arr, one
from .reduce import scan_axis
from .registry import define


def _int_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    for i in range(len(n.inputs)):
        ctx.need_dtype(i, "iu", "an integer tensor")
    idx = range(len(n.inputs))
    return [(ctx.same_dtype(idx), bcast(ctx, idx))]


def _is_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    float_dtype(ctx)
    return [(np.dtype(bool), ctx.shape(0))]


def _det_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt, s = float_dtype(ctx), ctx.shape(0)
    if s is None:
        return [(dt, None)]
    if len(s) < 2:
        raise ctx.fail(
            f"Det needs an input of shape (..., M, M), got {s}", "Reshape the input to (..., M, M)"
        )
    m, k = s[-2], s[-1]
    if isinstance(m, int) and isinstance(k, int) and m != k:
        raise ctx.fail(
            f"inconsistent shapes: Det needs square matrices, got {s}", "pass (..., M, M) matrices"
        )
    return [(dt, tuple(s[:-2]))]


def _mean_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    float_dtype(ctx)
    return binary(n, ctx)


def _cumprod_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    if "axis" in n.attrs:  # else a run-time input, checked by the kernel
        ctx.axis(n.attrs["axis"], ctx.rank(0))
    return [(ctx.dtype(0), ctx.shape(0))]


def _import_mean(ctx: ImportContext) -> None:
    ctx.emit("Identity" if len(ctx.inputs) == 1 else "Mean", ctx.inputs, ctx.outputs)


def _import_cumprod(ctx: ImportContext) -> None:
    axis, runtime = ctx.ints_or_input(1)
    if not runtime and (not axis or len(axis) != 1):
        raise ctx.unsupported(f"CumProd needs a one-element axis input, got {axis}")
    attrs = {"exclusive": int(ctx.attrs.get("exclusive", 0)), "reverse": int(ctx.attrs.get("reverse", 0))}
    if not runtime:  # a constant axis becomes the attribute; one computed at run time stays an input
        attrs["axis"] = axis[0]  # type: ignore[index]
    ctx.emit("CumProd", ctx.inputs[:1] + runtime, ctx.outputs, attrs)


def _export_cumprod(n: Node, ctx: ExportContext) -> None:
    """The IR's axis attribute (or run-time input) back to ONNX CumProd's axis input."""
    axis = ctx.const(np.array(n.attrs["axis"], np.int64), "axis") if "axis" in n.attrs else n.inputs[1]
    ctx.emit(
        "CumProd",
        [n.inputs[0], axis],
        n.outputs,
        exclusive=n.attrs.get("exclusive", 0),
        reverse=n.attrs.get("reverse", 0),
    )


def _run_mod(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.mod(x[0], x[1], fmod=bool(n.attrs.get("fmod", 0)))]


def _run_bitshift(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.bit_shift(x[0], x[1], direction=str(n.attrs["direction"]))]


def _run_isinf(n: Node, x: list[Arr]) -> list[Arr]:
    a = n.attrs
    return [
        ops.isinf(
            x[0],
            detect_positive=bool(a.get("detect_positive", 1)),
            detect_negative=bool(a.get("detect_negative", 1)),
        )
    ]


def _run_mean(n: Node, x: list[Arr]) -> list[Arr]:
    dt = x[0].dtype
    work = ops.compute_dtype(dt)  # low precision: sum and divide in float32, round once
    acc = x[0].astype(work)
    for b in x[1:]:
        acc = ops.add(acc, b.astype(work))
    return [ops.cast(ops.div(acc, np.asarray(len(x), work)), dtype=dt)]


def _run_cumprod(n: Node, x: list[Arr]) -> list[Arr]:
    a = n.attrs
    return [
        ops.cumprod(
            x[0],
            axis=scan_axis(n, x),
            exclusive=bool(a.get("exclusive", 0)),
            reverse=bool(a.get("reverse", 0)),
        )
    ]


# --------------------------------------------------------------------------- the rows

_FLOAT_UNARY = {
    "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan",
    "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
    "Ceil": "ceil", "Floor": "floor", "Round": "round",
}  # fmt: skip
for _name, _fn in _FLOAT_UNARY.items():
    define(
        _name,
        shape=unary_float,
        kernel=one(getattr(ops, _fn)),
        uses=(_fn,),
        elementwise="unary",
        dtypes="float",
    )
define("Sign", shape=unary_num, kernel=one(ops.sign), uses=("sign",), elementwise="unary", dtypes="numeric")
define("IsNaN", shape=_is_rule, kernel=one(ops.isnan), uses=("isnan",), elementwise="unary", dtypes="float")
define(
    "IsInf", attrs={"detect_negative": 1, "detect_positive": 1}, shape=_is_rule, kernel=_run_isinf,
    uses=("isinf",), elementwise="unary", dtypes="float",
)  # fmt: skip
define(
    "Mod", attrs={"fmod": 0}, shape=binary, kernel=_run_mod, uses=("mod",), elementwise="binary",
    dtypes="numeric", doc="fmod=0 floors (sign of the divisor), fmod=1 truncates (sign of the dividend)",
)  # fmt: skip
define(
    "BitShift", shape=_int_rule, kernel=_run_bitshift, uses=("bit_shift",), elementwise="binary", dtypes="int"
)
for _name, _fn in {
    "BitwiseAnd": "bitwise_and",
    "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor",
}.items():
    define(
        _name, shape=_int_rule, kernel=one(getattr(ops, _fn)), uses=(_fn,), elementwise="binary", dtypes="int"
    )
define(
    "BitwiseNot", shape=_int_rule, kernel=one(ops.bitwise_not), uses=("bitwise_not",), elementwise="unary",
    dtypes="int",
)  # fmt: skip
define("Det", shape=_det_rule, kernel=one(ops.det), uses=("det",), dtypes="float")
define(
    "Mean", importer=_import_mean, shape=_mean_rule, kernel=_run_mean, uses=("add", "div", "cast"),
    elementwise="variadic", dtypes="float",
)  # fmt: skip
define(
    "CumProd", importer=_import_cumprod, shape=_cumprod_rule, kernel=_run_cumprod, uses=("cumprod",),
    dtypes="numeric",
)  # fmt: skip
register_export("CumProd", _export_cumprod)
