"""Attention whose whole problem is one FlashAttention tile: scores materialised, softmax in place.

When the cpu kernel's tiling gives a single query tile, a single key tile and a single batch chunk
(short sequences: BERT- and GPT-sized prompts of a few hundred tokens), the online softmax has
nothing to combine; its running-max / running-sum bookkeeping, the query packing and the per-tile
Python calls are pure overhead. This path computes ``softmax(q k^T * scale + mask) v`` directly on
the ``(B, Hkv, G, N, M)`` score tensor (grouped heads as a broadcast dim, never copied K/V; for float32
the softmax is the native library's row loop), with the same conventions as the tiled kernel: float32
accumulation for low precision, fully masked rows give 0 and logsumexp -inf.
"""

from __future__ import annotations

import numpy as np

from ..native.kernels import softmax_rows_inplace
from .attention import AttnShape, causal_keep

__all__ = ["attention_single_tile"]

NEG_INF = -np.inf


def attention_single_tile(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    s: AttnShape,
    causal: bool,
    scale: float,
    acc: np.dtype,
) -> tuple[np.ndarray, np.ndarray]:
    """Output ``(B, H, N, Dv)`` in ``acc`` and logsumexp ``(B, H, N)``; inputs already validated."""
    g = s.h // s.hkv
    qs = np.multiply(q.reshape(s.b, s.hkv, g, s.n, s.d), acc.type(scale), dtype=acc)  # (B, Hkv, G, N, D)
    ka = k.astype(acc, copy=False)[:, :, None]  # (B, Hkv, 1, M, D)
    va = v.astype(acc, copy=False)[:, :, None]  # (B, Hkv, 1, M, Dv)
    sc = np.matmul(qs, ka.swapaxes(-1, -2))  # (B, Hkv, G, N, M)
    if mask is not None:
        m5 = np.broadcast_to(mask, (s.b, s.h, s.n, s.m)).reshape(s.b, s.hkv, g, s.n, s.m)
        if m5.dtype == np.bool_:
            np.copyto(sc, NEG_INF, where=~m5)
        else:
            sc += m5.astype(acc, copy=False)
    if causal:
        np.copyto(sc, NEG_INF, where=~causal_keep(s.n, s.m))
    if acc == np.float32 and sc.flags.c_contiguous:  # one C loop per row: max, exp, sum, normalise, lse
        lse = np.empty(sc.shape[:-1], np.float32)
        if softmax_rows_inplace(sc, lse):
            return np.matmul(sc, va).reshape(s.b, s.h, s.n, s.dv), lse.reshape(s.b, s.h, s.n)
    mx = sc.max(axis=-1, keepdims=True)  # (B, Hkv, G, N, 1)
    np.copyto(mx, 0.0, where=mx == NEG_INF)  # a row with every key masked: exp(-inf - 0) = 0, no NaN
    sc -= mx
    np.exp(sc, out=sc)
    total = sc.sum(axis=-1, keepdims=True)
    empty = total == 0
    with np.errstate(divide="ignore"):
        lse = np.log(total)
    lse += mx
    np.copyto(lse, NEG_INF, where=empty)
    np.copyto(total, 1.0, where=empty)
    out = np.matmul(sc, va)  # (B, Hkv, G, N, Dv), unnormalised
    out /= total
    return out.reshape(s.b, s.h, s.n, s.dv), lse.reshape(s.b, s.h, s.n)
