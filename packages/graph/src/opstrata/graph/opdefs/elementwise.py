"""Elementwise ops: arithmetic, comparison, logic, unary math, Clip, Cast, CastLike (ONNX semantics, numpy broadcasting).

Most are one row: name, shape rule, kernel, the opstrata.ops kernels it uses, its elementwise class
and the code generator's name for it (fusable into a FusedElementwise chain)."""

from __future__ import annotations

from typing import Any

import numpy as np

import opstrata.ops as ops

from .._ir import Node
from .._shape_rules import (
    RuleContext,
    TypeShape,
    bcast,
    binary,
    float_dtype,
    unary_float,
    unary_num,
)
from ..onnx.context import ImportContext
from ..onnx.types import dtype_from_onnx
from .common import Arr, one
from .registry import HOST, define


def _pow_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    base = ctx.dtype(0)
    dt = base if base is not None and base.kind in "iu" else float_dtype(ctx)
    return [(dt, bcast(ctx, [0, 1]))]


def _compare_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.same_dtype([0, 1])
    return [(np.dtype(bool), bcast(ctx, [0, 1]))]


def _logical_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    for i in range(len(n.inputs)):
        ctx.need_dtype(i, "b", "bool")
    return [(np.dtype(bool), bcast(ctx, range(len(n.inputs))))]


def _where_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(0, "b", "bool")
    return [(ctx.same_dtype([1, 2]), bcast(ctx, [0, 1, 2]))]


def _clip_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(ctx.same_dtype([i for i in range(len(n.inputs)) if n.inputs[i]]), ctx.shape(0))]


def _cast_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(np.dtype(n.attrs["to"]), ctx.shape(0))]


def _import_variadic(ctx: ImportContext) -> None:
    ctx.emit("Identity" if len(ctx.inputs) == 1 else ctx.op_type, ctx.inputs, ctx.outputs)


def _import_cast(ctx: ImportContext) -> None:
    to = dtype_from_onnx(ctx.attrs["to"], f"node '{ctx.name}'")
    attrs: dict[str, Any] = {"to": to}
    if to.name in ("float8_e4m3fn", "float8_e5m2") and ctx.attrs.get("saturate", 1):  # ONNX default: clamp
        attrs["saturate"] = 1
    ctx.emit("Cast", ctx.inputs, ctx.outputs, attrs)


def _run_div(n: Node, x: list[Arr]) -> list[Arr]:
    a, b = x
    if a.dtype.kind in "iu":  # host: integer shape arithmetic, C-style truncation as ONNX Runtime
        q = np.abs(a) // np.abs(b)
        return [np.asarray(np.where((a < 0) ^ (b < 0), -q, q), a.dtype)]
    return [ops.div(a, b)]


def _run_pow(n: Node, x: list[Arr]) -> list[Arr]:
    a, b = x
    if a.dtype.kind in "iu":  # ONNX Pow with an integer base keeps the base's dtype (as ONNX Runtime)
        if b.dtype.kind in "iu":
            return [ops.pow(a, b.astype(a.dtype, copy=False))]
        with np.errstate(all="ignore"):  # host: a float exponent evaluates in float64 and truncates
            return [np.asarray(np.power(a.astype(np.float64), b.astype(np.float64))).astype(a.dtype)]
    return [ops.pow(a, b.astype(a.dtype, copy=False))]


def _run_reciprocal(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.div(np.ones((), x[0].dtype), x[0])]


def _run_variadic(n: Node, x: list[Arr]) -> list[Arr]:
    acc = x[0]
    for b in x[1:]:
        if n.op_type == "Sum":
            acc = ops.add(acc, b)
        else:
            pick = ops.greater(acc, b) if n.op_type == "Max" else ops.less(acc, b)
            acc = ops.where(pick, acc, b)
    return [np.asarray(acc)]


def _run_cmp_eq(n: Node, x: list[Arr]) -> list[Arr]:
    strict = ops.less(*x) if n.op_type == "LessOrEqual" else ops.greater(*x)
    return [np.logical_or(strict, ops.equal(*x))]


def _run_logic(n: Node, x: list[Arr]) -> list[Arr]:
    fn = {"Not": np.logical_not, "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}[n.op_type]
    return [np.asarray(fn(*x))]


def _run_clip(n: Node, x: list[Any]) -> list[Arr]:
    lo = x[1] if len(x) > 1 else None
    hi = x[2] if len(x) > 2 else None
    if lo is None and hi is None:
        return [x[0]]
    return [ops.clip(x[0], min=lo, max=hi)]


_FLOAT8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}  # largest finite values


def _run_cast(n: Node, x: list[Arr]) -> list[Arr]:
    return [_cast_to(x[0], np.dtype(n.attrs["to"]), bool(n.attrs.get("saturate")))]


def _run_castlike(n: Node, x: list[Arr]) -> list[Arr]:
    # saturate (opset 19+, default 1) stays off the IR node unless the model sets it, so export to an
    # older opset writes no attribute it does not know
    return [_cast_to(x[0], x[1].dtype, bool(n.attrs.get("saturate", 1)))]


def _castlike_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(ctx.dtype(1), ctx.shape(0))]


