"""Backward kernels of softmax, log_softmax and cross_entropy on ``ref`` and ``cpu``.

From the saved forward output ``y`` (as torch's ``_softmax_backward_data``):
``softmax: dx = y * (g - sum(g * y))``; ``log_softmax: dx = g - exp(y) * sum(g)``.
cross_entropy (the forward's semantics in ``kernels/loss.py``, label smoothing per Szegedy et al. 2016):
``dlogits = w * (softmax(x) - q)`` with ``q = (1 - eps) onehot(t) + eps / C`` and ``w`` the
upstream gradient per position (divided by the number of non-ignored positions for ``"mean"``);
ignored positions get zero gradient, and so does everything when all positions are ignored
(torch's behaviour, although the forward ``"mean"`` is NaN then). Low precision computes in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtypes import compute_dtype
from .._errors import OpError
from .._registry import call, register
from ..kernels.elementwise import FLOATS, cast_back, checked, ieee, nd, upcast
from ..kernels.loss import _prepare
from ..kernels.reduce import normalize_axis
from ..kernels.softmax import safe_sum, shifted_buffer
from .matmul import check_grad

__all__ = ["cross_entropy_backward", "log_softmax_backward", "softmax_backward"]


def _validate(op: str, y: Any, grad: Any, axis: int) -> tuple[np.ndarray, np.ndarray, int]:
    y, grad = nd(y), nd(grad)
    check_grad(op, grad, y.shape, "y", y)
    return y, grad, normalize_axis(op, y, axis)


def _dot_along(a: np.ndarray, b: np.ndarray, ax: int) -> np.ndarray:
    """``sum(a * b, ax)`` with keepdims and no full-size temporary (einsum over moved-axis views)."""
    s = np.einsum("...i,...i->...", np.moveaxis(a, ax, -1), np.moveaxis(b, ax, -1))
    return np.expand_dims(s, ax)


# --------------------------------------------------------------------------- ref


@register("softmax_backward", device="ref", dtypes=FLOATS)
@ieee
def softmax_backward_ref(y: Any, grad: Any, *, axis: int = -1) -> np.ndarray:
    y, grad, ax = _validate("softmax_backward", y, grad, axis)
    yt, gt = upcast(y), upcast(grad)
    return cast_back(yt * (gt - (gt * yt).sum(axis=ax, keepdims=True)), y.dtype)


@register("log_softmax_backward", device="ref", dtypes=FLOATS)
@ieee
def log_softmax_backward_ref(y: Any, grad: Any, *, axis: int = -1) -> np.ndarray:
    y, grad, ax = _validate("log_softmax_backward", y, grad, axis)
    yt, gt = upcast(y), upcast(grad)
    return cast_back(gt - np.exp(yt) * gt.sum(axis=ax, keepdims=True), y.dtype)


# --------------------------------------------------------------------------- cpu


#: Bytes of float32 rows per chunk when the softmax axis is the last one: the chunk's inputs,
#: temporaries and output stay in cache between the passes (~1.2x on 2048 x 2048 fp32).
CHUNK_BYTES = 1024 * 1024


def _rows_backward(y: np.ndarray, grad: np.ndarray, log: bool) -> np.ndarray:
    """Last-axis backward over row chunks: only chunk-sized temporaries, even for low precision."""
    n = y.shape[-1]
    y2, g2 = y.reshape(-1, n), grad.reshape(-1, n)  # views when contiguous
    out = np.empty(y2.shape, y.dtype)
    cdt = compute_dtype(y.dtype)
    step = max(1, CHUNK_BYTES // max(1, 4 * n))
    for s in range(0, y2.shape[0], step):
        yy, gg = upcast(y2[s : s + step]), upcast(g2[s : s + step])
        o = out[s : s + step] if out.dtype == cdt else np.empty(yy.shape, cdt)
        if log:
            np.exp(yy, out=o)  # softmax
            o *= gg.sum(axis=1, keepdims=True)
            np.subtract(gg, o, out=o)
        else:
            np.subtract(gg, np.einsum("ij,ij->i", gg, yy)[:, None], out=o)
            o *= yy
        if o.dtype != out.dtype:
            cast_back(o, y.dtype, out=out[s : s + step])
    return out.reshape(y.shape)


@register("softmax_backward", device="cpu", dtypes=FLOATS)
@ieee
def softmax_backward_cpu(y: Any, grad: Any, *, axis: int = -1) -> np.ndarray:
    y, grad, ax = _validate("softmax_backward", y, grad, axis)
    if ax == y.ndim - 1 and y.size:
        return _rows_backward(y, grad, log=False)
    yt, gt = upcast(y), upcast(grad)
    t = np.subtract(gt, _dot_along(gt, yt, ax), dtype=yt.dtype)  # the one full-size buffer
    t *= yt
    return cast_back(t, y.dtype)


@register("log_softmax_backward", device="cpu", dtypes=FLOATS)
@ieee
def log_softmax_backward_cpu(y: Any, grad: Any, *, axis: int = -1) -> np.ndarray:
    y, grad, ax = _validate("log_softmax_backward", y, grad, axis)
    if ax == y.ndim - 1 and y.size:
        return _rows_backward(y, grad, log=True)
    gt = upcast(grad)
    t = np.exp(y, dtype=gt.dtype)  # the one full-size buffer: softmax
    t *= gt.sum(axis=ax, keepdims=True)
    np.subtract(gt, t, out=t)
    return cast_back(t, y.dtype)


# --------------------------------------------------------------------------- cross_entropy


def _ce_weights(grad: Any, valid: np.ndarray, reduction: str, unbatched: bool, cdt: np.dtype) -> np.ndarray:
    """Per-position upstream gradient ``(N, d1, ...)`` in ``cdt``: 0 at ignored positions."""
    g = nd(grad)
    if reduction == "none":
        want, what = (valid.shape[1:] if unbatched else valid.shape), "the target's shape"
    else:
        want, what = (), "a scalar"
    if g.shape != want:
        raise OpError(
            "cross_entropy_backward", "grad", f"shape {want} ({what}, reduction={reduction!r})", str(g.shape)
        )
    g = g.astype(cdt).reshape(valid.shape) if reduction == "none" else g.astype(cdt)
    if reduction == "mean":
        n = int(valid.sum())
        g = g / cdt.type(n) if n else np.zeros((), cdt)  # every position ignored: zero gradient (torch)
    return np.where(valid, g, cdt.type(0)).astype(cdt, copy=False)


def _ce_args(logits: Any, target: Any, grad: Any, reduction: str, ignore_index: int, eps: float) -> Any:
    x, t, valid, unbatched = _prepare(logits, target, reduction, ignore_index, eps, "cross_entropy_backward")
    cdt = compute_dtype(x.dtype)
    w = _ce_weights(grad, valid, reduction, unbatched, cdt)  # (N, d1, ...)
    return x, t, w, unbatched, cdt


@register("cross_entropy_backward", device="ref", dtypes=FLOATS)
@ieee
def cross_entropy_backward_ref(
    logits: Any,
    target: Any,
    grad: Any = 1.0,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> np.ndarray:
    x, t, w, unbatched, cdt = _ce_args(logits, target, grad, reduction, ignore_index, label_smoothing)
    xt = upcast(x)
    e = np.exp(xt - xt.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)  # (N, C, ...)
    onehot = np.moveaxis(np.eye(x.shape[1], dtype=cdt)[t], -1, 1)  # (N, C, ...)
    q = (1 - label_smoothing) * onehot + label_smoothing / x.shape[1]
    dx = (p - q) * w[:, None]
    return cast_back(dx[0] if unbatched else dx, x.dtype)


@register("cross_entropy_backward", device="cpu", dtypes=FLOATS)
@ieee
def cross_entropy_backward_cpu(
    logits: Any,
    target: Any,
    grad: Any = 1.0,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> np.ndarray:
    x, t, w, unbatched, _ = _ce_args(logits, target, grad, reduction, ignore_index, label_smoothing)
    z = shifted_buffer(x, 1)  # (N, C, ...), the one full-size buffer
    np.exp(z, out=z)
    wz = w[:, None]  # (N, 1, ...)
    z *= wz / safe_sum(z, 1)  # w * softmax
    if label_smoothing:
        z -= wz * (label_smoothing / x.shape[1])
    picked = np.take_along_axis(z, t[:, None], axis=1)  # (N, 1, ...)
    np.put_along_axis(z, t[:, None], picked - (1 - label_smoothing) * wz, axis=1)
    return cast_back(z[0] if unbatched else z, x.dtype)


# --------------------------------------------------------------------------- public


def softmax_backward(y: Any, grad: Any, *, axis: int = -1, device: str | None = None) -> np.ndarray:
    """Gradient of ``softmax`` w.r.t. its input, from its output ``y`` and the output gradient ``grad``.

    >>> y = np.array([0.25, 0.75]); softmax_backward(y, np.array([1.0, 0.0])).tolist()
    [0.1875, -0.1875]
    """
    y = checked("softmax_backward", "y", y, FLOATS)
    return call("softmax_backward", y, grad, axis=axis, device=device)


def log_softmax_backward(y: Any, grad: Any, *, axis: int = -1, device: str | None = None) -> np.ndarray:
    """Gradient of ``log_softmax`` w.r.t. its input, from its output ``y`` and ``grad``.

    >>> log_softmax_backward(np.log([0.5, 0.5]), np.array([1.0, 0.0])).tolist()
    [0.5, -0.5]
    """
    y = checked("log_softmax_backward", "y", y, FLOATS)
    return call("log_softmax_backward", y, grad, axis=axis, device=device)


def cross_entropy_backward(
    logits: Any,
    target: Any,
    grad: Any = 1.0,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    device: str | None = None,
) -> np.ndarray:
    """Gradient of :func:`cross_entropy` w.r.t. ``logits`` (same arguments, same semantics).

    ``grad`` is the upstream gradient: a scalar for ``"mean"``/``"sum"``, the target's shape for
    ``"none"``. Ignored positions get 0. Returns an array of the logits' shape and dtype.

    >>> cross_entropy_backward(np.array([[0.0, 0.0]]), np.array([1])).tolist()
    [[0.5, -0.5]]
    """
    logits = checked("cross_entropy_backward", "logits", logits, FLOATS)
    return call(
        "cross_entropy_backward",
        logits,
        target,
        grad,
        reduction=reduction,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        device=device,
    )
