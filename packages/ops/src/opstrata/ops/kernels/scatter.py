"""Element- and slice-indexed gathers and scatters on ``ref`` and ``cpu`` (ONNX operator spec).

Semantics follow ONNX GatherElements, GatherND (``batch_dims``), ScatterElements and ScatterND
(``reduction`` none/add/mul/max/min): negative indices count from the end of their axis (all four
ops, as in onnxruntime), out-of-range indices raise :class:`OpError` naming the first bad one.
With ``reduction="none"`` and duplicate indices the last update wins (the spec leaves it open).
Results are fresh arrays with ``x``'s dtype; ``ref`` loops over indices, ``cpu`` vectorizes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtypes import TENSOR_DTYPES
from .._errors import OpError, check_dtype, check_ndim
from .._registry import call, register
from .index import _check_indices
from .shape import normalize_axis

__all__ = ["REDUCTIONS", "gather_elements", "gather_nd", "scatter_elements", "scatter_nd"]

#: ``reduction`` values of ScatterElements/ScatterND and the ufunc that combines an update into x.
REDUCTIONS: dict[str, Any] = {
    "none": None,
    "add": np.add,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


def _check_reduction(op: str, reduction: Any, x: np.ndarray) -> Any:
    if reduction not in REDUCTIONS:
        raise OpError(op, "reduction", f"one of {sorted(REDUCTIONS)}", repr(reduction))
    if reduction != "none" and x.dtype == np.bool_ and reduction in ("add", "mul"):
        raise OpError(op, "x", f"a numeric dtype for reduction={reduction!r}", "bool", "cast x to int")
    return REDUCTIONS[reduction]


def _wrap(indices: np.ndarray, size: int | np.ndarray) -> np.ndarray:
    """Indices with negative entries counted from the end (int64)."""
    idx = indices.astype(np.int64, copy=False)
    return np.where(idx < 0, idx + size, idx)


# ---------------------------------------------------------------------------------------------
# gather_elements / scatter_elements
# ---------------------------------------------------------------------------------------------


def _check_elements(op: str, x: np.ndarray, indices: np.ndarray, axis: Any) -> int:
    check_ndim(op, "x", x, (1, None))
    ax = normalize_axis(op, axis, x.ndim)
    if indices.ndim != x.ndim:
        raise OpError(op, "indices", f"rank {x.ndim} (the rank of x {x.shape})", f"shape {indices.shape}")
    n = x.shape[ax]
    _check_indices(op, indices, -n, n, f"axis {ax} of x has size {n}")
    return ax


def _check_gather_elements(x: np.ndarray, indices: np.ndarray, axis: Any) -> int:
    ax = _check_elements("gather_elements", x, indices, axis)
    bad = [d for d in range(x.ndim) if d != ax and indices.shape[d] > x.shape[d]]
    if bad:
        raise OpError(
            "gather_elements", "indices", f"dims no larger than x {x.shape} off the axis", str(indices.shape)
        )
    return ax


@register("gather_elements", device="ref", dtypes=TENSOR_DTYPES)
def gather_elements_ref(x: Any, indices: Any, *, axis: int = 0) -> np.ndarray:
    x, indices = np.asarray(x), np.asarray(indices)
    ax = _check_gather_elements(x, indices, axis)
    idx = _wrap(indices, x.shape[ax])
    out = np.empty(indices.shape, x.dtype)
    for pos in np.ndindex(*indices.shape):  # out[pos] = x[pos with pos[ax] replaced by the index]
        src = list(pos)
        src[ax] = int(idx[pos])
        out[pos] = x[tuple(src)]
    return out


@register("gather_elements", device="cpu", dtypes=TENSOR_DTYPES)
def gather_elements_cpu(x: Any, indices: Any, *, axis: int = 0) -> np.ndarray:
    x, indices = np.asarray(x), np.asarray(indices)
    ax = _check_gather_elements(x, indices, axis)
    view = x[tuple(slice(0, s) if d != ax else slice(None) for d, s in enumerate(indices.shape))]
    return np.take_along_axis(view, _wrap(indices, x.shape[ax]), axis=ax)


def _check_scatter_elements(
    x: np.ndarray, indices: np.ndarray, updates: np.ndarray, axis: Any, reduction: Any
) -> tuple[int, Any]:
    op = "scatter_elements"
    ax = _check_elements(op, x, indices, axis)
    if updates.shape != indices.shape:
        raise OpError(op, "updates", f"shape {indices.shape} (the shape of indices)", str(updates.shape))
    if updates.dtype != x.dtype:
        raise OpError(op, "updates", f"dtype {x.dtype} (the dtype of x)", str(updates.dtype))
    if any(indices.shape[d] > x.shape[d] for d in range(x.ndim) if d != ax):
        raise OpError(op, "indices", f"dims no larger than x {x.shape} off the axis", str(indices.shape))
    return ax, _check_reduction(op, reduction, x)


@register("scatter_elements", device="ref", dtypes=TENSOR_DTYPES)
def scatter_elements_ref(
    x: Any, indices: Any, updates: Any, *, axis: int = 0, reduction: str = "none"
) -> np.ndarray:
    x, indices, updates = np.asarray(x), np.asarray(indices), np.asarray(updates)
    ax, ufunc = _check_scatter_elements(x, indices, updates, axis, reduction)
    out = x.copy()
    idx = _wrap(indices, x.shape[ax])
    for pos in np.ndindex(*indices.shape):  # one update at a time, in index order
        dst = list(pos)
        dst[ax] = int(idx[pos])
        t = tuple(dst)
        out[t] = updates[pos] if ufunc is None else ufunc(out[t], updates[pos])
    return out


def _element_targets(indices: np.ndarray, ax: int, n: int) -> tuple[np.ndarray, ...]:
    """The full index tuple of every element of ``indices`` with ``indices`` along ``ax``."""
    grids = list(np.indices(indices.shape, sparse=True))
    grids[ax] = _wrap(indices, n)
    return tuple(np.broadcast_to(g, indices.shape) for g in grids)


@register("scatter_elements", device="cpu", dtypes=TENSOR_DTYPES)
def scatter_elements_cpu(
    x: Any, indices: Any, updates: Any, *, axis: int = 0, reduction: str = "none"
) -> np.ndarray:
    x, indices, updates = np.asarray(x), np.asarray(indices), np.asarray(updates)
    ax, ufunc = _check_scatter_elements(x, indices, updates, axis, reduction)
    out = x.copy()
    target = _element_targets(indices, ax, x.shape[ax])
    if ufunc is None:
        out[target] = updates  # duplicates: numpy assigns in order, so the last wins
    else:
        ufunc.at(out, target, updates)
    return out


# ---------------------------------------------------------------------------------------------
# gather_nd / scatter_nd
# ---------------------------------------------------------------------------------------------


def _check_nd(op: str, x: np.ndarray, indices: np.ndarray, batch_dims: int) -> int:
    check_dtype(op, "indices", indices, (np.dtype(np.int32), np.dtype(np.int64)))
    check_ndim(op, "x", x, (1, None))
    check_ndim(op, "indices", indices, (1, None))
    b = batch_dims
    if not isinstance(b, (int, np.integer)) or not 0 <= b < min(x.ndim, indices.ndim):
        raise OpError(op, "batch_dims", f"an int in [0, {min(x.ndim, indices.ndim) - 1}]", repr(batch_dims))
    if x.shape[:b] != indices.shape[:b]:
        raise OpError(op, "indices", f"leading dims {x.shape[:b]} (x's batch dims)", str(indices.shape))
    k = indices.shape[-1]
    if k > x.ndim - b:
        raise OpError(op, "indices", f"a last dim <= {x.ndim - b} (x's rank less batch_dims)", str(k))
    if indices.size:
        dims = np.array(x.shape[b : b + k], np.int64)
        bad = (indices < -dims) | (indices >= dims)
        if bad.any():
            pos = tuple(int(p) for p in np.argwhere(bad)[0])
            raise OpError(
                op,
                "indices",
                f"entries in [-d, d) for the indexed dims {tuple(dims)}",
                f"{indices[pos]} at {pos}",
            )
    return k


def _nd_tuples(x: np.ndarray, indices: np.ndarray, b: int, k: int) -> tuple[np.ndarray, ...]:
    """Index arrays (each shaped like ``indices[..., 0]``) addressing x's first ``b + k`` dims."""
    lead = indices.shape[:-1]
    batch = [g.reshape(g.shape[:b] + (1,) * (len(lead) - b)) for g in np.indices(lead[:b], sparse=True)]
    cols = [_wrap(indices[..., j], x.shape[b + j]) for j in range(k)]
    return tuple(np.broadcast_to(g, lead) for g in (*batch, *cols))


