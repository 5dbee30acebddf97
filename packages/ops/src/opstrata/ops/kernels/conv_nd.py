"""N-D convolution and pooling over ``(N, C, *spatial)`` inputs: conv_nd, conv_transpose_nd,
max_pool_nd (with ONNX indices), avg_pool_nd, lp_pool_nd and max_unpool_nd.

Semantics follow the ONNX operator spec (Conv, ConvTranspose, MaxPool, AveragePool, LpPool,
MaxUnpool) for any number of spatial dims: ``pads`` is ONNX's ``[begin_0, .., begin_k, end_0, ..,
end_k]`` (or one int for all), ``stride`` defaults to 1 (ONNX, not torch's "= kernel"), ``ceil_mode``
drops a last window that would start in the end padding. One simple implementation (windows from
numpy stride tricks, then a matmul or a reduction) is registered on both ``ref`` and ``cpu``; the
fast 2-D kernels (conv2d, max_pool2d, avg_pool2d) stay the 2-D path. Floats accumulate in float32
(float64 for float64) and return x's dtype; max pooling is exact and also takes integers.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .._dtypes import FLOAT_DTYPES, INT_DTYPES, accumulation_dtype
from .._errors import OpError, check_dtype, check_ndim
from .._registry import call, register
from .elementwise import ieee

__all__ = [
    "avg_pool_nd",
    "conv_nd",
    "conv_transpose_nd",
    "lp_pool_nd",
    "max_pool_nd",
    "max_unpool_nd",
    "pool_output_size",
]

Ints = tuple[int, ...]
NUMERIC = FLOAT_DTYPES + INT_DTYPES


# ---------------------------------------------------------------------------------------------
# attribute parsing
# ---------------------------------------------------------------------------------------------


def _ints(op: str, name: str, value: Any, n: int, minimum: int) -> Ints:
    """An int (repeated ``n`` times) or ``n`` ints, each >= ``minimum``."""
    vals = (value,) * n if isinstance(value, (int, np.integer)) else tuple(value)
    if len(vals) != n or not all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= minimum for v in vals
    ):
        raise OpError(op, name, f"an int >= {minimum} or {n} of them (one per spatial dim)", repr(value))
    return tuple(int(v) for v in vals)


def _pads(op: str, value: Any, nd: int) -> tuple[Ints, Ints]:
    """ONNX pads (``[begin..., end...]`` or one int) -> (begin, end)."""
    vals = _ints(op, "pads", value, 2 * nd, 0)
    return vals[:nd], vals[nd:]


def pool_output_size(size: int, k: int, s: int, d: int, p0: int, p1: int, ceil: bool) -> int:
    """Output length along one axis (ONNX; with ``ceil`` a last window starting in the end pad is dropped)."""
    span = size + p0 + p1 - d * (k - 1) - 1
    if span < 0:
        return 0
    out = (-(-span // s) if ceil else span // s) + 1
    return out - 1 if ceil and (out - 1) * s >= size + p0 else out


@dataclass(frozen=True)
class Window:
    """Resolved window attributes of one N-D conv or pool call."""

    kernel: Ints
    stride: Ints
    begin: Ints
    end: Ints
    dilation: Ints
    out: Ints
    extra: Ints  # end padding ceil_mode needs beyond ``end``


def _window(op: str, x: np.ndarray, kernel: Any, stride: Any, pads: Any, dilation: Any, ceil: bool) -> Window:
    nd = x.ndim - 2
    k = _ints(op, "kernel_size", kernel, nd, 1)
    s, d = _ints(op, "stride", stride, nd, 1), _ints(op, "dilation", dilation, nd, 1)
    b, e = _pads(op, pads, nd)
    sizes = x.shape[2:]
    out = tuple(pool_output_size(*a, ceil) for a in zip(sizes, k, s, d, b, e, strict=True))
    if any(o < 1 for o in out):
        eff = tuple(di * (ki - 1) + 1 for ki, di in zip(k, d, strict=True))
        raise OpError(
            op, "x", f"padded spatial dims at least the dilated kernel {eff}",
            f"shape {x.shape} with pads {b + e}", fix="increase pads or use a smaller kernel/dilation",
        )  # fmt: skip
    extra = tuple(
        max(0, (o - 1) * si + di * (ki - 1) + 1 - (n + bi + ei))
        for o, si, di, ki, n, bi, ei in zip(out, s, d, k, sizes, b, e, strict=True)
    )
    return Window(k, s, b, e, d, out, extra)


def _padded(x: np.ndarray, w: Window, dtype: np.dtype, fill: Any) -> np.ndarray:
    """``x`` in ``dtype`` with the window's begin/end (+ ceil extra) padding filled with ``fill``."""
    shape = x.shape[:2] + tuple(
        n + b + e + x_ for n, b, e, x_ in zip(x.shape[2:], w.begin, w.end, w.extra, strict=True)
    )
    out = np.full(shape, fill, dtype)
    out[(slice(None), slice(None), *(slice(b, b + n) for b, n in zip(w.begin, x.shape[2:], strict=True)))] = x
    return out


