"""Residual-add fused with layer_norm / rms_norm over the last axis, on ``ref`` and ``cpu``.

The pre-/post-LN transformer block's ``h = x + residual; y = norm(h)`` in one pass over blocks of rows,
as apex's ``FusedLayerNorm`` and flash-attention's ``dropout_add_layer_norm`` do (without dropout).
layer_norm is Ba et al. (2016) with the biased variance; rms_norm is Zhang & Sennrich (2019).

Dtypes: x any float dtype; residual/weight/bias any float dtype, used in x's compute dtype (float32
for float16/bfloat16/float8). The sum is formed in the compute dtype and normalized *unrounded*;
with ``return_sum=True`` it is also returned rounded to x's dtype (the residual stream a transformer
carries on). Outputs have x's shape and dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtypes import compute_dtype
from .._errors import OpError
from .._registry import call, register, register_decomposition
from .chunking import as_rows, fit, row_block, scratch
from .elementwise import FLOATS, cast_back, checked, ieee, nd, upcast
from .fused import operand_like
from .normalization import layer_norm_ref, rms_norm_ref

Result = np.ndarray | tuple[np.ndarray, np.ndarray]


def _check_eps(op: str, eps: Any) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating)) or not eps >= 0:
        raise OpError(op, "eps", "a number >= 0", repr(eps))


def _validate(op: str, x: Any, residual: Any, params: dict[str, Any]) -> tuple[np.ndarray, Any, list[Any]]:
    x = checked(op, "x", x, FLOATS)
    if x.ndim == 0:
        raise OpError(op, "x", "an array with at least 1 dim (normalized over the last)", "a 0-d array")
    if residual is None:
        raise OpError(
            op, "residual", "an array broadcastable to x (use layer_norm/rms_norm without one)", "None"
        )
    residual = operand_like(op, "residual", residual, x.shape)
    n = x.shape[-1]
    out = []
    for name, p in params.items():
        p = operand_like(op, name, p, (n,))
        if p is not None and p.shape != (n,):
            raise OpError(op, name, f"shape ({n},) (x.shape[-1])", str(p.shape))
        out.append(p)
    return x, residual, out


def _finish(y: np.ndarray, s: np.ndarray, dtype: np.dtype, return_sum: bool) -> Result:
    y = cast_back(y, dtype)
    return (y, cast_back(s, dtype)) if return_sum else y


# --------------------------------------------------------------------------- public


def add_layer_norm(
    x: Any,
    residual: Any,
    weight: Any = None,
    bias: Any = None,
    *,
    eps: float = 1e-5,
    return_sum: bool = False,
    device: str | None = None,
) -> Result:
    """``layer_norm(x + residual)`` over the last axis; with ``return_sum`` also ``x + residual``.

    weight/bias have shape ``(x.shape[-1],)``; residual broadcasts to x's shape. Returns ``y`` or
    ``(y, sum)`` in x's dtype.

    >>> add_layer_norm(np.array([[0.0, 2.0]]), np.array([[1.0, 1.0]])).round(3)
    array([[-1.,  1.]])
    """
    _check_eps("add_layer_norm", eps)
    x, residual, (w, b) = _validate("add_layer_norm", x, residual, {"weight": weight, "bias": bias})
    return call("add_layer_norm", x, residual, w, b, eps=eps, return_sum=bool(return_sum), device=device)


def add_rms_norm(
    x: Any,
    residual: Any,
    weight: Any = None,
    *,
    eps: float = 1e-6,
    return_sum: bool = False,
    device: str | None = None,
) -> Result:
    """``rms_norm(x + residual)`` over the last axis; with ``return_sum`` also ``x + residual``.

    >>> add_rms_norm(np.array([[2.0, 3.0]]), np.array([[1.0, 1.0]]), eps=0.0).round(4)
    array([[0.8485, 1.1314]])
    """
    _check_eps("add_rms_norm", eps)
    x, residual, (w,) = _validate("add_rms_norm", x, residual, {"weight": weight})
    return call("add_rms_norm", x, residual, w, eps=eps, return_sum=bool(return_sum), device=device)


# --------------------------------------------------------------------------- ref and decompositions


def _ref_sum(x: Any, residual: Any) -> np.ndarray:
    t = upcast(nd(x))
    return t + nd(residual).astype(t.dtype)


@register("add_layer_norm", device="ref", dtypes=FLOATS)
@ieee
def add_layer_norm_ref(
    x: Any,
    residual: Any,
    weight: Any = None,
    bias: Any = None,
    *,
    eps: float = 1e-5,
    return_sum: bool = False,
) -> Result:
    s = _ref_sum(x, residual)
    return _finish(layer_norm_ref(s, weight, bias, axis=-1, eps=eps), s, nd(x).dtype, return_sum)


@register("add_rms_norm", device="ref", dtypes=FLOATS)
@ieee
def add_rms_norm_ref(
    x: Any, residual: Any, weight: Any = None, *, eps: float = 1e-6, return_sum: bool = False
) -> Result:
    s = _ref_sum(x, residual)
    return _finish(rms_norm_ref(s, weight, axis=-1, eps=eps), s, nd(x).dtype, return_sum)


@register_decomposition("add_layer_norm", dtypes=FLOATS)
def add_layer_norm_decomposition(
    x: Any,
    residual: Any,
    weight: Any = None,
    bias: Any = None,
    *,
    eps: float = 1e-5,
    return_sum: bool = False,
) -> Result:
    """add_layer_norm = layer_norm(add(x, residual)) (the sum rounded to x's dtype first)."""
    x = nd(x)
    s = call("add", x, nd(residual).astype(x.dtype, copy=False))
    y = call("layer_norm", s, weight, bias, axis=-1, eps=eps)
    return (y, s) if return_sum else y


@register_decomposition("add_rms_norm", dtypes=FLOATS)
def add_rms_norm_decomposition(
    x: Any, residual: Any, weight: Any = None, *, eps: float = 1e-6, return_sum: bool = False
) -> Result:
    """add_rms_norm = rms_norm(add(x, residual)) (the sum rounded to x's dtype first)."""
    x = nd(x)
    s = call("add", x, nd(residual).astype(x.dtype, copy=False))
    y = call("rms_norm", s, weight, axis=-1, eps=eps)
    return (y, s) if return_sum else y


# --------------------------------------------------------------------------- cpu


def _add_norm_cpu(
    x: np.ndarray,
    residual: Any,
    weight: Any,
    bias: Any,
    eps: float,
    return_sum: bool,
    center: bool,
) -> Result:
    """Blocks of rows: s = x + r, [s -= mean], s *= rsqrt(mean(s^2) + eps), affine; one write each."""
    cdt = compute_dtype(x.dtype)
    out = np.empty(x.shape, x.dtype)
    total = np.empty(x.shape, x.dtype) if return_sum else None
    if x.size == 0:
        return (out, total) if total is not None else out
    n = x.shape[-1]
    x2, r2, o2 = as_rows(x, x.shape), as_rows(nd(residual), x.shape), out.reshape(-1, n)
    s2 = None if total is None else total.reshape(-1, n)
    w = None if weight is None else nd(weight).astype(cdt, copy=False)
    b = None if bias is None else nd(bias).astype(cdt, copy=False)
    rb = min(x2.shape[0], row_block(n))
    (t_buf,) = scratch((rb, n), cdt, 1)
    direct = cdt == x.dtype
    for r0 in range(0, x2.shape[0], rb):
        rs = slice(r0, r0 + rb)
        t = fit(t_buf, x2[rs])
        np.add(x2[rs], r2[rs], out=t, dtype=cdt)
        if s2 is not None:
            np.copyto(s2[rs], t, casting="unsafe")
        if center:
            t -= t.mean(axis=1, keepdims=True)
        ms = np.einsum("ij,ij->i", t, t)[:, None]  # (rb, 1) sum of squares, no temporary
        ms *= 1.0 / n
        ms += eps
        np.sqrt(ms, out=ms)
        np.reciprocal(ms, out=ms)
        y = o2[rs] if direct else t  # the last step writes straight into the result
        steps = [
            (ufunc, p) for ufunc, p in ((np.multiply, ms), (np.multiply, w), (np.add, b)) if p is not None
        ]
        for i, (ufunc, p) in enumerate(steps):
            ufunc(t, p, out=y if i == len(steps) - 1 else t)
        if not direct:
            np.copyto(o2[rs], t, casting="unsafe")
    return (out, total) if total is not None else out


@register("add_layer_norm", device="cpu", dtypes=FLOATS)
@ieee
def add_layer_norm_cpu(
    x: Any,
    residual: Any,
    weight: Any = None,
    bias: Any = None,
    *,
    eps: float = 1e-5,
    return_sum: bool = False,
) -> Result:
    return _add_norm_cpu(nd(x), residual, weight, bias, eps, return_sum, center=True)


@register("add_rms_norm", device="cpu", dtypes=FLOATS)
@ieee
def add_rms_norm_cpu(
    x: Any, residual: Any, weight: Any = None, *, eps: float = 1e-6, return_sum: bool = False
) -> Result:
    return _add_norm_cpu(nd(x), residual, weight, None, eps, return_sum, center=False)
