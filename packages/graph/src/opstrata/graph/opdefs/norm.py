"""Normalisation and softmax (ONNX operator spec): BatchNormalization (inference; training_mode=1 from
opset 14 with its running mean / variance outputs), LayerNormalization (with its Mean / InvStdDev
outputs), RMSNormalization, InstanceNormalization, GroupNormalization (opset 18 and 21 forms), LRN,
LpNormalization, MeanVarianceNormalization, Softmax, LogSoftmax."""

from __future__ import annotations

from typing import Any

import numpy as np

import opstrata.ops as ops

from .._errors import GraphError
from .._ir import OPSTRATA_DOMAIN, Node
from .._shape_rules import (
    RuleContext,
    TypeShape,
    float_dtype,
    unary_float,
)
from ..onnx.context import ImportContext
from ..onnx.export import ExportContext, register_export
from .common import Arr
from .registry import define


def _import_batch_norm(ctx: ImportContext) -> None:
    """Inference, or training_mode=1 (opset 14+): normalise with the batch's own statistics and output
    the updated running mean / variance. The older opsets' training outputs stay refused."""
    eps = float(ctx.attrs.get("epsilon", 1e-5))
    if ctx.since >= 14 and ctx.attrs.get("training_mode", 0):
        attrs = {"epsilon": eps, "momentum": float(ctx.attrs.get("momentum", 0.9)), "training_mode": 1}
        ctx.emit("BatchNormalization", ctx.inputs, ctx.outputs[:3], attrs)
        return
    if ctx.attrs.get("training_mode", 0) or any(ctx.is_used(k) for k in (1, 2, 3, 4)):
        raise ctx.unsupported(
            "BatchNormalization in training mode before opset 14 (saved mean / variance outputs) is not "
            "supported; use opset 14+ with training_mode=1"
        )
    ctx.emit("BatchNormalization", ctx.inputs, ctx.outputs[:1], {"epsilon": eps})


def _batch_norm_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    """Y like X; in training mode the running mean / variance like the mean / var inputs."""
    out = unary_float(n, ctx)
    return out + [(ctx.dtype(k), ctx.shape(k)) for k in (3, 4)][: len(n.outputs) - 1]


def _import_layer_norm(ctx: ImportContext) -> None:
    attrs = {"axis": int(ctx.attrs.get("axis", -1)), "epsilon": float(ctx.attrs.get("epsilon", 1e-5))}
    stats = ctx.is_used(1) or ctx.is_used(2)
    if stats and int(ctx.attrs.get("stash_type", 1)) != 1:
        raise ctx.unsupported(
            f"LayerNormalization's Mean / InvStdDev outputs with stash_type={ctx.attrs['stash_type']} are not "
            "supported; opstrata computes them in float32 (stash_type=1)"
        )
    ctx.emit("LayerNormalization", ctx.inputs, ctx.outputs[:3] if stats else ctx.outputs[:1], attrs)


def _import_group_norm(ctx: ImportContext) -> None:
    g = int(ctx.attrs["num_groups"])
    attrs = {"num_groups": g, "epsilon": float(ctx.attrs.get("epsilon", 1e-5))}
    if int(ctx.attrs.get("stash_type", 1)) != 1:
        raise ctx.unsupported(
            f"GroupNormalization with stash_type={ctx.attrs['stash_type']} is not supported; opstrata computes "
            "the statistics in float32 (stash_type=1)"
        )
    if ctx.since >= 21:
        ctx.emit("GroupNormalization", ctx.inputs, ctx.outputs, attrs)
        return
    # opset 18: scale/bias are per group. On x viewed as (N, G, -1) each group is one channel, so the
    # per-channel (opset 21) op applies them; then back to x's shape.
    x = ctx.inputs[0]
    target, grouped, normed, shape = (ctx.fresh(h) for h in ("group_shape", "grouped", "normed", "x_shape"))
    ctx.graph.add_initializer(target, np.array([0, g, -1], np.int64))
    ctx.emit("Reshape", [x, target], [grouped])
    ctx.emit("GroupNormalization", [grouped, *ctx.inputs[1:]], [normed], attrs)
    ctx.emit("Shape", [x], [shape])
    ctx.emit("Reshape", [normed, shape], ctx.outputs[:1])


