"""Index-driven ops on ``ref`` and ``cpu``: embedding, gather, top_k, cumsum, argmin, one_hot, compress,
unique.

Semantics: torch ``F.embedding``; ONNX Gather (negative indices allowed), TopK (ties go to the
lower index; NaN ranks above every number, as in torch) and CumSum (exclusive, reverse).
Out-of-range indices raise :class:`OpError` naming the first bad index, never wrap silently.
"""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from .._dtypes import (
    ALL_DTYPES,
    INDEX_DTYPES,
    NUMERIC_DTYPES,
    TENSOR_DTYPES,
    accumulation_dtype,
    compute_dtype,
)
from .._errors import OpError, check_dtype, check_ndim
from .._registry import call, register
from .shape import normalize_axis

__all__ = ["argmin", "compress", "cumsum", "embedding", "gather", "one_hot", "top_k", "unique"]

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


@register("gather", device="ref", dtypes=TENSOR_DTYPES)
def gather_ref(x: Any, indices: Any, *, axis: int = 0) -> np.ndarray:
    x, indices = np.asarray(x), np.asarray(indices)
    ax = _check_gather(x, indices, axis)
    idx = np.where(indices < 0, indices + x.shape[ax], indices)  # ONNX: negative counts from the end
    return x[(slice(None),) * ax + (idx,)]  # (*x.shape[:ax], *indices.shape, *x.shape[ax+1:])


@register("gather", device="cpu", dtypes=TENSOR_DTYPES)
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


# ---------------------------------------------------------------------------------------------
# argmin (ONNX ArgMin; select_last_index for ArgMin and ArgMax) and one_hot
# ---------------------------------------------------------------------------------------------


def _check_arg_extreme(op: str, x: np.ndarray, axis: Any) -> int:
    check_dtype(op, "x", x, NUMERIC_DTYPES)
    check_ndim(op, "x", x, (1, None))
    ax = normalize_axis(op, axis, x.ndim)
    if x.shape[ax] == 0:
        raise OpError(op, "x", f"a non-empty axis {ax}", f"shape {x.shape}")
    return ax


def _arg_extreme(x: np.ndarray, ax: int, keepdims: bool, last: bool, pick: Any) -> np.ndarray:
    """``pick`` (np.argmin/np.argmax) along ``ax``; ``last`` takes the last of tied entries."""
    v = x.astype(compute_dtype(x.dtype), copy=False)
    n = v.shape[ax]
    idx = (n - 1 - pick(np.flip(v, ax), axis=ax)) if last else pick(v, axis=ax)
    idx = idx.astype(np.int64)
    return np.expand_dims(idx, ax) if keepdims else idx


def _below(a: float, b: float) -> bool:
    """``a < b`` with NaN below every number."""
    return (a != a and b == b) or a < b


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)


@register("argmin", device="ref", dtypes=NUMERIC_DTYPES)
def argmin_ref(
    x: Any, *, axis: int = 0, keepdims: bool = False, select_last_index: bool = False
) -> np.ndarray:
    x = np.asarray(x)
    ax = _check_arg_extreme("argmin", x, axis)
    rows = np.moveaxis(x, ax, -1).astype(np.float64 if x.dtype.kind not in "iu" else np.int64)
    out = np.empty(rows.shape[:-1], np.int64)
    for pos in np.ndindex(*rows.shape[:-1]):  # scan each row; NaN counts as the minimum (first NaN wins)
        row = rows[pos].tolist()
        best = 0
        for i, val in enumerate(row):
            if _below(val, row[best]) or (select_last_index and _same(val, row[best])):
                best = i
        out[pos] = best
    return np.expand_dims(out, ax) if keepdims else out


@register("argmin", device="cpu", dtypes=NUMERIC_DTYPES)
def argmin_cpu(
    x: Any, *, axis: int = 0, keepdims: bool = False, select_last_index: bool = False
) -> np.ndarray:
    x = np.asarray(x)
    ax = _check_arg_extreme("argmin", x, axis)
    return _arg_extreme(x, ax, keepdims, select_last_index, np.argmin)


def _check_one_hot(indices: np.ndarray, depth: Any, values: np.ndarray, axis: Any) -> tuple[int, int]:
    check_dtype("one_hot", "indices", indices, NUMERIC_DTYPES)
    d = int(depth) if np.asarray(depth).size == 1 else -1
    if d < 1:
        raise OpError("one_hot", "depth", "a positive scalar", repr(depth))
    if values.shape != (2,):
        raise OpError("one_hot", "values", "2 entries [off_value, on_value]", f"shape {values.shape}")
    ax = normalize_axis("one_hot", axis, indices.ndim + 1)
    return d, ax


def _one_hot(indices: Any, depth: Any, values: Any, *, axis: int = -1) -> np.ndarray:
    indices, values = np.asarray(indices), np.asarray(values)
    d, ax = _check_one_hot(indices, depth, values, axis)
    idx = indices.astype(np.int64)  # ONNX: float indices are truncated, negative count from the end
    idx = np.where(idx < 0, idx + d, idx)
    hot = np.expand_dims(idx, ax) == np.arange(d).reshape((d,) + (1,) * (indices.ndim - ax))
    return np.where(hot, values[1], values[0]).astype(values.dtype)  # out of range: all off


