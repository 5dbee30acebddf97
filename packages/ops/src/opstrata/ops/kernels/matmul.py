"""matmul, linear and gemm kernels on ``ref`` and ``cpu`` (numpy matmul semantics; ONNX Gemm).

Rule of accumulation: float16, bfloat16 and float8 inputs are multiplied and summed in float32 and
the result is cast back to the input dtype; float32 and float64 accumulate in their own dtype.
Both operands must share one dtype (as in ONNX MatMul/Gemm and torch).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from .._dtypes import FLOAT_DTYPES, accumulation_dtype
from .._errors import OpError, check_dtype, check_ndim
from .._registry import call, register
from .elementwise import check_out

__all__ = ["gemm", "linear", "matmul"]


# ---------------------------------------------------------------------------------------------
# validation shared by the three ops (and by other kernel-b modules)
# ---------------------------------------------------------------------------------------------


def check_same_dtype(op: str, ref_name: str, ref: np.ndarray, name: str, arr: np.ndarray) -> None:
    """Raise OpError unless ``arr`` has the dtype of ``ref``."""
    if arr.dtype != ref.dtype:
        raise OpError(
            op,
            name,
            f"dtype {ref.dtype} (the dtype of '{ref_name}')",
            str(arr.dtype),
            fix="cast with .astype(...)",
        )


def _check_matmul(op: str, a: np.ndarray, b: np.ndarray) -> tuple[int, ...]:
    """Validate ``a @ b`` operands; return the broadcast batch shape."""
    check_dtype(op, "a", a, FLOAT_DTYPES)
    check_same_dtype(op, "a", a, "b", b)
    check_ndim(op, "a", a, (1, None))
    check_ndim(op, "b", b, (1, None))
    k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if a.shape[-1] != k_b:
        raise OpError(
            op,
            "b",
            f"inner dim {a.shape[-1]} (a.shape[-1])",
            f"{k_b}: inner dims must match, got {a.shape} @ {b.shape}",
        )
    try:
        return tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    except ValueError:
        raise OpError(
            op,
            "b",
            f"batch dims broadcastable with {a.shape[:-2]}",
            f"{b.shape[:-2]}; shapes {a.shape} @ {b.shape}",
        ) from None


def _check_linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> None:
    check_dtype("linear", "x", x, FLOAT_DTYPES)
    check_same_dtype("linear", "x", x, "weight", weight)
    check_ndim("linear", "x", x, (1, None))
    check_ndim("linear", "weight", weight, 2, layout="[out_features, in_features]")
    if weight.shape[1] != x.shape[-1]:
        raise OpError("linear", "weight", f"shape [out, {x.shape[-1]}] (in = x.shape[-1])", str(weight.shape))
    if bias is not None:
        check_same_dtype("linear", "x", x, "bias", bias)
        if bias.shape != (weight.shape[0],):
            raise OpError("linear", "bias", f"shape ({weight.shape[0]},) (out_features)", str(bias.shape))


def _gemm_operands(
    a: np.ndarray, b: np.ndarray, c: np.ndarray | None, trans_a: bool, trans_b: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Validate Gemm inputs; return A', B' (transposed views)."""
    check_dtype("gemm", "a", a, FLOAT_DTYPES)
    check_same_dtype("gemm", "a", a, "b", b)
    check_ndim("gemm", "a", a, 2)
    check_ndim("gemm", "b", b, 2)
    at = a.T if trans_a else a  # (M, K)
    bt = b.T if trans_b else b  # (K, N)
    if at.shape[1] != bt.shape[0]:
        raise OpError(
            "gemm",
            "b",
            f"inner dim {at.shape[1]}",
            f"{bt.shape[0]}: inner dims must match, got {at.shape} @ {bt.shape}",
        )
    if c is not None:
        check_same_dtype("gemm", "a", a, "c", c)
        out = (at.shape[0], bt.shape[1])
        fits = c.ndim <= 2 and all(
            cd in (1, od) for cd, od in zip(c.shape[::-1], out[::-1], strict=False)
        )  # c may have fewer dims
        if not fits:
            raise OpError("gemm", "c", f"a shape unidirectionally broadcastable to {out}", str(c.shape))
    return at, bt


