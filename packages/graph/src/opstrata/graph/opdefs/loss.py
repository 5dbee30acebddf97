"""Losses of the ONNX operator spec: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 12/13).

Both take class scores ``(N, C, d1, ...)``, integer targets ``(N, d1, ...)`` and optional per-class
weights ``(C,)``; ``reduction`` is none/sum/mean (mean is weighted: divided by the summed weights of the
non-ignored positions); ``ignore_index`` (no default) drops positions. SoftmaxCrossEntropyLoss's optional
second output is ``log_softmax(scores, axis=1)``. The kernels are opstrata.ops ``nll_loss`` and
``log_softmax``.
"""

from __future__ import annotations

import numpy as np

import opstrata.ops as ops

from .._ir import Node
from .._shape_rules import RuleContext, TypeShape, float_dtype
from ..onnx.context import ImportContext
from .common import Arr
from .registry import define

_REDUCTIONS = ("none", "sum", "mean")


def _import_loss(ctx: ImportContext) -> None:
    """reduction (default mean) and ignore_index (only when given: it has no default) as IR attributes."""
    reduction = ctx.attrs.get("reduction", "mean")
    if isinstance(reduction, bytes):
        reduction = reduction.decode()
    if reduction not in _REDUCTIONS:
        raise ctx.unsupported(f"reduction '{reduction}' is not one of {_REDUCTIONS}")
    attrs: dict[str, object] = {"reduction": reduction}
    if "ignore_index" in ctx.attrs:
        attrs["ignore_index"] = int(ctx.attrs["ignore_index"])
    ctx.emit(ctx.op_type, ctx.inputs, ctx.outputs, attrs)


def _fits(t: tuple, want: tuple) -> bool:
    """True when shape ``t`` can equal ``want`` (symbolic dims match anything)."""
    if len(t) != len(want):
        return False
    return all(
        not (isinstance(a, int) and isinstance(b, int)) or a == b for a, b in zip(t, want, strict=True)
    )


def _loss_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = float_dtype(ctx)
    ctx.need_dtype(1, "iu", "an integer tensor of class indices")
    x, t = ctx.shape(0), ctx.shape(1)
    if x is not None and len(x) < 2:
        raise ctx.fail(f"scores of shape {x} need rank >= 2 (N, C, d1, ...)")
    if x is not None and t is not None and not _fits(t, (x[0], *x[2:])):
        raise ctx.fail(f"target shape {t} must be the scores' shape {x} without the class dim 1")
    if len(n.inputs) > 2 and n.inputs[2]:
        ctx.same_dtype([0, 2])
    loss = (dt, t if n.attrs.get("reduction", "mean") == "none" else ())
    return [loss, (dt, x)][: len(n.outputs)]


def _options(n: Node, x: list[Arr]) -> tuple[Arr | None, dict[str, object]]:
    weight = x[2] if len(x) > 2 else None
    return weight, {
        "reduction": n.attrs.get("reduction", "mean"),
        "ignore_index": n.attrs.get("ignore_index"),
    }


def _run_nll(n: Node, x: list[Arr]) -> list[Arr]:
    weight, kw = _options(n, x)
    return [ops.nll_loss(x[0], x[1], weight, **kw)]  # type: ignore[arg-type]


def _run_sce(n: Node, x: list[Arr]) -> list[Arr]:
    weight, kw = _options(n, x)
    log_prob = ops.log_softmax(x[0], axis=1)
    loss = ops.nll_loss(log_prob, x[1], weight, **kw)  # type: ignore[arg-type]
    return [np.asarray(loss), log_prob][: len(n.outputs)]


define(
    "NegativeLogLikelihoodLoss", importer=_import_loss, shape=_loss_rule, kernel=_run_nll, uses=("nll_loss",),
    dtypes="float", doc="-input[n, target, d...] * weight[target], reduced",
)  # fmt: skip
define(
    "SoftmaxCrossEntropyLoss", importer=_import_loss, shape=_loss_rule, kernel=_run_sce,
    uses=("log_softmax", "nll_loss"), dtypes="float", doc="nll of log_softmax(scores, 1); log_prob output",
)  # fmt: skip
