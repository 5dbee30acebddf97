"""Reduction kernels — sum, mean, max, min, argmax, var, prod and the ONNX reductions reduce_l1,
reduce_l2, reduce_log_sum, reduce_log_sum_exp, reduce_sum_square — on ``ref`` and ``cpu``, plus axis
validation.

Semantics are numpy's/torch's: ``axis`` is None (all dims), an int or a tuple of ints; ``var`` takes
torch's ``correction`` (Bessel's correction by default). Rule of accumulation
(:func:`opstrata.ops._dtypes.accumulation_dtype`): float16/bfloat16/float8 accumulate in float32,
float32 in float32, float64 in float64, integers in int64.
"""

from __future__ import annotations

import builtins
import math
import operator
from functools import partial
from typing import Any

import numpy as np

from .._dtypes import accumulation_dtype, bool_, float64, int64
from .._errors import OpError
from .._registry import call, register, register_decomposition
from .elementwise import FLOATS, NUMERIC, cast_back, checked, ieee, nd

Axis = int | tuple[int, ...] | None
#: max and min also take bool (ONNX ReduceMax/ReduceMin since opset 20): any / all
EXTREME: tuple[np.dtype, ...] = (*NUMERIC, bool_)


# --------------------------------------------------------------------------- axis helpers


def normalize_axis(op: str, x: np.ndarray, axis: Any, name: str = "axis") -> int:
    """A single axis in ``[0, ndim)``; :class:`OpError` for non-ints or out-of-range axes."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise OpError(op, name, "an int", f"{type(axis).__name__} {axis!r}")
    nd_ = x.ndim
    if not -nd_ <= axis < nd_:
        raise OpError(op, name, f"an axis in [-{nd_}, {nd_}) for x of shape {x.shape}", str(axis))
    return operator.index(axis) % nd_


def normalize_axes(op: str, x: np.ndarray, axis: Axis, name: str = "axis") -> tuple[int, ...]:
    """Axes as a sorted tuple in ``[0, ndim)``; None means every dim; duplicates are an error."""
    if axis is None:
        return tuple(range(x.ndim))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    axes = tuple(normalize_axis(op, x, a, name) for a in items)
    if len(set(axes)) != len(axes):
        raise OpError(op, name, "distinct axes", str(axis))
    return tuple(sorted(axes))


def reduced_count(x: np.ndarray, axes: tuple[int, ...]) -> int:
    """How many elements each output of a reduction over ``axes`` combines."""
    return math.prod(x.shape[a] for a in axes)


def mean_over(
    t: np.ndarray, axes: int | tuple[int, ...], keepdims: bool = False, dtype: Any = None
) -> np.ndarray:
    """``sum / count`` over ``axes``: NaN (not numpy's "Mean of empty slice" warning) for empty ones."""
    axes_t = (axes,) if isinstance(axes, int) else axes
    s = nd(t.sum(axis=axes_t, keepdims=keepdims, dtype=dtype))
    with np.errstate(invalid="ignore"):
        return np.divide(s, math.prod(t.shape[a] for a in axes_t), out=s)


def _check_nonempty(op: str, x: np.ndarray, axes: tuple[int, ...]) -> None:
    if any(x.shape[a] == 0 for a in axes):
        raise OpError(
            op, "x", "a non-empty dimension to reduce (no identity exists)", f"shape {x.shape}, axes {axes}"
        )


def _sum_dtype(dtype: np.dtype) -> np.dtype:
    """sum returns int64 for integers (like numpy and torch) and the input dtype for floats."""
    return int64 if dtype.kind in "iu" else dtype


# --------------------------------------------------------------------------- sum, mean


def sum(x: Any, *, axis: Axis = None, keepdims: bool = False, device: str | None = None) -> np.ndarray:
    """Sum over ``axis`` (None: all). Low-precision floats accumulate in float32 and return their dtype;
    float32/64 accumulate in their own dtype; integers accumulate in and return int64.

    >>> sum(np.array([[1, 2], [3, 4]], dtype=np.int8), axis=0)
    array([4, 6])
    """
    return call("sum", checked("sum", "x", x, NUMERIC), axis=axis, keepdims=keepdims, device=device)


@register("sum", device="ref", dtypes=NUMERIC)
@ieee
def sum_ref(x: Any, *, axis: Axis = None, keepdims: bool = False) -> np.ndarray:
    x = nd(x)
    axes = normalize_axes("sum", x, axis)
    total = np.sum(x.astype(accumulation_dtype(x.dtype)), axis=axes, keepdims=keepdims)
    return cast_back(total, _sum_dtype(x.dtype))


@register("sum", device="cpu", dtypes=NUMERIC)
@ieee
def sum_cpu(x: Any, *, axis: Axis = None, keepdims: bool = False) -> np.ndarray:
    x = nd(x)
    axes = normalize_axes("sum", x, axis)
    # dtype= upcasts chunk-wise in numpy's buffered loop: no full-size float32 copy of a bf16 input
    return cast_back(
        x.sum(axis=axes, dtype=accumulation_dtype(x.dtype), keepdims=keepdims), _sum_dtype(x.dtype)
    )


#: Integer dtypes mean takes (ONNX ReduceMean, opset 18): the result is truncated toward zero.
MEAN_INT_DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(t) for t in (np.int32, np.int64, np.uint32, np.uint64))
_MEAN_DTYPES = FLOATS + MEAN_INT_DTYPES


