"""Normalization kernels — layer_norm, rms_norm, batch_norm (inference) — on ``ref`` and ``cpu``; and the
ONNX ones instance_norm, group_norm, lrn, lp_normalize, mean_variance_norm, layer_norm_stats (one
implementation registered on both devices; they follow the ONNX operator spec of the same name).

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


# --------------------------------------------------------------------------- ONNX normalisations
# InstanceNormalization, GroupNormalization, LRN, LpNormalization, MeanVarianceNormalization and the
# Mean / InvStdDev outputs of LayerNormalization. Rare ops: one implementation on ref and cpu.


def _both(name: str, fn: Any) -> None:
    register(name, device="ref", dtypes=FLOATS)(fn)
    register(name, device="cpu", dtypes=FLOATS)(fn)


def _channel_affine(op: str, x: np.ndarray, scale: Any, bias: Any, t: np.ndarray) -> np.ndarray:
    """``t * scale + bias`` with (C,) scale/bias on channel axis 1 (None skipped)."""
    c = (x.shape[1],)
    s = _check_param(op, "scale", scale, c, "(C,) with C = x.shape[1]")
    b = _check_param(op, "bias", bias, c, "(C,) with C = x.shape[1]")
    if s is not None:
        t = t * _per_channel(s, x.ndim, t.dtype)
    if b is not None:
        t = t + _per_channel(b, x.ndim, t.dtype)
    return t


def _standardize(t: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    mu = mean_over(t, axes, keepdims=True)
    d = t - mu
    return d / np.sqrt(mean_over(d * d, axes, keepdims=True) + eps)


@ieee
def _instance_norm(x: Any, scale: Any = None, bias: Any = None, *, eps: float = 1e-5) -> np.ndarray:
    x = nd(x)
    check_ndim("instance_norm", "x", x, (3, None), layout="(N, C, *spatial)")
    t = _standardize(upcast(x), tuple(range(2, x.ndim)), eps)
    return cast_back(_channel_affine("instance_norm", x, scale, bias, t), x.dtype)


_both("instance_norm", _instance_norm)


def instance_norm(
    x: Any, scale: Any = None, bias: Any = None, *, eps: float = 1e-5, device: str | None = None
) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) * scale + bias`` over the spatial dims of each (n, c) (ONNX
    InstanceNormalization); scale/bias are (C,); floats, low precision computes in float32.

    >>> instance_norm(np.array([[[1.0, 3.0]]])).round(3).tolist()
    [[[-1.0, 1.0]]]
    """
    _check_eps("instance_norm", eps)
    x = checked("instance_norm", "x", x, FLOATS)
    return call("instance_norm", x, scale, bias, eps=eps, device=device)


@ieee
def _group_norm(
    x: Any, scale: Any = None, bias: Any = None, *, num_groups: int, eps: float = 1e-5
) -> np.ndarray:
    x = nd(x)
    op = "group_norm"
    check_ndim(op, "x", x, (2, None), layout="(N, C, *spatial)")
    if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)) or num_groups < 1:
        raise OpError(op, "num_groups", "an int >= 1", repr(num_groups))
    if x.shape[1] % num_groups:
        raise OpError(op, "num_groups", f"a divisor of C = {x.shape[1]}", str(num_groups))
    g = upcast(x).reshape(x.shape[0], num_groups, -1)
    t = _standardize(g, (2,), eps).reshape(x.shape)
    return cast_back(_channel_affine(op, x, scale, bias, t), x.dtype)


_both("group_norm", _group_norm)


def group_norm(
    x: Any,
    scale: Any = None,
    bias: Any = None,
    *,
    num_groups: int,
    eps: float = 1e-5,
    device: str | None = None,
) -> np.ndarray:
    """Group normalization (Wu & He 2018; ONNX GroupNormalization, opset 21 form): channels split into
    ``num_groups`` groups, each (n, group) standardized over its channels and spatial dims, then the
    per-channel (C,) scale and bias. Floats; statistics in float32 for low precision.

    >>> group_norm(np.array([[1.0, 3.0]]), num_groups=1).round(3).tolist()
    [[-1.0, 1.0]]
    """
    _check_eps("group_norm", eps)
    x = checked("group_norm", "x", x, FLOATS)
    return call("group_norm", x, scale, bias, num_groups=num_groups, eps=eps, device=device)


@ieee
def _lrn(x: Any, *, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> np.ndarray:
    x = nd(x)
    check_ndim("lrn", "x", x, (3, None), layout="(N, C, *spatial)")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise OpError("lrn", "size", "an int >= 1 (channels in the window)", repr(size))
    t = upcast(x)
    sq = t * t
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)  # channels before / after c
    c = x.shape[1]
    csum = np.concatenate([np.zeros_like(sq[:, :1]), np.cumsum(sq, axis=1)], axis=1)  # (N, C+1, ...)
    idx = np.arange(c)
    s = csum[:, np.minimum(idx + hi + 1, c)] - csum[:, np.maximum(idx - lo, 0)]
    return cast_back(t / (bias + (alpha / size) * s) ** beta, x.dtype)


