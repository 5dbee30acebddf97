"""Backward kernels of matmul and linear on ``ref`` and ``cpu``: ``dA = G @ B^T``, ``dB = A^T @ G``.

Gradients of broadcast operands are summed back to the operand's shape (numpy matmul broadcasting,
as torch autograd does). Low precision multiplies and accumulates in float32 and returns the input
dtype. The cpu kernel folds a shared (2-D) weight's batch into one GEMM instead of a batched matmul
followed by a sum, so ``(B, M, K) @ (K, N)`` costs one BLAS call per gradient and no (B, K, N) temporary.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtypes import FLOAT_DTYPES, accumulation_dtype
from .._errors import OpError
from .._registry import call, register
from ..kernels.matmul import _check_linear, _check_matmul, _matmul_sum, _mm_shape, check_same_dtype

__all__ = ["linear_backward", "matmul_backward"]


def check_grad(op: str, grad: np.ndarray, shape: tuple[int, ...], ref_name: str, ref: np.ndarray) -> None:
    """Raise OpError unless ``grad`` has the forward output's ``shape`` and the dtype of ``ref``."""
    if grad.shape != tuple(shape):
        raise OpError(op, "grad", f"shape {tuple(shape)} (the forward output's shape)", str(grad.shape))
    check_same_dtype(op, ref_name, ref, "grad", grad)


