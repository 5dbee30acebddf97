"""Linear algebra: MatMul, Gemm, and Einsum (imported as Transpose/MatMul/ReduceSum/(Un)Squeeze)."""

from __future__ import annotations

from typing import Any

import opstrata.ops as ops

from .._ir import Node
from .._shape_rules import (
    RuleContext,
    TypeShape,
    matmul_shape,
)
from .._symbolic import broadcast_shapes
from ..onnx.context import ImportContext
from .common import Arr, one
from .registry import define


def _matmul_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(ctx.same_dtype([0, 1]), matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))]


def _gemm_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    a, b = ctx.shape(0), ctx.shape(1)
    dt = ctx.same_dtype([i for i in range(len(n.inputs)) if n.inputs[i]])
    for i, s in ((0, a), (1, b)):
        if s is not None and len(s) != 2:
            raise ctx.fail(
                f"Gemm input '{n.inputs[i]}' must be 2-D, got shape {s}", "use MatMul for batched products"
            )
    if a is None or b is None:
        return [(dt, None)]
    if n.attrs.get("transA"):
        a = a[::-1]
    if n.attrs.get("transB"):
        b = b[::-1]
    out = matmul_shape(ctx, a, b)
    if ctx.shape(2) is not None and out is not None:
        try:
            broadcast_shapes(out, ctx.shape(2))  # type: ignore[arg-type]
        except ValueError:
            raise ctx.fail(f"inconsistent shapes: C {ctx.shape(2)} does not broadcast to {out}") from None
    return [(dt, out)]


def _import_einsum(ctx: ImportContext) -> None:
    from ..onnx.einsum import import_einsum

    import_einsum(ctx)


def _run_gemm(n: Node, x: list[Any]) -> list[Arr]:
    a = n.attrs
    c = x[2] if len(x) > 2 else None
    return [
        ops.gemm(
            x[0], x[1], c, alpha=a.get("alpha", 1.0), beta=a.get("beta", 1.0),
            trans_a=bool(a.get("transA", 0)), trans_b=bool(a.get("transB", 0)),
        )
    ]  # fmt: skip


define(
    "MatMul", shape=_matmul_rule, kernel=one(ops.matmul), uses=("matmul",), dtypes="float", layout="matmul"
)
define(
    "Gemm", attrs={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}, shape=_gemm_rule, kernel=_run_gemm,
    uses=("gemm",), dtypes="float",
)  # fmt: skip
define("Einsum", importer=_import_einsum, doc="imported as Transpose/MatMul/ReduceSum/(Un)Squeeze")
