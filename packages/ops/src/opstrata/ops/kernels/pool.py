"""max_pool2d, avg_pool2d and global_avg_pool on ``ref`` (explicit windows) and ``cpu`` (strided slices).

Semantics follow torch ``F.max_pool2d`` / ``F.avg_pool2d`` (ceil_mode, count_include_pad) and ONNX
GlobalAveragePool, on NCHW images. The cpu kernels loop over the kH * kW kernel offsets and combine
whole strided output planes in place, instead of looping over output positions.
Max is exact in any dtype; averages of low-precision inputs accumulate in float32.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._dtypes import FLOAT_DTYPES, accumulation_dtype, compute_dtype
from .._errors import OpError, check_dtype, check_ndim
from .._registry import call, register
from .conv import Pads, Pair, as_pads, as_pair, out_size, pad_array

__all__ = ["avg_pool2d", "global_avg_pool", "max_pool2d"]


@dataclass(frozen=True)
class PoolGeom:
    """Resolved pooling attributes, output size and the extra bottom/right pad ceil_mode needs."""

    kernel: Pair
    stride: Pair
    pads: Pads
    dilation: Pair
    out_hw: Pair
    extra: Pair


def _check_pool(
    op: str, x: np.ndarray, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil: bool
) -> PoolGeom:
    check_dtype(op, "x", x, FLOAT_DTYPES)
    check_ndim(op, "x", x, 4, layout="NCHW")
    k = as_pair(op, "kernel_size", kernel_size)
    s = k if stride is None else as_pair(op, "stride", stride)
    d, pads = as_pair(op, "dilation", dilation), as_pads(op, padding)
    eff = (d[0] * (k[0] - 1) + 1, d[1] * (k[1] - 1) + 1)
    if max(pads[0], pads[2]) > eff[0] // 2 or max(pads[1], pads[3]) > eff[1] // 2:
        raise OpError(op, "padding", f"at most half the (dilated) kernel size {eff}", str(pads))
    h, w = x.shape[2:]
    ho = out_size(h, k[0], s[0], d[0], pads[0], pads[2], ceil)
    wo = out_size(w, k[1], s[1], d[1], pads[1], pads[3], ceil)
    if ho < 1 or wo < 1:
        raise OpError(
            op, "x", f"padded H, W at least the kernel {eff}", f"shape {x.shape} with padding {pads}"
        )
    extra_h = max(0, (ho - 1) * s[0] + eff[0] - (h + pads[0] + pads[2]))
    extra_w = max(0, (wo - 1) * s[1] + eff[1] - (w + pads[1] + pads[3]))
    return PoolGeom(k, s, pads, d, (ho, wo), (extra_h, extra_w))


def _avg_divisor(g: PoolGeom, hw: Pair, count_include_pad: bool) -> np.ndarray:
    """``(Ho, Wo)`` divisors, torch's rule: padded window size clipped to input+pad, or real elements only."""
    per_axis = []
    for ax in (0, 1):
        start = np.arange(g.out_hw[ax]) * g.stride[ax] - g.pads[ax]
        end = np.minimum(start + g.kernel[ax], hw[ax] + g.pads[ax + 2])
        if count_include_pad:
            per_axis.append(end - start)
        else:
            per_axis.append(np.minimum(end, hw[ax]) - np.maximum(start, 0))
    return np.multiply.outer(per_axis[0], per_axis[1])


# ---------------------------------------------------------------------------------------------
# ref: one explicit window per output position
# ---------------------------------------------------------------------------------------------


