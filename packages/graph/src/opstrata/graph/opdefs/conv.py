"""Convolution and pooling (NCHW): Conv, MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import opstrata.ops as ops

from .._ir import Node
from .._shape_rules import (
    RuleContext,
    TypeShape,
    conv_pads,
    float_dtype,
    pool_out_size,
)
from .._symbolic import Dim, Shape
from ..onnx.context import ImportContext
from .common import Arr
from .registry import define


def _window_attrs(ctx: ImportContext, nd: int | None, pool: bool) -> dict[str, Any]:
    a = ctx.attrs
    auto = a.get("auto_pad", "NOTSET")
    if nd is not None and nd != 2:
        raise ctx.unsupported(f"{ctx.op_type} with {nd} spatial dims is not supported (only 2-D, NCHW)")
    out: dict[str, Any] = {}
    if "kernel_shape" in a:
        out["kernel_shape"] = list(a["kernel_shape"])
    if nd is not None:
        out["strides"] = list(a.get("strides", [1] * nd))
        out["pads"] = list(a.get("pads", [0] * 2 * nd))
        out["dilations"] = list(a.get("dilations", [1] * nd))
    out["auto_pad"] = auto
    if pool:
        out["ceil_mode"] = int(a.get("ceil_mode", 0))
    return out


def _import_conv(ctx: ImportContext) -> None:
    w = ctx.const(1)
    ks = ctx.attrs.get("kernel_shape")
    nd = len(ks) if ks is not None else (w.ndim - 2 if w is not None else None)
    attrs = _window_attrs(ctx, nd, pool=False)
    if "kernel_shape" not in attrs and w is not None:
        attrs["kernel_shape"] = list(w.shape[2:])
    attrs["group"] = int(ctx.attrs.get("group", 1))
    ctx.emit("Conv", ctx.inputs, ctx.outputs, attrs)


def _import_max_pool(ctx: ImportContext) -> None:
    if ctx.is_used(1):
        raise ctx.unsupported("MaxPool's Indices output is not supported")
    attrs = _window_attrs(ctx, len(ctx.attrs["kernel_shape"]), pool=True)
    ctx.emit("MaxPool", ctx.inputs[:1], ctx.outputs[:1], attrs)


def _import_avg_pool(ctx: ImportContext) -> None:
    attrs = _window_attrs(ctx, len(ctx.attrs["kernel_shape"]), pool=True)
    if any(d != 1 for d in attrs["dilations"]):
        raise ctx.unsupported("AveragePool with dilations != 1 is not supported")
    del attrs["dilations"]
    attrs["count_include_pad"] = int(ctx.attrs.get("count_include_pad", 0))
    ctx.emit("AveragePool", ctx.inputs, ctx.outputs, attrs)


def _spatial(n: Node, ctx: RuleContext, x: Shape, kernel: Sequence[int]) -> list[Dim]:
    nd = len(kernel)
    strides = n.attrs.get("strides") or [1] * nd
    dil = n.attrs.get("dilations") or [1] * nd
    auto = n.attrs.get("auto_pad", "NOTSET")
    ceil = bool(n.attrs.get("ceil_mode", 0))
    sizes = x[2:]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        return [
            -(-d // s) if isinstance(d, int) else (d if s == 1 else None)
            for d, s in zip(sizes, strides, strict=True)
        ]
    pads = conv_pads([0] * nd, kernel, strides, dil, n.attrs.get("pads") or [], auto)
    out: list[Dim] = []
    for i, d in enumerate(sizes):
        k, s, dl, p0, p1 = kernel[i], strides[i], dil[i], pads[i], pads[i + nd]
        if isinstance(d, int):
            o = pool_out_size(d, k, s, dl, p0, p1, ceil)
            if o <= 0:
                raise ctx.fail(
                    f"inconsistent shapes: spatial dim {i} of size {d} is smaller than the window "
                    f"(kernel {k}, dilation {dl}, pads {p0}+{p1})",
                    "use a larger input or a smaller kernel",
                )
            out.append(o)
        else:
            out.append(d if s == 1 and p0 + p1 == dl * (k - 1) else None)
    return out


def _conv_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = ctx.same_dtype([i for i in range(len(n.inputs)) if n.inputs[i]])
    x, w = ctx.shape(0), ctx.shape(1)
    if x is not None and len(x) != 4:
        raise ctx.fail(f"only 2-D convolution (NCHW input) is supported, got input shape {x}")
    if x is None or w is None:
        return [(dt, None if x is None else (x[0], None if w is None else w[0], None, None))]
    kernel = n.attrs.get("kernel_shape") or list(w[2:])
    if not all(isinstance(k, int) for k in kernel):
        return [(dt, (x[0], w[0], None, None))]
    group = n.attrs.get("group", 1)
    if isinstance(x[1], int) and isinstance(w[1], int) and x[1] != w[1] * group:
        raise ctx.fail(
            f"inconsistent shapes: input has {x[1]} channels but weight {w} with group={group} expects {w[1] * group}"
        )
    return [(dt, (x[0], w[0], *_spatial(n, ctx, x, kernel)))]


def _pool_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x = ctx.shape(0)
    dt = float_dtype(ctx) if n.op_type == "AveragePool" else ctx.dtype(0)
    if x is None:
        return [(dt, None)]
    if len(x) != 4:
        raise ctx.fail(f"only 2-D pooling (NCHW input) is supported, got input shape {x}")
    return [(dt, (x[0], x[1], *_spatial(n, ctx, x, n.attrs["kernel_shape"])))]


def _global_pool_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x = ctx.shape(0)
    return [(float_dtype(ctx), None if x is None else (*x[:2], *([1] * (len(x) - 2))))]


def _window(n: Node, x: Arr, kernel_shape: Sequence[int]) -> dict[str, Any]:
    nd = len(kernel_shape)
    strides = n.attrs.get("strides") or [1] * nd
    dil = n.attrs.get("dilations") or [1] * nd
    pads = conv_pads(
        x.shape[2:], kernel_shape, strides, dil, n.attrs.get("pads") or [], n.attrs.get("auto_pad", "NOTSET")
    )
    return {"stride": tuple(strides), "padding": (pads[0], pads[1], pads[2], pads[3]), "dilation": tuple(dil)}


def _run_conv(n: Node, x: list[Any]) -> list[Arr]:
    w = x[1]
    b = x[2] if len(x) > 2 else None
    kw = _window(n, x[0], n.attrs.get("kernel_shape") or w.shape[2:])
    return [ops.conv2d(x[0], w, b, groups=n.attrs.get("group", 1), **kw)]


def _run_max_pool(n: Node, x: list[Arr]) -> list[Arr]:
    k = n.attrs["kernel_shape"]
    kw = _window(n, x[0], k)
    return [ops.max_pool2d(x[0], kernel_size=tuple(k), ceil_mode=bool(n.attrs.get("ceil_mode", 0)), **kw)]


def _run_avg_pool(n: Node, x: list[Arr]) -> list[Arr]:
    k = n.attrs["kernel_shape"]
    kw = _window(n, x[0], k)
    kw.pop("dilation")
    return [
        ops.avg_pool2d(
            x[0], kernel_size=tuple(k), ceil_mode=bool(n.attrs.get("ceil_mode", 0)),
            count_include_pad=bool(n.attrs.get("count_include_pad", 0)), **kw,
        )
    ]  # fmt: skip


def _run_gap(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.global_avg_pool(x[0])]


def _run_gmp(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.max(x[0], axis=tuple(range(2, x[0].ndim)), keepdims=True)]


define("Conv", importer=_import_conv, shape=_conv_rule, kernel=_run_conv, uses=("conv2d",), dtypes="float")
define("MaxPool", importer=_import_max_pool, shape=_pool_rule, kernel=_run_max_pool, uses=("max_pool2d",))
define("AveragePool", importer=_import_avg_pool, shape=_pool_rule, kernel=_run_avg_pool, uses=("avg_pool2d",))
define("GlobalAveragePool", shape=_global_pool_rule, kernel=_run_gap, uses=("global_avg_pool",))
define("GlobalMaxPool", shape=_global_pool_rule, kernel=_run_gmp, uses=("max",))
