"""Normalization kernels — layer_norm, rms_norm, batch_norm (inference) — on ``ref`` and ``cpu``.

layer_norm follows ONNX LayerNormalization (Ba et al. 2016): normalize over dims ``axis..end`` with
the biased variance; rms_norm is Zhang & Sennrich (2019), ``x / sqrt(mean(x^2) + eps)``; batch_norm
is Ioffe & Szegedy (2015) at inference, with running statistics and channel axis 1 (NCHW).
All compute in float32 for low-precision inputs (float64 for float64) and return x's dtype;
weight/bias/statistics may be any float dtype and are used in that compute dtype.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._dtypes import compute_dtype
from .._errors import OpError, check_dtype, check_ndim
from .._registry import call, register, register_decomposition
from .elementwise import FLOATS, cast_back, check_out, check_out_overlap, checked, const, ieee, nd, upcast
from .reduce import mean_over, normalize_axis


def _check_param(op: str, name: str, p: Any, shape: tuple[int, ...], what: str) -> np.ndarray | None:
    """A float parameter of exactly ``shape``, or None."""
    if p is None:
        return None
    p = nd(p)
    check_dtype(op, name, p, "floating")
    if p.shape != shape:
        raise OpError(op, name, f"shape {shape} ({what})", str(p.shape))
    return p


def _check_eps(op: str, eps: Any) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating)) or not eps >= 0:
        raise OpError(op, "eps", "a number >= 0", repr(eps))


def _trailing(op: str, x: Any, axis: int, params: dict[str, Any]) -> tuple[np.ndarray, int, list[Any]]:
    """Validate a norm over dims ``axis..end``: (x, axis in [0, ndim), params checked against x.shape[axis:])."""
    x = nd(x)
    a = normalize_axis(op, x, axis)
    norm_shape = x.shape[a:]
    checked_params = [_check_param(op, n, p, norm_shape, "x.shape[axis:]") for n, p in params.items()]
    return x, a, checked_params


def _as(p: np.ndarray | None, dtype: np.dtype) -> np.ndarray | None:
    return None if p is None else p.astype(dtype, copy=False)


# --------------------------------------------------------------------------- layer_norm


def layer_norm(
    x: Any,
    weight: Any = None,
    bias: Any = None,
    *,
    axis: int = -1,
    eps: float = 1e-5,
    out: np.ndarray | None = None,
    device: str | None = None,
) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over dims ``axis..end`` (ONNX LayerNormalization).

    ``var`` is biased (divide by N). weight/bias have shape ``x.shape[axis:]``. Floats; low precision
    computes in float32 and returns x's dtype. ``out`` (optional: x's shape and dtype) receives the
    result, normalized in it on cpu; it may be ``x`` itself, but must not otherwise overlap x, weight
    or bias.

    >>> layer_norm(np.array([[1.0, 3.0]])).round(3)
    array([[-1.,  1.]])
    """
    _check_eps("layer_norm", eps)
    x = checked("layer_norm", "x", x, FLOATS)
    if out is None:
        return call("layer_norm", x, weight, bias, axis=axis, eps=eps, device=device)
    check_out("layer_norm", out, x.shape, x.dtype)
    check_out_overlap("layer_norm", out, x, weight=_nd_or_none(weight), bias=_nd_or_none(bias))
    got = call("layer_norm", x, weight, bias, axis=axis, eps=eps, out=out, device=device)
    if got is not out:
        np.copyto(out, got)
    return out


def _nd_or_none(p: Any) -> np.ndarray | None:
    return None if p is None else nd(p)


