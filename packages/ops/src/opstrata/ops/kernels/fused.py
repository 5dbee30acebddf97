"""Fused elementwise kernels — bias + activation + residual, scale + mask + softmax — on ``ref`` and ``cpu``.

These are the epilogue fusions of Megatron-LM's fused bias-GeLU and fused scale-mask-softmax
(Shoeybi et al. 2019, ``megatron/fused_kernels``): the chain runs once per cache-sized block
(:mod:`._chunking`) instead of streaming the whole tensor through memory at every step. ``ref`` is the
straightforward composition of the ``ref`` activation/softmax kernels (the oracle); each op also has a
decomposition into existing ops, which is its definition and the fallback on other devices.

Dtypes: x is any float dtype; bias/residual/mask may be any float dtype and are used in x's compute
dtype (float32 for float16/bfloat16/float8, else x's own). The result has x's dtype and shape and is
rounded once at the end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .._dtypes import bool_, compute_dtype
from .._errors import OpError
from .._registry import call, register, register_decomposition
from .activation import GELU_TILE, gelu_half_tile_f32, gelu_ref, gelu_tanh_tile, relu_ref, silu_ref
from .chunking import as_rows, fit, reshape_view, row_block, row_tile, scratch, tile_shape, tiles
from .elementwise import (
    FLOATS,
    cast_back,
    check_out,
    check_out_overlap,
    checked,
    const,
    ieee,
    nd,
    same_view,
    upcast,
)
from .reduce import normalize_axis
from .softmax import softmax_ref

#: Activations :func:`bias_act` accepts.
ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_tanh", "silu", "relu")
_SQRT1_2 = 1.0 / math.sqrt(2.0)
_K = math.sqrt(2.0 / math.pi)
_C = 0.044715


def _check_act(op: str, act: Any) -> None:
    if act not in ACTIVATIONS:
        raise OpError(op, "act", f"one of {ACTIVATIONS}", repr(act))


def operand_like(op: str, name: str, a: Any, shape: tuple[int, ...], *, allow_bool: bool = False) -> Any:
    """A float (or bool) array broadcastable to ``shape`` without enlarging it, or None."""
    if a is None:
        return None
    a = nd(a)
    if not (a.dtype in FLOATS or (allow_bool and a.dtype == bool_)):
        kinds = "a floating or bool dtype" if allow_bool else "a floating dtype"
        raise OpError(op, name, kinds, str(a.dtype))
    try:
        ok = np.broadcast_shapes(a.shape, shape) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise OpError(op, name, f"a shape broadcastable to x's shape {tuple(shape)}", str(a.shape))
    return a


# --------------------------------------------------------------------------- bias_act


def bias_act(
    x: Any,
    bias: Any = None,
    residual: Any = None,
    *,
    act: str = "gelu",
    out: np.ndarray | None = None,
    device: str | None = None,
) -> np.ndarray:
    """``act(x + bias) + residual`` in one pass over cache-sized blocks (Megatron's fused bias-GeLU).

    ``act`` is ``"gelu"`` (exact, erf), ``"gelu_tanh"``, ``"silu"`` or ``"relu"``; bias and residual are
    optional and broadcast to x's shape (a bias is typically ``(N,)`` for x ``(..., N)``). Floats; the
    result has x's dtype, computed in float32 for low precision and rounded once. ``out`` (optional:
    x's shape and dtype) receives the result; it may be ``x`` itself (a GEMM epilogue in place), but
    must not otherwise overlap x, bias or residual.

    >>> bias_act(np.array([[-1.0, 1.0]]), np.array([1.0, 0.0]), act="relu")
    array([[0., 1.]])
    """
    x = checked("bias_act", "x", x, FLOATS)
    _check_act("bias_act", act)
    bias = operand_like("bias_act", "bias", bias, x.shape)
    residual = operand_like("bias_act", "residual", residual, x.shape)
    if out is None:
        return call("bias_act", x, bias, residual, act=act, device=device)
    check_out("bias_act", out, x.shape, x.dtype)
    check_out_overlap("bias_act", out, x, bias=bias, residual=residual)
    got = call("bias_act", x, bias, residual, act=act, out=out, device=device)
    if got is not out:
        np.copyto(out, got)
    return out


@register("bias_act", device="ref", dtypes=FLOATS)
@ieee
def bias_act_ref(
    x: Any, bias: Any = None, residual: Any = None, *, act: str = "gelu", out: np.ndarray | None = None
) -> np.ndarray:
    _check_act("bias_act", act)
    x = nd(x)
    t = upcast(x)
    if bias is not None:
        t = t + nd(bias).astype(t.dtype)
    if act == "relu":
        y = relu_ref(t)
    elif act == "silu":
        y = silu_ref(t)
    else:
        y = gelu_ref(t, approximate="tanh" if act == "gelu_tanh" else "none")
    if residual is not None:
        y = y + nd(residual).astype(t.dtype)
    return cast_back(y, x.dtype, out)


@register_decomposition("bias_act", dtypes=FLOATS)
def bias_act_decomposition(
    x: Any, bias: Any = None, residual: Any = None, *, act: str = "gelu", out: np.ndarray | None = None
) -> np.ndarray:
    """bias_act = add(act(add(x, bias)), residual), with bias/residual cast to x's dtype (``out`` is
    filled by the caller)."""
    _check_act("bias_act", act)
    x = nd(x)
    h = x if bias is None else call("add", x, nd(bias).astype(x.dtype, copy=False))
    if act in ("relu", "silu"):
        y = call(act, h)
    else:
        y = call("gelu", h, approximate="tanh" if act == "gelu_tanh" else "none")
    return y if residual is None else call("add", y, nd(residual).astype(x.dtype, copy=False))


def _gelu_tanh_block(h: np.ndarray, t: np.ndarray, q: np.ndarray, o: np.ndarray) -> None:
    """The gelu kernel's tanh-form tile (bit-identical to ``gelu(approximate="tanh")`` on cpu)."""
    gelu_tanh_tile(h, t, o)


