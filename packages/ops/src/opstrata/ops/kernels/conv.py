"""conv2d on ``ref`` (a sum over kernel positions) and ``cpu`` (im2col + one BLAS matmul per group).

Semantics follow torch ``F.conv2d`` / ONNX Conv on NCHW images: cross-correlation with stride,
zero padding, dilation and groups; weight ``(C_out, C_in / groups, kH, kW)``. The cpu kernel is
the classic im2col lowering (Chellapilla et al., 2006): windows gathered with
``sliding_window_view``, then a batched GEMM. Low precision accumulates in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .._dtypes import FLOAT_DTYPES, accumulation_dtype
from .._errors import OpError, check_dtype, check_ndim
from .._registry import call, register
from .matmul import check_same_dtype

__all__ = ["conv2d"]

Pair = tuple[int, int]
Pads = tuple[int, int, int, int]  # (top, left, bottom, right), the ONNX pads order for 2-D


# ---------------------------------------------------------------------------------------------
# attribute parsing shared with pooling
# ---------------------------------------------------------------------------------------------


def as_pair(op: str, name: str, value: Any, *, minimum: int = 1) -> Pair:
    """``3`` -> ``(3, 3)``; ``(2, 3)`` stays; each entry an int >= ``minimum``."""
    vals = (value, value) if isinstance(value, (int, np.integer)) else tuple(value)
    if len(vals) != 2 or not all(isinstance(v, (int, np.integer)) and v >= minimum for v in vals):
        raise OpError(op, name, f"an int >= {minimum} or a pair of them", repr(value))
    return int(vals[0]), int(vals[1])


def as_pads(op: str, value: Any) -> Pads:
    """``p`` | ``(ph, pw)`` | ``(top, left, bottom, right)`` -> ``(top, left, bottom, right)``."""
    vals = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if len(vals) not in (1, 2, 4) or not all(isinstance(v, (int, np.integer)) and v >= 0 for v in vals):
        raise OpError(op, "padding", "an int >= 0, (ph, pw) or (top, left, bottom, right)", repr(value))
    if len(vals) == 1:
        vals = vals * 4
    elif len(vals) == 2:
        vals = vals * 2
    return int(vals[0]), int(vals[1]), int(vals[2]), int(vals[3])


def out_size(
    size: int, kernel: int, stride: int, dilation: int, pad0: int, pad1: int, ceil: bool = False
) -> int:
    """Output length along one axis (torch's formula; ``ceil`` drops a last window starting in the end pad)."""
    span = size + pad0 + pad1 - dilation * (kernel - 1) - 1
    if span < 0:
        return 0
    if not ceil:
        return span // stride + 1
    n = -(-span // stride) + 1
    return n - 1 if (n - 1) * stride >= size + pad0 else n


def pad_array(x: np.ndarray, pads: Pads, dtype: np.dtype, fill: float, extra: Pair = (0, 0)) -> np.ndarray:
    """Copy of NCHW ``x`` in ``dtype`` padded with ``fill`` (plus ``extra`` rows/cols bottom/right)."""
    top, left, bottom, right = pads
    n, c, h, w = x.shape
    out = np.full((n, c, h + top + bottom + extra[0], w + left + right + extra[1]), fill, dtype)
    out[:, :, top : top + h, left : left + w] = x
    return out


# ---------------------------------------------------------------------------------------------
# conv2d validation
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConvGeom:
    """Resolved conv2d attributes and output size."""

    stride: Pair
    pads: Pads
    dilation: Pair
    groups: int
    out_hw: Pair


def _check_conv(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
) -> ConvGeom:
    op = "conv2d"
    check_dtype(op, "x", x, FLOAT_DTYPES)
    check_same_dtype(op, "x", x, "weight", weight)
    check_ndim(op, "x", x, 4, layout="NCHW")
    check_ndim(op, "weight", weight, 4, layout="[C_out, C_in / groups, kH, kW]")
    if not isinstance(groups, (int, np.integer)) or groups < 1:
        raise OpError(op, "groups", "an int >= 1", repr(groups))
    c, o = x.shape[1], weight.shape[0]
    if c % groups or o % groups:
        raise OpError(op, "groups", f"a divisor of C_in ({c}) and C_out ({o})", str(groups))
    if weight.shape[1] != c // groups:
        raise OpError(op, "weight", f"dim 1 = C_in / groups = {c // groups}", f"shape {weight.shape}")
    if bias is not None:
        check_same_dtype(op, "x", x, "bias", bias)
        if bias.shape != (o,):
            raise OpError(op, "bias", f"shape ({o},) (C_out)", str(bias.shape))
    st, dil, pads = as_pair(op, "stride", stride), as_pair(op, "dilation", dilation), as_pads(op, padding)
    kh, kw = weight.shape[2:]
    ho = out_size(x.shape[2], kh, st[0], dil[0], pads[0], pads[2])
    wo = out_size(x.shape[3], kw, st[1], dil[1], pads[1], pads[3])
    if ho < 1 or wo < 1:
        raise OpError(
            op, "x", f"padded H, W at least the dilated kernel {(dil[0] * (kh - 1) + 1, dil[1] * (kw - 1) + 1)}",
            f"shape {x.shape} with padding {pads}", fix="increase padding or use a smaller kernel/dilation",
        )  # fmt: skip
    return ConvGeom(st, pads, dil, int(groups), (ho, wo))


def _arr(x: Any) -> np.ndarray | None:
    return None if x is None else np.asarray(x)


# ---------------------------------------------------------------------------------------------
# ref: one einsum per group and kernel position
# ---------------------------------------------------------------------------------------------


@register("conv2d", device="ref", dtypes=FLOAT_DTYPES)
def conv2d_ref(
    x: Any,
    weight: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> np.ndarray:
    x, weight, bias = np.asarray(x), np.asarray(weight), _arr(bias)
    g = _check_conv(x, weight, bias, stride, padding, dilation, groups)
    acc = accumulation_dtype(x.dtype)
    xp = pad_array(x, g.pads, acc, 0.0)  # (N, C, Hp, Wp)
    w = weight.astype(acc)  # (O, Cg, kh, kw)
    (sh, sw), (dh, dw), (ho, wo) = g.stride, g.dilation, g.out_hw
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    og = o // g.groups
    out = np.zeros((n, o, ho, wo), acc)
    for grp in range(g.groups):
        xs = xp[:, grp * cg : (grp + 1) * cg]  # (N, Cg, Hp, Wp)
        ws = w[grp * og : (grp + 1) * og]  # (Og, Cg, kh, kw)
        for i in range(kh):
            for j in range(kw):
                r, s = i * dh, j * dw
                patch = xs[
                    :, :, r : r + sh * (ho - 1) + 1 : sh, s : s + sw * (wo - 1) + 1 : sw
                ]  # (N, Cg, Ho, Wo)
                out[:, grp * og : (grp + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    if bias is not None:
        out += bias.astype(acc)[:, None, None]
    return out.astype(x.dtype)


# ---------------------------------------------------------------------------------------------
# cpu: im2col via strided windows, then a (G, Og, K) @ (N, G, K, L) batched GEMM
# ---------------------------------------------------------------------------------------------


def windows(xp: np.ndarray, kernel: Pair, g: ConvGeom) -> np.ndarray:
    """The convolution windows of padded ``xp`` as a view ``(N, G, Cg, kh, kw, Ho, Wo)`` (no copy)."""
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = kernel, g.stride, g.dilation, g.out_hw
    n, c = xp.shape[:2]
    eff = (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    win = sliding_window_view(xp, eff, axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]  # (N, C, Ho', Wo', kh, kw)
    win = win[:, :, :ho, :wo].reshape(n, g.groups, c // g.groups, ho, wo, kh, kw)
    return win.transpose(0, 1, 2, 5, 6, 3, 4)


def im2col(xp: np.ndarray, kernel: Pair, g: ConvGeom) -> np.ndarray:
    """Columns ``(N, G, Cg * kh * kw, Ho * Wo)`` of padded ``xp`` (one copy; windows are views)."""
    (kh, kw), (ho, wo) = kernel, g.out_hw
    n, c = xp.shape[:2]
    return windows(xp, kernel, g).reshape(n, g.groups, (c // g.groups) * kh * kw, ho * wo)


@register("conv2d", device="cpu", dtypes=FLOAT_DTYPES)
def conv2d_cpu(
    x: Any,
    weight: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> np.ndarray:
    x, weight, bias = np.asarray(x), np.asarray(weight), _arr(bias)
    g = _check_conv(x, weight, bias, stride, padding, dilation, groups)
    acc = accumulation_dtype(x.dtype)
    xp = x.astype(acc, copy=False) if not any(g.pads) else pad_array(x, g.pads, acc, 0.0)  # (N, C, Hp, Wp)
    o, cg, kh, kw = weight.shape
    cols = im2col(xp, (kh, kw), g)  # (N, G, K, L)
    wm = weight.astype(acc, copy=False).reshape(g.groups, o // g.groups, cg * kh * kw)  # (G, Og, K)
    out = np.matmul(wm, cols)  # (N, G, Og, L): one BLAS GEMM per image and group
    out = out.reshape(x.shape[0], o, *g.out_hw)  # (N, O, Ho, Wo), no copy
    if bias is not None:
        out += bias.astype(acc, copy=False)[:, None, None]
    return out.astype(x.dtype, copy=False)


def bind_conv2d(
    x: Any,
    weight: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    out: Any = None,
) -> Any:
    """``conv2d_cpu(...)`` into ``out`` with its checks done once (ops.bind): a padded scratch image and
    a columns buffer allocated once, then per call the interior copy, the im2col copy (none for a 1x1,
    stride-1, unpadded convolution: its columns are the image), the same GEMM and the bias add -- the
    same arithmetic as the eager kernel, so the same bits. float32, C-contiguous ``x`` and ``out``."""
    arrays = (x, weight, out)
    if not all(type(t) is np.ndarray and t.dtype == np.float32 for t in arrays):
        return None
    if bias is not None and (type(bias) is not np.ndarray or bias.dtype != np.float32):
        return None
    try:
        g = _check_conv(x, weight, bias, stride, padding, dilation, groups)
    except Exception:
        return None  # the kernel's own call raises it where it is made
    n, c, h, w = x.shape
    o, cg, kh, kw = weight.shape
    ho, wo = g.out_hw
    if out.shape != (n, o, ho, wo) or not (
        x.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable
    ):
        return None
    if np.may_share_memory(out, x) or min(n, c, o, ho, wo) == 0:
        return None
    steps: list[Any] = []
    if any(g.pads):
        top, left, bottom, right = g.pads
        xp = np.zeros((n, c, h + top + bottom, w + left + right), np.float32)
        steps.append(partial(np.copyto, xp[:, :, top : top + h, left : left + w], x))
    else:
        xp = x
    plain = (kh, kw) == (1, 1) and g.stride == (1, 1) and not any(g.pads)
    if plain:
        cols = x.reshape(n, g.groups, cg, ho * wo)  # the image is its own columns
    else:  # im2col's copy, into a buffer kept for every call
        win7 = windows(xp, (kh, kw), g)
        cols = np.empty((n, g.groups, cg * kh * kw, ho * wo), np.float32)
        steps.append(partial(np.copyto, cols.reshape(win7.shape), win7))
    wm = weight.reshape(g.groups, o // g.groups, cg * kh * kw)
    steps.append(partial(np.matmul, wm, cols, out=out.reshape(n, g.groups, o // g.groups, ho * wo)))
    if bias is not None:
        steps.append(partial(np.add, out, bias[:, None, None], out=out))

    def run() -> None:
        for step in steps:
            step()

    return run


conv2d_cpu.binder = bind_conv2d  # type: ignore[attr-defined]


def conv2d(
    x: Any,
    weight: Any,
    bias: Any = None,
    *,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, ...] = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
    device: str | None = None,
) -> np.ndarray:
    """2-D convolution (cross-correlation) of NCHW ``x`` ``(N, C_in, H, W)`` with ``weight``.

    ``weight`` is ``(C_out, C_in / groups, kH, kW)``, ``bias`` ``(C_out,)``. ``padding`` is zero
    padding given as ``p``, ``(ph, pw)`` or ``(top, left, bottom, right)``. The result is
    ``(N, C_out, H_out, W_out)`` with ``H_out = (H + top + bottom - dH * (kH - 1) - 1) // sH + 1``.
    Low precision accumulates in float32 and returns the input dtype.

    >>> conv2d(np.ones((1, 1, 4, 4), np.float32), np.ones((2, 1, 3, 3), np.float32), padding=1).shape
    (1, 2, 4, 4)
    """
    return call(
        "conv2d",
        x,
        weight,
        bias,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        device=device,
    )