def mean(x: Any, *, axis: Axis = None, keepdims: bool = False, device: str | None = None) -> np.ndarray:
    """Arithmetic mean over ``axis``; accumulates as :func:`sum` and returns x's dtype.

    The mean of an empty float reduction is NaN (as torch and numpy). For int32/int64/uint32/uint64
    (ONNX ReduceMean) the exact 64-bit sum is divided by the count and truncated toward zero, as
    onnxruntime's C++ division does; an empty integer reduction is an :class:`OpError` (no NaN in ints).

    >>> mean(np.array([1.0, 2.0, 6.0]))
    array(3.)
    >>> mean(np.array([-7, 0, 0], dtype=np.int32))
    array(-2, dtype=int32)
    """
    return call("mean", checked("mean", "x", x, _MEAN_DTYPES), axis=axis, keepdims=keepdims, device=device)


def _int_mean(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """sum // count rounded toward zero, in 64-bit integers, returned in x's dtype."""
    n = reduced_count(x, axes)
    if n == 0:
        raise OpError("mean", "x", "a non-empty dimension to average (an integer mean of nothing is undefined)",
                      f"shape {x.shape}, axes {axes}")  # fmt: skip
    wide = np.uint64 if x.dtype.kind == "u" else np.int64
    total = np.asarray(np.sum(x, axis=axes, keepdims=keepdims, dtype=wide))
    if wide is np.uint64:
        return (total // np.uint64(n)).astype(x.dtype)
    return (np.sign(total) * (np.abs(total) // n)).astype(x.dtype)


@register("mean", device="ref", dtypes=_MEAN_DTYPES)
@ieee
def mean_ref(x: Any, *, axis: Axis = None, keepdims: bool = False) -> np.ndarray:
    x = nd(x)
    axes = normalize_axes("mean", x, axis)
    if x.dtype.kind in "iu":
        return _int_mean(x, axes, keepdims)
    total = np.sum(x.astype(accumulation_dtype(x.dtype)), axis=axes, keepdims=keepdims)
    return cast_back(total / reduced_count(x, axes), x.dtype)


@register("mean", device="cpu", dtypes=_MEAN_DTYPES)
@ieee
def mean_cpu(x: Any, *, axis: Axis = None, keepdims: bool = False) -> np.ndarray:
    x = nd(x)
    axes = normalize_axes("mean", x, axis)
    if x.dtype.kind in "iu":
        return _int_mean(x, axes, keepdims)
    return cast_back(mean_over(x, axes, keepdims, dtype=accumulation_dtype(x.dtype)), x.dtype)


def bind_mean(x: Any, *, axis: Axis = None, keepdims: bool = False, out: Any = None) -> Any:
    """``mean_cpu(...)`` into ``out`` with its checks done once (ops.bind): the same sum (into ``out``)
    and division by the count, so the same bits. float32 / float64, non-empty axes, C-contiguous ``out``."""
    if not (type(x) is np.ndarray and type(out) is np.ndarray and x.dtype == out.dtype):
        return None
    if x.dtype not in (np.float32, np.float64) or not (out.flags.c_contiguous and out.flags.writeable):
        return None
    try:
        axes = normalize_axes("mean", x, axis)
    except Exception:
        return None  # the kernel's own call raises it where it is made
    count = reduced_count(x, axes)
    if count == 0 or np.may_share_memory(x, out):
        return None
    shape = (
        tuple(1 if a in axes else d for a, d in enumerate(x.shape))
        if keepdims
        else tuple(d for a, d in enumerate(x.shape) if a not in axes)
    )
    if out.shape != shape:
        return None
    total = partial(np.sum, x, axis=axes, keepdims=keepdims, dtype=x.dtype, out=out)
    divide = partial(np.divide, out, count, out=out)

    def run() -> None:
        with np.errstate(all="ignore"):
            total()
            divide()

    return run


mean_cpu.binder = bind_mean  # type: ignore[attr-defined]


@register_decomposition("mean", dtypes=FLOATS)
def mean_decomposition(x: Any, *, axis: Axis = None, keepdims: bool = False) -> np.ndarray:
    """mean = sum(x) / count (sum accumulates in float32 for low precision)."""
    x = nd(x)
    n = reduced_count(x, normalize_axes("mean", x, axis))
    return call("div", call("sum", x, axis=axis, keepdims=keepdims), np.asarray(n, dtype=x.dtype))


# --------------------------------------------------------------------------- max, min, argmax


def max(x: Any, *, axis: Axis = None, keepdims: bool = False, device: str | None = None) -> np.ndarray:
    """Maximum over ``axis``; floats, ints and bool (any); exact, returns x's dtype; NaN propagates (as torch).

    Reducing an empty dimension is an :class:`OpError` (there is no identity).

    >>> max(np.array([[1, 5], [7, 2]]), axis=1)
    array([5, 7])
    """
    return call("max", checked("max", "x", x, EXTREME), axis=axis, keepdims=keepdims, device=device)


def min(x: Any, *, axis: Axis = None, keepdims: bool = False, device: str | None = None) -> np.ndarray:
    """Minimum over ``axis``; as :func:`max`.

    >>> min(np.array([[1, 5], [7, 2]]), axis=1)
    array([1, 2])
    """
    return call("min", checked("min", "x", x, EXTREME), axis=axis, keepdims=keepdims, device=device)


def _ref_extreme(op: str, x: Any, axis: Axis, keepdims: bool, pick: Any) -> np.ndarray:
    x = nd(x)
    axes = normalize_axes(op, x, axis)
    _check_nonempty(op, x, axes)
    r = x
    for a in reversed(axes):  # one axis at a time, highest first so lower indices stay valid
        r = pick.reduce(r, axis=a, keepdims=keepdims)
    return nd(r)


@register("max", device="ref", dtypes=EXTREME)
def max_ref(x: Any, *, axis: Axis = None, keepdims: bool = False) -> np.ndarray:
    return _ref_extreme("max", x, axis, keepdims, np.maximum)


@register("max", device="cpu", dtypes=EXTREME)
def max_cpu(x: Any, *, axis: Axis = None, keepdims: bool = False) -> np.ndarray:
    x = nd(x)
    axes = normalize_axes("max", x, axis)
    _check_nonempty("max", x, axes)
    return nd(x.max(axis=axes, keepdims=keepdims))


@register("min", device="ref", dtypes=EXTREME)
def min_ref(x: Any, *, axis: Axis = None, keepdims: bool = False) -> np.ndarray:
    return _ref_extreme("min", x, axis, keepdims, np.minimum)


@register("min", device="cpu", dtypes=EXTREME)
def min_cpu(x: Any, *, axis: Axis = None, keepdims: bool = False) -> np.ndarray:
    x = nd(x)
    axes = normalize_axes("min", x, axis)
    _check_nonempty("min", x, axes)
    return nd(x.min(axis=axes, keepdims=keepdims))


def argmax(
    x: Any, *, axis: int | None = None, keepdims: bool = False, device: str | None = None
) -> np.ndarray:
    """Index of the maximum along ``axis`` (None: of the flattened array) as int64; floats and ints.

    Ties give the first index; a NaN counts as the maximum (first NaN wins), as numpy and torch.

    >>> argmax(np.array([[1, 5], [7, 2]]), axis=1)
    array([1, 0])
    """
    return call("argmax", checked("argmax", "x", x, NUMERIC), axis=axis, keepdims=keepdims, device=device)


def _argmax_prep(x: Any, axis: int | None) -> tuple[np.ndarray, int | None]:
    x = nd(x)
    ax = None if axis is None else normalize_axis("argmax", x, axis)
    _check_nonempty("argmax", x, tuple(range(x.ndim)) if ax is None else (ax,))
    return x, ax


@register("argmax", device="ref", dtypes=NUMERIC)
def argmax_ref(x: Any, *, axis: int | None = None, keepdims: bool = False) -> np.ndarray:
    x, ax = _argmax_prep(x, axis)
    rows = np.moveaxis(x.reshape(-1) if ax is None else x, -1 if ax is None else ax, -1)  # (..., n)
    rows = rows.astype(np.float64) if rows.dtype.kind not in "iu" else rows
    nan = np.isnan(rows) if rows.dtype.kind == "f" else np.zeros(rows.shape, bool)
    is_best = np.where(nan.any(-1, keepdims=True), nan, rows == rows.max(-1, keepdims=True))
    idx = np.where(is_best, np.arange(rows.shape[-1]), rows.shape[-1]).min(-1)  # first hit
    if keepdims:
        idx = idx.reshape((1,) * x.ndim) if ax is None else np.expand_dims(idx, ax)
    return nd(idx).astype(int64)


@register("argmax", device="cpu", dtypes=NUMERIC)
def argmax_cpu(x: Any, *, axis: int | None = None, keepdims: bool = False) -> np.ndarray:
    x, ax = _argmax_prep(x, axis)
    return nd(np.argmax(x, axis=ax, keepdims=keepdims)).astype(int64, copy=False)


# --------------------------------------------------------------------------- var


def var(
    x: Any,
    *,
    axis: Axis = None,
    correction: float = 1,
    keepdims: bool = False,
    device: str | None = None,
) -> np.ndarray:
    """Variance over ``axis`` with torch's ``correction``: ``sum((x - mean)^2) / max(N - correction, 0)``.

    Floats; accumulates as :func:`sum` (two passes: mean, then squared deviations) and returns x's
    dtype. ``N <= correction`` divides by zero: NaN for zero deviations, inf otherwise (as torch).

    >>> var(np.array([1.0, 2.0, 3.0, 4.0]))
    array(1.66666667)
    """
    if isinstance(correction, bool) or not isinstance(correction, (int, float, np.integer, np.floating)):
        raise OpError("var", "correction", "a number", f"{type(correction).__name__} {correction!r}")
    return call(
        "var",
        checked("var", "x", x, FLOATS),
        axis=axis,
        correction=correction,
        keepdims=keepdims,
        device=device,
    )


@register("var", device="ref", dtypes=FLOATS)
@ieee
def var_ref(x: Any, *, axis: Axis = None, correction: float = 1, keepdims: bool = False) -> np.ndarray:
    x = nd(x)
    axes = normalize_axes("var", x, axis)
    n = reduced_count(x, axes)
    t = x.astype(accumulation_dtype(x.dtype))
    mu = np.sum(t, axis=axes, keepdims=True) / n
    ss = np.sum((t - mu) ** 2, axis=axes, keepdims=keepdims)
    return cast_back(ss / builtins.max(n - correction, 0), x.dtype)


@register("var", device="cpu", dtypes=FLOATS)
@ieee
def var_cpu(x: Any, *, axis: Axis = None, correction: float = 1, keepdims: bool = False) -> np.ndarray:
    x = nd(x)
    axes = normalize_axes("var", x, axis)
    n = reduced_count(x, axes)
    t = x.astype(accumulation_dtype(x.dtype))  # the one full-size buffer; deviations squared in place
    t -= mean_over(t, axes, keepdims=True)
    np.square(t, out=t)
    ss = nd(t.sum(axis=axes, keepdims=keepdims))
    return cast_back(np.divide(ss, builtins.max(n - correction, 0), out=ss), x.dtype)


# --------------------------------------------------------------------------- prod and the ONNX reductions
# ONNX ReduceProd / ReduceL1 / ReduceL2 / ReduceLogSum / ReduceLogSumExp / ReduceSumSquare. An empty
# reduction gives the identity (1 for prod, 0 for the sums, -inf for the logs), as the ONNX spec says.
# Floats return x's dtype (ref computes in float64, cpu in the accumulation dtype); integers return
# int64 (uint64 for uint64) for the exact ones (prod, l1, sum_square) and float64 for l2 / log_sum /
# log_sum_exp.


def _lse(t: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """log(sum(exp(t))) shifted by the max (no overflow); -inf for an empty or all -inf slice."""
    m = np.max(t, axis=axes, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    r = np.log(np.sum(np.exp(t - m), axis=axes, keepdims=True)) + m
    return r if keepdims else np.squeeze(r, axis=axes)


_ONNX_REDUCTIONS: dict[str, tuple[bool, Any]] = {  # name -> (exact on ints, fn(t, axes, keepdims))
    "prod": (True, lambda t, a, k: np.prod(t, axis=a, keepdims=k)),
    "reduce_l1": (True, lambda t, a, k: np.sum(np.abs(t), axis=a, keepdims=k)),
    "reduce_l2": (False, lambda t, a, k: np.sqrt(np.sum(t * t, axis=a, keepdims=k))),
    "reduce_sum_square": (True, lambda t, a, k: np.sum(t * t, axis=a, keepdims=k)),
    "reduce_log_sum": (False, lambda t, a, k: np.log(np.sum(t, axis=a, keepdims=k))),
    "reduce_log_sum_exp": (False, _lse),
}


INT_SET = frozenset(d for d in NUMERIC if d.kind in "iu")


def _onnx_out_dtype(op: str, dtype: np.dtype) -> np.dtype:
    if dtype.kind == "f" or dtype not in INT_SET:
        return dtype
    return accumulation_dtype(dtype) if _ONNX_REDUCTIONS[op][0] else float64  # int64 (uint64 stays)


def _make_onnx_reduction(op: str, device: str) -> Any:
    exact, fn = _ONNX_REDUCTIONS[op]

    @ieee
    def kernel(x: Any, *, axis: Axis = None, keepdims: bool = False) -> np.ndarray:
        x = nd(x)
        axes = normalize_axes(op, x, axis)
        if x.dtype in INT_SET:
            work = accumulation_dtype(x.dtype) if exact else float64
        else:
            work = float64 if device == "ref" else accumulation_dtype(x.dtype)
        return cast_back(fn(x.astype(work), axes, keepdims), _onnx_out_dtype(op, x.dtype))

    kernel.__name__ = kernel.__qualname__ = f"{op}_{device}"
    return register(op, device=device, dtypes=NUMERIC)(kernel)


for _op in _ONNX_REDUCTIONS:
    for _dev in ("ref", "cpu"):
        _make_onnx_reduction(_op, _dev)


def _onnx_reduce(op: str, x: Any, axis: Axis, keepdims: bool, device: str | None) -> np.ndarray:
    return call(op, checked(op, "x", x, NUMERIC), axis=axis, keepdims=keepdims, device=device)


def prod(x: Any, *, axis: Axis = None, keepdims: bool = False, device: str | None = None) -> np.ndarray:
    """Product over ``axis`` (ONNX ReduceProd); an empty reduction is 1; ints return int64.

    >>> prod(np.array([[1.0, 2.0], [3.0, 4.0]]), axis=1)
    array([ 2., 12.])
    """
    return _onnx_reduce("prod", x, axis, keepdims, device)


def reduce_l1(x: Any, *, axis: Axis = None, keepdims: bool = False, device: str | None = None) -> np.ndarray:
    """``sum(|x|)`` over ``axis`` (ONNX ReduceL1); ints return int64.

    >>> reduce_l1(np.array([1.0, -2.0]))
    array(3.)
    """
    return _onnx_reduce("reduce_l1", x, axis, keepdims, device)


def reduce_l2(x: Any, *, axis: Axis = None, keepdims: bool = False, device: str | None = None) -> np.ndarray:
    """``sqrt(sum(x^2))`` over ``axis`` (ONNX ReduceL2); ints return float64.

    >>> reduce_l2(np.array([3.0, -4.0]))
    array(5.)
    """
    return _onnx_reduce("reduce_l2", x, axis, keepdims, device)


def reduce_sum_square(
    x: Any, *, axis: Axis = None, keepdims: bool = False, device: str | None = None
) -> np.ndarray:
    """``sum(x^2)`` over ``axis`` (ONNX ReduceSumSquare); ints return int64.

    >>> reduce_sum_square(np.array([3.0, -4.0]))
    array(25.)
    """
    return _onnx_reduce("reduce_sum_square", x, axis, keepdims, device)


def reduce_log_sum(
    x: Any, *, axis: Axis = None, keepdims: bool = False, device: str | None = None
) -> np.ndarray:
    """``log(sum(x))`` over ``axis`` (ONNX ReduceLogSum); an empty reduction is -inf; ints return float64.

    >>> reduce_log_sum(np.array([1.0, 0.0]))
    array(0.)
    """
    return _onnx_reduce("reduce_log_sum", x, axis, keepdims, device)


def reduce_log_sum_exp(
    x: Any, *, axis: Axis = None, keepdims: bool = False, device: str | None = None
) -> np.ndarray:
    """``log(sum(exp(x)))`` over ``axis``, shifted by the max so it does not overflow (ONNX
    ReduceLogSumExp); an empty reduction is -inf; ints return float64.

    >>> reduce_log_sum_exp(np.array([1000.0, 1000.0])).round(4)
    array(1000.6931)
    """
    return _onnx_reduce("reduce_log_sum_exp", x, axis, keepdims, device)
