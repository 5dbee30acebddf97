"""Sampling and rearranging kernels — grid_sample, affine_grid, col2im, center_crop_pad, deform_conv,
tensor_scatter, causal_conv_with_state — on ``ref`` and ``cpu`` (one numpy implementation each).

Semantics follow the ONNX operator specification (GridSample-22, AffineGrid-20, Col2Im-18,
CenterCropPad-18, DeformConv-22, TensorScatter-24, CausalConvWithState-27). Grid sampling works on
any number of spatial dims: each output point sums the taps of its interpolation kernel (1 nearest,
2 linear, 4 Keys-cubic with a = -0.75 per dim), each tap's index mapped by the padding mode (zeros:
out of range reads 0; border: clamped; reflection: mirrored at the borders). Low precision computes
in float32 and returns the input dtype. Cubic sampling with border padding clamps each tap, not the
coordinate, as PyTorch and onnxruntime do (onnx's reference evaluator clamps the coordinate first).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._dtypes import FLOAT_DTYPES, NUMERIC_DTYPES, accumulation_dtype
from .._errors import OpError, check_dtype
from .._registry import call, register

__all__ = [
    "affine_grid", "causal_conv_with_state", "center_crop_pad", "col2im", "deform_conv", "grid_sample",
    "tensor_scatter",
]  # fmt: skip

GRID_MODES = {
    "linear": "linear",
    "bilinear": "linear",
    "nearest": "nearest",
    "cubic": "cubic",
    "bicubic": "cubic",
}
PADDING_MODES = ("zeros", "border", "reflection")
SCATTER_MODES = ("linear", "circular")
CONV_ACTIVATIONS = ("none", "silu", "swish")


# --------------------------------------------------------------------------- grid sampling core


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Mirror ``x`` at ``lo``/``hi`` until it lies in ``[lo, hi]``."""
    rng = hi - lo
    if rng <= 0:
        return np.full_like(x, lo)
    below, above = x < lo, x > hi
    dx = np.where(below, lo - x, x - hi)
    n = np.floor(dx / rng)
    r = dx - n * rng
    even = n % 2 == 0
    out = np.where(below, np.where(even, lo + r, hi - r), np.where(even, hi - r, lo + r))
    return np.where(below | above, out, x)


def _cubic(f: np.ndarray) -> list[np.ndarray]:
    """Keys cubic weights (a = -0.75) of the taps at -1, 0, 1, 2 for fraction ``f``."""
    a = -0.75

    def near(t: np.ndarray) -> np.ndarray:
        return ((a + 2) * t - (a + 3)) * t * t + 1

    def far(t: np.ndarray) -> np.ndarray:
        return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a

    return [far(f + 1), near(f), near(1 - f), far(2 - f)]


