"""Index-driven ops on ``ref`` and ``cpu``: embedding, gather, top_k, cumsum.

Semantics: torch ``F.embedding``; ONNX Gather (negative indices allowed), TopK (ties go to the
lower index; NaN ranks above every number, as in torch) and CumSum (exclusive, reverse).
Out-of-range indices raise :class:`OpError` naming the first bad index, never wrap silently.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtypes import ALL_DTYPES, INDEX_DTYPES, NUMERIC_DTYPES, accumulation_dtype, compute_dtype
from .._errors import OpError, check_dtype, check_ndim
from .._registry import call, register
from .shape import normalize_axis

__all__ = ["cumsum", "embedding", "gather", "top_k"]

builtin_sorted = sorted  # top_k's ``sorted`` argument shadows the builtin inside its kernels


def _check_indices(op: str, indices: np.ndarray, lo: int, hi: int, where: str) -> None:
    """Raise OpError unless every index lies in ``[lo, hi)``; the message names the first bad one."""
    check_dtype(op, "indices", indices, INDEX_DTYPES)
    if indices.size == 0:
        return
    bad = (indices < lo) | (indices >= hi)
    if bad.any():
        pos = tuple(int(p) for p in np.unravel_index(int(np.argmax(bad)), indices.shape))
        raise OpError(
            op, "indices", f"values in [{lo}, {hi - 1}] ({where})", f"{int(indices[pos])} at position {pos}"
        )


# ---------------------------------------------------------------------------------------------
# embedding (dispatches on the weight's dtype) and gather
# ---------------------------------------------------------------------------------------------


def _check_embedding(indices: np.ndarray, weight: np.ndarray) -> None:
    check_ndim("embedding", "weight", weight, 2, layout="[num_embeddings, embedding_dim]")
    _check_indices("embedding", indices, 0, weight.shape[0], f"num_embeddings = {weight.shape[0]}")


@register("embedding", device="ref", dtypes=ALL_DTYPES, dtype_arg=1)
def embedding_ref(indices: Any, weight: Any) -> np.ndarray:
    indices, weight = np.asarray(indices), np.asarray(weight)
    _check_embedding(indices, weight)
    out = np.empty((indices.size, weight.shape[1]), weight.dtype)
    for row, i in enumerate(indices.ravel().tolist()):  # one row lookup per index
        out[row] = weight[i]
    return out.reshape(*indices.shape, weight.shape[1])


@register("embedding", device="cpu", dtypes=ALL_DTYPES, dtype_arg=1)
def embedding_cpu(indices: Any, weight: Any) -> np.ndarray:
    indices, weight = np.asarray(indices), np.asarray(weight)
    _check_embedding(indices, weight)
    return np.take(weight, indices, axis=0)  # (*indices.shape, D)


def _check_gather(x: np.ndarray, indices: np.ndarray, axis: Any) -> int:
    check_ndim("gather", "x", x, (1, None))
    ax = normalize_axis("gather", axis, x.ndim)
    s = x.shape[ax]
    _check_indices("gather", indices, -s, s, f"axis {ax} of x has size {s}")
    return ax


@register("gather", device="ref", dtypes=ALL_DTYPES)
def gather_ref(x: Any, indices: Any, *, axis: int = 0) -> np.ndarray:
    x, indices = np.asarray(x), np.asarray(indices)
    ax = _check_gather(x, indices, axis)
    idx = np.where(indices < 0, indices + x.shape[ax], indices)  # ONNX: negative counts from the end
    return x[(slice(None),) * ax + (idx,)]  # (*x.shape[:ax], *indices.shape, *x.shape[ax+1:])


@register("gather", device="cpu", dtypes=ALL_DTYPES)
def gather_cpu(x: Any, indices: Any, *, axis: int = 0) -> np.ndarray:
    x, indices = np.asarray(x), np.asarray(indices)
    ax = _check_gather(x, indices, axis)
    return np.take(x, indices, axis=ax)  # np.take reads negative indices from the end


# ---------------------------------------------------------------------------------------------
# top_k
# ---------------------------------------------------------------------------------------------


def _check_top_k(x: np.ndarray, k: Any, axis: Any) -> int:
    check_dtype("top_k", "x", x, NUMERIC_DTYPES)
    check_ndim("top_k", "x", x, (1, None))
    ax = normalize_axis("top_k", axis, x.ndim)
    n = x.shape[ax]
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 0 <= k <= n:
        raise OpError("top_k", "k", f"an int in [0, {n}] (size of axis {ax} of x {x.shape})", repr(k))
    return ax


def _rank_key(v: float | int, i: int, largest: bool) -> tuple[int, float | int, int]:
    """Sort key: NaN above every number, then by value, ties by lower index."""
    if v != v:  # NaN
        return (0 if largest else 1, 0, i)
    return (1 if largest else 0, -v if largest else v, i)


@register("top_k", device="ref", dtypes=NUMERIC_DTYPES)
def top_k_ref(
    x: Any, *, k: int, axis: int = -1, largest: bool = True, sorted: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x)
    ax = _check_top_k(x, k, axis)
    xs = np.moveaxis(x, ax, -1)  # (..., n)
    rows = xs.reshape(-1, xs.shape[-1]).astype(np.float64 if x.dtype.kind not in "iub" else np.int64)
    idx = np.empty((rows.shape[0], k), np.int64)
    for r, row in enumerate(rows.tolist()):
        order = builtin_sorted(range(len(row)), key=lambda i, row=row: _rank_key(row[i], i, largest))
        idx[r] = order[:k]
    idx = idx.reshape(*xs.shape[:-1], k)
    values = np.take_along_axis(xs, idx, axis=-1)
    return np.moveaxis(values, -1, ax), np.moveaxis(idx, -1, ax)


def _stable_order(v: np.ndarray, largest: bool) -> np.ndarray:
    """Argsort along the last axis, descending if ``largest``, ties by lower index (NaN ranks highest)."""
    if not largest:
        return np.argsort(v, axis=-1, kind="stable")
    n = v.shape[-1]
    # a stable ascending sort of the reversed row, read backwards: descending, ties by lower index
    return (n - 1 - np.argsort(v[..., ::-1], axis=-1, kind="stable"))[..., ::-1]


def _top_k_candidates(v: np.ndarray, k: int, largest: bool) -> np.ndarray:
    """Indices (ascending) of the k winners per row, in O(n): partition, then break ties at the k-th value."""
    n = v.shape[-1]
    kth = n - k if largest else k - 1
    part = np.argpartition(v, kth, axis=-1)
    pivot = np.take_along_axis(v, part[..., kth : kth + 1], axis=-1)  # (..., 1) the k-th best value
    better = v > pivot if largest else v < pivot
    tie = v == pivot
    need = k - better.sum(axis=-1, keepdims=True)
    take = better | (tie & (np.cumsum(tie, axis=-1) <= need))  # exactly k per row
    return np.nonzero(take)[-1].reshape(*v.shape[:-1], k)


@register("top_k", device="cpu", dtypes=NUMERIC_DTYPES)
def top_k_cpu(
    x: Any, *, k: int, axis: int = -1, largest: bool = True, sorted: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x)
    ax = _check_top_k(x, k, axis)
    xs = np.moveaxis(x, ax, -1)  # (..., n)
    v = xs.astype(compute_dtype(x.dtype), copy=False)  # order-preserving, exact upcast
    n = v.shape[-1]
    if k == 0 or v.size == 0:
        idx = np.zeros((*v.shape[:-1], k), np.int64)
    elif k < n and not (v.dtype.kind == "f" and np.isnan(v).any()):
        cand = _top_k_candidates(v, k, largest)  # (..., k)
        idx = np.take_along_axis(cand, _stable_order(np.take_along_axis(v, cand, axis=-1), largest), axis=-1)
    else:
        idx = _stable_order(v, largest)[..., :k]
    idx = idx.astype(np.int64, copy=False)
    values = np.take_along_axis(xs, idx, axis=-1)
    return np.moveaxis(values, -1, ax), np.moveaxis(idx, -1, ax)


# ---------------------------------------------------------------------------------------------
# cumsum
# ---------------------------------------------------------------------------------------------


def _check_cumsum(x: np.ndarray, axis: Any) -> int:
    check_dtype("cumsum", "x", x, NUMERIC_DTYPES)
    check_ndim("cumsum", "x", x, (1, None))
    return normalize_axis("cumsum", axis, x.ndim)


@register("cumsum", device="ref", dtypes=NUMERIC_DTYPES)
def cumsum_ref(x: Any, *, axis: int, exclusive: bool = False, reverse: bool = False) -> np.ndarray:
    x = np.asarray(x)
    ax = _check_cumsum(x, axis)
    xs = np.moveaxis(x.astype(accumulation_dtype(x.dtype)), ax, 0)  # (n, ...)
    out = np.empty_like(xs)
    running = np.zeros_like(xs[0]) if len(xs) else None
    for i in reversed(range(len(xs))) if reverse else range(len(xs)):
        if exclusive:
            out[i], running = running, running + xs[i]
        else:
            running = running + xs[i]
            out[i] = running
    return np.moveaxis(out, 0, ax).astype(x.dtype)


@register("cumsum", device="cpu", dtypes=NUMERIC_DTYPES)
def cumsum_cpu(x: Any, *, axis: int, exclusive: bool = False, reverse: bool = False) -> np.ndarray:
    x = np.asarray(x)
    ax = _check_cumsum(x, axis)
    acc = accumulation_dtype(x.dtype)
    xs = np.flip(x, ax) if reverse else x
    if exclusive:
        out = np.zeros(x.shape, acc)
        head, tail = [slice(None)] * x.ndim, [slice(None)] * x.ndim
        head[ax], tail[ax] = slice(None, -1), slice(1, None)
        np.cumsum(xs[tuple(head)], axis=ax, dtype=acc, out=out[tuple(tail)])
    else:
        out = np.cumsum(xs, axis=ax, dtype=acc)
    out = np.flip(out, ax) if reverse else out
    return out.astype(x.dtype)  # int sums wrap like the input dtype; low precision rounds once


# ---------------------------------------------------------------------------------------------
# public ops
# ---------------------------------------------------------------------------------------------


def embedding(indices: Any, weight: Any, *, device: str | None = None) -> np.ndarray:
    """Rows of ``weight`` ``(num_embeddings, D)`` at int32/int64 ``indices``: ``(*indices.shape, D)``.

    torch ``F.embedding`` semantics; an index outside ``[0, num_embeddings)`` raises OpError naming it.
    Dispatches on ``weight``'s dtype, which the result keeps.

    >>> embedding(np.array([2, 0]), np.arange(6.0).reshape(3, 2)).tolist()
    [[4.0, 5.0], [0.0, 1.0]]
    """
    return call("embedding", indices, weight, device=device)


def gather(x: Any, indices: Any, *, axis: int = 0, device: str | None = None) -> np.ndarray:
    """ONNX Gather: entries of ``x`` along ``axis`` at ``indices`` (negative counts from the end).

    The result shape is ``x.shape[:axis] + indices.shape + x.shape[axis + 1:]``; the dtype is ``x``'s.

    >>> gather(np.arange(6).reshape(2, 3), np.array([-1, 0]), axis=1).tolist()
    [[2, 0], [5, 3]]
    """
    return call("gather", x, indices, axis=axis, device=device)


def top_k(
    x: Any, *, k: int, axis: int = -1, largest: bool = True, sorted: bool = True, device: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest (or smallest) entries along ``axis`` and their int64 indices (ONNX TopK).

    Ties go to the lower index; NaN ranks above every number. Results are always in sorted order
    (``sorted=False`` allows any order, so sorted is valid). ``k`` must lie in ``[0, x.shape[axis]]``.

    >>> [a.tolist() for a in top_k(np.array([1, 3, 3, 2]), k=2)]
    [[3, 3], [1, 2]]
    """
    return call("top_k", x, k=k, axis=axis, largest=largest, sorted=sorted, device=device)


def cumsum(
    x: Any, *, axis: int, exclusive: bool = False, reverse: bool = False, device: str | None = None
) -> np.ndarray:
    """Running sum along ``axis`` (ONNX CumSum): ``exclusive`` leaves out the current entry, ``reverse`` sums from the end.

    Low-precision floats accumulate in float32, ints in int64; the result has ``x``'s dtype.

    >>> cumsum(np.array([1, 2, 3]), axis=0, exclusive=True).tolist()
    [0, 1, 3]
    """
    return call("cumsum", x, axis=axis, exclusive=exclusive, reverse=reverse, device=device)
