"""Layout ops on ``ref`` and ``cpu``: pad, tile, depth_to_space, space_to_depth, reverse_sequence,
eye_like and resize (ONNX operator spec: Pad, Tile, DepthToSpace, SpaceToDepth, ReverseSequence,
EyeLike, Resize).

Data-movement ops are exact for every dtype. ``resize`` interpolates separably, one axis at a time,
in float64 (as onnx's reference evaluator does), then casts back to the input dtype (integers
truncate toward zero as onnxruntime does, and saturate; onnx's reference evaluator rounds);
its coordinate and coefficient rules follow the Resize spec of opset 19.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._dtypes import ALL_DTYPES, NUMERIC_DTYPES, STRING_DTYPE, TENSOR_DTYPES
from .._errors import OpError, check_dtype, check_ndim
from .._registry import call, register
from .shape import _ints, normalize_axis

__all__ = [
    "PAD_MODES",
    "RESIZE_COORDINATE_MODES",
    "RESIZE_MODES",
    "depth_to_space",
    "eye_like",
    "pad",
    "resize",
    "reverse_sequence",
    "space_to_depth",
    "tile",
]

PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _both(name: str, dtypes: Any = TENSOR_DTYPES) -> Any:
    """Register one implementation on ``ref`` and ``cpu`` (rare ops: the numpy code is the oracle)."""

    def deco(fn: Any) -> Any:
        register(name, device="cpu", dtypes=dtypes)(fn)
        return register(name, device="ref", dtypes=dtypes)(fn)

    return deco


# ---------------------------------------------------------------------------------------------
# pad
# ---------------------------------------------------------------------------------------------


def _check_pad(x: np.ndarray, pads: Any, mode: Any) -> list[int]:
    p = _ints("pad", "pads", pads)
    if len(p) != 2 * x.ndim:
        raise OpError("pad", "pads", f"{2 * x.ndim} ints (begin and end per dim of x {x.shape})", str(p))
    if mode not in PAD_MODES:
        raise OpError("pad", "mode", f"one of {PAD_MODES}", repr(mode))
    for d in range(x.ndim):
        kept = x.shape[d] + min(p[d], 0) + min(p[d + x.ndim], 0)
        if kept < 0:
            raise OpError("pad", "pads", f"crops no larger than dim {d} of x {x.shape}", str(p))
        if mode != "constant" and kept == 0 and (p[d] > 0 or p[d + x.ndim] > 0):
            raise OpError("pad", "x", f"a non-empty dim {d} to pad in mode {mode!r}", str(x.shape))
    return p


@_both("pad")
def pad_kernel(x: Any, pads: Any, *, mode: str = "constant", value: Any = 0) -> np.ndarray:
    x = np.asarray(x)
    p = _check_pad(x, pads, mode)
    r = x.ndim
    crop = tuple(slice(max(-p[d], 0), x.shape[d] - max(-p[d + r], 0)) for d in range(r))
    x = x[crop]  # negative pads remove entries first
    width = [(max(p[d], 0), max(p[d + r], 0)) for d in range(r)]
    if mode == "constant":
        if x.dtype == STRING_DTYPE and not isinstance(value, str):
            if value != 0:
                raise OpError(
                    "pad", "value", "a str to pad a string tensor (default: the empty string)", repr(value)
                )
            value = ""  # ONNX: the default constant is 0, the empty string or False by dtype
        return np.pad(x, width, mode="constant", constant_values=np.asarray(value, x.dtype))
    return np.pad(x, width, mode=mode)


# ---------------------------------------------------------------------------------------------
# tile
# ---------------------------------------------------------------------------------------------


@_both("tile")
def tile_kernel(x: Any, repeats: Any) -> np.ndarray:
    x = np.asarray(x)
    reps = _ints("tile", "repeats", repeats)
    if len(reps) != x.ndim or any(v < 0 for v in reps):
        raise OpError("tile", "repeats", f"{x.ndim} ints >= 0 (one per dim of x {x.shape})", str(reps))
    return np.tile(x, reps)


# ---------------------------------------------------------------------------------------------
# depth_to_space / space_to_depth
# ---------------------------------------------------------------------------------------------


def _check_block(op: str, x: np.ndarray, blocksize: Any, mode: Any) -> int:
    check_ndim(op, "x", x, 4, layout="NCHW")
    if not isinstance(blocksize, (int, np.integer)) or blocksize < 1:
        raise OpError(op, "blocksize", "an int >= 1", repr(blocksize))
    if mode not in ("DCR", "CRD"):
        raise OpError(op, "mode", "'DCR' or 'CRD'", repr(mode))
    return int(blocksize)


@_both("depth_to_space")
def depth_to_space_kernel(x: Any, *, blocksize: int, mode: str = "DCR") -> np.ndarray:
    x = np.asarray(x)
    bs = _check_block("depth_to_space", x, blocksize, mode)
    n, c, h, w = x.shape
    if c % (bs * bs):
        raise OpError("depth_to_space", "x", f"channels divisible by blocksize**2 = {bs * bs}", str(x.shape))
    c2 = c // (bs * bs)
    if mode == "DCR":
        y = x.reshape(n, bs, bs, c2, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c2, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return np.ascontiguousarray(y).reshape(n, c2, h * bs, w * bs)


@_both("space_to_depth")
def space_to_depth_kernel(x: Any, *, blocksize: int, mode: str = "DCR") -> np.ndarray:
    x = np.asarray(x)
    bs = _check_block("space_to_depth", x, blocksize, mode)
    n, c, h, w = x.shape
    if h % bs or w % bs:
        raise OpError("space_to_depth", "x", f"height and width divisible by blocksize {bs}", str(x.shape))
    y = x.reshape(n, c, h // bs, bs, w // bs, bs)
    y = y.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.transpose(0, 1, 3, 5, 2, 4)
    return np.ascontiguousarray(y).reshape(n, c * bs * bs, h // bs, w // bs)


# ---------------------------------------------------------------------------------------------
# reverse_sequence
# ---------------------------------------------------------------------------------------------


@_both("reverse_sequence")
def reverse_sequence_kernel(
    x: Any, sequence_lens: Any, *, time_axis: int = 0, batch_axis: int = 1
) -> np.ndarray:
    x, lens = np.asarray(x), np.asarray(sequence_lens)
    check_ndim("reverse_sequence", "x", x, (2, None))
    t = normalize_axis("reverse_sequence", time_axis, x.ndim, "time_axis")
    b = normalize_axis("reverse_sequence", batch_axis, x.ndim, "batch_axis")
    if t == b or t > 1 or b > 1:
        raise OpError("reverse_sequence", "time_axis", "0 or 1, and batch_axis the other", f"{t} and {b}")
    if lens.shape != (x.shape[b],) or lens.dtype.kind not in "iu":
        raise OpError("reverse_sequence", "sequence_lens", f"{x.shape[b]} ints", f"{lens.dtype}{lens.shape}")
    if lens.size and (lens.min() < 0 or lens.max() > x.shape[t]):
        raise OpError("reverse_sequence", "sequence_lens", f"values in [0, {x.shape[t]}]", str(lens.tolist()))
    xs = np.moveaxis(x, (b, t), (0, 1))  # (batch, time, ...)
    out = xs.copy()
    for i, n in enumerate(lens.tolist()):
        out[i, :n] = xs[i, :n][::-1]
    return np.moveaxis(out, (0, 1), (b, t))


# ---------------------------------------------------------------------------------------------
# eye_like
# ---------------------------------------------------------------------------------------------


def _eye_like(x: Any, *, k: int = 0, dtype: Any = None) -> np.ndarray:
    x = np.asarray(x)
    check_ndim("eye_like", "x", x, 2)
    return np.eye(x.shape[0], x.shape[1], k=int(k), dtype=x.dtype if dtype is None else np.dtype(dtype))


register("eye_like", device="ref", dtypes=ALL_DTYPES)(_eye_like)
register("eye_like", device="cpu", dtypes=ALL_DTYPES)(_eye_like)


# ---------------------------------------------------------------------------------------------
# resize
# ---------------------------------------------------------------------------------------------

RESIZE_MODES = ("nearest", "linear", "cubic")
RESIZE_COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _source_coords(
    coord: str, out_size: int, in_size: int, scale: float, roi: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray | None]:
    """x_original of every output position along one axis; and the extrapolated mask (tf_crop_and_resize)."""
    y = np.arange(out_size, dtype=np.float64)
    out_f = scale * in_size  # the spec's (float) output width
    if coord == "align_corners":
        return (np.zeros(out_size) if out_f == 1 else y * (in_size - 1) / (out_f - 1)), None
    if coord == "asymmetric":
        return y / scale, None
    if coord == "pytorch_half_pixel":
        return (np.full(out_size, -0.5) if out_f == 1 else (y + 0.5) / scale - 0.5), None
    if coord == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if coord == "half_pixel_symmetric":
        offset = in_size / 2 * (1 - out_size / out_f)
        return offset + (y + 0.5) / scale - 0.5, None
    start, end = roi  # tf_crop_and_resize
    if out_f == 1:
        x = np.full(out_size, (end - start) * (in_size - 1) / 2)
    else:
        x = y * (end - start) * (in_size - 1) / (out_f - 1)
    x = x + start * (in_size - 1)
    return x, (x < 0) | (x > in_size - 1)


def _nearest_index(x: np.ndarray, nearest_mode: str, in_size: int) -> np.ndarray:
    fl = np.floor(x)
    frac = x - fl
    if nearest_mode == "round_prefer_floor":
        i = np.where(frac <= 0.5, fl, fl + 1)
    elif nearest_mode == "round_prefer_ceil":
        i = np.where(frac < 0.5, fl, fl + 1)
    elif nearest_mode == "floor":
        i = fl
    else:
        i = np.ceil(x)
    return np.clip(i, 0, in_size - 1).astype(np.intp)


def _cubic_weight(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _taps(
    x: np.ndarray, mode: str, scale: float, antialias: bool, cubic_a: float
) -> tuple[np.ndarray, np.ndarray]:
    """Source positions ``(out, n)`` (unclamped) and weights ``(out, n)`` of linear/cubic interpolation.

    The left neighbour is ``ceil(x) - 1``, so the ratio lies in ``(0, 1]`` as in the spec's reference.
    """
    base = np.ceil(x) - 1
    ratio = x - base  # (out,)
    s = min(scale, 1.0) if antialias else 1.0
    if mode == "linear":
        start = int(math.floor(-1 / s) + 1) if antialias else 0
        offs = np.arange(start, 2 - start)
        w = np.clip(1 - np.abs((offs[None, :] - ratio[:, None]) * s), 0, 1)
    else:
        start = int(math.floor(-2 / s) + 1) if antialias else -1
        offs = np.arange(start, 2 - start)
        w = _cubic_weight((offs[None, :] - ratio[:, None]) * s, cubic_a)
    if antialias:
        w = w / w.sum(axis=1, keepdims=True)
    return base.astype(np.int64)[:, None] + offs[None, :], w


def _resize_axis(
    data: np.ndarray, axis: int, out_size: int, scale: float, roi: tuple[float, float], a: dict[str, Any]
) -> np.ndarray:
    """``data`` (float64) resized along one axis."""
    n = data.shape[axis]
    x, outside = _source_coords(a["coordinate_transformation_mode"], out_size, n, scale, roi)
    if a["mode"] == "nearest":
        res = np.take(data, _nearest_index(x, a["nearest_mode"], n), axis=axis)
    else:
        pos, w = _taps(x, a["mode"], scale, a["antialias"], a["cubic_coeff_a"])
        if a["exclude_outside"]:
            w = np.where((pos < 0) | (pos >= n), 0.0, w)
            tot = w.sum(axis=1, keepdims=True)
            w = w / np.where(tot == 0, 1.0, tot)
        got = np.take(data, np.clip(pos, 0, n - 1).astype(np.intp), axis=axis)  # (..., out, taps, ...)
        shape = (1,) * axis + w.shape + (1,) * (data.ndim - axis - 1)
        res = (got * w.reshape(shape)).sum(axis=axis + 1)
    if outside is not None and outside.any():
        mask = outside.reshape((1,) * axis + (out_size,) + (1,) * (data.ndim - axis - 1))
        res = np.where(mask, np.asarray(a["extrapolation_value"]).astype(res.dtype), res)
    return res


def _resize_plan(
    x: np.ndarray, scales: Any, sizes: Any, axes: Any, policy: str
) -> tuple[list[int], list[float], list[int]]:
    """(resized axes, their scales, their output sizes) per the spec (scales xor sizes given)."""
    r = x.ndim
    ax = (
        list(range(r))
        if axes is None
        else [normalize_axis("resize", a, r, "axes") for a in _ints("resize", "axes", axes)]
    )
    if (scales is None) == (sizes is None):
        raise OpError(
            "resize", "scales", "exactly one of scales and sizes", f"scales={scales!r}, sizes={sizes!r}"
        )
    if scales is not None:
        sc = [float(s) for s in np.asarray(scales, np.float64).ravel()]
        if len(sc) != len(ax) or any(s <= 0 for s in sc):
            raise OpError("resize", "scales", f"{len(ax)} positive floats (one per resized axis)", str(sc))
        return ax, sc, [math.floor(x.shape[d] * s) for d, s in zip(ax, sc, strict=True)]
    sz = _ints("resize", "sizes", sizes)
    if len(sz) != len(ax) or any(s < 0 for s in sz):
        raise OpError("resize", "sizes", f"{len(ax)} ints >= 0 (one per resized axis)", str(sz))
    if any(x.shape[d] == 0 for d in ax):
        raise OpError("resize", "x", "non-empty resized dims", str(x.shape))
    sc = [s / x.shape[d] for d, s in zip(ax, sz, strict=True)]
    if policy == "stretch":
        return ax, sc, sz
    if policy not in ("not_larger", "not_smaller"):
        raise OpError(
            "resize", "keep_aspect_ratio_policy", "stretch, not_larger or not_smaller", repr(policy)
        )
    s = min(sc) if policy == "not_larger" else max(sc)
    return ax, [s] * len(ax), [int(s * x.shape[d] + 0.5) for d in ax]


def _resize_roi(roi: Any, ax: list[int]) -> list[tuple[float, float]]:
    if roi is None or np.asarray(roi).size == 0:
        return [(0.0, 1.0)] * len(ax)
    v = [float(t) for t in np.asarray(roi, np.float64).ravel()]
    if len(v) != 2 * len(ax):
        raise OpError("resize", "roi", f"{2 * len(ax)} floats (starts then ends of the resized axes)", str(v))
    return list(zip(v[: len(ax)], v[len(ax) :], strict=True))


def _to_dtype(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Integer results truncate toward zero (as onnxruntime casts) and saturate; floats cast."""
    if y.dtype == dtype:
        return y
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.trunc(y), info.min, info.max).astype(dtype)
    return y.astype(dtype)