def _layer_norm_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    out = unary_float(n, ctx)
    if len(n.outputs) == 1:
        return out
    x = ctx.shape(0)
    a = ctx.axis(n.attrs.get("axis", -1), ctx.rank(0))
    stat = None if x is None or a is None else (*x[:a], *([1] * (len(x) - a)))
    f32 = np.dtype(np.float32)
    return [out[0], (f32, stat), (f32, stat)]


def _group_norm_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, g = ctx.shape(0), n.attrs["num_groups"]
    if x is not None and len(x) >= 2 and isinstance(x[1], int) and (g < 1 or x[1] % g):
        raise ctx.fail(f"num_groups={g} does not divide the {x[1]} channels of {x}", "use a divisor of C")
    return unary_float(n, ctx)


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
    eps = n.attrs.get("epsilon", 1e-5)
    if not n.attrs.get("training_mode", 0):
        return [ops.batch_norm(xx, mean, var, scale, bias, eps=eps)]
    axes = (0, *range(2, xx.ndim))  # every axis but the channel axis 1
    cur_mean, cur_var = ops.mean(xx, axis=axes), ops.var(xx, axis=axes, correction=0)  # population variance
    y = ops.batch_norm(xx, cur_mean, cur_var, scale, bias, eps=eps)
    m = n.attrs.get("momentum", 0.9)  # running = input * momentum + current * (1 - momentum)
    run_mean = (mean * m + cur_mean.astype(mean.dtype) * (1 - m)).astype(mean.dtype)
    run_var = (var * m + cur_var.astype(var.dtype) * (1 - m)).astype(var.dtype)
    return [y, run_mean, run_var][: len(n.outputs)]


def _run_layer_norm(n: Node, x: list[Any]) -> list[Arr]:
    b = x[2] if len(x) > 2 else None
    axis, eps = n.attrs.get("axis", -1), n.attrs.get("epsilon", 1e-5)
    y = ops.layer_norm(x[0], x[1], b, axis=axis, eps=eps)
    if len(n.outputs) == 1:
        return [y]
    mean, inv_std = ops.layer_norm_stats(x[0], axis=axis, eps=eps)
    return [y, mean.astype(np.float32, copy=False), inv_std.astype(np.float32, copy=False)]


def _opt(x: list[Any], i: int) -> Any:
    return x[i] if len(x) > i else None


def _run_instance_norm(n: Node, x: list[Any]) -> list[Arr]:
    return [ops.instance_norm(x[0], _opt(x, 1), _opt(x, 2), eps=n.attrs.get("epsilon", 1e-5))]


def _run_group_norm(n: Node, x: list[Any]) -> list[Arr]:
    a = n.attrs
    return [
        ops.group_norm(x[0], _opt(x, 1), _opt(x, 2), num_groups=a["num_groups"], eps=a.get("epsilon", 1e-5))
    ]


def _run_lrn(n: Node, x: list[Arr]) -> list[Arr]:
    a = n.attrs
    return [ops.lrn(x[0], size=a["size"], alpha=a["alpha"], beta=a["beta"], bias=a["bias"])]


def _run_lp_norm(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.lp_normalize(x[0], axis=n.attrs.get("axis", -1), p=n.attrs.get("p", 2))]


def _run_mvn(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.mean_variance_norm(x[0], axes=tuple(n.attrs.get("axes", (0, 2, 3))))]


def _run_softmax(n: Node, x: list[Arr]) -> list[Arr]:
    fn = ops.softmax if n.op_type == "Softmax" else ops.log_softmax
    return [fn(x[0], axis=n.attrs.get("axis", -1))]