def _gelu_block(h: np.ndarray, t: np.ndarray, q: np.ndarray, o: np.ndarray) -> None:
    """o = 0.5 h (1 + erf(h / sqrt 2)): float32 by the gelu kernel's tanh-polynomial erf, float64 by Cephes."""
    from .erf import erf_values

    if h.dtype == np.float32:  # the gelu kernel's tile: bit-identical to gelu(h) on cpu
        h *= 0.5
        gelu_half_tile_f32(h, t, q, o)
        return
    np.multiply(h, _SQRT1_2, out=t)
    erf_values(t, out=t)
    t += 1.0
    t *= h
    np.multiply(t, 0.5, out=o)


def _silu_block(h: np.ndarray, t: np.ndarray, q: np.ndarray, o: np.ndarray) -> None:
    """o = h / (1 + exp(-h)): exp overflow gives h/inf = -0, the correctly rounded limit."""
    np.negative(h, out=t)
    np.exp(t, out=t)
    t += 1.0
    np.divide(h, t, out=o)


def _relu_block(h: np.ndarray, t: np.ndarray, q: np.ndarray, o: np.ndarray) -> None:
    """o = max(h, 0); against a zero tile, since numpy's maximum has no SIMD loop for a scalar operand."""
    t[...] = 0.0
    np.maximum(h, t, out=o)


#: ``block(h, t, q, o)``: ``o = act(h)`` with ``h`` (clobbered), ``t``, ``q`` scratch; ``o`` is written
#: last and may be ``h`` itself
_ACT_BLOCKS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]] = {
    "gelu": _gelu_block,
    "gelu_tanh": _gelu_tanh_block,
    "silu": _silu_block,
    "relu": _relu_block,
}