def sum_to_shape(t: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``t`` over the dims that broadcasting added or expanded to reach ``t.shape`` from ``shape``."""
    lead = t.ndim - len(shape)
    if lead:
        t = t.sum(axis=tuple(range(lead)))
    expanded = tuple(i for i, s in enumerate(shape) if s == 1 and t.shape[i] != 1)
    if expanded:
        t = t.sum(axis=expanded, keepdims=True)
    return t


def _as_2d(a: np.ndarray, b: np.ndarray, grad: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """a, b and grad with numpy's 1-D operand rules undone: a row vector, a column vector."""
    a2 = a[None, :] if a.ndim == 1 else a  # (..., M, K)
    b2 = b[:, None] if b.ndim == 1 else b  # (..., K, N)
    g2 = grad
    if a.ndim == 1:
        g2 = g2[..., None, :] if b.ndim > 1 else g2[..., None]
    if b.ndim == 1:
        g2 = g2[..., None]  # (..., M, N)
    return a2, b2, g2


def _validate(a: Any, b: Any, grad: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, b, grad = np.asarray(a), np.asarray(b), np.asarray(grad)
    _check_matmul("matmul_backward", a, b)
    check_grad("matmul_backward", grad, _mm_shape(a, b), "a", a)
    return a, b, grad


# --------------------------------------------------------------------------- ref


@register("matmul_backward", device="ref", dtypes=FLOAT_DTYPES)
def matmul_backward_ref(a: Any, b: Any, grad: Any) -> tuple[np.ndarray, np.ndarray]:
    a, b, grad = _validate(a, b, grad)
    acc = accumulation_dtype(a.dtype)
    a2, b2, g2 = (t.astype(acc) for t in _as_2d(a, b, grad))
    da = _matmul_sum(g2, np.swapaxes(b2, -1, -2))  # (batch, M, K)
    db = _matmul_sum(np.swapaxes(a2, -1, -2), g2)  # (batch, K, N)
    da = sum_to_shape(da, a2.shape).reshape(a.shape)
    db = sum_to_shape(db, b2.shape).reshape(b.shape)
    return da.astype(a.dtype), db.astype(b.dtype)


@register("linear_backward", device="ref", dtypes=FLOAT_DTYPES)
def linear_backward_ref(
    x: Any, weight: Any, grad: Any, *, has_bias: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    x, weight, grad = _validate_linear(x, weight, grad)
    acc = accumulation_dtype(x.dtype)
    xa, wa, ga = x.astype(acc), weight.astype(acc), grad.astype(acc)
    dx = (ga[..., :, None] * wa).sum(axis=-2)  # (..., in): sum_o g[..., o] w[o, i]
    x2, g2 = xa.reshape(-1, x.shape[-1]), ga.reshape(-1, weight.shape[0])  # (R, in), (R, out)
    dw = (g2[:, :, None] * x2[:, None, :]).sum(axis=0)  # (out, in)
    db = g2.sum(axis=0).astype(x.dtype) if has_bias else None
    return dx.astype(x.dtype), dw.astype(x.dtype), db


# --------------------------------------------------------------------------- cpu


def _mm(a: np.ndarray, b: np.ndarray, acc: np.dtype) -> np.ndarray:
    """``a @ b`` in ``acc`` (operands cast once; float32/float64 operands are used as they are)."""
    return np.matmul(a.astype(acc, copy=False), b.astype(acc, copy=False))


@register("matmul_backward", device="cpu", dtypes=FLOAT_DTYPES)
def matmul_backward_cpu(a: Any, b: Any, grad: Any) -> tuple[np.ndarray, np.ndarray]:
    a, b, grad = _validate(a, b, grad)
    acc = accumulation_dtype(a.dtype)
    a2, b2, g2 = _as_2d(a, b, grad)
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    if b2.ndim == 2:  # shared weight: fold a's batch into the rows of one GEMM per gradient
        g_rows = g2.reshape(-1, n)  # (batch*M, N); a's batch is the output's batch here
        db = _mm(a2.reshape(-1, k).T, g_rows, acc)  # (K, N)
        da = _mm(g_rows, b2.T, acc)  # (batch*M, K)
    elif a2.ndim == 2:  # shared left operand: concatenate the batch along N
        db = sum_to_shape(_mm(a2.T, g2, acc), b2.shape)  # (batch, K, N)
        gt = np.moveaxis(g2, -2, 0).reshape(m, -1)  # (M, batch*N)
        bt = np.swapaxes(np.broadcast_to(b2, (*g2.shape[:-2], k, n)), -1, -2).reshape(-1, k)  # (batch*N, K)
        da = _mm(gt, bt, acc)  # (M, K)
    else:
        db = sum_to_shape(_mm(np.swapaxes(a2, -1, -2), g2, acc), b2.shape)
        da = sum_to_shape(_mm(g2, np.swapaxes(b2, -1, -2), acc), a2.shape)
    return (
        np.asarray(da).reshape(a.shape).astype(a.dtype, copy=False),
        np.asarray(db).reshape(b.shape).astype(b.dtype, copy=False),
    )


def _validate_linear(x: Any, weight: Any, grad: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, weight, grad = np.asarray(x), np.asarray(weight), np.asarray(grad)
    _check_linear(x, weight, None)
    check_grad("linear_backward", grad, (*x.shape[:-1], weight.shape[0]), "x", x)
    return x, weight, grad


@register("linear_backward", device="cpu", dtypes=FLOAT_DTYPES)
def linear_backward_cpu(
    x: Any, weight: Any, grad: Any, *, has_bias: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    x, weight, grad = _validate_linear(x, weight, grad)
    acc = accumulation_dtype(x.dtype)
    g2 = grad.reshape(-1, weight.shape[0]).astype(acc, copy=False)  # (R, out), cast once, used twice
    dx = _mm(g2, weight, acc).reshape(x.shape)  # (..., in)
    dw = _mm(g2.T, x.reshape(-1, x.shape[-1]), acc)  # (out, in): the batch folded into one GEMM
    db = g2.sum(axis=0).astype(x.dtype, copy=False) if has_bias else None
    return dx.astype(x.dtype, copy=False), dw.astype(x.dtype, copy=False), db


# --------------------------------------------------------------------------- public


def matmul_backward(a: Any, b: Any, grad: Any, *, device: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Gradients ``(da, db)`` of ``matmul(a, b)`` given the output gradient ``grad``.

    numpy matmul semantics (batched, broadcast batch dims, 1-D operands); a broadcast operand's
    gradient is summed back to its own shape. Low precision accumulates in float32.

    >>> da, db = matmul_backward(np.ones((2, 3)), np.ones((3, 4)), np.ones((2, 4)))
    >>> da.shape, db.shape, float(db[0, 0])
    ((2, 3), (3, 4), 2.0)
    """
    return call("matmul_backward", a, b, grad, device=device)


def linear_backward(
    x: Any, weight: Any, grad: Any, *, has_bias: bool = True, device: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Gradients ``(dx, dw, db)`` of ``linear(x, weight, bias)``; ``db`` is None when ``has_bias`` is False.

    ``x`` ``(..., in)``, ``weight`` ``(out, in)``, ``grad`` ``(..., out)``; ``dw`` and ``db`` sum over
    every leading dim of ``x``. Low precision accumulates in float32 and returns the input dtype.

    >>> dx, dw, db = linear_backward(np.ones((5, 3)), np.ones((4, 3)), np.ones((5, 4)))
    >>> dx.shape, dw.shape, db.tolist()
    ((5, 3), (4, 3), [5.0, 5.0, 5.0, 5.0])
    """
    return call("linear_backward", x, weight, grad, has_bias=has_bias, device=device)