def _export_group_norm(n: Node, ctx: ExportContext) -> None:
    """GroupNormalization-21 (per-channel scale/bias); before opset 21 (the per-group form is deprecated)
    as InstanceNormalization over the (N, G, -1) view, then the per-channel affine."""
    if ctx.opset >= 21:
        ctx.emit("GroupNormalization", n.inputs, n.outputs, **n.attrs)
        return
    x, scale, bias = [*n.inputs, "", ""][:3]
    shape = ctx.shape_of(x)
    if shape is None:
        raise GraphError(
            f"export of node '{n.name}' (GroupNormalization)",
            "opset < 21 needs the input rank",
            "run infer_shapes",
        )
    g, dt = n.attrs["num_groups"], ctx.dtype_of(x)
    grouped, normed, xs, y = ctx.fresh("grouped"), ctx.fresh("normed"), ctx.fresh("x_shape"), ctx.fresh("y")
    ctx.emit("Reshape", [x, ctx.ints([0, g, -1], "group_shape")], [grouped])
    ones, zeros = ctx.const(np.ones(g, dt), "ones"), ctx.const(np.zeros(g, dt), "zeros")
    ctx.emit("InstanceNormalization", [grouped, ones, zeros], [normed], epsilon=n.attrs.get("epsilon", 1e-5))
    ctx.emit("Shape", [x], [xs])
    ctx.emit("Reshape", [normed, xs], [y if scale or bias else n.outputs[0]])
    per_channel = ctx.ints([-1] + [1] * (len(shape) - 2), "channel_shape")
    steps = [(op, p) for op, p in (("Mul", scale), ("Add", bias)) if p]
    for i, (op, p) in enumerate(steps):
        pc, out = ctx.fresh(f"{op.lower()}_c"), n.outputs[0] if i == len(steps) - 1 else ctx.fresh("scaled")
        ctx.emit("Reshape", [p, per_channel], [pc])
        ctx.emit(op, [y, pc], [out])
        y = out


register_export("GroupNormalization", _export_group_norm)
define(
    "BatchNormalization", importer=_import_batch_norm, shape=_batch_norm_rule, kernel=_run_batch_norm,
    uses=("batch_norm", "mean", "var"), dtypes="float",
)  # fmt: skip
define(
    "LayerNormalization", importer=_import_layer_norm, shape=_layer_norm_rule, kernel=_run_layer_norm,
    uses=("layer_norm", "layer_norm_stats"), dtypes="float", layout="norm",
)  # fmt: skip
define(
    "InstanceNormalization", attrs={"epsilon": 1e-5}, shape=unary_float, kernel=_run_instance_norm,
    uses=("instance_norm",), dtypes="float",
)  # fmt: skip
define(
    "GroupNormalization", importer=_import_group_norm, shape=_group_norm_rule, kernel=_run_group_norm,
    uses=("group_norm",), dtypes="float", doc="opset 18 (per-group scale) imports through a (N, G, -1) view",
)  # fmt: skip
define(
    "LRN", attrs={"alpha": 1e-4, "beta": 0.75, "bias": 1.0}, shape=unary_float, kernel=_run_lrn,
    uses=("lrn",), dtypes="float",
)  # fmt: skip
define(
    "LpNormalization", attrs={"axis": -1, "p": 2}, shape=unary_float, kernel=_run_lp_norm,
    uses=("lp_normalize",), dtypes="float",
)  # fmt: skip
define(
    "MeanVarianceNormalization", attrs={"axes": [0, 2, 3]}, shape=unary_float, kernel=_run_mvn,
    uses=("mean_variance_norm",), dtypes="float",
)  # fmt: skip
define("RMSNormalization", importer=_import_rms_normalization, doc="imported as ai.opstrata::RMSNorm")
define(
    "Softmax", attrs={"axis": -1}, shape=_softmax_rule, kernel=_run_softmax, uses=("softmax",), inplace=True,
    layout="softmax",
)  # fmt: skip
define(
    "LogSoftmax", attrs={"axis": -1}, shape=_softmax_rule, kernel=_run_softmax, uses=("log_softmax",),
    layout="softmax",
)  # fmt: skip