@register("max_pool2d", device="ref", dtypes=FLOAT_DTYPES)
def max_pool2d_ref(
    x: Any,
    *,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> np.ndarray:
    x = np.asarray(x)
    g = _check_pool("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode)
    xp = pad_array(x, g.pads, np.dtype(np.float64), -np.inf, g.extra)  # exact for every float dtype
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = g.kernel, g.stride, g.dilation, g.out_hw
    out = np.empty((*x.shape[:2], ho, wo), np.float64)
    for i in range(ho):
        for j in range(wo):
            win = xp[:, :, i * sh : i * sh + dh * (kh - 1) + 1 : dh, j * sw : j * sw + dw * (kw - 1) + 1 : dw]
            out[:, :, i, j] = win.max(axis=(2, 3))
    return out.astype(x.dtype)


@register("avg_pool2d", device="ref", dtypes=FLOAT_DTYPES)
def avg_pool2d_ref(
    x: Any,
    *,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> np.ndarray:
    x = np.asarray(x)
    g = _check_pool("avg_pool2d", x, kernel_size, stride, padding, 1, ceil_mode)
    acc = accumulation_dtype(x.dtype)
    xa = x.astype(acc)
    (kh, kw), (sh, sw), (pt, pl, pb, pr), (ho, wo) = g.kernel, g.stride, g.pads, g.out_hw
    h, w = x.shape[2:]
    out = np.empty((*x.shape[:2], ho, wo), acc)
    for i in range(ho):
        for j in range(wo):
            h0, w0 = i * sh - pt, j * sw - pl
            h1, w1 = min(h0 + kh, h + pb), min(w0 + kw, w + pr)  # window clipped to input + pad
            hc0, wc0, hc1, wc1 = max(h0, 0), max(w0, 0), min(h1, h), min(w1, w)  # real elements
            total = xa[:, :, hc0:hc1, wc0:wc1].sum(axis=(2, 3))
            count = (h1 - h0) * (w1 - w0) if count_include_pad else (hc1 - hc0) * (wc1 - wc0)
            out[:, :, i, j] = total / count
    return out.astype(x.dtype)


@register("global_avg_pool", device="ref", dtypes=FLOAT_DTYPES)
def global_avg_pool_ref(x: Any) -> np.ndarray:
    x = np.asarray(x)
    _check_global(x)
    acc = accumulation_dtype(x.dtype)
    axes = tuple(range(2, x.ndim))
    count = int(np.prod(x.shape[2:]))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (x.astype(acc).sum(axis=axes, keepdims=True) / acc.type(count)).astype(x.dtype)


def _check_global(x: np.ndarray) -> None:
    check_dtype("global_avg_pool", "x", x, FLOAT_DTYPES)
    check_ndim("global_avg_pool", "x", x, (3, None), layout="N, C, spatial...")


# ---------------------------------------------------------------------------------------------
# cpu: kH * kW passes, each over a whole strided output plane, accumulated in place
# ---------------------------------------------------------------------------------------------


def _offset_planes(xp: np.ndarray, g: PoolGeom) -> Iterator[np.ndarray]:
    """Yield the ``(N, C, Ho, Wo)`` strided view for each kernel offset."""
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = g.kernel, g.stride, g.dilation, g.out_hw
    for i in range(kh):
        for j in range(kw):
            r, c = i * dh, j * dw
            yield xp[:, :, r : r + sh * (ho - 1) + 1 : sh, c : c + sw * (wo - 1) + 1 : sw]


@register("max_pool2d", device="cpu", dtypes=FLOAT_DTYPES)
def max_pool2d_cpu(
    x: Any,
    *,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> np.ndarray:
    x = np.asarray(x)
    g = _check_pool("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode)
    cdt = compute_dtype(x.dtype)  # float8_e4m3fn has no -inf: pad in float32
    padded = any(g.pads) or any(g.extra)
    xp = pad_array(x, g.pads, cdt, -np.inf, g.extra) if padded else x.astype(cdt, copy=False)
    planes = _offset_planes(xp, g)
    out = next(planes).copy()  # (N, C, Ho, Wo)
    for plane in planes:
        np.maximum(out, plane, out=out)
    return out.astype(x.dtype, copy=False)


@register("avg_pool2d", device="cpu", dtypes=FLOAT_DTYPES)
def avg_pool2d_cpu(
    x: Any,
    *,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> np.ndarray:
    x = np.asarray(x)
    g = _check_pool("avg_pool2d", x, kernel_size, stride, padding, 1, ceil_mode)
    acc = accumulation_dtype(x.dtype)
    padded = any(g.pads) or any(g.extra)
    xp = pad_array(x, g.pads, acc, 0.0, g.extra) if padded else x.astype(acc, copy=False)
    planes = _offset_planes(xp, g)
    out = next(planes).copy()  # (N, C, Ho, Wo)
    for plane in planes:
        out += plane
    out /= _avg_divisor(g, x.shape[2:], count_include_pad).astype(acc)
    return out.astype(x.dtype, copy=False)


@register("global_avg_pool", device="cpu", dtypes=FLOAT_DTYPES)
def global_avg_pool_cpu(x: Any) -> np.ndarray:
    x = np.asarray(x)
    _check_global(x)
    acc = accumulation_dtype(x.dtype)
    flat = x.reshape(*x.shape[:2], int(np.prod(x.shape[2:])))  # (N, C, H * W)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.add.reduce(flat, axis=-1, dtype=acc)  # (N, C)
        out /= acc.type(flat.shape[-1])
    return out.astype(x.dtype, copy=False).reshape(*x.shape[:2], *([1] * (x.ndim - 2)))


# ---------------------------------------------------------------------------------------------
# public ops
# ---------------------------------------------------------------------------------------------


def max_pool2d(
    x: Any,
    *,
    kernel_size: int | tuple[int, int],
    stride: int | tuple[int, int] | None = None,
    padding: int | tuple[int, ...] = 0,
    dilation: int | tuple[int, int] = 1,
    ceil_mode: bool = False,
    device: str | None = None,
) -> np.ndarray:
    """Max over ``kernel_size`` windows of NCHW ``x``; ``stride`` defaults to ``kernel_size`` (torch).

    ``padding`` (``p``, ``(ph, pw)`` or ``(top, left, bottom, right)``, each at most half the dilated
    kernel) pads with -inf. ``ceil_mode`` rounds the output size up, dropping a last window that
    would start in the end padding. A dilated window that covers only padding gives -inf (as torch;
    NaN in float8_e4m3fn, which has no inf). Exact in every float dtype; returns the input dtype.

    >>> max_pool2d(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4), kernel_size=2)[0, 0].tolist()
    [[5.0, 7.0], [13.0, 15.0]]
    """
    return call(
        "max_pool2d",
        x,
        kernel_size=kernel_size,
        stride=stride,
        padding=padding,
        dilation=dilation,
        ceil_mode=ceil_mode,
        device=device,
    )


def avg_pool2d(
    x: Any,
    *,
    kernel_size: int | tuple[int, int],
    stride: int | tuple[int, int] | None = None,
    padding: int | tuple[int, ...] = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    device: str | None = None,
) -> np.ndarray:
    """Mean over ``kernel_size`` windows of NCHW ``x`` (torch ``F.avg_pool2d`` semantics).

    Zero padding; with ``count_include_pad`` the divisor counts padded positions (but not the part
    of a ceil_mode window past the padding), else only real elements. Low precision accumulates in
    float32 and returns the input dtype.

    >>> avg_pool2d(np.ones((1, 1, 2, 2), np.float32), kernel_size=2, padding=1, count_include_pad=False).shape
    (1, 1, 2, 2)
    """
    return call(
        "avg_pool2d",
        x,
        kernel_size=kernel_size,
        stride=stride,
        padding=padding,
        ceil_mode=ceil_mode,
        count_include_pad=count_include_pad,
        device=device,
    )


def global_avg_pool(x: Any, *, device: str | None = None) -> np.ndarray:
    """Mean over all spatial dims (ONNX GlobalAveragePool): ``(N, C, H, W)`` -> ``(N, C, 1, 1)``.

    Any rank >= 3 works (spatial dims become 1). Low precision accumulates in float32 and returns
    the input dtype; empty spatial dims give NaN, as a mean over nothing does.

    >>> global_avg_pool(np.ones((2, 3, 4, 4), np.float32)).shape
    (2, 3, 1, 1)
    """
    return call("global_avg_pool", x, device=device)