def _taps(x: np.ndarray, mode: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """(integer index, weight) of each interpolation tap along one dim."""
    if mode == "nearest":
        return [(np.trunc(x).astype(np.int64), np.ones_like(x))]
    x0 = np.floor(x)
    f = x - x0
    i0 = x0.astype(np.int64)
    if mode == "linear":
        return [(i0, 1 - f), (i0 + 1, f)]
    return [(i0 + k - 1, w) for k, w in enumerate(_cubic(f))]


def _sample(
    xt: np.ndarray,
    coords: Sequence[np.ndarray],
    mode: str,
    padding: str,
    bounds: Sequence[tuple[float, float]],
) -> np.ndarray:
    """``xt`` (N, *D, C) sampled at pixel coordinates ``coords`` (one (N, *O) array per dim) -> (N, *O, C)."""
    dims = xt.shape[1:-1]
    n_idx = np.arange(xt.shape[0]).reshape((-1,) + (1,) * (coords[0].ndim - 1))
    per_dim = []
    for c, size, (lo, hi) in zip(coords, dims, bounds, strict=True):
        taps = []
        for idx, w in _taps(c, mode):
            if padding == "zeros":
                w = np.where((idx >= 0) & (idx < size), w, 0)
            elif padding == "reflection":
                idx = np.trunc(_reflect(idx.astype(c.dtype), lo, hi)).astype(np.int64)
            taps.append((np.clip(idx, 0, size - 1), w))
        per_dim.append(taps)
    out = np.zeros((*coords[0].shape, xt.shape[-1]), xt.dtype)
    for combo in itertools.product(*per_dim):
        w = np.prod(np.stack([t[1] for t in combo]), axis=0).astype(xt.dtype)
        out += w[..., None] * xt[(n_idx, *(t[0] for t in combo))]
    return out


@register("grid_sample", device="ref", dtypes=FLOAT_DTYPES)
@register("grid_sample", device="cpu", dtypes=FLOAT_DTYPES)
def grid_sample_ref(
    x: Any, grid: Any, *, mode: str = "linear", padding_mode: str = "zeros", align_corners: bool = False
) -> np.ndarray:
    op = "grid_sample"
    x, grid = np.asarray(x), np.asarray(grid)
    check_dtype(op, "x", x, FLOAT_DTYPES)
    nd = x.ndim - 2
    if nd < 1 or grid.ndim != x.ndim or grid.shape[-1] != nd or grid.shape[0] != x.shape[0]:
        raise OpError(
            op, "grid", f"shape (N={x.shape[0]}, *out, {nd}) for x {x.shape}", str(grid.shape),
        )  # fmt: skip
    adt = accumulation_dtype(x.dtype)
    cdt = np.float64 if grid.dtype == np.float64 else np.float32
    dims = x.shape[2:]
    coords, bounds = [], []
    for i, size in enumerate(dims):
        u = grid[..., nd - 1 - i].astype(cdt)  # grid's last entry is the innermost (x) dim
        c = (u + 1) / 2 * (size - 1) if align_corners else ((u + 1) * size - 1) / 2
        lo, hi = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        if mode == "nearest":
            c = np.rint(c)
        if padding_mode == "border" and mode != "cubic":  # cubic clamps each tap only (PyTorch, onnxruntime)
            c = np.where((c < lo) | (c > hi), np.clip(c, 0, size - 1), c)
        elif padding_mode == "reflection":
            c = _reflect(c, lo, hi)
        coords.append(c.astype(cdt))
        bounds.append((lo, hi))
    xt = np.moveaxis(x.astype(adt), 1, -1)  # (N, *D, C)
    y = _sample(xt, coords, mode, padding_mode, bounds)
    return np.moveaxis(y, -1, 1).astype(x.dtype)


def grid_sample(
    x: Any, grid: Any, *, mode: str = "linear", padding_mode: str = "zeros", align_corners: bool = False,
    device: str | None = None,
) -> np.ndarray:  # fmt: skip
    """ONNX GridSample: ``x`` (N, C, *D) sampled at ``grid`` (N, *out, nd) in [-1, 1] -> (N, C, *out).

    ``mode`` linear/nearest/cubic (bilinear/bicubic accepted); ``padding_mode`` zeros/border/reflection.

    >>> x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    >>> grid_sample(x, np.zeros((1, 1, 1, 2), np.float32)).ravel().tolist()  # the centre
    [1.5]
    """
    check_dtype("grid_sample", "x", np.asarray(x), FLOAT_DTYPES)
    if mode not in GRID_MODES:
        raise OpError("grid_sample", "mode", f"one of {sorted(GRID_MODES)}", repr(mode))
    if padding_mode not in PADDING_MODES:
        raise OpError("grid_sample", "padding_mode", f"one of {PADDING_MODES}", repr(padding_mode))
    return call(
        "grid_sample", x, grid, mode=GRID_MODES[mode], padding_mode=padding_mode,
        align_corners=bool(align_corners), device=device,
    )  # fmt: skip


# --------------------------------------------------------------------------- affine_grid


def _base_coords(size: int, align_corners: bool) -> np.ndarray:
    i = np.arange(size, dtype=np.float64)
    if align_corners:
        return -1 + 2 * i / (size - 1) if size > 1 else np.full(size, -1.0)
    return -1 + (2 * i + 1) / size


@register("affine_grid", device="ref", dtypes=FLOAT_DTYPES)
@register("affine_grid", device="cpu", dtypes=FLOAT_DTYPES)
def affine_grid_ref(theta: Any, size: Any, *, align_corners: bool = False) -> np.ndarray:
    op = "affine_grid"
    theta = np.asarray(theta)
    check_dtype(op, "theta", theta, FLOAT_DTYPES)
    size = [int(s) for s in np.asarray(size).ravel()]
    nd = len(size) - 2
    if nd not in (2, 3) or theta.shape != (size[0], nd, nd + 1):
        raise OpError(
            op,
            "theta",
            f"(N, {nd}, {nd + 1}) with N = size[0] for size {size} (2-D or 3-D)",
            str(theta.shape),
        )
    spatial = size[2:]
    axes = np.meshgrid(*[_base_coords(s, align_corners) for s in spatial], indexing="ij")
    homo = np.stack([*axes[::-1], np.ones(spatial)], axis=-1).reshape(-1, nd + 1)  # (P, nd+1): x, y, (z), 1
    adt = accumulation_dtype(theta.dtype)
    grid = np.einsum("nij,pj->npi", theta.astype(adt), homo.astype(adt))
    return grid.reshape(size[0], *spatial, nd).astype(theta.dtype)


def affine_grid(
    theta: Any, size: Any, *, align_corners: bool = False, device: str | None = None
) -> np.ndarray:
    """ONNX AffineGrid: sampling grid (N, *spatial, nd) of the affine maps ``theta`` (N, nd, nd+1).

    >>> affine_grid(np.array([[[1, 0, 0], [0, 1, 0]]], np.float32), [1, 1, 1, 2]).tolist()
    [[[[-0.5, 0.0], [0.5, 0.0]]]]
    """
    check_dtype("affine_grid", "theta", np.asarray(theta), FLOAT_DTYPES)
    return call("affine_grid", theta, size, align_corners=bool(align_corners), device=device)


# --------------------------------------------------------------------------- col2im


@register("col2im", device="ref", dtypes=NUMERIC_DTYPES)
@register("col2im", device="cpu", dtypes=NUMERIC_DTYPES)
def col2im_ref(
    x: Any, image_shape: Any, block_shape: Any, *, dilations: Sequence[int] | None = None,
    pads: Sequence[int] | None = None, strides: Sequence[int] | None = None,
) -> np.ndarray:  # fmt: skip
    op = "col2im"
    x = np.asarray(x)
    img = [int(v) for v in np.asarray(image_shape).ravel()]
    blk = [int(v) for v in np.asarray(block_shape).ravel()]
    nd = len(img)
    dil = list(dilations or [1] * nd)
    st = list(strides or [1] * nd)
    pd = list(pads or [0] * (2 * nd))
    nblk = int(np.prod(blk))
    if x.ndim != 3 or len(blk) != nd or x.shape[1] % nblk:
        raise OpError(op, "x", f"(N, C*{nblk}, L) with block_shape of {nd} dims", f"{x.shape}, block {blk}")
    out = [(img[i] + pd[i] + pd[i + nd] - dil[i] * (blk[i] - 1) - 1) // st[i] + 1 for i in range(nd)]
    if int(np.prod(out)) != x.shape[2]:
        raise OpError(op, "x", f"L = {int(np.prod(out))} blocks for image {img}", f"L = {x.shape[2]}")
    n, c = x.shape[0], x.shape[1] // nblk
    adt = accumulation_dtype(x.dtype) if x.dtype.kind == "f" else x.dtype
    cols = x.astype(adt).reshape(n, c, *blk, *out)
    padded = np.zeros((n, c, *[img[i] + pd[i] + pd[i + nd] for i in range(nd)]), adt)
    for k in itertools.product(*[range(b) for b in blk]):
        sl = tuple(slice(k[i] * dil[i], k[i] * dil[i] + st[i] * (out[i] - 1) + 1, st[i]) for i in range(nd))
        padded[(slice(None), slice(None), *sl)] += cols[(slice(None), slice(None), *k)]
    crop = tuple(slice(pd[i], pd[i] + img[i]) for i in range(nd))
    return padded[(slice(None), slice(None), *crop)].astype(x.dtype)


def col2im(
    x: Any, image_shape: Any, block_shape: Any, *, dilations: Sequence[int] | None = None,
    pads: Sequence[int] | None = None, strides: Sequence[int] | None = None, device: str | None = None,
) -> np.ndarray:  # fmt: skip
    """ONNX Col2Im: sum the sliding blocks ``x`` (N, C*prod(block), L) back into an image (N, C, *image).

    >>> col2im(np.ones((1, 2, 2), np.float32), [3], [2]).tolist()
    [[[1.0, 2.0, 1.0]]]
    """
    return call(
        "col2im", x, image_shape, block_shape, dilations=dilations, pads=pads, strides=strides, device=device
    )


# --------------------------------------------------------------------------- center_crop_pad


@register("center_crop_pad", device="ref")
@register("center_crop_pad", device="cpu")
def center_crop_pad_ref(x: Any, shape: Any, *, axes: Sequence[int] | None = None) -> np.ndarray:
    op = "center_crop_pad"
    x = np.asarray(x)
    shape = [int(v) for v in np.asarray(shape).ravel()]
    axes = list(range(x.ndim)) if axes is None else [int(a) for a in axes]
    if len(axes) != len(shape) or any(not -x.ndim <= a < x.ndim for a in axes):
        raise OpError(op, "shape", f"one size per axis {axes} of a rank-{x.ndim} input", str(shape))
    src = [slice(None)] * x.ndim
    dst = [slice(None)] * x.ndim
    new = list(x.shape)
    for a, s in zip(axes, shape, strict=True):
        a %= x.ndim
        d = x.shape[a]
        new[a] = s
        if s < d:
            st = (d - s) // 2
            src[a] = slice(st, st + s)
        elif s > d:
            st = (s - d) // 2
            dst[a] = slice(st, st + d)
    out = np.zeros(new, x.dtype)
    out[tuple(dst)] = x[tuple(src)]
    return out


def center_crop_pad(
    x: Any, shape: Any, *, axes: Sequence[int] | None = None, device: str | None = None
) -> np.ndarray:
    """ONNX CenterCropPad: crop or zero-pad ``axes`` (default all) to ``shape``, keeping the centre.

    >>> center_crop_pad(np.arange(5), [3]).tolist()
    [1, 2, 3]
    """
    return call("center_crop_pad", x, shape, axes=axes, device=device)


# --------------------------------------------------------------------------- deform_conv


@register("deform_conv", device="ref", dtypes=FLOAT_DTYPES)
@register("deform_conv", device="cpu", dtypes=FLOAT_DTYPES)
def deform_conv_ref(
    x: Any, w: Any, offset: Any, b: Any = None, mask: Any = None, *, dilations: Sequence[int] | None = None,
    group: int = 1, offset_group: int = 1, pads: Sequence[int] | None = None, strides: Sequence[int] | None = None,
) -> np.ndarray:  # fmt: skip
    op = "deform_conv"
    x, w, offset = np.asarray(x), np.asarray(w), np.asarray(offset)
    check_dtype(op, "x", x, FLOAT_DTYPES)
    nd = x.ndim - 2
    ks = list(w.shape[2:])
    dil, st = list(dilations or [1] * nd), list(strides or [1] * nd)
    pd = list(pads or [0] * (2 * nd))
    n, ic = x.shape[:2]
    oc = w.shape[0]
    nk = int(np.prod(ks))
    if ic != w.shape[1] * group or oc % group or ic % offset_group:
        raise OpError(
            op,
            "w",
            f"(OC, C/group, *k) with C={ic}, group={group}, offset_group={offset_group}",
            str(w.shape),
        )
    if offset.ndim != x.ndim or offset.shape[1] != offset_group * nk * nd:
        raise OpError(op, "offset", f"(N, {offset_group * nk * nd}, *out)", str(offset.shape))
    out = offset.shape[2:]
    adt = accumulation_dtype(x.dtype)
    off = offset.astype(adt).reshape(n, offset_group, nk, nd, *out)
    m = np.ones((n, offset_group, nk, *out), adt) if mask is None else np.asarray(mask).astype(adt)
    m = m.reshape(n, offset_group, nk, *out)
    base = np.meshgrid(
        *[np.arange(o) * s - p for o, s, p in zip(out, st, pd[:nd], strict=True)], indexing="ij"
    )
    kpos = list(itertools.product(*[range(k) for k in ks]))
    cpg = ic // offset_group
    cols = np.zeros((n, ic, nk, *out), adt)  # sampled input per kernel tap
    xt = np.moveaxis(x.astype(adt), 1, -1)  # (N, *D, C)
    bounds = [(0.0, s - 1.0) for s in x.shape[2:]]
    for g in range(offset_group):
        xg = xt[..., g * cpg : (g + 1) * cpg]
        for t, kp in enumerate(kpos):
            coords = [base[i][None] + kp[i] * dil[i] + off[:, g, t, i] for i in range(nd)]
            v = _sample(xg, coords, "linear", "zeros", bounds) * m[:, g, t][..., None]  # (N, *out, cpg)
            cols[:, g * cpg : (g + 1) * cpg, t] = np.moveaxis(v, -1, 1)
    icg, ocg = ic // group, oc // group
    wf = w.astype(adt).reshape(oc, icg, nk)
    y = np.concatenate(
        [np.einsum("nckp,ock->nop", cols[:, gi * icg : (gi + 1) * icg].reshape(n, icg, nk, -1),
                   wf[gi * ocg : (gi + 1) * ocg]) for gi in range(group)],
        axis=1,
    ).reshape(n, oc, *out)  # fmt: skip
    if b is not None:
        y = y + np.asarray(b).astype(adt).reshape(1, oc, *[1] * nd)
    return y.astype(x.dtype)


def deform_conv(
    x: Any, w: Any, offset: Any, b: Any = None, mask: Any = None, *, dilations: Sequence[int] | None = None,
    group: int = 1, offset_group: int = 1, pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None, device: str | None = None,
) -> np.ndarray:  # fmt: skip
    """ONNX DeformConv: convolution whose taps sample ``x`` bilinearly at learned ``offset``s (times ``mask``).

    ``offset`` is (N, offset_group * prod(kernel) * nd, *out) with (dh, dw) per tap; zero outside ``x``.
    """
    check_dtype("deform_conv", "x", np.asarray(x), FLOAT_DTYPES)
    return call(
        "deform_conv", x, w, offset, b, mask, dilations=dilations, group=int(group),
        offset_group=int(offset_group), pads=pads, strides=strides, device=device,
    )  # fmt: skip


# --------------------------------------------------------------------------- tensor_scatter


@register("tensor_scatter", device="ref")
@register("tensor_scatter", device="cpu")
def tensor_scatter_ref(
    cache: Any, update: Any, write_indices: Any = None, *, mode: str = "linear", axis: int = -2
) -> np.ndarray:
    op = "tensor_scatter"
    cache, update = np.asarray(cache), np.asarray(update)
    if cache.ndim != update.ndim or not -cache.ndim <= axis < cache.ndim:
        raise OpError(
            op, "update", f"rank {cache.ndim} like the cache, axis in range", f"{update.shape}, axis={axis}"
        )
    ax = axis % cache.ndim
    if ax == 0:
        raise OpError(op, "axis", "a sequence axis after the batch axis 0", str(axis))
    for i, (c, u) in enumerate(zip(cache.shape, update.shape, strict=True)):
        if (i != ax and c != u) or (i == ax and u > c):
            raise OpError(
                op,
                "update",
                f"the cache's shape {cache.shape} (at most as long on axis {ax})",
                str(update.shape),
            )
    idx = (
        np.zeros(cache.shape[0], np.int64)
        if write_indices is None
        else np.asarray(write_indices).astype(np.int64)
    )
    out = cache.copy()
    view, upd = np.moveaxis(out, ax, 1), np.moveaxis(update, ax, 1)
    length = cache.shape[ax]
    for bi in range(cache.shape[0]):
        pos = idx[bi] + np.arange(update.shape[ax])
        if mode == "circular":
            pos %= length
        elif pos.size and (pos[0] < 0 or pos[-1] >= length):
            raise OpError(
                op, "write_indices", f"writes inside the cache length {length}", f"{pos[0]}..{pos[-1]}"
            )
        view[bi, pos] = upd[bi]
    return out


def tensor_scatter(
    cache: Any, update: Any, write_indices: Any = None, *, mode: str = "linear", axis: int = -2,
    device: str | None = None,
) -> np.ndarray:  # fmt: skip
    """ONNX TensorScatter: write ``update`` into a copy of the KV ``cache`` at per-batch ``write_indices``
    along ``axis`` (``circular`` wraps around the cache length).

    >>> tensor_scatter(np.zeros((1, 3, 1)), np.ones((1, 1, 1)), [1]).ravel().tolist()
    [0.0, 1.0, 0.0]
    """
    if mode not in SCATTER_MODES:
        raise OpError("tensor_scatter", "mode", f"one of {SCATTER_MODES}", repr(mode))
    return call("tensor_scatter", cache, update, write_indices, mode=mode, axis=int(axis), device=device)


# --------------------------------------------------------------------------- causal_conv_with_state


@register("causal_conv_with_state", device="ref", dtypes=FLOAT_DTYPES)
@register("causal_conv_with_state", device="cpu", dtypes=FLOAT_DTYPES)
def causal_conv_with_state_ref(
    x: Any, w: Any, b: Any = None, past_state: Any = None, *, activation: str = "none"
) -> tuple[np.ndarray, np.ndarray]:
    op = "causal_conv_with_state"
    x, w = np.asarray(x), np.asarray(w)
    check_dtype(op, "x", x, FLOAT_DTYPES)
    if x.ndim != 3 or w.ndim != 3 or w.shape[:2] != (x.shape[1], 1):
        raise OpError(
            op,
            "w",
            f"(C={x.shape[1] if x.ndim == 3 else '?'}, 1, k) for x (B, C, L)",
            f"x {x.shape}, w {w.shape}",
        )
    bsz, c, length = x.shape
    k = w.shape[2]
    pad = np.zeros((bsz, c, k - 1), x.dtype) if past_state is None else np.asarray(past_state)
    if pad.shape != (bsz, c, k - 1):
        raise OpError(op, "past_state", f"shape ({bsz}, {c}, {k - 1})", str(pad.shape))
    adt = accumulation_dtype(x.dtype)
    padded = np.concatenate([pad.astype(x.dtype), x], axis=2)
    pa, wa = padded.astype(adt), w.astype(adt)
    y = np.zeros((bsz, c, length), adt)
    for j in range(k):
        y += wa[None, :, 0, j, None] * pa[:, :, j : j + length]
    if b is not None:
        y += np.asarray(b).astype(adt)[None, :, None]
    y = y.astype(x.dtype).astype(adt)  # the conv output is rounded before the activation (spec's order)
    if activation in ("silu", "swish"):
        y = y / (1 + np.exp(-y))
    return y.astype(x.dtype), padded[:, :, padded.shape[2] - (k - 1) :]


def causal_conv_with_state(
    x: Any,
    w: Any,
    b: Any = None,
    past_state: Any = None,
    *,
    activation: str = "none",
    device: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """ONNX CausalConvWithState: depthwise causal conv1d over ``past_state ++ x``; ``(y, present_state)``.

    >>> y, s = causal_conv_with_state(np.ones((1, 1, 3), np.float32), np.ones((1, 1, 2), np.float32))
    >>> y.ravel().tolist(), s.shape
    ([1.0, 2.0, 2.0], (1, 1, 1))
    """
    check_dtype("causal_conv_with_state", "x", np.asarray(x), FLOAT_DTYPES)
    if activation not in CONV_ACTIVATIONS:
        raise OpError("causal_conv_with_state", "activation", f"one of {CONV_ACTIVATIONS}", repr(activation))
    return call("causal_conv_with_state", x, w, b, past_state, activation=activation, device=device)
