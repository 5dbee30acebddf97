"""RoiAlign (ONNX operator specification ``RoiAlign``, opsets 10/16) on ``ref`` and ``cpu``.

Each region of interest (x1, y1, x2, y2) * spatial_scale is cut into output_height x output_width bins;
each bin averages (``avg``) or maxes (``max``) bilinear samples on a sampling_ratio^2 grid
(ceil(roi/bins) per axis when sampling_ratio is 0). ``half_pixel`` shifts coordinates by -0.5 and
keeps small ROIs; ``output_half_pixel`` (opset 10) clamps ROI sizes to >= 1. Sample positions
beyond one pixel outside the map contribute 0. ``max`` takes the largest *weighted corner* of each
sample, as the spec's reference and onnxruntime's CPU kernel do. The bilinear weights are separable, so
``avg`` is two small matrix products per ROI; weights are computed in float64 and the result is
rounded once to the input dtype.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._errors import OpError, check_dtype
from .._registry import call, register

__all__ = ["ROI_ALIGN_MODES", "roi_align"]

ROI_ALIGN_MODES: tuple[str, ...] = ("avg", "max")
_FLOATS = (np.float16, np.float32, np.float64)
_OP = "roi_align"


def _axis_samples(start: float, bin_size: float, bins: int, grid: int, size: int) -> tuple[np.ndarray, ...]:
    """Low/high pixel indices and weights of the bins*grid sample positions along one axis."""
    pos = start + np.arange(bins)[:, None] * bin_size + (np.arange(grid)[None, :] + 0.5) * bin_size / grid
    pos = pos.reshape(-1)
    valid = (pos >= -1.0) & (pos <= size)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.int64)
    edge = low >= size - 1
    low = np.where(edge, size - 1, low)
    high = np.where(edge, size - 1, low + 1)
    frac = np.where(edge, 0.0, pos - low)
    return low, high, np.where(valid, 1.0 - frac, 0.0), np.where(valid, frac, 0.0)


def _one_roi(img: np.ndarray, roi: np.ndarray, a: dict[str, Any]) -> np.ndarray:
    h, w = img.shape[1:]
    oh, ow, ratio = a["output_height"], a["output_width"], a["sampling_ratio"]
    off = 0.5 if a["half_pixel"] else 0.0
    x0, y0, x1, y1 = (float(v) * a["spatial_scale"] - off for v in roi)
    rw, rh = x1 - x0, y1 - y0
    if not a["half_pixel"]:
        rw, rh = max(rw, 1.0), max(rh, 1.0)
    gh = ratio if ratio > 0 else math.ceil(rh / oh)
    gw = ratio if ratio > 0 else math.ceil(rw / ow)
    ylo, yhi, wyl, wyh = _axis_samples(y0, rh / oh, oh, gh, h)
    xlo, xhi, wxl, wxh = _axis_samples(x0, rw / ow, ow, gw, w)
    if a["mode"] == "avg":
        wy, wx = np.zeros((oh * gh, h)), np.zeros((ow * gw, w))
        rows_y, rows_x = np.arange(oh * gh), np.arange(ow * gw)
        np.add.at(wy, (rows_y, ylo), wyl)
        np.add.at(wy, (rows_y, yhi), wyh)
        np.add.at(wx, (rows_x, xlo), wxl)
        np.add.at(wx, (rows_x, xhi), wxh)
        wy = wy.reshape(oh, gh, h).sum(1)
        wx = wx.reshape(ow, gw, w).sum(1)
        return np.einsum("ph,chw,qw->cpq", wy, img, wx) / max(gh * gw, 1)
    corners = [
        img[:, yi][:, :, xi] * (wyy[:, None] * wxx[None, :])
        for yi, wyy in ((ylo, wyl), (yhi, wyh))
        for xi, wxx in ((xlo, wxl), (xhi, wxh))
    ]
    best = np.maximum.reduce(corners).reshape(img.shape[0], oh, gh, ow, gw)
    return best.max(axis=(2, 4))


@register(_OP, device="ref", dtypes=_FLOATS)
@register(_OP, device="cpu", dtypes=_FLOATS)
def roi_align_ref(
    x: Any,
    rois: Any,
    batch_indices: Any,
    *,
    output_height: int = 1,
    output_width: int = 1,
    sampling_ratio: int = 0,
    spatial_scale: float = 1.0,
    mode: str = "avg",
    half_pixel: bool = True,
) -> np.ndarray:
    x, rois, idx = np.asarray(x), np.asarray(rois), np.asarray(batch_indices)
    if x.ndim != 4:
        raise OpError(_OP, "x", "a 4-D (N, C, H, W) array", str(x.shape))
    if rois.ndim != 2 or rois.shape[1] != 4:
        raise OpError(_OP, "rois", "a (num_rois, 4) array of (x1, y1, x2, y2)", str(rois.shape))
    if idx.shape != (rois.shape[0],) or idx.dtype.kind not in "iu":
        raise OpError(
            _OP, "batch_indices", f"an integer array of shape ({rois.shape[0]},)", f"{idx.dtype}{idx.shape}"
        )
    if rois.shape[0] and (idx.min() < 0 or idx.max() >= x.shape[0]):
        raise OpError(_OP, "batch_indices", f"indices in [0, {x.shape[0]})", f"{idx.min()}..{idx.max()}")
    if mode not in ROI_ALIGN_MODES:
        raise OpError(_OP, "mode", f"one of {ROI_ALIGN_MODES}", repr(mode))
    if output_height < 1 or output_width < 1 or sampling_ratio < 0:
        raise OpError(
            _OP, "output_height", "output_height, output_width >= 1 and sampling_ratio >= 0",
            f"{output_height}, {output_width}, {sampling_ratio}",
        )  # fmt: skip
    a = {
        "output_height": int(output_height), "output_width": int(output_width), "mode": mode,
        "sampling_ratio": int(sampling_ratio), "spatial_scale": float(spatial_scale), "half_pixel": bool(half_pixel),
    }  # fmt: skip
    xs = x.astype(np.float64)
    out = np.zeros((rois.shape[0], x.shape[1], a["output_height"], a["output_width"]))
    for n in range(rois.shape[0]):
        out[n] = _one_roi(xs[int(idx[n])], rois[n], a)
    return out.astype(x.dtype)


def roi_align(
    x: Any,
    rois: Any,
    batch_indices: Any,
    *,
    output_height: int = 1,
    output_width: int = 1,
    sampling_ratio: int = 0,
    spatial_scale: float = 1.0,
    mode: str = "avg",
    half_pixel: bool = True,
    device: str | None = None,
) -> np.ndarray:
    """ONNX RoiAlign: (num_rois, C, output_height, output_width) bilinear-pooled crops of ``x`` (N, C, H, W).

    >>> x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    >>> roi_align(x, np.array([[0, 0, 4, 4]], np.float32), np.array([0]), half_pixel=False).tolist()
    [[[[9.375]]]]
    """
    check_dtype(_OP, "x", x, _FLOATS)
    return call(
        _OP, x, rois, batch_indices, output_height=output_height, output_width=output_width,
        sampling_ratio=sampling_ratio, spatial_scale=spatial_scale, mode=mode, half_pixel=half_pixel, device=device,
    )  # fmt: skip