_both("lrn", _lrn)


def lrn(
    x: Any,
    *,
    size: int,
    alpha: float = 1e-4,
    beta: float = 0.75,
    bias: float = 1.0,
    device: str | None = None,
) -> np.ndarray:
    """Local response normalization across channels (Krizhevsky et al. 2012; ONNX LRN):
    ``x / (bias + alpha / size * sum_{window} x^2) ^ beta`` over ``size`` neighbouring channels.

    >>> lrn(np.ones((1, 1, 1)), size=1, alpha=1.0, beta=1.0, bias=1.0).tolist()
    [[[0.5]]]
    """
    x = checked("lrn", "x", x, FLOATS)
    return call("lrn", x, size=size, alpha=alpha, beta=beta, bias=bias, device=device)


@ieee
def _lp_normalize(x: Any, *, axis: int = -1, p: int = 2) -> np.ndarray:
    x = nd(x)
    a = normalize_axis("lp_normalize", x, axis)
    if p not in (1, 2) or isinstance(p, bool):
        raise OpError("lp_normalize", "p", "1 or 2", repr(p))
    t = upcast(x)
    norm = (
        np.sum(np.abs(t), axis=a, keepdims=True) if p == 1 else np.sqrt(np.sum(t * t, axis=a, keepdims=True))
    )
    return cast_back(np.where(norm == 0, 0, t / norm), x.dtype)


_both("lp_normalize", _lp_normalize)


def lp_normalize(x: Any, *, axis: int = -1, p: int = 2, device: str | None = None) -> np.ndarray:
    """``x / ||x||_p`` along ``axis`` (ONNX LpNormalization, p 1 or 2); a zero norm gives 0, not NaN.

    >>> lp_normalize(np.array([3.0, 4.0])).tolist()
    [0.6, 0.8]
    """
    x = checked("lp_normalize", "x", x, FLOATS)
    return call("lp_normalize", x, axis=axis, p=p, device=device)


@ieee
def _mean_variance_norm(x: Any, *, axes: Any = (0, 2, 3)) -> np.ndarray:
    x = nd(x)
    ax = tuple(normalize_axis("mean_variance_norm", x, a, "axes") for a in axes)
    t = upcast(x)
    mu = mean_over(t, ax, keepdims=True)
    var = mean_over(t * t, ax, keepdims=True) - mu * mu  # the ONNX function's E[x^2] - E[x]^2
    return cast_back((t - mu) / (np.sqrt(np.maximum(var, 0)) + 1e-9), x.dtype)


_both("mean_variance_norm", _mean_variance_norm)


def mean_variance_norm(x: Any, *, axes: Any = (0, 2, 3), device: str | None = None) -> np.ndarray:
    """``(x - mean) / (std + 1e-9)`` over ``axes`` (ONNX MeanVarianceNormalization, its function body).

    >>> mean_variance_norm(np.array([1.0, 3.0]), axes=(0,)).round(3).tolist()
    [-1.0, 1.0]
    """
    x = checked("mean_variance_norm", "x", x, FLOATS)
    return call("mean_variance_norm", x, axes=tuple(axes), device=device)


@ieee
def _layer_norm_stats(x: Any, *, axis: int = -1, eps: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
    x = nd(x)
    a = normalize_axis("layer_norm_stats", x, axis)
    t = x.astype(np.float64 if x.dtype == np.float64 else np.float32)
    dims = tuple(range(a, x.ndim))
    mu = mean_over(t, dims, keepdims=True)
    var = mean_over((t - mu) ** 2, dims, keepdims=True)
    return mu, 1.0 / np.sqrt(var + eps)


_both("layer_norm_stats", _layer_norm_stats)


def layer_norm_stats(
    x: Any, *, axis: int = -1, eps: float = 1e-5, device: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, 1 / sqrt(var + eps))`` over dims ``axis..end``, kept as size-1 dims: LayerNormalization's
    Mean and InvStdDev outputs, in float32 (float64 for float64 x; ONNX stash_type=1).

    >>> [a.tolist() for a in layer_norm_stats(np.array([[1.0, 3.0]]), eps=0.0)]
    [[[2.0]], [[1.0]]]
    """
    _check_eps("layer_norm_stats", eps)
    x = checked("layer_norm_stats", "x", x, FLOATS)
    return call("layer_norm_stats", x, axis=axis, eps=eps, device=device)