def _arr(x: Any) -> np.ndarray | None:
    return None if x is None else np.asarray(x)


# ---------------------------------------------------------------------------------------------
# ref: sums of products written out, in the accumulation dtype
# ---------------------------------------------------------------------------------------------


def _matmul_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum_k a[..., i, k] * b[..., k, j] by broadcasting (both at least 2-D, accumulation dtype)."""
    return (a[..., :, :, None] * b[..., None, :, :]).sum(axis=-2)  # (..., M, N)


@register("matmul", device="ref", dtypes=FLOAT_DTYPES)
def matmul_ref(a: Any, b: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    into, a, b = out, np.asarray(a), np.asarray(b)
    _check_matmul("matmul", a, b)
    acc = accumulation_dtype(a.dtype)
    a2 = a.astype(acc)[None, :] if a.ndim == 1 else a.astype(acc)  # 1-D a: a row vector
    b2 = b.astype(acc)[:, None] if b.ndim == 1 else b.astype(acc)  # 1-D b: a column vector
    out = _matmul_sum(a2, b2)
    if b.ndim == 1:
        out = out[..., 0]
    if a.ndim == 1:
        out = out[..., 0, :] if b.ndim > 1 else out[..., 0]
    return _into(np.asarray(out).astype(a.dtype), into)


@register("linear", device="ref", dtypes=FLOAT_DTYPES)
def linear_ref(x: Any, weight: Any, bias: Any = None, *, out: np.ndarray | None = None) -> np.ndarray:
    into, x, weight, bias = out, np.asarray(x), np.asarray(weight), _arr(bias)
    _check_linear(x, weight, bias)
    acc = accumulation_dtype(x.dtype)
    out = (x.astype(acc)[..., None, :] * weight.astype(acc)).sum(axis=-1)  # (..., out)
    if bias is not None:
        out = out + bias.astype(acc)
    return _into(out.astype(x.dtype), into)


@register("gemm", device="ref", dtypes=FLOAT_DTYPES)
def gemm_ref(
    a: Any,
    b: Any,
    c: Any = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    trans_a: bool = False,
    trans_b: bool = False,
) -> np.ndarray:
    a, b, c = np.asarray(a), np.asarray(b), _arr(c)
    at, bt = _gemm_operands(a, b, c, trans_a, trans_b)
    acc = accumulation_dtype(a.dtype)
    out = alpha * _matmul_sum(at.astype(acc), bt.astype(acc))  # (M, N)
    if c is not None:
        out = out + beta * c.astype(acc)
    return np.asarray(out, dtype=acc).astype(a.dtype)


# ---------------------------------------------------------------------------------------------
# cpu: one BLAS call, float32 accumulation buffers for low precision, scaling in place
# ---------------------------------------------------------------------------------------------


def _into(result: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """``result``, or ``out`` after copying it in (kernels whose arithmetic cannot target ``out``)."""
    if out is None:
        return result
    np.copyto(out, result, casting="unsafe")
    return out


def _blas_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` in the accumulation dtype (float32 for low precision, written with ``out=``).

    ``out`` (optional, the accumulation dtype and result shape) receives the product directly.

    A C-contiguous ``(..., M, K)`` ``a`` against a 2-D ``b`` is one ``(prod(...) * M, K)`` GEMM: numpy's
    matmul would otherwise call BLAS once per leading index (slower for the (batch, seq, hidden)
    activations of transformer linears).
    """
    if out is not None and not out.flags.c_contiguous:
        # numpy < 2 multiplies into a non-contiguous ``out=`` with its own loop instead of BLAS, which
        # rounds differently from the BLAS product the same call returns without ``out``: compute, copy
        np.copyto(out, _blas_matmul(a, b))
        return out
    acc = accumulation_dtype(a.dtype)
    if a.ndim > 2 and b.ndim == 2 and a.flags.c_contiguous and (out is None or out.flags.c_contiguous):
        rows = math.prod(a.shape[:-1])
        flat = _blas_matmul(
            a.reshape(rows, a.shape[-1]), b, None if out is None else out.reshape(rows, b.shape[1])
        )
        return flat.reshape(*a.shape[:-1], b.shape[1]) if out is None else out
    if a.dtype == acc:
        return np.matmul(a, b, out=out)
    a32, b32 = a.astype(acc), b.astype(acc)
    return np.matmul(a32, b32, out=np.empty(_mm_shape(a, b), acc) if out is None else out)