def _check_resize_attrs(a: dict[str, Any]) -> None:
    for name, allowed in (
        ("mode", RESIZE_MODES),
        ("coordinate_transformation_mode", RESIZE_COORDINATE_MODES),
        ("nearest_mode", NEAREST_MODES),
    ):
        if a[name] not in allowed:
            raise OpError("resize", name, f"one of {allowed}", repr(a[name]))
    if a["antialias"] and a["mode"] == "nearest":
        raise OpError("resize", "antialias", "0 with mode='nearest'", "1")


@_both("resize", NUMERIC_DTYPES)
def resize_kernel(
    x: Any,
    *,
    scales: Sequence[float] | None = None,
    sizes: Sequence[int] | None = None,
    axes: Sequence[int] | None = None,
    roi: Sequence[float] | None = None,
    mode: str = "nearest",
    coordinate_transformation_mode: str = "half_pixel",
    nearest_mode: str = "round_prefer_floor",
    cubic_coeff_a: float = -0.75,
    exclude_outside: bool = False,
    extrapolation_value: float = 0.0,
    antialias: bool = False,
    keep_aspect_ratio_policy: str = "stretch",
) -> np.ndarray:
    x = np.asarray(x)
    check_dtype("resize", "x", x, NUMERIC_DTYPES)
    a = {
        "mode": mode,
        "coordinate_transformation_mode": coordinate_transformation_mode,
        "nearest_mode": nearest_mode,
        "cubic_coeff_a": float(cubic_coeff_a),
        "exclude_outside": bool(exclude_outside),
        "extrapolation_value": float(extrapolation_value),
        "antialias": bool(antialias),
    }
    _check_resize_attrs(a)
    ax, sc, out = _resize_plan(x, scales, sizes, axes, keep_aspect_ratio_policy)
    rois = _resize_roi(roi, ax) if coordinate_transformation_mode == "tf_crop_and_resize" else None
    y = x if mode == "nearest" else x.astype(np.float64)  # nearest only copies: exact in any dtype
    for i, d in enumerate(ax):
        roi_d = rois[i] if rois is not None else (0.0, 1.0)
        if out[i] == y.shape[d] and sc[i] == 1.0 and roi_d == (0.0, 1.0):
            continue  # identity along this axis
        if out[i] == 0:
            y = np.empty((*y.shape[:d], 0, *y.shape[d + 1 :]), y.dtype)
            continue
        y = _resize_axis(y, d, out[i], sc[i], roi_d, a)
    return y.copy() if y is x else _to_dtype(y, x.dtype)