def _windows(xp: np.ndarray, w: Window) -> np.ndarray:
    """View ``(N, C, *out, *kernel)`` of every (strided, dilated) window of the padded input."""
    nd = len(w.kernel)
    eff = tuple(d * (k - 1) + 1 for k, d in zip(w.kernel, w.dilation, strict=True))
    v = sliding_window_view(xp, eff, axis=tuple(range(2, 2 + nd)))
    idx = (
        slice(None),
        slice(None),
        *(slice(0, (o - 1) * s + 1, s) for o, s in zip(w.out, w.stride, strict=True)),
        *(slice(None, None, d) for d in w.dilation),
    )
    return v[idx]


def _check_x(op: str, x: Any, allowed: Any) -> np.ndarray:
    x = np.asarray(x)
    check_dtype(op, "x", x, allowed)
    check_ndim(op, "x", x, (3, None), layout="(N, C, *spatial)")
    return x


# ---------------------------------------------------------------------------------------------
# conv_nd
# ---------------------------------------------------------------------------------------------


def _check_weight(op: str, x: np.ndarray, weight: Any, bias: Any, groups: Any, transpose: bool) -> tuple:
    w = np.asarray(weight)
    if w.dtype != x.dtype:
        raise OpError(op, "weight", f"x's dtype {x.dtype}", str(w.dtype), fix="cast weight to x's dtype")
    layout = "(C_in, C_out / groups, *kernel)" if transpose else "(C_out, C_in / groups, *kernel)"
    check_ndim(op, "weight", w, x.ndim, layout=layout)
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise OpError(op, "groups", "an int >= 1", repr(groups))
    c = x.shape[1]
    if transpose:
        if w.shape[0] != c or c % groups:
            raise OpError(
                op, "weight", f"dim 0 = C_in = {c} divisible by groups={groups}", f"shape {w.shape}"
            )
        c_out = w.shape[1] * groups
    else:
        c_out = w.shape[0]
        if c % groups or c_out % groups or w.shape[1] != c // groups:
            raise OpError(
                op, "weight", f"dim 1 = C_in / groups = {c / groups:g} and C_out divisible by {groups}",
                f"shape {w.shape}",
            )  # fmt: skip
    b = None
    if bias is not None:
        b = np.asarray(bias)
        if b.dtype != x.dtype or b.shape != (c_out,):
            raise OpError(op, "bias", f"shape ({c_out},) and dtype {x.dtype}", f"{b.dtype}{list(b.shape)}")
    return w, b, int(groups), c_out


