"""Normalisation and softmax: BatchNormalization (inference), LayerNormalization, RMSNormalization, Softmax, LogSoftmax."""

from __future__ import annotations

from typing import Any

import opstrata.ops as ops

from .._ir import OPSTRATA_DOMAIN, Node
from .._shape_rules import (
    RuleContext,
    TypeShape,
    float_dtype,
    unary_float,
)
from ..onnx.context import ImportContext
from .common import Arr
from .registry import define


def _import_batch_norm(ctx: ImportContext) -> None:
    if ctx.attrs.get("training_mode", 0) or any(ctx.is_used(k) for k in (1, 2, 3, 4)):
        raise ctx.unsupported("BatchNormalization in training mode (running-stat outputs) is not supported")
    ctx.emit(
        "BatchNormalization", ctx.inputs, ctx.outputs[:1], {"epsilon": float(ctx.attrs.get("epsilon", 1e-5))}
    )


def _import_layer_norm(ctx: ImportContext) -> None:
    if ctx.is_used(1) or ctx.is_used(2):
        raise ctx.unsupported("LayerNormalization's Mean / InvStdDev outputs are not supported")
    attrs = {"axis": int(ctx.attrs.get("axis", -1)), "epsilon": float(ctx.attrs.get("epsilon", 1e-5))}
    ctx.emit("LayerNormalization", ctx.inputs, ctx.outputs[:1], attrs)


def _import_rms_normalization(ctx: ImportContext) -> None:
    if int(ctx.attrs.get("stash_type", 1)) != 1:
        raise ctx.unsupported(
            f"RMSNormalization with stash_type={ctx.attrs['stash_type']} is not supported; opstrata "
            "computes the statistics in float32 (stash_type=1)"
        )
    attrs = {"axis": int(ctx.attrs.get("axis", -1)), "epsilon": float(ctx.attrs.get("epsilon", 1e-5))}
    ctx.emit("RMSNorm", ctx.inputs[:2], ctx.outputs[:1], attrs, domain=OPSTRATA_DOMAIN)


def _softmax_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.axis(n.attrs.get("axis", -1), ctx.rank(0))
    return [(float_dtype(ctx), ctx.shape(0))]


def _run_batch_norm(n: Node, x: list[Arr]) -> list[Arr]:
    xx, scale, bias, mean, var = x[:5]
    return [ops.batch_norm(xx, mean, var, scale, bias, eps=n.attrs.get("epsilon", 1e-5))]


def _run_layer_norm(n: Node, x: list[Any]) -> list[Arr]:
    b = x[2] if len(x) > 2 else None
    return [ops.layer_norm(x[0], x[1], b, axis=n.attrs.get("axis", -1), eps=n.attrs.get("epsilon", 1e-5))]


def _run_softmax(n: Node, x: list[Arr]) -> list[Arr]:
    fn = ops.softmax if n.op_type == "Softmax" else ops.log_softmax
    return [fn(x[0], axis=n.attrs.get("axis", -1))]


define(
    "BatchNormalization", importer=_import_batch_norm, shape=unary_float, kernel=_run_batch_norm,
    uses=("batch_norm",), dtypes="float",
)  # fmt: skip
define(
    "LayerNormalization", importer=_import_layer_norm, shape=unary_float, kernel=_run_layer_norm,
    uses=("layer_norm",), dtypes="float",
)  # fmt: skip
define("RMSNormalization", importer=_import_rms_normalization, doc="imported as ai.opstrata::RMSNorm")
define("Softmax", attrs={"axis": -1}, shape=_softmax_rule, kernel=_run_softmax, uses=("softmax",))
define("LogSoftmax", attrs={"axis": -1}, shape=_softmax_rule, kernel=_run_softmax, uses=("log_softmax",))