# ---------------------------------------------------------------------------------------------
# public ops
# ---------------------------------------------------------------------------------------------


def pad(
    x: Any, pads: Sequence[int], *, mode: str = "constant", value: Any = 0, device: str | None = None
) -> np.ndarray:
    """ONNX Pad: ``pads`` is ``[begin_0, ..., begin_{r-1}, end_0, ..., end_{r-1}]``; negative entries crop.

    ``mode`` is constant (filled with ``value``), reflect, edge or wrap.

    >>> pad(np.array([1, 2, 3]), [1, 2], mode="reflect").tolist()
    [2, 1, 2, 3, 2, 1]
    """
    return call("pad", x, pads, mode=mode, value=value, device=device)


def tile(x: Any, repeats: Sequence[int], *, device: str | None = None) -> np.ndarray:
    """ONNX Tile: ``x`` repeated ``repeats[d]`` times along each dim ``d``.

    >>> tile(np.array([[1, 2]]), [2, 2]).tolist()
    [[1, 2, 1, 2], [1, 2, 1, 2]]
    """
    return call("tile", x, repeats, device=device)


def depth_to_space(x: Any, *, blocksize: int, mode: str = "DCR", device: str | None = None) -> np.ndarray:
    """ONNX DepthToSpace on NCHW ``x``: channel blocks moved into ``blocksize`` x ``blocksize`` spatial tiles.

    ``mode`` DCR (depth-column-row, the default) or CRD (pixel shuffle, torch's order).
    """
    return call("depth_to_space", x, blocksize=blocksize, mode=mode, device=device)


