"""Backward kernels of gelu, silu and embedding on ``ref`` and ``cpu``.

gelu (Hendrycks & Gimpel 2016): exact ``d/dx = Phi(x) + x phi(x)``; tanh form with
``u = sqrt(2/pi) (x + 0.044715 x^3)``: ``0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2)``.
silu: ``s (1 + x (1 - s))`` with ``s = sigmoid(x)``. embedding: ``dweight[i] = sum of grad rows whose
index is i`` (a scatter-add); the cpu kernel picks (autotuned ``method``) between one ``bincount``
per column, a sort + ``np.add.reduceat`` over runs, and numpy's ``add.at``. Low precision computes and
accumulates in float32 and returns the input dtype.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._dtypes import FLOAT_DTYPES, compute_dtype
from .._errors import OpError, check_ndim
from .._registry import call, register
from ..kernels.activation import _check_approximate, _sigmoid_ref_values
from ..kernels.elementwise import FLOATS, buffer_op, cast_back, checked, ieee, nd, upcast
from ..kernels.erf import erf_ref, erf_values
from ..kernels.index import _check_indices
from ..tune.autotune import Tunable, autotuned
from .matmul import check_grad

__all__ = ["embedding_backward", "gelu_backward", "silu_backward"]

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


def _validate(op: str, x: Any, grad: Any) -> tuple[np.ndarray, np.ndarray]:
    x, grad = nd(x), nd(grad)
    check_grad(op, grad, x.shape, "x", x)
    return x, grad


# --------------------------------------------------------------------------- gelu


@register("gelu_backward", device="ref", dtypes=FLOATS)
@ieee
def gelu_backward_ref(x: Any, grad: Any, *, approximate: str = "none") -> np.ndarray:
    _check_approximate(approximate)
    x, grad = _validate("gelu_backward", x, grad)
    t, g = upcast(x), upcast(grad)
    if approximate == "tanh":
        th = np.tanh(_SQRT_2_PI * (t + _GELU_C * t**3))
        d = 0.5 * (1 + th) + 0.5 * t * (1 - th**2) * _SQRT_2_PI * (1 + 3 * _GELU_C * t**2)
    else:
        d = 0.5 * (1 + erf_ref(t * _SQRT1_2)) + t * _INV_SQRT_2PI * np.exp(-0.5 * t * t)
    return cast_back(g * d, x.dtype)


@register("gelu_backward", device="cpu", dtypes=FLOATS)
@ieee
def gelu_backward_cpu(x: Any, grad: Any, *, approximate: str = "none") -> np.ndarray:
    _check_approximate(approximate)
    x, grad = _validate("gelu_backward", x, grad)
    x2 = buffer_op(np.multiply, x, x)  # buffer 1: x^2
    if approximate == "tanh":
        t = np.multiply(x2, _GELU_C, out=np.empty_like(x2))  # buffer 2
        t += 1.0
        t *= x
        t *= _SQRT_2_PI
        np.tanh(t, out=t)  # th
        x2 *= 3 * _GELU_C  # 3 c x^2
        x2 += 1.0
        x2 *= x
        x2 *= 0.5 * _SQRT_2_PI  # 0.5 x sqrt(2/pi) (1 + 3 c x^2)
        dt = np.multiply(t, t, out=np.empty_like(t))  # th^2 (buffer 3)
        np.subtract(1.0, dt, out=dt)
        x2 *= dt
        t += 1.0
        t *= 0.5
        t += x2
    else:
        x2 *= -0.5
        np.exp(x2, out=x2)
        x2 *= x
        x2 *= _INV_SQRT_2PI  # x phi(x)
        t = buffer_op(np.multiply, x, _SQRT1_2)  # buffer 2
        erf_values(t, out=t)
        t += 1.0
        t *= 0.5  # Phi(x)
        t += x2
    t *= grad
    return cast_back(t, x.dtype)


# --------------------------------------------------------------------------- silu


@register("silu_backward", device="ref", dtypes=FLOATS)
@ieee
def silu_backward_ref(x: Any, grad: Any) -> np.ndarray:
    x, grad = _validate("silu_backward", x, grad)
    t, g = upcast(x), upcast(grad)
    s = _sigmoid_ref_values(t)
    return cast_back(g * s * (1 + t * (1 - s)), x.dtype)


@register("silu_backward", device="cpu", dtypes=FLOATS)
@ieee
def silu_backward_cpu(x: Any, grad: Any) -> np.ndarray:
    x, grad = _validate("silu_backward", x, grad)
    s = buffer_op(np.negative, x)  # buffer 1 becomes s = 1 / (1 + exp(-x))
    np.exp(s, out=s)  # overflows to inf for x < -88 (float32): s = 0 there, the right limit
    s += 1.0
    np.reciprocal(s, out=s)
    t = np.subtract(1.0, s, out=np.empty_like(s))  # buffer 2: 1 - s
    t *= x
    t += 1.0
    t *= s
    t *= grad
    return cast_back(t, x.dtype)


# --------------------------------------------------------------------------- embedding


def _validate_embedding(indices: Any, grad: Any, num_embeddings: Any) -> tuple[np.ndarray, np.ndarray, int]:
    op = "embedding_backward"
    indices, grad = nd(indices), nd(grad)
    if (
        isinstance(num_embeddings, bool)
        or not isinstance(num_embeddings, (int, np.integer))
        or num_embeddings < 0
    ):
        raise OpError(op, "num_embeddings", "an int >= 0 (rows of the embedding table)", repr(num_embeddings))
    check_ndim(op, "grad", grad, (1, None), layout="[*indices.shape, embedding_dim]")
    if grad.shape[:-1] != indices.shape:
        raise OpError(
            op, "grad", f"shape {indices.shape} + (embedding_dim,) (indices.shape + (D,))", str(grad.shape)
        )
    _check_indices(op, indices, 0, int(num_embeddings), f"num_embeddings = {num_embeddings}")
    return indices, grad.reshape(-1, grad.shape[-1]), int(num_embeddings)


@register("embedding_backward", device="ref", dtypes=FLOAT_DTYPES, dtype_arg=1)
def embedding_backward_ref(indices: Any, grad: Any, num_embeddings: int) -> np.ndarray:
    indices, g2, n = _validate_embedding(indices, grad, num_embeddings)
    out = np.zeros((n, g2.shape[1]), compute_dtype(g2.dtype))
    np.add.at(out, indices.ravel(), g2.astype(out.dtype))
    return out.astype(g2.dtype)


EMBEDDING_METHODS: tuple[str, ...] = ("auto", "bincount", "sort", "add_at")
EMBEDDING_BACKWARD = Tunable(
    op="embedding_backward",
    device="cpu",
    version="1",
    params={"method": list(EMBEDDING_METHODS)},
    default={"method": "auto"},
)


def _scatter_bincount(idx: np.ndarray, g2: np.ndarray, n: int, cdt: np.dtype) -> np.ndarray:
    """One ``bincount`` per embedding column: O(D (R + n)), no per-element scatter; float64 sums."""
    gt = np.ascontiguousarray(g2.T)  # (D, R): contiguous columns for bincount's weights
    out_t = np.empty((g2.shape[1], n), cdt)  # (D, n)
    for j in range(g2.shape[1]):
        out_t[j] = np.bincount(idx, weights=gt[j], minlength=n)
    return np.ascontiguousarray(out_t.T)  # (n, D)


def _scatter_sort(idx: np.ndarray, g2: np.ndarray, n: int, cdt: np.dtype) -> np.ndarray:
    """Sort the indices once and sum each run of equal indices with ``np.add.reduceat``."""
    out = np.zeros((n, g2.shape[1]), cdt)
    order = np.argsort(idx, kind="stable")
    sorted_idx = idx[order]
    starts = np.flatnonzero(np.r_[True, sorted_idx[1:] != sorted_idx[:-1]])  # first row of each run
    rows = np.take(g2, order, axis=0).astype(cdt, copy=False)  # (R, D) grouped by index
    out[sorted_idx[starts]] = np.add.reduceat(rows, starts, axis=0)
    return out


def _scatter_add_at(idx: np.ndarray, g2: np.ndarray, n: int, cdt: np.dtype) -> np.ndarray:
    out = np.zeros((n, g2.shape[1]), cdt)
    np.add.at(out, idx, g2.astype(cdt, copy=False))  # numpy >= 1.25 has a fast path for this
    return out


_SCATTER = {"bincount": _scatter_bincount, "sort": _scatter_sort, "add_at": _scatter_add_at}


@register("embedding_backward", device="cpu", dtypes=FLOAT_DTYPES, dtype_arg=1)
@autotuned(EMBEDDING_BACKWARD)
def embedding_backward_cpu(
    indices: Any, grad: Any, num_embeddings: int, *, method: str | None = None
) -> np.ndarray:
    """cpu kernel; ``method`` is the tuning knob. ``auto``: bincount per column when the table has no
    more rows than there are indices (its cost is D (R + n)), else numpy's add.at (cost R D)."""
    indices, g2, n = _validate_embedding(indices, grad, num_embeddings)
    method = "auto" if method is None else method
    if method not in EMBEDDING_METHODS:
        raise OpError("embedding_backward", "method", f"one of {EMBEDDING_METHODS}", repr(method))
    cdt = compute_dtype(g2.dtype)
    idx = indices.ravel()
    if idx.size == 0:
        return np.zeros((n, g2.shape[1]), g2.dtype)
    if method == "auto":
        method = "bincount" if n <= idx.size else "add_at"
    return _SCATTER[method](idx, g2, n, cdt).astype(g2.dtype, copy=False)


