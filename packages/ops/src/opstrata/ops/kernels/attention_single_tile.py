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

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..native.blas import sgemm_ready
from ..native.kernels import softmax_rows_inplace
from ..native.library import library, native_threads
from ..native.packed import NativeCall
from .attention import AttnShape, _check_attention, causal_keep

__all__ = ["SMALL_ATTENTION_MACS", "attention_single_tile", "bind_small_attention"]

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


#: Problems up to this many multiply-adds (B * H * N * M * (D + Dv)) run as the native loop kernel when
#: bound (ops.bind): below it numpy's ~10 calls per attention cost more than the arithmetic (the zoo's
#: 32-token, 4-head models: 22 us vs 43 us). Above it the native call multiplies through numpy's BLAS
#: (``opstrata_attention_blas_f32``: two sgemm per head and 64-row block, the softmax in C), where that
#: BLAS is reachable from C; else the numpy path.
SMALL_ATTENTION_MACS = 1 << 18


def _elem_strides(a: np.ndarray, nd: int) -> list[int] | None:
    st = [s // a.itemsize for s in a.strides]
    if any(s % a.itemsize for s in a.strides) or (a.shape[-1] > 1 and st[-1] != 1):
        return None
    return st[:nd]


def bind_small_attention(
    q: Any, k: Any, v: Any, *, out: Any, causal: bool = False, mask: Any = None, scale: float | None = None,
    lse: np.ndarray | None = None, **rest: Any,
) -> Callable[[], object] | None:  # fmt: skip
    """``attention_cpu(q, k, v, causal=, mask=, scale=)`` into ``out`` as one native call with every
    pointer and stride resolved once (ops.bind: the runtime's arena views are fixed per shape), for
    float32 problems: up to :data:`SMALL_ATTENTION_MACS` the loop kernel, above it the BLAS-backed kernel
    (on the pool's threads); None where neither applies (the caller keeps the numpy path). q / k / v / out
    may be strided views (a (B, S, H, D) tensor seen as (B, H, S, D)); ``lse``
    (contiguous float32 (B, H, N)), when given, receives the rows' logsumexp."""
    arrays = (q, k, v, out)
    if rest or not all(type(t) is np.ndarray and t.dtype == np.float32 and t.ndim == 4 for t in arrays):
        return None
    if mask is not None and (type(mask) is not np.ndarray or mask.dtype not in (np.float32, np.bool_)):
        return None
    try:
        s = _check_attention(q, k, v, mask)
    except Exception:
        return None  # the kernel's own call raises the error where it is made
    if out.shape != (s.b, s.h, s.n, s.dv) or not out.flags.writeable or min(s.n, s.m, s.d, s.dv) == 0:
        return None
    if lse is not None and (
        lse.shape != (s.b, s.h, s.n) or lse.dtype != np.float32 or not lse.flags.c_contiguous
    ):
        return None
    if any(np.may_share_memory(out, t) for t in (q, k, v) if t is not None):
        return None
    strides = [_elem_strides(t, 3) for t in arrays]
    lib = library()
    if lib is None or any(st is None for st in strides):
        return None
    small = s.b * s.h * s.n * s.m * (s.d + s.dv) <= SMALL_ATTENTION_MACS
    if not small and not (hasattr(lib, "opstrata_attention_blas_f32") and sgemm_ready(lib)):
        return None
    kind, ms = 0, [0, 0, 0, 0]
    mb = None
    if mask is not None:
        mb = np.broadcast_to(mask, (s.b, s.h, s.n, s.m))
        kind = 1 if mask.dtype == np.bool_ else 2
        ms = [st // mb.itemsize for st in mb.strides]
    dims = np.array([s.b, s.h, s.hkv, s.n, s.m, s.d, s.dv], np.int64)
    st_arr = [np.array(st, np.int64) for st in strides] + [np.array(ms, np.int64)]
    sc = 1.0 / math.sqrt(s.d) if scale is None else float(scale)
    args = (
        q.ctypes.data, k.ctypes.data, v.ctypes.data, None if mb is None else mb.ctypes.data, out.ctypes.data,
        None if lse is None else lse.ctypes.data, dims.ctypes.data, *(a.ctypes.data for a in st_arr), kind, int(bool(causal)), sc,
    )  # fmt: skip
    keep = (arrays, mb, dims, st_arr, lse, out)
    return NativeCall(
        lib,
        "opstrata_attention_f32" if small else "opstrata_attention_blas_f32",
        args if small else (*args, native_threads()),
        keep,
        lambda rc: (
            MemoryError("attention: the native kernel could not allocate its scratch rows")
            if rc == -2
            else RuntimeError(
                f"attention: the native kernel failed with code {rc} (-3: numpy's BLAS not bound)"
            )
        ),
        result=out,
    )
