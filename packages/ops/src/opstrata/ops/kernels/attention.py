"""Scaled dot-product attention: the public ops, argument checks and the ``ref`` forward/backward.

Semantics follow torch ``F.scaled_dot_product_attention`` with grouped-query heads (GQA, Ainslie
et al. 2023). ``ref`` is the textbook formula on the whole ``(B, H, N, M)`` score tensor and the
hand-derived backward of ``softmax(q k^T * scale + mask) v``; the ``cpu`` kernels are the
FlashAttention-2 ones in ``kernels/flash_attention.py`` (Dao et al. 2022; Dao 2023). Low precision
accumulates in float32.

Conventions (both devices):

- ``causal`` is aligned to the bottom-right corner: query ``i`` sees keys ``j <= i + M - N``, so a
  decoding step with a KV cache (N new queries after M - N cached keys) sees the whole cache.
- ``mask`` is boolean (True = keep) or additive float, broadcastable to ``(B, H, N, M)``; with
  ``causal`` both apply.
- A row whose every key is masked outputs zeros (not NaN); its logsumexp is ``-inf`` and its
  gradients are zeros.
- ``return_lse=True`` also returns the per-row logsumexp ``(B, H, N)`` of the scaled, masked scores
  in the accumulation dtype: the statistics ``attention_backward`` recomputes the softmax from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._dtypes import FLOAT_DTYPES, accumulation_dtype
from .._errors import OpError, check_dtype, check_ndim
from .._registry import call, register
from .matmul import check_same_dtype

__all__ = ["attention", "attention_backward", "attention_onnx"]


#: Autotuned knob of the cpu kernel: queries per block (None: the ``BLOCK_BYTES`` heuristic).
@dataclass(frozen=True)
class AttnShape:
    b: int
    h: int
    hkv: int
    n: int
    m: int
    d: int
    dv: int


def _check_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, op: str = "attention"
) -> AttnShape:
    check_dtype(op, "q", q, FLOAT_DTYPES)
    check_same_dtype(op, "q", q, "k", k)
    check_same_dtype(op, "q", q, "v", v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_ndim(op, name, t, 4, layout="[B, H, N, D]" if name == "q" else "[B, Hkv, M, D]")
    b, h, n, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise OpError(op, "k", f"shape ({b}, Hkv, M, {d}) (batch and head dim of q {q.shape})", str(k.shape))
    if v.shape[:3] != k.shape[:3]:
        raise OpError(op, "v", f"shape {k.shape[:3]} + (Dv,) (B, Hkv, M of k)", str(v.shape))
    hkv = k.shape[1]
    if hkv == 0 or h % hkv:
        raise OpError(op, "k", f"a head count dividing q's H = {h} (grouped-query attention)", f"Hkv = {hkv}")
    m = k.shape[2]
    if mask is not None:
        if mask.dtype != np.bool_:
            check_dtype(op, "mask", mask, FLOAT_DTYPES)
        try:
            if np.broadcast_shapes(mask.shape, (b, h, n, m)) != (b, h, n, m):
                raise ValueError
        except ValueError:
            raise OpError(
                op, "mask", f"a shape broadcastable to (B, H, N, M) = {(b, h, n, m)}", str(mask.shape)
            ) from None
    return AttnShape(b, h, hkv, n, m, d, v.shape[3])


def _scale(scale: float | None, d: int) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)  # D == 0: scores are 0 anyway


def causal_keep(n: int, m: int, rows: slice | None = None) -> np.ndarray:
    """``(N, M)`` bool: query ``i`` keeps key ``j`` iff ``j <= i + M - N`` (bottom-right aligned)."""
    i = np.arange(n)[rows or slice(None)][:, None]
    return np.arange(m)[None, :] <= i + (m - n)


def _check_backward(
    q: np.ndarray, out: np.ndarray, grad_out: np.ndarray, lse: np.ndarray, s: AttnShape
) -> None:
    op = "attention_backward"
    for name, t in (("out", out), ("grad_out", grad_out)):
        check_same_dtype(op, "q", q, name, t)
        if t.shape != (s.b, s.h, s.n, s.dv):
            raise OpError(op, name, f"shape (B, H, N, Dv) = {(s.b, s.h, s.n, s.dv)}", str(t.shape))
    check_dtype(op, "lse", lse, FLOAT_DTYPES)
    if lse.shape != (s.b, s.h, s.n):
        raise OpError(
            op,
            "lse",
            f"shape (B, H, N) = {(s.b, s.h, s.n)}",
            str(lse.shape),
            fix="pass the lse returned by attention(..., return_lse=True)",
        )


def _as_arrays(*xs: Any) -> list[Any]:
    return [None if x is None else np.asarray(x) for x in xs]


# ---------------------------------------------------------------------------------------------
# ref: the textbook formula on the whole (B, H, N, M) score tensor
# ---------------------------------------------------------------------------------------------


def _ref_probs(
    q: np.ndarray, k: np.ndarray, causal: bool, mask: np.ndarray | None, scale: float, group: int
) -> tuple[np.ndarray, np.ndarray]:
    """``softmax`` probabilities ``(B, H, N, M)`` and logsumexp ``(B, H, N)``; empty rows: 0 and -inf."""
    n, m = q.shape[2], k.shape[2]
    kk = np.repeat(k, group, axis=1)  # (B, H, M, D): kv head h // group serves query head h
    scores = np.einsum("bhnd,bhmd->bhnm", q, kk) * q.dtype.type(scale)  # (B, H, N, M)
    keep = np.ones((n, m), bool) if not causal else causal_keep(n, m)
    if mask is not None and mask.dtype == np.bool_:
        keep = keep & mask
    elif mask is not None:
        scores = scores + mask.astype(q.dtype)
    scores = np.where(keep, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True, initial=-np.inf)
    masked_row = row_max == -np.inf  # every key masked
    weights = np.exp(scores - np.where(masked_row, 0, row_max))
    total = weights.sum(axis=-1, keepdims=True)
    probs = np.where(masked_row, 0, weights / np.where(masked_row, 1, total))  # (B, H, N, M)
    with np.errstate(divide="ignore"):
        lse = np.where(masked_row, -np.inf, row_max + np.log(np.where(masked_row, 1, total)))
    return probs, lse[..., 0]


@register("attention", device="ref", dtypes=FLOAT_DTYPES)
def attention_ref(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    mask: Any = None,
    scale: float | None = None,
    return_lse: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    q, k, v, mask = _as_arrays(q, k, v, mask)
    s = _check_attention(q, k, v, mask)
    acc = accumulation_dtype(q.dtype)
    group = s.h // s.hkv
    probs, lse = _ref_probs(q.astype(acc), k.astype(acc), causal, mask, _scale(scale, s.d), group)
    vv = np.repeat(v.astype(acc), group, axis=1)  # (B, H, M, Dv)
    out = np.einsum("bhnm,bhmd->bhnd", probs, vv).astype(q.dtype)  # (B, H, N, Dv)
    return (out, lse) if return_lse else out


@register("attention_backward", device="ref", dtypes=FLOAT_DTYPES)
def attention_backward_ref(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    grad_out: Any,
    lse: Any,
    *,
    causal: bool = False,
    mask: Any = None,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """By hand: ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - rowsum(P * dP))``, ``dQ = dS K``, ``dK = dS^T Q``.

    Recomputes ``P`` from scratch (``out`` and ``lse`` are only checked), so it is an independent oracle.
    """
    q, k, v, out, grad_out, lse, mask = _as_arrays(q, k, v, out, grad_out, lse, mask)
    s = _check_attention(q, k, v, mask, op="attention_backward")
    _check_backward(q, out, grad_out, lse, s)
    acc = accumulation_dtype(q.dtype)
    group, sc = s.h // s.hkv, _scale(scale, s.d)
    qa, ka, va, go = (t.astype(acc) for t in (q, k, v, grad_out))
    probs, _ = _ref_probs(qa, ka, causal, mask, sc, group)  # (B, H, N, M)
    dv = np.einsum("bhnm,bhnd->bhmd", probs, go)  # (B, H, M, Dv), per query head
    dp = np.einsum("bhnd,bhmd->bhnm", go, np.repeat(va, group, axis=1))  # (B, H, N, M)
    ds = probs * (dp - (probs * dp).sum(axis=-1, keepdims=True)) * acc.type(sc)  # (B, H, N, M)
    dq = np.einsum("bhnm,bhmd->bhnd", ds, np.repeat(ka, group, axis=1))  # (B, H, N, D)
    dk = np.einsum("bhnm,bhnd->bhmd", ds, qa)  # (B, H, M, D)

    def per_kv(t: np.ndarray) -> np.ndarray:  # sum the G query heads sharing a kv head
        return t.reshape(s.b, s.hkv, group, *t.shape[2:]).sum(axis=2)

    return dq.astype(q.dtype), per_kv(dk).astype(q.dtype), per_kv(dv).astype(q.dtype)


#: Budget for one query block's score buffer in :func:`attention_rows_cpu`.
BLOCK_BYTES = 8 * 1024 * 1024


# ---------------------------------------------------------------------------------------------
# the previous cpu kernel (query blocks only, full key rows): unregistered, a baseline for benchmarks
# ---------------------------------------------------------------------------------------------


def _block_rows(s: AttnShape, itemsize: int, block_q: int | None) -> int:
    if block_q is not None:
        if block_q < 1:
            raise OpError("attention", "block_q", "an int >= 1", repr(block_q))
        return block_q
    return max(1, BLOCK_BYTES // max(1, s.b * s.h * s.m * itemsize))


def _block_scores(
    qg: np.ndarray,
    kt: np.ndarray,
    rows: slice,
    s: AttnShape,
    causal: bool,
    mask: np.ndarray | None,
    scale: float,
) -> np.ndarray:
    """Masked, scaled scores ``(B, Hkv, G, nb, mb)`` of one query block; ``mb`` stops at the last visible key."""
    mb = s.m if not causal else max(0, min(s.m, rows.stop - 1 + s.m - s.n + 1))
    scores = np.matmul(qg[:, :, :, rows], kt[..., :mb])  # (B, Hkv, G, nb, mb)
    scores *= scale
    if mask is not None:
        blk = np.broadcast_to(mask, (s.b, s.h, s.n, s.m))[:, :, rows, :mb]
        blk = blk.reshape(s.b, s.hkv, s.h // s.hkv, *blk.shape[2:])  # (B, Hkv, G, nb, mb)
        if blk.dtype == np.bool_:
            np.copyto(scores, -np.inf, where=~blk)
        else:
            scores += blk.astype(scores.dtype, copy=False)  # cast per block, not the whole mask
    if causal:
        np.copyto(scores, -np.inf, where=~causal_keep(s.n, s.m, rows)[:, :mb])
    return scores


def _softmax_matmul(scores: np.ndarray, vb: np.ndarray) -> np.ndarray:
    """``softmax(scores) @ v`` in place on ``scores``; all-masked rows give zeros."""
    row_max = scores.max(axis=-1, keepdims=True, initial=-np.inf)
    row_max[row_max == -np.inf] = 0.0  # all-masked row: exp(-inf - 0) = 0, no NaN
    scores -= row_max
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    total[total == 0] = 1.0
    out = np.matmul(scores, vb)  # (B, Hkv, G, nb, Dv): normalise after the matmul, on the smaller tensor
    out /= total
    return out


def attention_rows_cpu(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    mask: Any = None,
    scale: float | None = None,
    block_q: int | None = None,
) -> np.ndarray:
    """Query blocks against all keys, softmax in place: a ``(B, H, block_q, M)`` buffer; ``block_q`` from ``BLOCK_BYTES``."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    mask = None if mask is None else np.asarray(mask)
    s = _check_attention(q, k, v, mask)
    acc = accumulation_dtype(q.dtype)
    g = s.h // s.hkv
    qg = q.astype(acc, copy=False).reshape(s.b, s.hkv, g, s.n, s.d)  # (B, Hkv, G, N, D)
    kt = k.astype(acc, copy=False).transpose(0, 1, 3, 2)[:, :, None]  # (B, Hkv, 1, D, M)
    va = v.astype(acc, copy=False)[:, :, None]  # (B, Hkv, 1, M, Dv)
    out = np.empty((s.b, s.hkv, g, s.n, s.dv), acc)
    step = _block_rows(s, acc.itemsize, block_q)
    sc = acc.type(_scale(scale, s.d))
    for start in range(0, s.n, step):
        rows = slice(start, min(start + step, s.n))
        scores = _block_scores(qg, kt, rows, s, causal, mask, sc)  # (B, Hkv, G, nb, mb)
        out[:, :, :, rows] = _softmax_matmul(scores, va[:, :, :, : scores.shape[-1]])
    return out.reshape(s.b, s.h, s.n, s.dv).astype(q.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# public ops
# ---------------------------------------------------------------------------------------------


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    mask: Any = None,
    scale: float | None = None,
    return_lse: bool = False,
    device: str | None = None,
) -> Any:
    """Scaled dot-product attention ``softmax(q @ k^T * scale + mask) @ v``.

    ``q`` ``(B, H, N, D)``; ``k`` ``(B, Hkv, M, D)``, ``v`` ``(B, Hkv, M, Dv)``. Grouped-query when
    ``Hkv < H`` (``H % Hkv == 0``; query head ``h`` reads kv head ``h // (H // Hkv)``). ``scale``
    defaults to ``1/sqrt(D)``. ``mask`` is bool (True = keep) or additive float, broadcastable to
    ``(B, H, N, M)``. ``causal`` is bottom-right aligned: query ``i`` sees keys ``j <= i + M - N``
    (what decoding with a KV cache needs). Rows with every key masked output zeros. Low precision
    accumulates in float32; the result ``(B, H, N, Dv)`` has ``q``'s dtype. With ``return_lse``
    the result is ``(out, lse)``, ``lse`` the per-row logsumexp ``(B, H, N)`` in the accumulation
    dtype (``-inf`` for an empty row), which :func:`attention_backward` takes.

    >>> q = np.zeros((1, 2, 3, 4), np.float32)
    >>> attention(q, q[:, :1], np.ones((1, 1, 3, 4), np.float32), causal=True).shape
    (1, 2, 3, 4)
    """
    extra = {"return_lse": True} if return_lse else {}  # kernels without lse support still serve the rest
    return call("attention", q, k, v, causal=causal, mask=mask, scale=scale, device=device, **extra)


