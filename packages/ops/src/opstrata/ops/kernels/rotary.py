"""rotary_embedding on ``ref`` and ``cpu``: RoPE (Su et al., RoFormer 2021) in rotate-half and GPT-J layouts.

Each pair of channels ``(a, b)`` of a head is rotated by the position's angle:
``a' = a cos - b sin``, ``b' = b cos + a sin``. Rotate-half (GPT-NeoX / Llama) pairs channel ``i``
with ``i + D/2``; interleaved (GPT-J) pairs ``2i`` with ``2i + 1``. Low precision computes in
float32 and returns the input dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtypes import FLOAT_DTYPES, compute_dtype
from .._errors import OpError, check_dtype, check_ndim
from .._registry import call, register

__all__ = ["rope_rotate_half", "rotary_embedding", "rotary_embedding_onnx"]


def _check_rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
    op = "rotary_embedding"
    check_dtype(op, "x", x, FLOAT_DTYPES)
    check_ndim(op, "x", x, 4, layout="[B, H, N, D]")
    d, n = x.shape[3], x.shape[2]
    if d % 2:
        raise OpError(op, "x", "an even head dim D (channels rotate in pairs)", f"D = {d}, shape {x.shape}")
    for name, t in (("cos", cos), ("sin", sin)):
        check_dtype(op, name, t, FLOAT_DTYPES)
        if t.shape != (n, d // 2):
            raise OpError(op, name, f"shape ({n}, {d // 2}) = (N, D/2) for x {x.shape}", str(t.shape))


def _pairs(d: int, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
    """Channel indices ``(a, b)`` of each rotated pair."""
    half = np.arange(d // 2)
    return (2 * half, 2 * half + 1) if interleaved else (half, half + d // 2)


@register("rotary_embedding", device="ref", dtypes=FLOAT_DTYPES)
def rotary_embedding_ref(x: Any, cos: Any, sin: Any, *, interleaved: bool = False) -> np.ndarray:
    x, cos, sin = np.asarray(x), np.asarray(cos), np.asarray(sin)
    _check_rotary(x, cos, sin)
    cdt = compute_dtype(x.dtype)
    xc, c, s = x.astype(cdt), cos.astype(cdt), sin.astype(cdt)  # (B, H, N, D), (N, D/2), (N, D/2)
    out = np.empty_like(xc)
    for p, (a, b) in enumerate(
        zip(*_pairs(x.shape[3], interleaved), strict=True)
    ):  # one channel pair at a time
        out[..., a] = xc[..., a] * c[:, p] - xc[..., b] * s[:, p]
        out[..., b] = xc[..., b] * c[:, p] + xc[..., a] * s[:, p]
    return out.astype(x.dtype)


@register("rotary_embedding", device="cpu", dtypes=FLOAT_DTYPES)
def rotary_embedding_cpu(x: Any, cos: Any, sin: Any, *, interleaved: bool = False) -> np.ndarray:
    x, cos, sin = np.asarray(x), np.asarray(cos), np.asarray(sin)
    _check_rotary(x, cos, sin)
    cdt = compute_dtype(x.dtype)
    xc = x.astype(cdt, copy=False)
    c, s = cos.astype(cdt, copy=False), sin.astype(cdt, copy=False)  # (N, D/2)
    h = x.shape[3] // 2
    a, b = (
        (xc[..., 0::2], xc[..., 1::2]) if interleaved else (xc[..., :h], xc[..., h:])
    )  # views (B, H, N, D/2)
    out = np.empty(x.shape, cdt)
    oa, ob = (out[..., 0::2], out[..., 1::2]) if interleaved else (out[..., :h], out[..., h:])
    np.multiply(a, c, out=oa)
    oa -= b * s
    np.multiply(b, c, out=ob)
    ob += a * s
    return out.astype(x.dtype, copy=False)


def rotary_embedding(
    x: Any, cos: Any, sin: Any, *, interleaved: bool = False, device: str | None = None
) -> np.ndarray:
    """Rotary position embedding of ``x`` ``(B, H, N, D)`` with per-position ``cos``/``sin`` ``(N, D/2)``.

    Default rotate-half pairs channel ``i`` with ``i + D/2`` (Llama, GPT-NeoX); ``interleaved=True``
    pairs ``2i`` with ``2i + 1`` (GPT-J). Pair ``p`` at position ``n`` turns by the angle whose cosine
    is ``cos[n, p]``. Low precision computes in float32 and returns ``x``'s dtype.

    >>> x = np.ones((1, 1, 1, 2), np.float32)
    >>> rotary_embedding(x, np.zeros((1, 1)), np.ones((1, 1))).tolist()  # a quarter turn
    [[[[-1.0, 1.0]]]]
    """
    return call("rotary_embedding", x, cos, sin, interleaved=interleaved, device=device)


# --------------------------------------------------------------------------- ONNX RotaryEmbedding


@register("rotary_embedding_onnx", device="ref", dtypes=FLOAT_DTYPES)
@register("rotary_embedding_onnx", device="cpu", dtypes=FLOAT_DTYPES)
def rotary_embedding_onnx_ref(
    x: Any,
    cos: Any,
    sin: Any,
    position_ids: Any = None,
    *,
    interleaved: bool = False,
    rotary_dim: int = 0,
    num_heads: int = 0,
) -> np.ndarray:
    op = "rotary_embedding_onnx"
    x, cos, sin = np.asarray(x), np.asarray(cos), np.asarray(sin)
    check_dtype(op, "x", x, FLOAT_DTYPES)
    if x.ndim == 4:
        xs = x.transpose(0, 2, 1, 3)  # (B, S, H, D)
    elif x.ndim == 3 and num_heads > 0 and x.shape[2] % num_heads == 0:
        xs = x.reshape(x.shape[0], x.shape[1], num_heads, x.shape[2] // num_heads)
    else:
        raise OpError(
            op, "x", "4-D (B, H, S, D), or 3-D (B, S, H*D) with num_heads dividing the last dim",
            f"shape {x.shape}, num_heads={num_heads}",
        )  # fmt: skip
    d = xs.shape[3]
    r = rotary_dim or d
    if r % 2 or r > d:
        raise OpError(op, "rotary_dim", f"an even number <= head size {d}", str(r))
    if position_ids is not None:
        pos = np.asarray(position_ids).astype(np.int64)
        cos, sin = cos[pos], sin[pos]
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape != (xs.shape[0], xs.shape[1], r // 2):
            raise OpError(op, name, f"(B, S, {r // 2}) after position_ids, for x {x.shape}", str(t.shape))
    cdt = compute_dtype(x.dtype)
    xc = xs.astype(cdt)
    c, s = cos.astype(cdt)[:, :, None, :], sin.astype(cdt)[:, :, None, :]
    rot = xc[..., :r]
    a, b = (rot[..., 0::2], rot[..., 1::2]) if interleaved else (rot[..., : r // 2], rot[..., r // 2 :])
    out = xc.copy()
    oa, ob = (out[..., 0:r:2], out[..., 1:r:2]) if interleaved else (out[..., : r // 2], out[..., r // 2 : r])
    real, imag = a * c - b * s, a * s + b * c
    oa[...], ob[...] = real, imag
    out = out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)
    return out.astype(x.dtype)


def rotary_embedding_onnx(
    x: Any,
    cos: Any,
    sin: Any,
    position_ids: Any = None,
    *,
    interleaved: bool = False,
    rotary_dim: int = 0,
    num_heads: int = 0,
    device: str | None = None,
) -> np.ndarray:
    """ONNX RotaryEmbedding (opset 23): per-batch ``cos``/``sin`` ``(B, S, R/2)``, or caches gathered by
    ``position_ids`` ``(B, S)``; 4-D ``(B, H, S, D)`` or 3-D ``(B, S, H*D)`` x; the first ``rotary_dim``
    channels (all when 0) rotate, the rest pass through.

    >>> x = np.ones((1, 1, 1, 2), np.float32)
    >>> rotary_embedding_onnx(x, np.zeros((1, 1, 1)), np.ones((1, 1, 1))).tolist()
    [[[[-1.0, 1.0]]]]
    """
    check_dtype("rotary_embedding_onnx", "x", np.asarray(x), FLOAT_DTYPES)
    return call(
        "rotary_embedding_onnx", x, cos, sin, position_ids, interleaved=interleaved, rotary_dim=rotary_dim,
        num_heads=num_heads, device=device,
    )  # fmt: skip


# --------------------------------------------------------------------------- exporters' rotate-half form


def _check_rotate_half(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, out: np.ndarray | None) -> None:
    op = "rope_rotate_half"
    check_dtype(op, "x", x, FLOAT_DTYPES)
    if x.ndim < 1 or x.shape[-1] % 2:
        raise OpError(op, "x", "an even last dim (its halves swap)", f"shape {x.shape}")
    for name, t in (("cos", cos), ("sin", sin)):
        check_dtype(op, name, t, FLOAT_DTYPES)
        try:
            ok = np.broadcast_shapes(x.shape, t.shape) == x.shape
        except ValueError:
            ok = False
        if not ok or t.shape[-1:] not in ((x.shape[-1],), (1,), ()):
            raise OpError(op, name, f"a shape broadcasting to x's {x.shape}", str(t.shape))
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype):
        raise OpError(
            op, "out", f"{x.dtype}{list(x.shape)} (x's shape and dtype)", f"{out.dtype}{list(out.shape)}"
        )


def _halves(t: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray]:
    return (t, t) if t.shape[-1:] in ((1,), ()) else (t[..., :h], t[..., h:])


@register("rope_rotate_half", device="ref", dtypes=FLOAT_DTYPES)
def rope_rotate_half_ref(x: Any, cos: Any, sin: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    x, cos, sin = np.asarray(x), np.asarray(cos), np.asarray(sin)
    _check_rotate_half(x, cos, sin, out)
    cdt = compute_dtype(x.dtype)
    xc = x.astype(cdt)
    h = x.shape[-1] // 2
    rot = np.concatenate([-xc[..., h:], xc[..., :h]], axis=-1)  # the exported rotate_half(x)
    y = (xc * cos.astype(cdt) + rot * sin.astype(cdt)).astype(x.dtype)
    if out is None:
        return y
    np.copyto(out, y)
    return out


@register("rope_rotate_half", device="cpu", dtypes=FLOAT_DTYPES)
def rope_rotate_half_cpu(x: Any, cos: Any, sin: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    x, cos, sin = np.asarray(x), np.asarray(cos), np.asarray(sin)
    _check_rotate_half(x, cos, sin, out)
    cdt = compute_dtype(x.dtype)
    if x.dtype != cdt:  # low precision: compute in float32, round once
        y = rope_rotate_half_cpu(x.astype(cdt), cos.astype(cdt), sin.astype(cdt))
        return y.astype(x.dtype) if out is None else _into(out, y)
    cos, sin = cos.astype(cdt, copy=False), sin.astype(cdt, copy=False)
    res = np.empty(x.shape, cdt) if out is None or np.may_share_memory(out, x) else out
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    (c1, c2), (s1, s2) = _halves(cos, h), _halves(sin, h)
    o1, o2 = res[..., :h], res[..., h:]
    tmp = np.empty(x1.shape, cdt)
    np.multiply(x1, c1, out=o1)  # first half: x1 cos - x2 sin (the graph's x1 cos + (-x2) sin, same bits)
    np.multiply(x2, s1, out=tmp)
    np.subtract(o1, tmp, out=o1)
    np.multiply(x2, c2, out=o2)  # second half: x2 cos + x1 sin
    np.multiply(x1, s2, out=tmp)
    np.add(o2, tmp, out=o2)
    return res if out is None or res is out else _into(out, res)


def _into(out: np.ndarray, y: np.ndarray) -> np.ndarray:
    np.copyto(out, y, casting="unsafe")
    return out


def rope_rotate_half(
    x: Any, cos: Any, sin: Any, *, out: np.ndarray | None = None, device: str | None = None
) -> np.ndarray:
    """``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = concat(-x[..., D/2:], x[..., :D/2])``: the
    rotary embedding as Llama / GPT-NeoX code writes it and torch.onnx exports it (Slice, Neg, Concat,
    Mul, Add), in one op. ``cos`` / ``sin`` broadcast to ``x`` (any per-batch / per-head layout, full
    head dim D or 1); nothing assumes the two halves of ``cos`` agree, so the result is the exported
    graph's to the bit.

    >>> x = np.array([[1.0, 2.0]], np.float32)
    >>> rope_rotate_half(x, np.zeros((1, 2), np.float32), np.ones((1, 2), np.float32)).tolist()
    [[-2.0, 1.0]]
    """
    return call("rope_rotate_half", x, cos, sin, out=out, device=device)
