"""RoiAlign of the ONNX operator specification (opsets 10 and 16), and MaxRoiPool (opset 1, Fast R-CNN).

Imports as itself with every attribute filled: opset 10 has no coordinate_transformation_mode and
behaves as ``output_half_pixel``; opset 16 defaults to ``half_pixel``. Runs through
``opstrata.ops.roi_align`` (avg or max of bilinear samples per bin).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import opstrata.ops as ops

from .._ir import Node
from .._shape_rules import RuleContext, TypeShape, float_dtype
from ..onnx.context import ImportContext
from .common import Arr
from .registry import HOST, define

_DEFAULTS: dict[str, Any] = {
    "mode": "avg", "output_height": 1, "output_width": 1, "sampling_ratio": 0, "spatial_scale": 1.0,
}  # fmt: skip
_MODES = ("half_pixel", "output_half_pixel")


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _import_roi_align(ctx: ImportContext) -> None:
    """ONNX RoiAlign -> IR RoiAlign with the opset's defaults made explicit."""
    attrs = {**_DEFAULTS, **ctx.attrs}
    ctm = "half_pixel" if ctx.since >= 16 else "output_half_pixel"
    attrs["coordinate_transformation_mode"] = _text(attrs.get("coordinate_transformation_mode", ctm))
    attrs["mode"] = _text(attrs["mode"])
    if attrs["coordinate_transformation_mode"] not in _MODES:
        raise ctx.unsupported(
            f"RoiAlign coordinate_transformation_mode={attrs['coordinate_transformation_mode']!r}; use one of {_MODES}"
        )
    if attrs["mode"] not in ops.ROI_ALIGN_MODES:
        raise ctx.unsupported(f"RoiAlign mode={attrs['mode']!r}; use 'avg' or 'max'")
    ctx.emit("RoiAlign", ctx.inputs, ctx.outputs, attrs)


def _roi_align_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = float_dtype(ctx)
    x, rois, idx = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if x is not None and len(x) != 4:
        raise ctx.fail(f"RoiAlign expects a 4-D (N, C, H, W) input, got {x}", "Reshape the input to NCHW")
    if rois is not None and (len(rois) != 2 or (isinstance(rois[1], int) and rois[1] != 4)):
        raise ctx.fail(f"RoiAlign rois must be (num_rois, 4), got {rois}", "pass (x1, y1, x2, y2) rows")
    ctx.need_dtype(2, "iu", "an integer tensor")
    num = rois[0] if rois is not None else (idx[0] if idx is not None and len(idx) == 1 else None)
    c = x[1] if x is not None else None
    return [(dt, (num, c, int(n.attrs["output_height"]), int(n.attrs["output_width"])))]


def _run_roi_align(n: Node, x: list[Arr]) -> list[Arr]:
    a = n.attrs
    return [
        ops.roi_align(
            x[0], x[1], x[2], output_height=int(a["output_height"]), output_width=int(a["output_width"]),
            sampling_ratio=int(a["sampling_ratio"]), spatial_scale=float(a["spatial_scale"]), mode=_text(a["mode"]),
            half_pixel=_text(a["coordinate_transformation_mode"]) == "half_pixel",
        )
    ]  # fmt: skip


define(
    "RoiAlign", importer=_import_roi_align, shape=_roi_align_rule, kernel=_run_roi_align, uses=("roi_align",),
    dtypes="float", doc="avg/max of bilinear samples per bin; half_pixel or output_half_pixel coordinates",
)  # fmt: skip


# --------------------------------------------------------------------------- MaxRoiPool


def _round_half_away(v: Arr) -> Arr:
    """C's roundf: halves away from zero (numpy's round is half to even)."""
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def _max_roi_pool_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = float_dtype(ctx)
    x, rois = ctx.shape(0), ctx.shape(1)
    if x is not None and len(x) != 4:
        raise ctx.fail(f"MaxRoiPool expects a 4-D (N, C, H, W) input, got {x}", "Reshape the input to NCHW")
    if rois is not None and (len(rois) != 2 or (isinstance(rois[1], int) and rois[1] != 5)):
        raise ctx.fail(
            f"MaxRoiPool rois must be (num_rois, 5), got {rois}", "pass (batch_index, x1, y1, x2, y2) rows"
        )
    pooled = n.attrs.get("pooled_shape")
    if pooled is None or len(pooled) != 2 or min(pooled) < 1:
        raise ctx.fail(
            f"MaxRoiPool pooled_shape must be two positive ints, got {pooled}", "set pooled_shape=[h, w]"
        )
    return [(dt, (rois[0] if rois else None, x[1] if x else None, int(pooled[0]), int(pooled[1])))]


def _run_max_roi_pool(n: Node, x: list[Arr]) -> list[Arr]:
    """Fast R-CNN ROI max pooling as onnxruntime computes it: corners scaled and rounded, each ROI at
    least 1x1, bin edges floor/ceil of the ROI's even split, empty bins 0."""
    data, rois = np.asarray(x[0]), np.asarray(x[1], np.float64)
    ph, pw = (int(v) for v in n.attrs["pooled_shape"])
    scale = float(n.attrs.get("spatial_scale", 1.0))
    _, c, h, w = data.shape
    out = np.zeros((len(rois), c, ph, pw), data.dtype)
    for r, (b, *corners) in enumerate(rois):
        bi = int(b)
        if not 0 <= bi < data.shape[0]:
            raise ValueError(f"MaxRoiPool roi {r} has batch index {bi}, outside 0..{data.shape[0] - 1}")
        x1, y1, x2, y2 = (int(v) for v in _round_half_away(np.array(corners) * scale))
        bin_h, bin_w = max(y2 - y1 + 1, 1) / ph, max(x2 - x1 + 1, 1) / pw
        for i in range(ph):
            hs = min(max(int(np.floor(i * bin_h)) + y1, 0), h)
            he = min(max(int(np.ceil((i + 1) * bin_h)) + y1, 0), h)
            for j in range(pw):
                ws = min(max(int(np.floor(j * bin_w)) + x1, 0), w)
                we = min(max(int(np.ceil((j + 1) * bin_w)) + x1, 0), w)
                if he > hs and we > ws:
                    out[r, :, i, j] = data[bi, :, hs:he, ws:we].max(axis=(1, 2))
    return [out]


define(
    "MaxRoiPool", attrs={"spatial_scale": 1.0}, shape=_max_roi_pool_rule, kernel=_run_max_roi_pool, uses=(HOST,),
    dtypes="float", doc="Fast R-CNN ROI max pooling (rounded corners, floor/ceil bins, empty bins 0)",
)  # fmt: skip
