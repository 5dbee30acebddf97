"""Sampling and rearranging ops of the ONNX operator specification: GridSample, AffineGrid, Col2Im,
CenterCropPad, DeformConv, TensorScatter and CausalConvWithState.

Each imports as itself (attribute defaults filled in). Size inputs (AffineGrid's size, Col2Im's
image/block shapes, CenterCropPad's shape) stay inputs: a constant one gives a static output shape,
one computed at run time gives unknown dims and the kernel reads it. The executor kernel is one
opstrata.ops call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import opstrata.ops as ops

from .._ir import Node
from .._shape_rules import RuleContext, TypeShape
from .common import Arr
from .registry import define


def _grid_sample_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, g = ctx.shape(0), ctx.shape(1)
    dt = ctx.need_dtype(0, "f", "a float tensor")
    if x is None or g is None:
        return [(dt, None)]
    if len(x) < 3 or len(g) != len(x) or (isinstance(g[-1], int) and g[-1] != len(x) - 2):
        raise ctx.fail(f"GridSample needs X (N, C, *D) and grid (N, *out, {len(x) - 2}), got {x} and {g}")
    return [(dt, (x[0], x[1], *g[1:-1]))]


def _run_grid_sample(n: Node, x: list[Any]) -> list[Arr]:
    a = n.attrs
    return [
        ops.grid_sample(
            x[0], x[1], mode=a.get("mode", "linear"), padding_mode=a.get("padding_mode", "zeros"),
            align_corners=bool(a.get("align_corners", 0)),
        )
    ]  # fmt: skip


def _affine_grid_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = ctx.need_dtype(0, "f", "a float tensor")
    size = ctx.static_ints(1)
    if size is None:
        t = ctx.shape(0)
        return [(dt, None if t is None or not isinstance(t[1], int) else (None,) * (t[1] + 2))]
    if len(size) not in (4, 5):
        raise ctx.fail(f"AffineGrid size must be (N, C, H, W) or (N, C, D, H, W), got {size}")
    return [(dt, (size[0], *size[2:], len(size) - 2))]


def _col2im_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, img, blk = ctx.shape(0), ctx.static_ints(1), ctx.static_ints(2)
    dt = ctx.dtype(0)
    if x is None or img is None or blk is None:
        return [(dt, None if img is None else (None, None, *img))]
    nblk = int(np.prod(blk))
    c = x[1] // nblk if isinstance(x[1], int) else None
    return [(dt, (x[0], c, *img))]


def _center_crop_pad_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, shape = ctx.shape(0), ctx.static_ints(1)
    if x is None:
        return [(ctx.dtype(0), None)]
    if shape is None:
        return [(ctx.dtype(0), (None,) * len(x))]
    axes = n.attrs.get("axes")
    axes = list(range(len(x))) if axes is None else [ctx.axis(int(a), len(x), "axes") for a in axes]
    if len(axes) != len(shape):
        raise ctx.fail(f"CenterCropPad got {len(shape)} sizes for axes {axes}", "give one size per axis")
    out = list(x)
    for a, s in zip(axes, shape, strict=True):
        out[a] = s
    return [(ctx.dtype(0), tuple(out))]


def _deform_conv_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, w, off = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    dt = ctx.same_dtype([0, 1, 2])
    if x is None or w is None or off is None:
        return [(dt, None)]
    return [(dt, (x[0], w[0], *off[2:]))]


def _causal_conv_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, w = ctx.shape(0), ctx.shape(1)
    dt = ctx.same_dtype([0, 1])
    if x is None or w is None:
        return [(dt, x), (dt, None)]
    if len(x) != 3 or len(w) != 3:
        raise ctx.fail(f"CausalConvWithState needs input (B, C, L) and weight (C, 1, k), got {x} and {w}")
    k = w[2]
    return [(dt, x), (dt, (x[0], x[1], k - 1 if isinstance(k, int) else None))]


def _opt(a: dict[str, Any], k: str) -> list[int] | None:
    v = a.get(k)
    return None if v is None else [int(i) for i in v]


def _run_deform_conv(n: Node, x: list[Any]) -> list[Arr]:
    a = n.attrs
    x = [*x, *[None] * (5 - len(x))]
    return [
        ops.deform_conv(
            *x[:5], dilations=_opt(a, "dilations"), group=int(a.get("group", 1)),
            offset_group=int(a.get("offset_group", 1)), pads=_opt(a, "pads"), strides=_opt(a, "strides"),
        )
    ]  # fmt: skip


def _run_col2im(n: Node, x: list[Any]) -> list[Arr]:
    a = n.attrs
    return [
        ops.col2im(
            x[0], x[1], x[2], dilations=_opt(a, "dilations"), pads=_opt(a, "pads"), strides=_opt(a, "strides")
        )
    ]


def _run_tensor_scatter(n: Node, x: list[Any]) -> list[Arr]:
    a = n.attrs
    idx = x[2] if len(x) > 2 else None
    return [ops.tensor_scatter(x[0], x[1], idx, mode=a.get("mode", "linear"), axis=int(a.get("axis", -2)))]


def _run_causal_conv(n: Node, x: list[Any]) -> list[Arr]:
    x = [*x, *[None] * (4 - len(x))]
    return list(ops.causal_conv_with_state(*x[:4], activation=n.attrs.get("activation", "none")))


def _same(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(ctx.dtype(0), ctx.shape(0))]


define(
    "GridSample", attrs={"mode": "linear", "padding_mode": "zeros", "align_corners": 0},
    shape=_grid_sample_rule, kernel=_run_grid_sample, uses=("grid_sample",), dtypes="float",
    doc="ONNX GridSample: linear/nearest/cubic, zeros/border/reflection padding, any spatial rank",
)  # fmt: skip
define(
    "AffineGrid", attrs={"align_corners": 0}, shape=_affine_grid_rule, uses=("affine_grid",), dtypes="float",
    kernel=lambda n, x: [ops.affine_grid(x[0], x[1], align_corners=bool(n.attrs.get("align_corners", 0)))],
    doc="ONNX AffineGrid: the 2-D/3-D sampling grid of affine maps theta",
)  # fmt: skip
define(
    "Col2Im", shape=_col2im_rule, kernel=_run_col2im, uses=("col2im",), dtypes="numeric",
    doc="ONNX Col2Im: sum sliding blocks back into an N-D image",
)  # fmt: skip
define(
    "CenterCropPad", shape=_center_crop_pad_rule, uses=("center_crop_pad",), dtypes="all",
    kernel=lambda n, x: [ops.center_crop_pad(x[0], x[1], axes=_opt(n.attrs, "axes"))],
    doc="ONNX CenterCropPad: centre crop or zero pad to a shape",
)  # fmt: skip
define(
    "DeformConv", attrs={"group": 1, "offset_group": 1}, shape=_deform_conv_rule, kernel=_run_deform_conv,
    uses=("deform_conv",), dtypes="float", doc="ONNX DeformConv: convolution at learned bilinear offsets",
)  # fmt: skip
define(
    "TensorScatter", attrs={"mode": "linear", "axis": -2}, shape=_same, kernel=_run_tensor_scatter,
    uses=("tensor_scatter",), dtypes="all", doc="ONNX TensorScatter: write updates into a KV cache copy",
)  # fmt: skip
define(
    "CausalConvWithState", attrs={"activation": "none"}, shape=_causal_conv_rule, kernel=_run_causal_conv,
    uses=("causal_conv_with_state",), dtypes="float",
    doc="ONNX CausalConvWithState: depthwise causal conv1d with a carried state",
)  # fmt: skip
