"""softmax and log_softmax on ``ref`` and ``cpu``: max-shifted so large logits never overflow.

``softmax(x) = exp(x - m) / sum(exp(x - m))`` with ``m`` the max along ``axis`` (the standard
"safe softmax"; log_softmax is ``x - m - log(sum(exp(x - m)))``). Masking contract: ``-inf`` entries
get probability 0; a slice that is entirely ``-inf`` (fully masked) gives **all zeros** from softmax
and all ``-inf`` from log_softmax — NaN-free, unlike torch's NaN — so ``exp(log_softmax) == softmax``
still holds. A ``+inf`` or NaN entry makes its slice NaN. Low precision computes in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._registry import call, register, register_decomposition
from .elementwise import FLOATS, cast_back, checked, const, ieee, nd, upcast
from .reduce import normalize_axis


def softmax(x: Any, *, axis: int = -1, device: str | None = None) -> np.ndarray:
    """Normalized exponential along ``axis``; floats; returns x's dtype (float32 compute for low precision).

    An all ``-inf`` slice gives zeros (see the module docstring).

    >>> softmax(np.array([0.0, np.log(3.0)]))
    array([0.25, 0.75])
    """
    return call("softmax", checked("softmax", "x", x, FLOATS), axis=axis, device=device)


def log_softmax(x: Any, *, axis: int = -1, device: str | None = None) -> np.ndarray:
    """``log(softmax(x))`` along ``axis`` computed without forming softmax; floats.

    An all ``-inf`` slice gives ``-inf`` everywhere (see the module docstring).

    >>> log_softmax(np.array([0.0, 0.0])).round(4)
    array([-0.6931, -0.6931])
    """
    return call("log_softmax", checked("log_softmax", "x", x, FLOATS), axis=axis, device=device)


# --------------------------------------------------------------------------- ref


def _ref_parts(t: np.ndarray, ax: int) -> tuple[np.ndarray, np.ndarray]:
    """(x - m, sum(exp(x - m))) with m = 0 for all -inf slices and the sum 1 where it is 0."""
    m = np.max(t, axis=ax, keepdims=True, initial=-np.inf)
    m = np.where(m == -np.inf, 0, m)  # fully masked (or empty) slice: no shift
    s = np.sum(np.exp(t - m), axis=ax, keepdims=True)
    return t - m, np.where(s == 0, 1, s)  # s == 0 only for all -inf slices: 0/1 = 0, log 1 = 0


@register("softmax", device="ref", dtypes=FLOATS)
@ieee
def softmax_ref(x: Any, *, axis: int = -1) -> np.ndarray:
    x = nd(x)
    shifted, s = _ref_parts(upcast(x), normalize_axis("softmax", x, axis))
    return cast_back(np.exp(shifted) / s, x.dtype)


@register("log_softmax", device="ref", dtypes=FLOATS)
@ieee
def log_softmax_ref(x: Any, *, axis: int = -1) -> np.ndarray:
    x = nd(x)
    shifted, s = _ref_parts(upcast(x), normalize_axis("log_softmax", x, axis))
    return cast_back(shifted - np.log(s), x.dtype)


# --------------------------------------------------------------------------- decompositions


def _decomposed_parts(x: np.ndarray, axis: int) -> tuple[Any, Any]:
    """(x - m, sum(exp(x - m))) in primitives, with the same fully-masked-slice guards as the kernels."""
    ninf, zero, one = const(-np.inf, x.dtype), const(0, x.dtype), const(1, x.dtype)
    m = call("max", x, axis=axis, keepdims=True)
    m = call("where", call("equal", m, ninf), zero, m)
    shifted = call("sub", x, m)
    s = call("sum", call("exp", shifted), axis=axis, keepdims=True)
    return shifted, call("where", call("equal", s, zero), one, s)


@register_decomposition("softmax", dtypes=FLOATS)
def softmax_decomposition(x: Any, *, axis: int = -1) -> np.ndarray:
    """softmax = exp(x - m) / sum(exp(x - m)) (empty slices need a kernel: max has no identity)."""
    x = nd(x)
    shifted, s = _decomposed_parts(x, axis)
    return call("div", call("exp", shifted), s)


@register_decomposition("log_softmax", dtypes=FLOATS)
def log_softmax_decomposition(x: Any, *, axis: int = -1) -> np.ndarray:
    """log_softmax = (x - m) - log(sum(exp(x - m)))."""
    x = nd(x)
    shifted, s = _decomposed_parts(x, axis)
    return call("sub", shifted, call("log", s))


# --------------------------------------------------------------------------- cpu


def shifted_buffer(x: np.ndarray, ax: int) -> np.ndarray:
    """``x - max(x, ax)`` in a fresh compute-dtype buffer (max taken as 0 for all -inf slices)."""
    t = upcast(x)
    t = t.copy() if t is x else t  # upcast copied low precision already
    m = t.max(axis=ax, keepdims=True, initial=-np.inf)
    m[m == -np.inf] = 0
    t -= m
    return t


def safe_sum(e: np.ndarray, ax: int) -> np.ndarray:
    """``sum(e, ax)`` with keepdims, 1 where the sum is 0 (fully masked slices)."""
    s = e.sum(axis=ax, keepdims=True)
    s[s == 0] = 1
    return s


@register("softmax", device="cpu", dtypes=FLOATS)
@ieee
def softmax_cpu(x: Any, *, axis: int = -1) -> np.ndarray:
    x = nd(x)
    ax = normalize_axis("softmax", x, axis)
    t = shifted_buffer(x, ax)  # the only full-size buffer
    np.exp(t, out=t)
    t /= safe_sum(t, ax)
    return cast_back(t, x.dtype)


@register("log_softmax", device="cpu", dtypes=FLOATS)
@ieee
def log_softmax_cpu(x: Any, *, axis: int = -1) -> np.ndarray:
    x = nd(x)
    ax = normalize_axis("log_softmax", x, axis)
    t = shifted_buffer(x, ax)
    s = safe_sum(np.exp(t), ax)  # exp(t) is the one temporary
    t -= np.log(s, out=s)
    return cast_back(t, x.dtype)