register("one_hot", device="ref", dtypes=TENSOR_DTYPES, dtype_arg=2)(_one_hot)
register("one_hot", device="cpu", dtypes=TENSOR_DTYPES, dtype_arg=2)(_one_hot)


def argmin(
    x: Any,
    *,
    axis: int = 0,
    keepdims: bool = False,
    select_last_index: bool = False,
    device: str | None = None,
) -> np.ndarray:
    """Index of the minimum along ``axis`` as int64 (ONNX ArgMin); ties give the first index, or the last
    with ``select_last_index``. A NaN counts as the minimum (first NaN wins), as numpy.

    >>> argmin(np.array([[3, 1, 1], [0, 2, 0]]), axis=1).tolist()
    [1, 0]
    """
    return call("argmin", x, axis=axis, keepdims=keepdims, select_last_index=select_last_index, device=device)


def one_hot(
    indices: Any, depth: int, values: Any, *, axis: int = -1, device: str | None = None
) -> np.ndarray:
    """ONNX OneHot: ``values[1]`` where ``indices`` (negative from the end) hits, ``values[0]`` elsewhere.

    A new dim of size ``depth`` is inserted at ``axis``; indices outside ``[-depth, depth)`` give an
    all-off row, as the spec says. Dispatches on ``values``' dtype, which the result keeps.

    >>> one_hot(np.array([0, 2]), 3, np.array([0, 1])).tolist()
    [[1, 0, 0], [0, 0, 1]]
    """
    return call("one_hot", indices, depth, values, axis=axis, device=device)


# ---------------------------------------------------------------------------------------------
# compress and unique (ONNX Compress, Unique: output sizes depend on the data)
# ---------------------------------------------------------------------------------------------


def _compress(x: Any, condition: Any, *, axis: int | None = None) -> np.ndarray:
    x, cond = np.asarray(x), np.asarray(condition)
    if cond.ndim != 1 or cond.dtype != np.bool_:
        raise OpError("compress", "condition", "a 1-D bool array", f"{cond.dtype}{list(cond.shape)}")
    ax = None if axis is None else normalize_axis("compress", axis, max(x.ndim, 1))
    n = x.size if ax is None else x.shape[ax]
    if cond.size > n:
        raise OpError(
            "compress", "condition", f"at most {n} entries (the selected extent of x)", str(cond.size)
        )
    return np.compress(cond, x, axis=ax)  # entries past the condition's length are dropped, as ONNX says


register("compress", device="ref", dtypes=TENSOR_DTYPES)(_compress)
register("compress", device="cpu", dtypes=TENSOR_DTYPES)(_compress)


def _unique(
    x: Any, *, axis: int | None = None, sorted: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x = np.asarray(x)
    check_dtype("unique", "x", x, TENSOR_DTYPES)
    src = x.reshape(-1) if axis is None else x
    ax = 0 if axis is None else normalize_axis("unique", axis, x.ndim)
    key = src.astype(compute_dtype(x.dtype), copy=False) if x.dtype.kind not in "biu" else src
    if x.dtype.kind == "O":
        # numpy < 2 refuses np.unique(axis=) on object (string) arrays: number the slices along the axis
        # by their lexicographic rank (what np.unique sorts by) and find the unique ranks instead
        rows = [tuple(r) for r in np.moveaxis(src, ax, 0).reshape(src.shape[ax], -1)]
        row_rank = {r: i for i, r in enumerate(builtins.sorted(set(rows)))}
        key, ax = np.array([row_rank[r] for r in rows], np.int64), 0
    _, first, inverse, counts = np.unique(
        key, return_index=True, return_inverse=True, return_counts=True, axis=ax
    )
    ax = 0 if axis is None else normalize_axis("unique", axis, x.ndim)
    if not sorted:  # ONNX sorted=0: unique entries in the order of their first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first, counts, inverse = first[order], counts[order], rank[inverse.reshape(-1)]
    y = np.take(src, first, axis=ax)  # the original entries: exact in every dtype
    return y, first.astype(np.int64), inverse.reshape(-1).astype(np.int64), counts.astype(np.int64)


register("unique", device="ref", dtypes=TENSOR_DTYPES)(_unique)
register("unique", device="cpu", dtypes=TENSOR_DTYPES)(_unique)


def compress(x: Any, condition: Any, *, axis: int | None = None, device: str | None = None) -> np.ndarray:
    """ONNX Compress: the slices of ``x`` along ``axis`` (entries of flattened ``x`` when None) where
    ``condition`` is True; slices past ``condition``'s length are dropped.

    >>> compress(np.array([[1, 2], [3, 4], [5, 6]]), np.array([False, True]), axis=0).tolist()
    [[3, 4]]
    """
    return call("compress", x, condition, axis=axis, device=device)


def unique(
    x: Any, *, axis: int | None = None, sorted: bool = True, device: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """ONNX Unique: ``(y, indices, inverse_indices, counts)`` of the distinct entries of flattened ``x``
    (or distinct slices along ``axis``); ``sorted=False`` keeps the order of first occurrence.

    >>> [a.tolist() for a in unique(np.array([2, 1, 2, 3]), sorted=False)]
    [[2, 1, 3], [0, 1, 3], [0, 1, 0, 2], [2, 1, 1]]
    """
    return call("unique", x, axis=axis, sorted=sorted, device=device)