@register("bias_act", device="cpu", dtypes=FLOATS)
@ieee
def bias_act_cpu(
    x: Any, bias: Any = None, residual: Any = None, *, act: str = "gelu", out: np.ndarray | None = None
) -> np.ndarray:
    _check_act("bias_act", act)
    x = nd(x)
    if out is None:
        out = np.empty(x.shape, x.dtype)
    if x.size == 0:
        return out
    cdt = compute_dtype(x.dtype)
    shape = x.shape if x.ndim else (1,)
    try:  # out may be x itself: each tile is read into h before its result is written
        o2 = reshape_view(out, (math.prod(shape[:-1]), shape[-1]))
    except ValueError:  # an out= view that rows cannot express: compute fresh, copy once
        np.copyto(out, bias_act_cpu(x, bias, residual, act=act))
        return out
    x2 = as_rows(x, shape)
    b2 = None if bias is None else as_rows(nd(bias), shape)
    r2 = None if residual is None else as_rows(nd(residual), shape)
    block, direct = _ACT_BLOCKS[act], cdt == x.dtype
    in_place = direct and residual is None and same_view(x, out)
    # in place (a GEMM epilogue): each tile of out is h itself, so ~3 tile buffers live, not 5: smaller
    # tiles for the ~20-pass gelu keep them in L2
    block_elems = GELU_TILE if in_place and act in ("gelu", "gelu_tanh") else None
    tile = tile_shape(*x2.shape, block_elems)
    t_buf, q_buf, *more = scratch(tile, cdt, 2 if in_place else 4)
    b_tile = None if b2 is None else row_tile(b2, *tile, cdt)
    r_tile = None if r2 is None else row_tile(r2, *tile, cdt)
    for rs, cs in tiles(*x2.shape, block_elems):
        xs = x2[rs, cs]
        t, q = fit(t_buf, xs), fit(q_buf, xs)
        if in_place:  # h is the tile of out itself (x's rows view is read-only: write through out's)
            h = o2[rs, cs]
            if b2 is not None:
                np.add(h, b2[rs, cs] if b_tile is None else fit(b_tile, xs), out=h)
            block(h, t, q, h)
            continue
        h_buf, y_buf = more
        h = fit(h_buf, xs)
        if b2 is None:
            np.copyto(h, xs)
        else:
            np.add(xs, b2[rs, cs] if b_tile is None else fit(b_tile, xs), out=h, dtype=cdt)
        y = o2[rs, cs] if direct else fit(y_buf, xs)  # write straight into the result when dtypes agree
        block(h, t, q, y)
        if r2 is not None:
            np.add(y, r2[rs, cs] if r_tile is None else fit(r_tile, xs), out=y, dtype=cdt)
        if not direct:
            np.copyto(o2[rs, cs], y, casting="unsafe")
    return out


# --------------------------------------------------------------------------- scale_mask_softmax


def scale_mask_softmax(
    x: Any, mask: Any = None, *, scale: float = 1.0, axis: int = -1, device: str | None = None
) -> np.ndarray:
    """``softmax(x * scale + mask, axis)`` in one pass per block of rows (Megatron's fused softmax).

    ``mask`` broadcasts to x's shape: a float mask is added (``-inf`` masks out), a bool mask keeps
    True entries (torch's ``scaled_dot_product_attention`` convention). A fully masked slice gives
    zeros, as :func:`opstrata.ops.softmax`. Floats; result in x's dtype (float32 compute for low
    precision).

    >>> scale_mask_softmax(np.array([[1.0, 1.0, 5.0]]), np.array([True, True, False]))
    array([[0.5, 0.5, 0. ]])
    """
    x = checked("scale_mask_softmax", "x", x, FLOATS)
    normalize_axis("scale_mask_softmax", x, axis)
    mask = operand_like("scale_mask_softmax", "mask", mask, x.shape, allow_bool=True)
    if (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float, np.floating))
        or not math.isfinite(scale)
    ):
        raise OpError("scale_mask_softmax", "scale", "a finite number", repr(scale))
    return call("scale_mask_softmax", x, mask, scale=float(scale), axis=axis, device=device)


def _masked_ref(t: np.ndarray, mask: Any) -> np.ndarray:
    if mask is None:
        return t
    m = nd(mask)
    return np.where(m, t, -np.inf) if m.dtype == bool_ else t + m.astype(t.dtype)


