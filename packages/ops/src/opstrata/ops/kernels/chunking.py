"""Cache-sized blocking shared by the fused and generated kernels: 2-D row views and tile sizes.

The speed of a chain of numpy ufuncs on a large array is set by memory traffic: every step streams
the whole array through DRAM. Running the whole chain on one block that fits in L2, then the next,
keeps each step's operands in cache (the loop tiling / operator fusion lesson of Halide and
TVM, Ragan-Kelley et al. 2013). The helpers here turn broadcast operands into ``(rows, cols)`` views
without copying where numpy's strides allow, and pick block sizes in elements.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

#: Elements per block (per scratch buffer), read at call time so benchmarks can sweep it. Measured on
#: the shared 2-core bench machine (1 MiB L2/core, 32 MiB L3) with ``bench_fused.py --sweep``: at
#: 16-32 Ki elements the ~0.7 us Python cost of each ufunc call dominates; 128 Ki (512 KiB of float32
#: a buffer; the working set spills L2 into L3 but stays off DRAM) was fastest or tied for bias_act,
#: add_layer_norm/add_rms_norm, scale_mask_softmax, adamw_step and the generated chains.
BLOCK_ELEMS: int = 128 * 1024


_RESHAPE_HAS_COPY = tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 1)


def reshape_view(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` viewed with ``shape`` without copying; ValueError when strides cannot express it.

    numpy >= 2.1 says so with ``np.reshape(copy=False)``; older numpy (the declared minimum is 1.24)
    with an in-place shape change of a view, which refuses the same cases.
    """
    if _RESHAPE_HAS_COPY:
        return np.reshape(a, shape, copy=False)
    view = a.view()
    try:
        view.shape = shape
    except AttributeError as exc:  # numpy < 2.1: "Incompatible shape for in-place modification"
        raise ValueError(str(exc)) from None
    return view


def as_rows(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` broadcast to ``shape`` and viewed as ``(prod(shape[:-1]), shape[-1])``, copying only if needed.

    A bias of shape ``(N,)`` or a residual of ``x``'s shape become zero-copy views; a broadcast that
    strides cannot express (e.g. ``(B, 1, N)`` against ``(B, S, N)``) is materialized once.
    """
    b = np.broadcast_to(a, shape)
    rows = math.prod(shape[:-1]) if shape else 1
    cols = shape[-1] if shape else 1
    try:
        return reshape_view(b, (rows, cols))
    except ValueError:
        return np.ascontiguousarray(b).reshape(rows, cols)


def row_block(cols: int, block_elems: int | None = None) -> int:
    """Rows per block so that one block holds about ``block_elems`` elements (at least one row)."""
    return max(1, (block_elems or BLOCK_ELEMS) // max(cols, 1))


def tiles(rows: int, cols: int, block_elems: int | None = None) -> Iterator[tuple[slice, slice]]:
    """(row slice, col slice) tiles of about ``block_elems`` elements covering a ``(rows, cols)`` array."""
    block_elems = block_elems or BLOCK_ELEMS
    cb = min(cols, block_elems) if cols else 1
    rb = row_block(cb, block_elems)
    for r0 in range(0, rows, rb):
        for c0 in range(0, cols, cb):
            yield slice(r0, r0 + rb), slice(c0, c0 + cb)


def tile_shape(rows: int, cols: int, block_elems: int | None = None) -> tuple[int, int]:
    """The full-tile shape :func:`tiles` uses (scratch buffers are allocated at this size once)."""
    block_elems = block_elems or BLOCK_ELEMS
    cb = min(cols, block_elems) if cols else 1
    return min(rows, row_block(cb, block_elems)), cb


def scratch(shape: tuple[int, int], dtype: Any, n: int) -> list[np.ndarray]:
    """``n`` reusable scratch buffers of ``shape``; callers slice ``buf[:r, :c]`` for edge tiles."""
    return [np.empty(shape, dtype) for _ in range(n)]


def fit(buf: np.ndarray, like: np.ndarray) -> np.ndarray:
    """The leading ``like.shape`` corner of a scratch buffer (the whole buffer for a full tile)."""
    return buf if buf.shape == like.shape else buf[: like.shape[0], : like.shape[1]]


def row_tile(a2: np.ndarray, rb: int, cb: int, dtype: Any) -> np.ndarray | None:
    """A contiguous ``(rb, cols)`` copy of a row-broadcast ``(rows, cols)`` view (a bias), else None.

    numpy's inner loop over a zero-stride row operand runs ~2x slower than over a contiguous one, so
    an operand repeated on every row is laid out once as a full tile (only when tiles span all
    columns) and sliced ``[:nr]`` per block.
    """
    if a2.shape[0] <= 1 or a2.strides[0] != 0 or cb != a2.shape[1]:
        return None
    return np.ascontiguousarray(np.broadcast_to(a2[:1], (rb, a2.shape[1])), dtype=dtype)