@register("layer_norm", device="ref", dtypes=FLOATS)
@ieee
def layer_norm_ref(
    x: Any,
    weight: Any = None,
    bias: Any = None,
    *,
    axis: int = -1,
    eps: float = 1e-5,
    out: np.ndarray | None = None,
) -> np.ndarray:
    x, a, (w, b) = _trailing("layer_norm", x, axis, {"weight": weight, "bias": bias})
    t = upcast(x)
    dims = tuple(range(a, x.ndim))
    mu = mean_over(t, dims, keepdims=True)
    var = mean_over((t - mu) ** 2, dims, keepdims=True)
    y = (t - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * w.astype(t.dtype)
    if b is not None:
        y = y + b.astype(t.dtype)
    return cast_back(y, x.dtype, out)


def _rows(x: np.ndarray, a: int) -> np.ndarray:
    """x as a fresh C-contiguous (rows, n) buffer in its compute dtype, n = prod(x.shape[a:])."""
    n = math.prod(x.shape[a:])
    return np.array(x, dtype=compute_dtype(x.dtype), order="C", copy=True).reshape(math.prod(x.shape[:a]), n)


@register("layer_norm", device="cpu", dtypes=FLOATS)
@ieee
def layer_norm_cpu(
    x: Any,
    weight: Any = None,
    bias: Any = None,
    *,
    axis: int = -1,
    eps: float = 1e-5,
    out: np.ndarray | None = None,
) -> np.ndarray:
    x, a, (w, b) = _trailing("layer_norm", x, axis, {"weight": weight, "bias": bias})
    if x.size == 0:
        return np.empty(x.shape, x.dtype) if out is None else out
    n = math.prod(x.shape[a:])
    direct = False
    if x.dtype == compute_dtype(x.dtype) and x.flags.c_contiguous:  # the centring writes the one buffer
        xr = x.reshape(math.prod(x.shape[:a]), n)
        direct = out is not None and out.flags.c_contiguous  # ...the caller's (may be x: elementwise)
        mean = (xr @ np.full(n, 1.0 / n, xr.dtype))[:, None]  # a BLAS matvec: ~4x numpy's row sums
        t = np.subtract(xr, mean, out=out.reshape(xr.shape) if direct else None)
    else:
        t = _rows(x, a)  # a fresh C-contiguous copy in the compute dtype
        t -= mean_over(t, 1, keepdims=True)
    var = np.einsum("ij,ij->i", t, t)[:, None]  # (R, 1) sum of squares without a temporary
    var /= n
    var += eps
    t *= np.reciprocal(np.sqrt(var, out=var), out=var)
    if w is not None:
        t *= _as(w, t.dtype).reshape(n)
    if b is not None:
        t += _as(b, t.dtype).reshape(n)
    if direct:
        return out  # type: ignore[return-value]
    return cast_back(t.reshape(x.shape), x.dtype, out)


def _affine(y: Any, w: np.ndarray | None, b: np.ndarray | None) -> Any:
    y = y if w is None else call("mul", y, w.astype(y.dtype, copy=False))
    return y if b is None else call("add", y, b.astype(y.dtype, copy=False))


@register_decomposition("layer_norm", dtypes=FLOATS)
def layer_norm_decomposition(
    x: Any,
    weight: Any = None,
    bias: Any = None,
    *,
    axis: int = -1,
    eps: float = 1e-5,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """layer_norm = (x - mean) * rsqrt(mean((x - mean)^2) + eps) * weight + bias, in primitives
    (``out`` is filled by the caller)."""
    x, a, (w, b) = _trailing("layer_norm", x, axis, {"weight": weight, "bias": bias})
    dims = tuple(range(a, x.ndim))
    d = call("sub", x, call("mean", x, axis=dims, keepdims=True))
    var = call("mean", call("mul", d, d), axis=dims, keepdims=True)
    return _affine(call("mul", d, call("rsqrt", call("add", var, const(eps, x.dtype)))), w, b)


# --------------------------------------------------------------------------- rms_norm


def rms_norm(
    x: Any, weight: Any = None, *, axis: int = -1, eps: float = 1e-6, device: str | None = None
) -> np.ndarray:
    """``x / sqrt(mean(x^2) + eps) * weight`` over dims ``axis..end`` (RMSNorm, as in LLaMA).

    weight has shape ``x.shape[axis:]``. Floats; low precision computes in float32 and returns x's dtype.

    >>> rms_norm(np.array([[3.0, 4.0]]), eps=0.0).round(4)
    array([[0.8485, 1.1314]])
    """
    _check_eps("rms_norm", eps)
    return call("rms_norm", checked("rms_norm", "x", x, FLOATS), weight, axis=axis, eps=eps, device=device)


@register("rms_norm", device="ref", dtypes=FLOATS)
@ieee
def rms_norm_ref(x: Any, weight: Any = None, *, axis: int = -1, eps: float = 1e-6) -> np.ndarray:
    x, a, (w,) = _trailing("rms_norm", x, axis, {"weight": weight})
    t = upcast(x)
    ms = mean_over(t * t, tuple(range(a, x.ndim)), keepdims=True)
    y = t / np.sqrt(ms + eps)
    if w is not None:
        y = y * w.astype(t.dtype)
    return cast_back(y, x.dtype)


@register("rms_norm", device="cpu", dtypes=FLOATS)
@ieee
def rms_norm_cpu(x: Any, weight: Any = None, *, axis: int = -1, eps: float = 1e-6) -> np.ndarray:
    x, a, (w,) = _trailing("rms_norm", x, axis, {"weight": weight})
    if x.size == 0:
        return np.empty(x.shape, x.dtype)
    t = _rows(x, a)  # (R, n)
    n = t.shape[1]
    ms = np.einsum("ij,ij->i", t, t)[:, None]  # (R, 1)
    ms /= n
    ms += eps
    t *= np.reciprocal(np.sqrt(ms, out=ms), out=ms)
    if w is not None:
        t *= _as(w, t.dtype).reshape(n)
    return cast_back(t.reshape(x.shape), x.dtype)


@register_decomposition("rms_norm", dtypes=FLOATS)
def rms_norm_decomposition(x: Any, weight: Any = None, *, axis: int = -1, eps: float = 1e-6) -> np.ndarray:
    """rms_norm = x * rsqrt(mean(x^2) + eps) * weight, in primitives."""
    x, a, (w,) = _trailing("rms_norm", x, axis, {"weight": weight})
    ms = call("mean", call("mul", x, x), axis=tuple(range(a, x.ndim)), keepdims=True)
    return _affine(call("mul", x, call("rsqrt", call("add", ms, const(eps, x.dtype)))), w, None)


# --------------------------------------------------------------------------- batch_norm


def batch_norm(
    x: Any,
    mean: Any,
    var: Any,
    weight: Any = None,
    bias: Any = None,
    *,
    eps: float = 1e-5,
    device: str | None = None,
) -> np.ndarray:
    """Inference batch norm ``(x - mean) / sqrt(var + eps) * weight + bias`` per channel (axis 1).

    x is ``(N, C, ...)`` (NCHW for images); mean, var, weight, bias have shape ``(C,)``. Floats;
    low precision computes in float32 and returns x's dtype.

    >>> batch_norm(np.ones((1, 2, 1, 1)), np.array([1.0, 0.0]), np.array([1.0, 4.0]), eps=0.0).ravel()
    array([0. , 0.5])
    """
    _check_eps("batch_norm", eps)
    x = checked("batch_norm", "x", x, FLOATS)
    return call("batch_norm", x, mean, var, weight, bias, eps=eps, device=device)


def _channel_params(x: Any, params: dict[str, Any]) -> tuple[np.ndarray, list[Any]]:
    """Validate (N, C, ...) x and (C,) statistics/affine parameters."""
    x = nd(x)
    check_ndim("batch_norm", "x", x, (2, None), layout="N, C, ...")
    c = x.shape[1]
    for name in ("mean", "var"):
        if params[name] is None:
            raise OpError("batch_norm", name, "an array of shape (C,) (running statistics)", "None")
    return x, [_check_param("batch_norm", n, p, (c,), "(C,) with C = x.shape[1]") for n, p in params.items()]


def _per_channel(p: np.ndarray, ndim: int, dtype: np.dtype) -> np.ndarray:
    return p.astype(dtype, copy=False).reshape((1, -1) + (1,) * (ndim - 2))  # (1, C, 1, ...)


@register("batch_norm", device="ref", dtypes=FLOATS)
@ieee
def batch_norm_ref(
    x: Any, mean: Any, var: Any, weight: Any = None, bias: Any = None, *, eps: float = 1e-5
) -> np.ndarray:
    params = {"mean": mean, "var": var, "weight": weight, "bias": bias}
    x, (mu, v, w, b) = _channel_params(x, params)
    t = upcast(x)
    assert mu is not None and v is not None
    y = (t - _per_channel(mu, x.ndim, t.dtype)) / np.sqrt(_per_channel(v, x.ndim, t.dtype) + eps)
    if w is not None:
        y = y * _per_channel(w, x.ndim, t.dtype)
    if b is not None:
        y = y + _per_channel(b, x.ndim, t.dtype)
    return cast_back(y, x.dtype)


@register("batch_norm", device="cpu", dtypes=FLOATS)
@ieee
def batch_norm_cpu(
    x: Any, mean: Any, var: Any, weight: Any = None, bias: Any = None, *, eps: float = 1e-5
) -> np.ndarray:
    params = {"mean": mean, "var": var, "weight": weight, "bias": bias}
    x, (mu, v, w, b) = _channel_params(x, params)
    assert mu is not None and v is not None
    cdt = compute_dtype(x.dtype)
    scale = np.sqrt(v.astype(cdt) + eps)  # (C,) tiny: fold weight / std once per channel
    np.divide(1 if w is None else w.astype(cdt), scale, out=scale)
    t = np.subtract(x, _per_channel(mu, x.ndim, cdt), dtype=cdt)  # the one full-size buffer
    t *= _per_channel(scale, x.ndim, cdt)
    if b is not None:
        t += _per_channel(b, x.ndim, cdt)
    return cast_back(t, x.dtype)