def space_to_depth(x: Any, *, blocksize: int, mode: str = "DCR", device: str | None = None) -> np.ndarray:
    """ONNX SpaceToDepth on NCHW ``x``: the inverse of :func:`depth_to_space` with the same ``mode``."""
    return call("space_to_depth", x, blocksize=blocksize, mode=mode, device=device)


def reverse_sequence(
    x: Any, sequence_lens: Any, *, time_axis: int = 0, batch_axis: int = 1, device: str | None = None
) -> np.ndarray:
    """ONNX ReverseSequence: for each batch entry ``i``, the first ``sequence_lens[i]`` steps reversed.

    >>> reverse_sequence(np.array([[1, 2, 3], [4, 5, 6]]), np.array([2, 3]), time_axis=1, batch_axis=0).tolist()
    [[2, 1, 3], [6, 5, 4]]
    """
    return call(
        "reverse_sequence", x, sequence_lens, time_axis=time_axis, batch_axis=batch_axis, device=device
    )


def eye_like(x: Any, *, k: int = 0, dtype: Any = None, device: str | None = None) -> np.ndarray:
    """ONNX EyeLike: ones on diagonal ``k`` of a 2-D array shaped like ``x`` (dtype ``dtype`` or ``x``'s).

    >>> eye_like(np.zeros((2, 3)), k=1).tolist()
    [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """
    return call("eye_like", x, k=k, dtype=dtype, device=device)