def _mm_shape(a: np.ndarray, b: np.ndarray) -> tuple[int, ...]:
    """Result shape of numpy ``a @ b`` (already validated)."""
    if a.ndim == 1 and b.ndim == 1:
        return ()
    if a.ndim == 1:
        return (*b.shape[:-2], b.shape[-1])
    if b.ndim == 1:
        return a.shape[:-1]
    return (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])


@register("matmul", device="cpu", dtypes=FLOAT_DTYPES)
def matmul_cpu(a: Any, b: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    _check_matmul("matmul", a, b)
    if out is not None and a.dtype == accumulation_dtype(a.dtype) and a.ndim > 1 and b.ndim > 1:
        return _blas_matmul(a, b, out)  # BLAS writes the caller's buffer
    return _into(np.asarray(_blas_matmul(a, b)).astype(a.dtype, copy=False), out)


@register("linear", device="cpu", dtypes=FLOAT_DTYPES)
def linear_cpu(x: Any, weight: Any, bias: Any = None, *, out: np.ndarray | None = None) -> np.ndarray:
    x, weight, bias = np.asarray(x), np.asarray(weight), _arr(bias)
    _check_linear(x, weight, bias)
    direct = out is not None and x.dtype == accumulation_dtype(x.dtype) and x.ndim > 1
    y = _blas_matmul(x, weight.T, out if direct else None)  # (..., out) in the accumulation dtype
    if bias is not None:
        y += bias.astype(y.dtype, copy=False)
    return y if direct else _into(y.astype(x.dtype, copy=False), out)


def _gemm_view(a: np.ndarray, b: np.ndarray, out: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``(a2, out2)``: the 2-D operands of the one BLAS call ``_blas_matmul(a, b, out)`` makes, when
    the arrays let it take that path directly (float32 / float64, C-contiguous, 2-D ``b``, ``out`` of
    the result's shape and disjoint from the operands); None otherwise."""
    arrays = (a, b, out)
    if not all(type(t) is np.ndarray for t in arrays) or not a.dtype == b.dtype == out.dtype:
        return None
    if a.dtype != accumulation_dtype(a.dtype) or a.ndim < 2 or b.ndim != 2 or a.shape[-1] != b.shape[0]:
        return None
    if not (a.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable):
        return None
    if out.shape != (*a.shape[:-1], b.shape[1]) or np.may_share_memory(out, a) or np.may_share_memory(out, b):
        return None
    rows = math.prod(a.shape[:-1])
    return a.reshape(rows, a.shape[-1]), out.reshape(rows, b.shape[1])


def _bind_matmul(a: Any, b: Any, *, out: Any) -> Any:
    """``matmul_cpu(a, b, out=out)`` with its checks done once: the BLAS call itself (see ops.bind)."""
    views = _gemm_view(a, b, out)
    return None if views is None else partial(np.matmul, views[0], b, out=views[1])


def _bind_linear(x: Any, weight: Any, bias: Any = None, *, out: Any) -> Any:
    """``linear_cpu(x, weight, bias, out=out)`` with its checks done once: the GEMM, then the bias added
    in place, as the kernel does (see ops.bind)."""
    if type(weight) is not np.ndarray or weight.ndim != 2:
        return None
    views = _gemm_view(x, weight.T, out)
    if views is None or (bias is not None and (type(bias) is not np.ndarray or bias.shape != (weight.shape[0],)
                                               or bias.dtype != x.dtype)):  # fmt: skip
        return None
    gemm = partial(np.matmul, views[0], weight.T, out=views[1])
    if bias is None:
        return gemm
    add = partial(np.add, views[1], bias, out=views[1])

    def run() -> None:
        gemm()
        add()

    return run


matmul_cpu.binder = _bind_matmul  # type: ignore[attr-defined]
linear_cpu.binder = _bind_linear  # type: ignore[attr-defined]


@register("gemm", device="cpu", dtypes=FLOAT_DTYPES)
def gemm_cpu(
    a: Any,
    b: Any,
    c: Any = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    trans_a: bool = False,
    trans_b: bool = False,
) -> np.ndarray:
    a, b, c = np.asarray(a), np.asarray(b), _arr(c)
    at, bt = _gemm_operands(a, b, c, trans_a, trans_b)
    out = _blas_matmul(at, bt)  # (M, N), a fresh buffer we may scale in place
    if alpha != 1.0:
        out *= alpha
    if c is not None:  # beta == 0 still propagates NaN/inf in c, as ONNX's formula does
        cc = c.astype(out.dtype, copy=False)
        out += cc if beta == 1.0 else beta * cc
    return out.astype(a.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# public ops
# ---------------------------------------------------------------------------------------------


def matmul(a: Any, b: Any, *, out: np.ndarray | None = None, device: str | None = None) -> np.ndarray:
    """Matrix product with numpy ``matmul`` semantics: batched, broadcasting batch dims, 1-D operands.

    ``a`` ``(..., M, K)`` and ``b`` ``(..., K, N)`` give ``(broadcast(...), M, N)``; a 1-D ``a`` is a
    row vector and a 1-D ``b`` a column vector whose added dim is removed from the result. Both must
    share a float dtype; low precision accumulates in float32 and returns the input dtype. ``out``
    (optional: the result's shape and dtype) receives the result, written by BLAS where it can be.

    >>> matmul(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)).shape
    (2, 4)
    """
    if out is None:
        return call("matmul", a, b, device=device)
    a, b = np.asarray(a), np.asarray(b)
    _check_matmul("matmul", a, b)
    check_out("matmul", out, _mm_shape(a, b), a.dtype)
    return call("matmul", a, b, out=out, device=device)


def linear(
    x: Any, weight: Any, bias: Any = None, *, out: np.ndarray | None = None, device: str | None = None
) -> np.ndarray:
    """``x @ weight.T + bias`` with torch's layout: ``x`` ``(..., in)``, ``weight`` ``(out, in)``, ``bias`` ``(out,)``.

    Low precision accumulates in float32 and returns the input dtype. ``out`` (optional: the result's
    shape and dtype) receives the result, written by BLAS where it can be.

    >>> linear(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)).shape
    (2, 4)
    """
    if out is None:
        return call("linear", x, weight, bias, device=device)
    x, weight, bias = np.asarray(x), np.asarray(weight), _arr(bias)
    _check_linear(x, weight, bias)
    check_out("linear", out, (*x.shape[:-1], weight.shape[0]), x.dtype)
    return call("linear", x, weight, bias, out=out, device=device)


def gemm(
    a: Any,
    b: Any,
    c: Any = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    trans_a: bool = False,
    trans_b: bool = False,
    device: str | None = None,
) -> np.ndarray:
    """ONNX Gemm: ``alpha * A' @ B' + beta * C`` with ``A'`` = ``a.T`` if ``trans_a`` (same for ``b``).

    ``A'`` is ``(M, K)``, ``B'`` ``(K, N)``; ``c`` (optional) broadcasts to ``(M, N)``. Low precision
    accumulates in float32 and returns the input dtype.

    >>> gemm(np.eye(2), np.ones((2, 2)), np.ones(2), alpha=2.0).tolist()
    [[3.0, 3.0], [3.0, 3.0]]
    """
    return call("gemm", a, b, c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, device=device)