@register("gather_nd", device="ref", dtypes=TENSOR_DTYPES)
def gather_nd_ref(x: Any, indices: Any, *, batch_dims: int = 0) -> np.ndarray:
    x, indices = np.asarray(x), np.asarray(indices)
    k = _check_nd("gather_nd", x, indices, batch_dims)
    b = batch_dims
    lead = indices.shape[:-1]
    out = np.empty(lead + x.shape[b + k :], x.dtype)
    for pos in np.ndindex(*lead):  # each index tuple picks one slice of x
        src = tuple(pos[:b]) + tuple(int(i) % x.shape[b + j] for j, i in enumerate(indices[pos]))
        out[pos] = x[src]
    return out


@register("gather_nd", device="cpu", dtypes=TENSOR_DTYPES)
def gather_nd_cpu(x: Any, indices: Any, *, batch_dims: int = 0) -> np.ndarray:
    x, indices = np.asarray(x), np.asarray(indices)
    k = _check_nd("gather_nd", x, indices, batch_dims)
    return x[_nd_tuples(x, indices, batch_dims, k)]


def _check_scatter_nd(
    x: np.ndarray, indices: np.ndarray, updates: np.ndarray, reduction: Any
) -> tuple[int, Any]:
    op = "scatter_nd"
    k = _check_nd(op, x, indices, 0)
    want = indices.shape[:-1] + x.shape[k:]
    if updates.shape != want:
        raise OpError(op, "updates", f"shape {want} (indices.shape[:-1] + x.shape[k:])", str(updates.shape))
    if updates.dtype != x.dtype:
        raise OpError(op, "updates", f"dtype {x.dtype} (the dtype of x)", str(updates.dtype))
    return k, _check_reduction(op, reduction, x)