def resize(
    x: Any,
    *,
    scales: Sequence[float] | None = None,
    sizes: Sequence[int] | None = None,
    axes: Sequence[int] | None = None,
    roi: Sequence[float] | None = None,
    mode: str = "nearest",
    coordinate_transformation_mode: str = "half_pixel",
    nearest_mode: str = "round_prefer_floor",
    cubic_coeff_a: float = -0.75,
    exclude_outside: bool = False,
    extrapolation_value: float = 0.0,
    antialias: bool = False,
    keep_aspect_ratio_policy: str = "stretch",
    device: str | None = None,
) -> np.ndarray:
    """ONNX Resize (opset 19): ``x`` resized along ``axes`` (all by default) to ``sizes`` or by ``scales``.

    ``mode`` nearest/linear/cubic, every coordinate_transformation_mode and nearest_mode of the spec,
    ``antialias`` for downsampling linear/cubic, ``keep_aspect_ratio_policy`` with ``sizes``. Integer
    results truncate toward zero (as onnxruntime) and saturate to their dtype.

    >>> resize(np.array([[1.0, 2.0]]), scales=[1, 2], mode="nearest").tolist()
    [[1.0, 1.0, 2.0, 2.0]]
    """
    return call(
        "resize",
        x,
        scales=scales,
        sizes=sizes,
        axes=axes,
        roi=roi,
        mode=mode,
        coordinate_transformation_mode=coordinate_transformation_mode,
        nearest_mode=nearest_mode,
        cubic_coeff_a=cubic_coeff_a,
        exclude_outside=exclude_outside,
        extrapolation_value=extrapolation_value,
        antialias=antialias,
        keep_aspect_ratio_policy=keep_aspect_ratio_policy,
        device=device,
    )