def attention_backward(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    grad_out: Any,
    lse: Any,
    *,
    causal: bool = False,
    mask: Any = None,
    scale: float | None = None,
    device: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dq, dk, dv)`` of :func:`attention` given ``grad_out = dL/d out``.

    ``out`` and ``lse`` come from ``attention(q, k, v, ..., return_lse=True)`` with the same
    ``causal``/``mask``/``scale``; the cpu kernel recomputes the softmax block by block from ``lse``
    instead of storing the ``(N, M)`` probabilities. ``dk``/``dv`` of a kv head sum over the query
    heads that share it. A float ``mask`` gets no gradient. Results have ``q``'s dtype.

    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((1, 2, 3, 4)) for _ in range(3))
    >>> out, lse = attention(q, k, v, causal=True, return_lse=True)
    >>> dq, dk, dv = attention_backward(q, k, v, out, np.ones_like(out), lse, causal=True)
    >>> bool(np.allclose(dv.sum(axis=2), 3))  # with dO = 1: sum over keys of P^T 1 = N queries
    True
    """
    return call(
        "attention_backward",
        q,
        k,
        v,
        out,
        grad_out,
        lse,
        causal=causal,
        mask=mask,
        scale=scale,
        device=device,
    )


# --------------------------------------------------------------------------- ONNX Attention (full form)

#: ``qk_matmul_output_mode`` values of ONNX Attention: the scaled QK product (softcapped when softcap
#: is set), plus the mask bias, the softmax input (same as 1 here), the softmax probabilities.
QK_OUTPUT_MODES = (0, 1, 2, 3)


def _onnx_heads(x: np.ndarray, heads: int | None, name: str) -> np.ndarray:
    """3-D ``(B, S, heads*D)`` -> 4-D ``(B, heads, S, D)``; 4-D passes through."""
    op = "attention_onnx"
    if x.ndim == 4:
        return x
    if x.ndim != 3 or heads is None or heads <= 0 or x.shape[2] % heads:
        raise OpError(
            op, name, "4-D (B, H, S, D), or 3-D (B, S, H*D) with its head count dividing the last dim",
            f"shape {x.shape} with heads={heads}",
        )  # fmt: skip
    b, s, hd = x.shape
    return x.reshape(b, s, heads, hd // heads).transpose(0, 2, 1, 3)


def _onnx_bias(
    n: int, m: int, mask: np.ndarray | None, causal: bool, offset: Any, window: tuple[int, int], adt: Any
) -> np.ndarray:
    """The additive bias (0 / -inf / mask values) of ONNX Attention, broadcastable to ``(B, H, N, M)``."""
    bias = np.zeros((n, m), adt)
    if mask is not None:
        if mask.shape[-1] < m:  # a short mask is padded with "masked"
            pad = [(0, 0)] * (mask.ndim - 1) + [(0, m - mask.shape[-1])]
            mask = np.pad(mask, pad, constant_values=False if mask.dtype == np.bool_ else -np.inf)
        mask = np.where(mask, 0.0, -np.inf).astype(adt) if mask.dtype == np.bool_ else mask.astype(adt)
        bias = bias + mask
    i = np.arange(n).reshape(n, 1)
    j = np.arange(m).reshape(1, m)
    per_batch = np.ndim(offset) > 0
    diff = (i + np.reshape(offset, (-1, 1, 1))) - j if per_batch else (i + int(offset)) - j  # query pos - key
    allowed = np.ones(diff.shape, bool)
    if causal:
        allowed &= diff >= 0
    left, right = window
    if left >= 0:
        allowed &= diff <= left
    if right >= 0:
        allowed &= -diff <= right
    extra = np.where(allowed, 0.0, -np.inf).astype(adt)
    if per_batch:
        extra = extra.reshape(extra.shape[0], 1, n, m)
    return bias + extra


@register("attention_onnx", device="ref", dtypes=FLOAT_DTYPES)
@register("attention_onnx", device="cpu", dtypes=FLOAT_DTYPES)
def attention_onnx_ref(
    q: Any,
    k: Any,
    v: Any,
    mask: Any = None,
    past_key: Any = None,
    past_value: Any = None,
    nonpad_kv_seqlen: Any = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    softcap: float = 0.0,
    q_num_heads: int | None = None,
    kv_num_heads: int | None = None,
    qk_output_mode: int = 0,
    window: tuple[int, int] = (-1, -1),
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    op = "attention_onnx"
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    dt = check_dtype(op, "q", q, FLOAT_DTYPES)
    three_d = q.ndim == 3
    q4 = _onnx_heads(q, q_num_heads, "q")
    k4, v4 = _onnx_heads(k, kv_num_heads, "k"), _onnx_heads(v, kv_num_heads, "v")
    if (past_key is None) != (past_value is None):
        raise OpError(op, "past_key", "past_key and past_value given together", "only one of them")
    if past_key is not None:
        k4 = np.concatenate([np.asarray(past_key), k4], axis=2)
        v4 = np.concatenate([np.asarray(past_value), v4], axis=2)
    present_k, present_v = k4, v4
    b, hq, n, d = q4.shape
    hk, m = k4.shape[1], k4.shape[2]
    if hk != v4.shape[1] or hq % hk:
        raise OpError(
            op, "k", f"kv heads that divide the {hq} query heads (k and v alike)",
            f"k {k4.shape}, v {v4.shape}",
        )  # fmt: skip
    adt = accumulation_dtype(dt)
    s = 1.0 / math.sqrt(d) if scale is None else float(scale)
    kk, vv = np.repeat(k4, hq // hk, axis=1).astype(adt), np.repeat(v4, hq // hk, axis=1).astype(adt)
    qk = np.matmul(q4.astype(adt) * adt.type(s), kk.transpose(0, 1, 3, 2))
    if softcap > 0:
        qk = np.tanh(qk / adt.type(softcap)) * adt.type(softcap)
    seqlen = None if nonpad_kv_seqlen is None else np.asarray(nonpad_kv_seqlen).reshape(-1).astype(np.int64)
    if past_key is not None:
        offset: Any = np.asarray(past_key).shape[2]
    elif seqlen is not None:
        offset = seqlen - n
    else:
        offset = 0
    mask_arr = None if mask is None else np.asarray(mask)
    bias = _onnx_bias(n, m, mask_arr, bool(causal), offset, window, adt)
    if seqlen is not None:
        pad = np.where(np.arange(m) < seqlen[:, None], 0.0, -np.inf).astype(adt)
        bias = bias + pad.reshape(b, 1, 1, m)
    logits = qk + bias
    qk_out = logits if qk_output_mode == 2 else qk
    dead = np.isneginf(np.max(bias, axis=-1, keepdims=True))
    top = np.max(logits, axis=-1, keepdims=True)
    top = np.where(np.isneginf(top) | dead, 0.0, top)
    with np.errstate(invalid="ignore"):
        e = np.exp(logits - top)
        tot = e.sum(axis=-1, keepdims=True)
        p = e / np.where(tot == 0, 1.0, tot)
    p = np.where(dead, 0.0, p).astype(adt)
    if qk_output_mode == 3:
        qk_out = p
    y = np.matmul(p, vv)
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(b, n, -1)
    return y.astype(dt), present_k.astype(dt), present_v.astype(dt), np.asarray(qk_out).astype(dt)


def attention_onnx(
    q: Any,
    k: Any,
    v: Any,
    mask: Any = None,
    past_key: Any = None,
    past_value: Any = None,
    nonpad_kv_seqlen: Any = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    softcap: float = 0.0,
    q_num_heads: int | None = None,
    kv_num_heads: int | None = None,
    qk_output_mode: int = 0,
    window: tuple[int, int] = (-1, -1),
    device: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """ONNX Attention (opset 23+) in full: ``(y, present_key, present_value, qk_matmul_output)``.

    3-D ``(B, S, H*D)`` or 4-D ``(B, H, S, D)`` q/k/v; a KV cache (``past_key``/``past_value`` appended
    along the sequence) or per-batch valid key counts (``nonpad_kv_seqlen``); causal and sliding
    windows aligned bottom-right to the cache; ``softcap`` (``c * tanh(qk / c)``) before the mask;
    grouped-query heads. A row with every key masked outputs zeros. Accumulates in float32 (float64
    for float64); every result has ``q``'s dtype.

    >>> q = np.ones((1, 1, 2, 4), np.float32)
    >>> y, pk, pv, qk = attention_onnx(q, q, q, past_key=q, past_value=q, causal=True)
    >>> pk.shape, y.shape
    ((1, 1, 4, 4), (1, 1, 2, 4))
    """
    check_dtype("attention_onnx", "q", np.asarray(q), FLOAT_DTYPES)
    if qk_output_mode not in QK_OUTPUT_MODES:
        raise OpError("attention_onnx", "qk_output_mode", f"one of {QK_OUTPUT_MODES}", str(qk_output_mode))
    return call(
        "attention_onnx", q, k, v, mask, past_key, past_value, nonpad_kv_seqlen, causal=causal, scale=scale,
        softcap=softcap, q_num_heads=q_num_heads, kv_num_heads=kv_num_heads, qk_output_mode=qk_output_mode,
        window=window, device=device,
    )  # fmt: skip