def _cast_to(src: Arr, to: np.dtype, saturate: bool) -> Arr:
    hi = _FLOAT8_MAX.get(to.name) if saturate else None
    if (
        hi is not None
        and src.dtype.itemsize > 1
        and (src.dtype.kind == "f" or src.dtype in ops.LOW_PRECISION_DTYPES)
    ):
        # ONNX Cast(saturate=1) to float8: out-of-range and ±inf become ±max; NaN stays NaN
        src = ops.clip(src, min=np.asarray(-hi, src.dtype), max=np.asarray(hi, src.dtype))
    return ops.cast(src, dtype=to)


def _run_identity(n: Node, x: list[Arr]) -> list[Arr]:
    return [x[0]]


def _run_gelu(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.gelu(x[0], approximate=n.attrs.get("approximate", "none"))]


# --------------------------------------------------------------------------- the rows

# unary math: name -> (rule, opstrata.ops kernel = codegen name, dtypes)
for _name, (_rule, _fn, _dt) in {
    "Exp": (unary_float, "exp", "float"), "Log": (unary_float, "log", "float"),
    "Sqrt": (unary_float, "sqrt", "float"), "Tanh": (unary_float, "tanh", "float"),
    "Erf": (unary_float, "erf", "float"), "Sigmoid": (unary_float, "sigmoid", "float"),
    "Relu": (unary_num, "relu", "numeric"), "Neg": (unary_num, "neg", "numeric"),
    "Abs": (unary_num, "abs", "numeric"),
}.items():  # fmt: skip
    define(
        _name, shape=_rule, kernel=one(getattr(ops, _fn)), uses=(_fn,), elementwise="unary", codegen=_fn,
        dtypes=_dt, inplace=True,
    )  # fmt: skip
define(
    "Reciprocal", shape=unary_float, kernel=_run_reciprocal, uses=("div",), elementwise="unary",
    codegen="reciprocal", dtypes="float", inplace=True,
)  # fmt: skip
define("Identity", shape=unary_num, kernel=_run_identity, elementwise="unary", dtypes="all", view=True)
define(
    "Gelu", attrs={"approximate": "none"}, shape=unary_float, kernel=_run_gelu, uses=("gelu",),
    elementwise="unary", dtypes="float", inplace=True,
)  # fmt: skip
define(
    "Cast", importer=_import_cast, shape=_cast_rule, kernel=_run_cast, uses=("cast",), elementwise="unary",
    inplace=True,
)  # fmt: skip
define(
    "CastLike", shape=_castlike_rule, kernel=_run_castlike, uses=("cast",),
    elementwise="other", dtypes="all", doc="Cast to the dtype of the second input",
)  # fmt: skip

# binary arithmetic and comparison
for _name, _fn in {"Add": "add", "Sub": "sub", "Mul": "mul"}.items():
    define(
        _name, shape=binary, kernel=one(getattr(ops, _fn)), uses=(_fn,), elementwise="binary", codegen=_fn,
        dtypes="numeric", inplace=True,
    )  # fmt: skip
define(
    "Div",
    shape=binary,
    kernel=_run_div,
    uses=("div",),
    elementwise="binary",
    codegen="div",
    dtypes="numeric",
    inplace=True,
)
define(
    "Pow",
    shape=_pow_rule,
    kernel=_run_pow,
    uses=("pow",),
    elementwise="binary",
    codegen="pow",
    dtypes="numeric",
    inplace=True,
)
for _name, _fn in {"Equal": "equal", "Less": "less", "Greater": "greater"}.items():
    define(_name, shape=_compare_rule, kernel=one(getattr(ops, _fn)), uses=(_fn,), elementwise="binary")
define("LessOrEqual", shape=_compare_rule, kernel=_run_cmp_eq, uses=("less", "equal"), elementwise="binary")
define(
    "GreaterOrEqual", shape=_compare_rule, kernel=_run_cmp_eq, uses=("greater", "equal"), elementwise="binary"
)
define("Not", shape=_logical_rule, kernel=_run_logic, uses=(HOST,), elementwise="unary", dtypes="bool")
for _name in ("And", "Or", "Xor"):
    define(_name, shape=_logical_rule, kernel=_run_logic, uses=(HOST,), elementwise="binary", dtypes="bool")

# variadic and selection
define(
    "Max",
    importer=_import_variadic,
    shape=binary,
    kernel=_run_variadic,
    uses=("greater", "where"),
    elementwise="variadic",
    codegen="maximum",  # two inputs join a FusedElementwise chain (the fusion checks the arity)
)
define(
    "Min",
    importer=_import_variadic,
    shape=binary,
    kernel=_run_variadic,
    uses=("less", "where"),
    elementwise="variadic",
    codegen="minimum",
)
define(
    "Sum",
    importer=_import_variadic,
    shape=binary,
    kernel=_run_variadic,
    uses=("add",),
    elementwise="variadic",
)
define("Where", shape=_where_rule, kernel=one(ops.where), uses=("where",), elementwise="other", inplace=True)
define("Clip", shape=_clip_rule, kernel=_run_clip, uses=("clip",), elementwise="other", inplace=True)