@register("scatter_nd", device="ref", dtypes=TENSOR_DTYPES)
def scatter_nd_ref(x: Any, indices: Any, updates: Any, *, reduction: str = "none") -> np.ndarray:
    x, indices, updates = np.asarray(x), np.asarray(indices), np.asarray(updates)
    _, ufunc = _check_scatter_nd(x, indices, updates, reduction)
    out = x.copy()
    for pos in np.ndindex(*indices.shape[:-1]):  # one slice update at a time, in index order
        dst = tuple(int(i) % x.shape[j] for j, i in enumerate(indices[pos]))
        out[dst] = updates[pos] if ufunc is None else ufunc(out[dst], updates[pos])
    return out


@register("scatter_nd", device="cpu", dtypes=TENSOR_DTYPES)
def scatter_nd_cpu(x: Any, indices: Any, updates: Any, *, reduction: str = "none") -> np.ndarray:
    x, indices, updates = np.asarray(x), np.asarray(indices), np.asarray(updates)
    k, ufunc = _check_scatter_nd(x, indices, updates, reduction)
    out = x.copy()
    target = _nd_tuples(x, indices, 0, k)
    if ufunc is None:
        out[target] = updates  # duplicates: the last wins
    else:
        ufunc.at(out, target, updates)
    return out


# ---------------------------------------------------------------------------------------------
# public ops
# ---------------------------------------------------------------------------------------------


def gather_elements(x: Any, indices: Any, *, axis: int = 0, device: str | None = None) -> np.ndarray:
    """ONNX GatherElements: ``out[i][j] = x[indices[i][j]][j]`` for ``axis=0`` (torch ``gather``).

    ``indices`` has x's rank; the result has ``indices``' shape and x's dtype.

    >>> gather_elements(np.array([[1, 2], [3, 4]]), np.array([[0, 0], [1, 0]]), axis=1).tolist()
    [[1, 1], [4, 3]]
    """
    return call("gather_elements", x, indices, axis=axis, device=device)


def gather_nd(x: Any, indices: Any, *, batch_dims: int = 0, device: str | None = None) -> np.ndarray:
    """ONNX GatherND: slices of ``x`` addressed by the last dim of ``indices`` (after ``batch_dims``).

    The result shape is ``indices.shape[:-1] + x.shape[batch_dims + indices.shape[-1]:]``.

    >>> gather_nd(np.array([[0, 1], [2, 3]]), np.array([[1, 0], [0, 1]])).tolist()
    [2, 1]
    """
    return call("gather_nd", x, indices, batch_dims=batch_dims, device=device)


def scatter_elements(
    x: Any, indices: Any, updates: Any, *, axis: int = 0, reduction: str = "none", device: str | None = None
) -> np.ndarray:
    """ONNX ScatterElements: a copy of ``x`` with ``updates`` written (or reduced) at ``indices`` along ``axis``.

    ``reduction`` is none/add/mul/max/min; with duplicates under ``none`` the last update wins.

    >>> scatter_elements(np.zeros(3, np.int64), np.array([2, 2]), np.array([1, 5]), reduction="add").tolist()
    [0, 0, 6]
    """
    return call("scatter_elements", x, indices, updates, axis=axis, reduction=reduction, device=device)


def scatter_nd(
    x: Any, indices: Any, updates: Any, *, reduction: str = "none", device: str | None = None
) -> np.ndarray:
    """ONNX ScatterND: a copy of ``x`` with slices ``updates`` written (or reduced) at index tuples ``indices``.

    ``updates`` has shape ``indices.shape[:-1] + x.shape[indices.shape[-1]:]``.

    >>> scatter_nd(np.zeros(4, np.int64), np.array([[1], [3]]), np.array([7, 9])).tolist()
    [0, 7, 0, 9]
    """
    return call("scatter_nd", x, indices, updates, reduction=reduction, device=device)