@ieee
def _conv_nd(
    x: Any,
    weight: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> np.ndarray:
    op = "conv_nd"
    x = _check_x(op, x, FLOAT_DTYPES)
    w, b, g, c_out = _check_weight(op, x, weight, bias, groups, transpose=False)
    win = _window(op, x, w.shape[2:], stride, pads, dilation, False)
    acc = accumulation_dtype(x.dtype)
    out = grouped_correlate(_windows(_padded(x, win, acc, 0), win), w, g, win, acc)
    nd = x.ndim - 2
    if b is not None:
        out += b.astype(acc).reshape((1, c_out) + (1,) * nd)
    return out.astype(x.dtype, copy=False)


def grouped_correlate(cols: np.ndarray, w: np.ndarray, groups: int, win: Window, acc: Any) -> np.ndarray:
    """Windows ``cols`` (N, C, *out, *k) times weights ``w`` (M, C/groups, *k), one GEMM per group, in ``acc``."""
    nd, n, c, m = len(win.out), cols.shape[0], cols.shape[1], w.shape[0]
    cg, mg, kk = c // groups, m // groups, math.prod(win.kernel)
    out = np.empty((n, m, *win.out), acc)
    for gi in range(groups):
        part = np.moveaxis(cols[:, gi * cg : (gi + 1) * cg], 1, 1 + nd)  # (N, *out, Cg, *k)
        a = part.reshape(n * math.prod(win.out), cg * kk)
        wg = w[gi * mg : (gi + 1) * mg].astype(acc).reshape(mg, cg * kk)
        out[:, gi * mg : (gi + 1) * mg] = np.moveaxis((a @ wg.T).reshape(n, *win.out, mg), -1, 1)
    return out


register("conv_nd", device="ref", dtypes=FLOAT_DTYPES)(_conv_nd)
register("conv_nd", device="cpu", dtypes=FLOAT_DTYPES)(_conv_nd)


def conv_nd(
    x: Any,
    weight: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    device: str | None = None,
) -> np.ndarray:
    """N-D cross-correlation (ONNX Conv) of ``x`` (N, C, *spatial) with ``weight`` (M, C/groups, *kernel).

    ``pads`` is ONNX's ``[begin..., end...]`` (or one int); floats; returns x's dtype.

    >>> conv_nd(np.ones((1, 1, 4)), np.ones((1, 1, 2))).tolist()
    [[[2.0, 2.0, 2.0]]]
    """
    x = _check_x("conv_nd", x, FLOAT_DTYPES)
    return call(
        "conv_nd", x, weight, bias, stride=stride, pads=pads, dilation=dilation, groups=groups, device=device
    )


# ---------------------------------------------------------------------------------------------
# conv_transpose_nd
# ---------------------------------------------------------------------------------------------


@ieee
def _conv_transpose_nd(
    x: Any,
    weight: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    output_padding: Any = 0,
) -> np.ndarray:
    op = "conv_transpose_nd"
    x = _check_x(op, x, FLOAT_DTYPES)
    w, b, g, c_out = _check_weight(op, x, weight, bias, groups, transpose=True)
    nd, n = x.ndim - 2, x.shape[0]
    k = w.shape[2:]
    s, d = _ints(op, "stride", stride, nd, 1), _ints(op, "dilation", dilation, nd, 1)
    op_ = _ints(op, "output_padding", output_padding, nd, 0)
    begin, end = _pads(op, pads, nd)
    sizes = x.shape[2:]
    full = tuple(
        (i - 1) * si + (ki - 1) * di + 1 + oi for i, si, ki, di, oi in zip(sizes, s, k, d, op_, strict=True)
    )
    out_sz = tuple(f - bi - ei for f, bi, ei in zip(full, begin, end, strict=True))
    if any(o < 1 for o in out_sz):
        raise OpError(op, "pads", f"pads smaller than the full output {full}", str(begin + end))
    acc = accumulation_dtype(x.dtype)
    xa, wa = x.astype(acc), w.astype(acc)
    y = np.zeros((n, c_out, *full), acc)
    cg, mg = x.shape[1] // g, c_out // g
    for gi in range(g):
        xg = xa[:, gi * cg : (gi + 1) * cg]  # (N, Cg, *in)
        wg = wa[gi * cg : (gi + 1) * cg]  # (Cg, Mg, *k)
        for pos in itertools.product(*(range(ki) for ki in k)):
            t = np.moveaxis(np.tensordot(xg, wg[(slice(None), slice(None), *pos)], axes=([1], [0])), -1, 1)
            dst = tuple(
                slice(p * di, p * di + (i - 1) * si + 1, si)
                for p, di, i, si in zip(pos, d, sizes, s, strict=True)
            )
            y[(slice(None), slice(gi * mg, (gi + 1) * mg), *dst)] += t
    y = y[(slice(None), slice(None), *(slice(bi, bi + o) for bi, o in zip(begin, out_sz, strict=True)))]
    if b is not None:
        y = y + b.astype(acc).reshape((1, c_out) + (1,) * nd)
    return np.ascontiguousarray(y).astype(x.dtype, copy=False)


register("conv_transpose_nd", device="ref", dtypes=FLOAT_DTYPES)(_conv_transpose_nd)
register("conv_transpose_nd", device="cpu", dtypes=FLOAT_DTYPES)(_conv_transpose_nd)


def conv_transpose_nd(
    x: Any,
    weight: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    output_padding: Any = 0,
    device: str | None = None,
) -> np.ndarray:
    """N-D transposed convolution (ONNX ConvTranspose) of ``x`` (N, C, *spatial) with ``weight``
    (C, M/groups, *kernel): output size ``stride*(in-1) + output_padding + dilation*(k-1) + 1 - pads``.

    >>> conv_transpose_nd(np.ones((1, 1, 2)), np.ones((1, 1, 2))).tolist()
    [[[1.0, 2.0, 1.0]]]
    """
    x = _check_x("conv_transpose_nd", x, FLOAT_DTYPES)
    return call(
        "conv_transpose_nd", x, weight, bias, stride=stride, pads=pads, dilation=dilation, groups=groups,
        output_padding=output_padding, device=device,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# pooling
# ---------------------------------------------------------------------------------------------


def _lowest(dtype: np.dtype) -> Any:
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _max_dtype(x: np.ndarray) -> np.dtype:
    """Exact compare dtype: numpy's own floats and ints as they are, bfloat16/float8 in float32 (exact)."""
    return x.dtype if x.dtype.kind in "iuf" and x.dtype.type.__module__ == "numpy" else np.dtype(np.float32)


def _flat_indices(x: np.ndarray, win: Window, arg: np.ndarray, storage_order: int) -> np.ndarray:
    """ONNX MaxPool Indices: the flat input index (N and C included) of each window's maximum."""
    nd = x.ndim - 2
    kidx = np.unravel_index(arg, win.kernel)  # per spatial dim, shape (N, C, *out)
    sizes = x.shape[2:]
    coords = []
    for j in range(nd):
        o = np.arange(win.out[j]).reshape((1, 1, *tuple(-1 if i == j else 1 for i in range(nd))))
        coords.append(o * win.stride[j] - win.begin[j] + kidx[j] * win.dilation[j])
    if storage_order:  # column-major over the spatial dims
        flat, mul = np.zeros(arg.shape, np.int64), 1
        for j in range(nd):
            flat += coords[j] * mul
            mul *= sizes[j]
    else:
        flat = np.ravel_multi_index(tuple(coords), sizes, mode="wrap").astype(np.int64)
    n_, c_ = (
        np.arange(x.shape[0]).reshape((-1, 1) + (1,) * nd),
        np.arange(x.shape[1]).reshape((1, -1) + (1,) * nd),
    )
    return (n_ * x.shape[1] + c_) * math.prod(sizes) + flat


@ieee
def _max_pool_nd(
    x: Any,
    *,
    kernel_size: Any,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
    storage_order: int = 0,
) -> Any:
    op = "max_pool_nd"
    x = _check_x(op, x, NUMERIC)
    win = _window(op, x, kernel_size, stride, pads, dilation, ceil_mode)
    dt = _max_dtype(x)
    v = _windows(_padded(x, win, dt, _lowest(dt)), win)
    nd = x.ndim - 2
    flat = v.reshape(*v.shape[: 2 + nd], -1)
    out = flat.max(axis=-1).astype(x.dtype)
    if not return_indices:
        return out
    if storage_order not in (0, 1):
        raise OpError(op, "storage_order", "0 (row-major) or 1 (column-major)", repr(storage_order))
    return out, _flat_indices(x, win, flat.argmax(axis=-1), storage_order)


register("max_pool_nd", device="ref", dtypes=NUMERIC)(_max_pool_nd)
register("max_pool_nd", device="cpu", dtypes=NUMERIC)(_max_pool_nd)


def max_pool_nd(
    x: Any,
    *,
    kernel_size: Any,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
    storage_order: int = 0,
    device: str | None = None,
) -> Any:
    """N-D max pooling (ONNX MaxPool); floats and ints, exact. With ``return_indices`` also the int64
    flat index of each maximum in x (ONNX Indices; ``storage_order`` 1: column-major spatial dims).

    >>> max_pool_nd(np.array([[[1.0, 3.0, 2.0]]]), kernel_size=2).tolist()
    [[[3.0, 3.0]]]
    """
    x = _check_x("max_pool_nd", x, NUMERIC)
    return call(
        "max_pool_nd", x, kernel_size=kernel_size, stride=stride, pads=pads, dilation=dilation,
        ceil_mode=ceil_mode, return_indices=return_indices, storage_order=storage_order, device=device,
    )  # fmt: skip


def _divisor(x: np.ndarray, win: Window, count_include_pad: bool, acc: np.dtype) -> np.ndarray:
    """Per-output divisor: real elements in the window, or (count_include_pad) elements inside input + pads."""
    nd, zeros = len(win.kernel), (0,) * len(win.kernel)
    if count_include_pad:  # ones over input + pads; only ceil_mode's extra end counts as outside
        sizes = tuple(n + b + e for n, b, e in zip(x.shape[2:], win.begin, win.end, strict=True))
        only_extra = Window(win.kernel, win.stride, zeros, zeros, win.dilation, win.out, win.extra)
        grid = _padded(np.ones((1, 1, *sizes), acc), only_extra, acc, 0)
    else:
        grid = _padded(np.ones((1, 1, *x.shape[2:]), acc), win, acc, 0)
    return _windows(grid, win).sum(axis=tuple(range(-nd, 0)))


@ieee
def _avg_pool_nd(
    x: Any,
    *,
    kernel_size: Any,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    count_include_pad: bool = False,
) -> np.ndarray:
    op = "avg_pool_nd"
    x = _check_x(op, x, FLOAT_DTYPES)
    win = _window(op, x, kernel_size, stride, pads, dilation, ceil_mode)
    acc = accumulation_dtype(x.dtype)
    axes = tuple(range(-len(win.kernel), 0))
    total = _windows(_padded(x, win, acc, 0), win).sum(axis=axes)
    return (total / _divisor(x, win, bool(count_include_pad), acc)).astype(x.dtype)


register("avg_pool_nd", device="ref", dtypes=FLOAT_DTYPES)(_avg_pool_nd)
register("avg_pool_nd", device="cpu", dtypes=FLOAT_DTYPES)(_avg_pool_nd)


def avg_pool_nd(
    x: Any,
    *,
    kernel_size: Any,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    count_include_pad: bool = False,
    device: str | None = None,
) -> np.ndarray:
    """N-D average pooling (ONNX AveragePool, dilations included): the divisor counts the real input
    elements of each window, or with ``count_include_pad`` those inside input + pads (never the
    extra end that ceil_mode adds).

    >>> avg_pool_nd(np.array([[[1.0, 3.0, 2.0]]]), kernel_size=2).tolist()
    [[[2.0, 2.5]]]
    """
    x = _check_x("avg_pool_nd", x, FLOAT_DTYPES)
    return call(
        "avg_pool_nd", x, kernel_size=kernel_size, stride=stride, pads=pads, dilation=dilation,
        ceil_mode=ceil_mode, count_include_pad=count_include_pad, device=device,
    )  # fmt: skip


@ieee
def _lp_pool_nd(
    x: Any,
    *,
    kernel_size: Any,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    p: float = 2,
) -> np.ndarray:
    op = "lp_pool_nd"
    x = _check_x(op, x, FLOAT_DTYPES)
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or not p > 0:
        raise OpError(op, "p", "a number > 0", repr(p))
    win = _window(op, x, kernel_size, stride, pads, dilation, ceil_mode)
    acc = accumulation_dtype(x.dtype)
    v = _windows(_padded(np.abs(x.astype(acc)), win, acc, 0), win)
    s = np.power(v, p).sum(axis=tuple(range(-len(win.kernel), 0)))
    return np.power(s, 1.0 / p).astype(x.dtype)


register("lp_pool_nd", device="ref", dtypes=FLOAT_DTYPES)(_lp_pool_nd)
register("lp_pool_nd", device="cpu", dtypes=FLOAT_DTYPES)(_lp_pool_nd)


def lp_pool_nd(
    x: Any,
    *,
    kernel_size: Any,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    p: float = 2,
    device: str | None = None,
) -> np.ndarray:
    """N-D Lp pooling (ONNX LpPool): ``sum(|x|^p) ^ (1/p)`` over each window (pads count as zeros).

    >>> lp_pool_nd(np.array([[[3.0, 4.0]]]), kernel_size=2).tolist()
    [[[5.0]]]
    """
    x = _check_x("lp_pool_nd", x, FLOAT_DTYPES)
    return call(
        "lp_pool_nd", x, kernel_size=kernel_size, stride=stride, pads=pads, dilation=dilation,
        ceil_mode=ceil_mode, p=p, device=device,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# max_unpool_nd
# ---------------------------------------------------------------------------------------------


def _max_unpool_nd(x: Any, indices: Any, *, output_size: Any) -> np.ndarray:
    op = "max_unpool_nd"
    x = _check_x(op, x, NUMERIC)
    idx = np.asarray(indices)
    check_dtype(op, "indices", idx, "index")
    if idx.shape != x.shape:
        raise OpError(op, "indices", f"x's shape {x.shape}", str(idx.shape))
    size = _ints(op, "output_size", output_size, x.ndim - 2, 1)
    y = np.zeros((*x.shape[:2], *size), x.dtype)
    if idx.size and (idx.min() < 0 or idx.max() >= y.size):
        raise OpError(
            op, "indices", f"flat indices in [0, {y.size}) of the output", f"[{idx.min()}, {idx.max()}]"
        )
    y.reshape(-1)[idx.reshape(-1)] = x.reshape(-1)
    return y


register("max_unpool_nd", device="ref", dtypes=NUMERIC)(_max_unpool_nd)
register("max_unpool_nd", device="cpu", dtypes=NUMERIC)(_max_unpool_nd)


def max_unpool_nd(x: Any, indices: Any, *, output_size: Any, device: str | None = None) -> np.ndarray:
    """Partial inverse of :func:`max_pool_nd` (ONNX MaxUnpool): zeros of shape ``(N, C, *output_size)``
    with ``x``'s values written at the flat ``indices`` (as MaxPool's Indices output gives them).

    >>> max_unpool_nd(np.array([[[5.0]]]), np.array([[[1]]]), output_size=(2,)).tolist()
    [[[0.0, 5.0]]]
    """
    x = _check_x("max_unpool_nd", x, NUMERIC)
    return call("max_unpool_nd", x, indices, output_size=output_size, device=device)