@register("scale_mask_softmax", device="ref", dtypes=FLOATS)
@ieee
def scale_mask_softmax_ref(x: Any, mask: Any = None, *, scale: float = 1.0, axis: int = -1) -> np.ndarray:
    x = nd(x)
    t = upcast(x) * np.asarray(scale, compute_dtype(x.dtype))
    return cast_back(softmax_ref(_masked_ref(t, mask), axis=axis), x.dtype)


@register_decomposition("scale_mask_softmax", dtypes=FLOATS)
def scale_mask_softmax_decomposition(
    x: Any, mask: Any = None, *, scale: float = 1.0, axis: int = -1
) -> np.ndarray:
    """scale_mask_softmax = softmax(where(mask, x * scale, -inf)) or softmax(x * scale + mask)."""
    x = nd(x)
    t = call("mul", x, const(scale, x.dtype))
    if mask is not None:
        m = nd(mask)
        if m.dtype == bool_:
            t = call("where", m, t, const(-np.inf, x.dtype))
        else:
            t = call("add", t, m.astype(x.dtype, copy=False))
    return call("softmax", t, axis=axis)


def _softmax_rows(x2: np.ndarray, m2: np.ndarray | None, o2: np.ndarray, scale: float) -> None:
    """Row-wise scale + additive mask + softmax of (R, M) views into o2, one block of rows at a time."""
    cdt = compute_dtype(x2.dtype)
    rb = min(x2.shape[0], row_block(x2.shape[1]))
    (t_buf,) = scratch((rb, x2.shape[1]), cdt, 1)
    direct = cdt == o2.dtype
    for r0 in range(0, x2.shape[0], rb):
        rs = slice(r0, r0 + rb)
        t = fit(t_buf, x2[rs])
        np.multiply(x2[rs], scale, out=t, dtype=cdt)
        if m2 is not None:
            np.add(t, m2[rs], out=t)
        mx = t.max(axis=1, keepdims=True)
        mx[mx == -np.inf] = 0  # fully masked row: no shift, exp gives zeros
        t -= mx
        np.exp(t, out=t)
        s = t.sum(axis=1, keepdims=True)
        s[s == 0] = 1
        np.divide(t, s, out=o2[rs] if direct else t)
        if not direct:
            np.copyto(o2[rs], t, casting="unsafe")


def _additive(mask: np.ndarray, cdt: np.dtype) -> np.ndarray:
    """A bool mask as 0 / -inf in the compute dtype, at the mask's own (unbroadcast) shape."""
    if mask.dtype == bool_:
        return np.where(mask, cdt.type(0), cdt.type(-np.inf))
    return mask.astype(cdt, copy=False)


@register("scale_mask_softmax", device="cpu", dtypes=FLOATS)
@ieee
def scale_mask_softmax_cpu(x: Any, mask: Any = None, *, scale: float = 1.0, axis: int = -1) -> np.ndarray:
    x = nd(x)
    ax = normalize_axis("scale_mask_softmax", x, axis)
    if x.size == 0:
        return np.empty(x.shape, x.dtype)
    if ax != x.ndim - 1:  # rows must be the softmax axis: work on a transposed contiguous copy
        xt = np.ascontiguousarray(np.moveaxis(x, ax, -1))
        mt = None if mask is None else np.moveaxis(np.broadcast_to(nd(mask), x.shape), ax, -1)
        return np.ascontiguousarray(np.moveaxis(scale_mask_softmax_cpu(xt, mt, scale=scale), -1, ax))
    out = np.empty(x.shape, x.dtype)
    n = x.shape[-1]
    m = None if mask is None else np.broadcast_to(_additive(nd(mask), compute_dtype(x.dtype)), x.shape)
    try:  # the mask flattens to rows with x (same shape, (M,), (N, M) over a 2-D x, ...)
        m2 = None if m is None else reshape_view(m, (-1, n))
    except ValueError:  # e.g. an (N, M) mask over (B, H, N, M): one (N, M) matrix at a time
        for idx in np.ndindex(x.shape[:-2]):
            _softmax_rows(x[idx], m[idx], out[idx], scale)
        return out
    _softmax_rows(x.reshape(-1, n), m2, out.reshape(-1, n), scale)
    return out