# --------------------------------------------------------------------------- public


def gelu_backward(x: Any, grad: Any, *, approximate: str = "none", device: str | None = None) -> np.ndarray:
    """Gradient of :func:`gelu` w.r.t. ``x`` given the output gradient ``grad`` (same ``approximate``).

    >>> gelu_backward(np.array([0.0]), np.array([1.0])).tolist()
    [0.5]
    """
    x = checked("gelu_backward", "x", x, FLOATS)
    _check_approximate(approximate)
    return call("gelu_backward", x, grad, approximate=approximate, device=device)


def silu_backward(x: Any, grad: Any, *, device: str | None = None) -> np.ndarray:
    """Gradient of :func:`silu` w.r.t. ``x`` given the output gradient ``grad``.

    >>> silu_backward(np.array([0.0]), np.array([1.0])).tolist()
    [0.5]
    """
    x = checked("silu_backward", "x", x, FLOATS)
    return call("silu_backward", x, grad, device=device)


def embedding_backward(
    indices: Any, grad: Any, num_embeddings: int, *, device: str | None = None
) -> np.ndarray:
    """Gradient of :func:`embedding` w.r.t. its weight: ``(num_embeddings, D)``, rows scatter-added.

    ``grad`` has shape ``indices.shape + (D,)``; repeated indices sum; the result has grad's dtype
    (low precision accumulates in float32).

    >>> embedding_backward(np.array([1, 1]), np.ones((2, 3)), 3).tolist()
    [[0.0, 0.0, 0.0], [2.0, 2.0, 2.0], [0.0, 0.0, 0.0]]
    """
    grad = checked("embedding_backward", "grad", grad, FLOATS)
    return call("embedding_backward", indices, grad, num_embeddings, device=device)
