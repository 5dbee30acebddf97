"""FlashAttention-2 forward and backward on ``cpu``: tiles over queries and keys, online softmax.

Follows FlashAttention (Dao et al. 2022, "Fast and Memory-Efficient Exact Attention with
IO-Awareness") in the FlashAttention-2 loop order (Dao 2023): the outer loop walks query tiles, the
inner loop key/value tiles, and each query row keeps a running max ``m`` and running sum ``l`` of
``exp(s - m)``; a new key tile rescales the accumulator by ``exp(m_old - m_new)``. The ``(N, M)``
score matrix is never materialised: the largest temporary is one ``(B, Hkv, G * block_q, block_k)``
tile, reused for every step. The forward saves the row logsumexp ``lse = m + log(l)``; the backward
recomputes each probability tile as ``exp(s - lse)`` and uses ``delta = rowsum(dO * O)``.

Grouped-query attention: the ``G = H / Hkv`` query heads sharing a kv head are packed as the rows of
one matrix, ``(B, Hkv, N * G, D)`` ordered by position then head, so every K/V tile is read once per
group and row ``r`` of a tile sits at query position ``r // G`` (what causal masking needs).

Causal (bottom-right aligned, see ``kernels/attention.py``): key tiles entirely above the diagonal are never
visited, and only tiles straddling it are masked. Low-precision inputs are converted to float32
once (``q`` with ``scale`` folded in); tiles accumulate in float32 (float64 stays float64).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from .._dtypes import FLOAT_DTYPES, accumulation_dtype
from .._errors import OpError
from .._registry import register
from ..native.library import count
from ..tune.autotune import Tunable, autotuned
from .attention import AttnShape, _as_arrays, _check_attention, _check_backward, _scale
from .attention_single_tile import attention_single_tile, bind_small_attention
from .parallel import check_workers, run_tasks

__all__ = ["attention_backward_cpu", "attention_cpu"]

#: Score-tile rows (query positions x G heads) by default; measured on D=64 (benchmarks/bench_attention.py).
DEFAULT_TILE_ROWS = 128
#: Keys per tile by default: wide enough that per-tile Python overhead is small next to the numpy work.
DEFAULT_BLOCK_K = 512
#: Bytes of one score tile across the batch before the batch is processed in chunks (keeps tiles in cache).
TILE_BYTES = 4 * 1024 * 1024

NEG_INF = -np.inf


@dataclass(frozen=True)
class Tiling:
    """Tile geometry of one call: ``bq`` query positions (``bq * g`` rows) by ``bk`` keys."""

    g: int  # query heads per kv head
    bq: int  # query positions per tile
    bk: int  # keys per tile
    bb: int  # batch entries per chunk
    off: int  # causal offset M - N: query i sees keys j <= i + off
    causal: bool


def _tiling(
    op: str, s: AttnShape, itemsize: int, causal: bool, block_q: int | None, block_k: int | None
) -> Tiling:
    for name, val in (("block_q", block_q), ("block_k", block_k)):
        if val is not None and (not isinstance(val, (int, np.integer)) or isinstance(val, bool) or val < 1):
            raise OpError(op, name, "an int >= 1 (or None for the measured default)", repr(val))
    g = s.h // s.hkv
    bq = int(block_q) if block_q is not None else max(1, DEFAULT_TILE_ROWS // g)
    bk = int(block_k) if block_k is not None else DEFAULT_BLOCK_K
    bq, bk = min(bq, max(s.n, 1)), min(bk, max(s.m, 1))
    bb = max(1, TILE_BYTES // max(1, s.hkv * bq * g * bk * itemsize))
    return Tiling(g, bq, bk, bb, s.m - s.n, causal)


def _tiles(n: int, step: int) -> Iterator[tuple[int, int]]:
    for start in range(0, n, step):
        yield start, min(start + step, n)


def _key_end(t: Tiling, m: int, i1: int) -> int:
    """Keys past this are above the diagonal for every query in ``[.., i1)``: those tiles are skipped."""
    return m if not t.causal else max(0, min(m, i1 + t.off))


# ---------------------------------------------------------------------------------------------
# packing: (B, H, N, X) <-> (B, Hkv, N * G, X), rows ordered by position, then head in the group
# ---------------------------------------------------------------------------------------------


def _pack(x: np.ndarray, s: AttnShape, acc: np.dtype, scale: float | None = None) -> np.ndarray:
    g = s.h // s.hkv
    out = np.empty((s.b, s.hkv, s.n, g, x.shape[-1]), acc)  # (B, Hkv, N, G, X)
    out[...] = x.reshape(s.b, s.hkv, g, s.n, x.shape[-1]).transpose(0, 1, 3, 2, 4)
    if scale is not None:
        out *= acc.type(scale)  # fold the softmax scale into q once: O(N D), not O(N M)
    return out.reshape(s.b, s.hkv, s.n * g, x.shape[-1])  # (B, Hkv, N*G, X)


def _pack_rows(x: np.ndarray, s: AttnShape, acc: np.dtype) -> np.ndarray:
    g = s.h // s.hkv
    out = np.empty((s.b, s.hkv, s.n, g), acc)  # (B, Hkv, N, G)
    out[...] = x.reshape(s.b, s.hkv, g, s.n).transpose(0, 1, 3, 2)
    return out.reshape(s.b, s.hkv, s.n * g)  # (B, Hkv, N*G)


def _unpack(x: np.ndarray, s: AttnShape) -> np.ndarray:
    g = s.h // s.hkv
    tail = x.shape[3:]
    x = x.reshape(s.b, s.hkv, s.n, g, *tail).swapaxes(2, 3)  # (B, Hkv, G, N, ...)
    return x.reshape(s.b, s.h, s.n, *tail)


def _rows(mask5: np.ndarray | None, b0: int, b1: int) -> np.ndarray | None:
    return None if mask5 is None else mask5[b0:b1]


def _mask_view(mask: np.ndarray | None, s: AttnShape) -> np.ndarray | None:
    """The mask as a read-only ``(B, Hkv, G, N, M)`` view (no copy: splitting H is always a view)."""
    if mask is None:
        return None
    full = np.broadcast_to(mask, (s.b, s.h, s.n, s.m))
    return full.reshape(s.b, s.hkv, s.h // s.hkv, s.n, s.m)


# ---------------------------------------------------------------------------------------------
# one score tile: S = (q * scale) @ k^T, then user mask and causal diagonal
# ---------------------------------------------------------------------------------------------


def _scores(
    qi: np.ndarray,
    kj: np.ndarray,
    buf: np.ndarray,
    mask5: np.ndarray | None,
    t: Tiling,
    rows: tuple[int, int],
    cols: tuple[int, int],
) -> np.ndarray:
    """Masked scores of one tile ``(b, Hkv, R, C)`` written into ``buf``; masked entries are -inf."""
    (i0, i1), (j0, j1) = rows, cols
    sc = np.matmul(qi, kj.swapaxes(-1, -2), out=buf[:, :, : qi.shape[2], : j1 - j0])  # (b, Hkv, R, C)
    by_pos = sc.reshape(sc.shape[0], sc.shape[1], i1 - i0, t.g, j1 - j0)  # (b, Hkv, nb, G, C), a view
    if mask5 is not None:
        blk = mask5[:, :, :, i0:i1, j0:j1].transpose(0, 1, 3, 2, 4)  # (b, Hkv, nb, G, C)
        if blk.dtype == np.bool_:
            np.copyto(by_pos, NEG_INF, where=~blk)
        else:
            by_pos += blk.astype(sc.dtype, copy=False)  # cast per tile, never the whole mask
    if t.causal and j1 - 1 > i0 + t.off:  # the tile straddles the diagonal
        keep = np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None] + t.off  # (nb, C)
        np.copyto(by_pos, NEG_INF, where=~keep[:, None, :])
    return sc


# ---------------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------------


@dataclass
class _RowState:
    """Online-softmax state of one query tile: running max, running sum, unnormalised output."""

    m: np.ndarray  # (b, Hkv, R)
    total: np.ndarray  # (b, Hkv, R): running sum of exp(s - m)
    acc: np.ndarray  # (b, Hkv, R, Dv)

    @classmethod
    def empty(cls, b: int, hkv: int, r: int, dv: int, dtype: np.dtype) -> _RowState:
        return cls(
            np.full((b, hkv, r), NEG_INF, dtype),
            np.zeros((b, hkv, r), dtype),
            np.zeros((b, hkv, r, dv), dtype),
        )


def _online_step(sc: np.ndarray, vj: np.ndarray, st: _RowState, pv: np.ndarray) -> None:
    """Fold one score tile into the running state; ``sc`` is overwritten with ``exp(s - m_new)``."""
    m_new = np.maximum(st.m, sc.max(axis=-1))  # (b, Hkv, R)
    m_safe = np.where(m_new == NEG_INF, 0.0, m_new)  # a row with no key yet: exp(-inf - 0) = 0, no NaN
    alpha = np.exp(st.m - m_safe)  # (b, Hkv, R): rescales what was accumulated under the old max
    sc -= m_safe[..., None]
    np.exp(sc, out=sc)  # (b, Hkv, R, C) probabilities up to the 1 / l factor
    st.total *= alpha
    st.total += sc.sum(axis=-1)
    st.acc *= alpha[..., None]
    st.acc += np.matmul(sc, vj, out=pv[:, :, : sc.shape[2]])  # (b, Hkv, R, Dv)
    st.m = m_new


def _finish(st: _RowState) -> tuple[np.ndarray, np.ndarray]:
    """Normalised output ``(b, Hkv, R, Dv)`` and logsumexp ``(b, Hkv, R)``; empty rows -> 0 and -inf."""
    empty = st.total == 0
    l_safe = np.where(empty, 1.0, st.total)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, NEG_INF, st.m + np.log(l_safe))
    st.acc /= l_safe[..., None]
    return st.acc, lse


def _forward_tile(
    qt: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask5: np.ndarray | None,
    t: Tiling,
    rows: tuple[int, int],
    out: np.ndarray,
    lse: np.ndarray,
) -> None:
    """One query tile ``[i0, i1)`` against its visible key tiles; writes rows of ``out`` and ``lse``."""
    (i0, i1), (b, hkv) = rows, qt.shape[:2]
    r0, r1, m, dv = i0 * t.g, i1 * t.g, k.shape[2], v.shape[3]
    buf = np.empty((b, hkv, r1 - r0, t.bk), qt.dtype)  # (b, Hkv, R, C): the one score tile
    pv = np.empty((b, hkv, r1 - r0, dv), qt.dtype)  # (b, Hkv, R, Dv)
    st = _RowState.empty(b, hkv, r1 - r0, dv, qt.dtype)
    for j0, j1 in _tiles(_key_end(t, m, i1), t.bk):
        sc = _scores(qt[:, :, r0:r1], k[:, :, j0:j1], buf, mask5, t, (i0, i1), (j0, j1))
        _online_step(sc, v[:, :, j0:j1], st, pv)
    out[:, :, r0:r1], lse[:, :, r0:r1] = _finish(st)


#: Tile sizes the autotuner may pick for the cpu kernel (None = the documented defaults).
ATTENTION_TUNABLE = Tunable(
    op="attention",
    device="cpu",
    version="2",  # 2: flash kernel (query x key tiles); 1 was the query-rows kernel
    params={"block_q": [None, 32, 64, 256], "block_k": [None, 256, 1024]},
    default={"block_q": None, "block_k": None},
)


@register("attention", device="cpu", dtypes=FLOAT_DTYPES)
@autotuned(ATTENTION_TUNABLE)
def attention_cpu(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    mask: Any = None,
    scale: float | None = None,
    return_lse: bool = False,
    block_q: int | None = None,
    block_k: int | None = None,
    workers: int | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """FlashAttention-2 forward; ``block_q`` (query positions per tile) and ``block_k`` (keys per tile) tune it.

    Defaults: ``block_q = DEFAULT_TILE_ROWS // G`` (so a tile has ~128 rows whatever the group size)
    and ``block_k = DEFAULT_BLOCK_K``. Query tiles run on ``workers`` threads (default: one per core
    when threadpoolctl can pin BLAS to one thread, see ``_parallel``). Semantics are those of
    :func:`opstrata.ops.attention`.
    """
    q, k, v, mask = _as_arrays(q, k, v, mask)
    s = _check_attention(q, k, v, mask)
    acc = accumulation_dtype(q.dtype)
    t = _tiling("attention", s, acc.itemsize, causal, block_q, block_k)
    if workers is not None:
        check_workers("attention", workers)  # validated on every path
    if q.dtype == np.float32 and block_q is None and block_k is None:  # small: one native call (as ops.bind)
        out = np.empty((s.b, s.h, s.n, s.dv), np.float32)
        lse0 = np.empty((s.b, s.h, s.n), np.float32) if return_lse else None
        native = bind_small_attention(q, k, v, out=out, causal=causal, mask=mask, scale=scale, lse=lse0)
        if native is not None:
            native()
            count("attention", "native")
            return (out, lse0) if return_lse else out
    if t.bq >= s.n and t.bk >= s.m and t.bb >= s.b and min(s.n, s.m, s.d, s.dv) > 0:
        one, lse1 = attention_single_tile(q, k, v, mask, s, causal, _scale(scale, s.d), acc)
        res = one.astype(q.dtype, copy=False)  # one tile: no online softmax to combine
        return (res, lse1) if return_lse else res
    qt = _pack(q, s, acc, _scale(scale, s.d))  # (B, Hkv, N*G, D)
    ka, va = k.astype(acc, copy=False), v.astype(acc, copy=False)  # (B, Hkv, M, D), (B, Hkv, M, Dv)
    mask5 = _mask_view(mask, s)  # (B, Hkv, G, N, M) view or None
    out = np.empty((s.b, s.hkv, s.n * t.g, s.dv), acc)  # (B, Hkv, N*G, Dv)
    lse = np.empty((s.b, s.hkv, s.n * t.g), acc)  # (B, Hkv, N*G)
    tasks = [
        partial(
            _forward_tile,
            qt[b0:b1],
            ka[b0:b1],
            va[b0:b1],
            _rows(mask5, b0, b1),
            t,
            rows,
            out[b0:b1],
            lse[b0:b1],
        )
        for b0, b1 in _tiles(s.b, t.bb)
        for rows in reversed(list(_tiles(s.n, t.bq)))  # costliest (causal: last) tiles first
    ]
    run_tasks(tasks, _workers_for("attention", workers, s, causal))
    res = _unpack(out, s).astype(q.dtype, copy=False)  # (B, H, N, Dv)
    return (res, _unpack(lse, s)) if return_lse else res


attention_cpu.binder = bind_small_attention  # type: ignore[attr-defined]  # ops.bind: one native call

#: Below this many multiply-adds a call runs on one thread: a thread pool and re-pinning BLAS cost
#: ~0.1-1 ms, more than small (decode-sized) attention takes (measured with bench_ops.py).
PARALLEL_MIN_MACS = 1 << 26


def _workers_for(op: str, workers: int | None, s: AttnShape, causal: bool, passes: float = 1.0) -> int:
    """Explicit ``workers``, else one per core for large problems and 1 for small ones."""
    if workers is not None:
        return check_workers(op, workers)
    macs = passes * s.b * s.h * s.n * s.m * (s.d + s.dv) / (2 if causal else 1)
    return check_workers(op, None) if macs >= PARALLEL_MIN_MACS else 1


# ---------------------------------------------------------------------------------------------
# backward: recompute P = exp(S - lse) per tile; dV += P^T dO, dS = P (dO V^T - delta), dQ, dK
# ---------------------------------------------------------------------------------------------


@dataclass
class _Grads:
    """Gradient accumulators in packed layout (``dq`` is scaled by ``scale`` at the end)."""

    dq: np.ndarray  # (b, Hkv, N*G, D)
    dk: np.ndarray  # (b, Hkv, M, D)
    dv: np.ndarray  # (b, Hkv, M, Dv)


def _backward_tile(
    sc: np.ndarray,
    qi: np.ndarray,
    doi: np.ndarray,
    rows: tuple[int, int],
    cols: tuple[int, int],
    k: np.ndarray,
    v: np.ndarray,
    lse_i: np.ndarray,
    delta_i: np.ndarray,
    gr: _Grads,
    dp_buf: np.ndarray,
) -> None:
    """One (query tile, key tile) step; ``sc`` holds the masked scores and becomes P, ``dp_buf`` dS."""
    (r0, r1), (j0, j1) = rows, cols
    sc -= lse_i[..., None]
    np.exp(sc, out=sc)  # (b, Hkv, R, C) = P, exactly the forward's probabilities
    gr.dv[:, :, j0:j1] += np.matmul(sc.swapaxes(-1, -2), doi)  # (b, Hkv, C, Dv), G heads summed
    ds = np.matmul(doi, v[:, :, j0:j1].swapaxes(-1, -2), out=dp_buf[:, :, : r1 - r0, : j1 - j0])  # dP
    ds -= delta_i[..., None]
    ds *= sc  # (b, Hkv, R, C) = dS, the gradient w.r.t. the scaled scores
    gr.dq[:, :, r0:r1] += np.matmul(ds, k[:, :, j0:j1])  # (b, Hkv, R, D)
    gr.dk[:, :, j0:j1] += np.matmul(ds.swapaxes(-1, -2), qi)  # (b, Hkv, C, D): qi carries the scale


def _backward_chunk(
    qt: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    dot: np.ndarray,
    lse: np.ndarray,
    delta: np.ndarray,
    mask5: np.ndarray | None,
    t: Tiling,
    gr: _Grads,
    q_tiles: list[tuple[int, int]],
) -> None:
    """Backward of ``q_tiles`` for a chunk of (batch, kv head) pairs; ``gr`` holds that chunk's gradients."""
    b, hkv = qt.shape[:2]
    m = k.shape[2]
    buf = np.empty((b, hkv, t.bq * t.g, t.bk), qt.dtype)  # (b, Hkv, R, C) scores, then P
    dp_buf = np.empty_like(buf)  # (b, Hkv, R, C) dP, then dS
    lse_safe = np.where(lse == NEG_INF, np.inf, lse)  # an empty row: exp(s - inf) = 0, no NaN
    for i0, i1 in q_tiles:
        r0, r1 = i0 * t.g, i1 * t.g
        qi, doi = qt[:, :, r0:r1], dot[:, :, r0:r1]
        for j0, j1 in _tiles(_key_end(t, m, i1), t.bk):
            sc = _scores(qi, k[:, :, j0:j1], buf, mask5, t, (i0, i1), (j0, j1))
            _backward_tile(
                sc, qi, doi, (r0, r1), (j0, j1), k, v, lse_safe[:, :, r0:r1], delta[:, :, r0:r1], gr, dp_buf
            )


def _backward_units(s: AttnShape, t: Tiling, nw: int) -> list[tuple[slice, slice, list[tuple[int, int]]]]:
    """Work units ``(batch slice, kv-head slice, query tiles)``: kv heads split first; when there are
    fewer (batch, head) chunks than workers, the query tiles are dealt round-robin (balances causal)."""
    q_tiles = list(_tiles(s.n, t.bq))
    chunks = [
        (slice(b0, b1), slice(h0, h1))
        for b0, b1 in _tiles(s.b, t.bb)
        for h0, h1 in _tiles(s.hkv, -(-s.hkv // nw))
    ]
    if len(chunks) >= nw or len(q_tiles) < 2:
        return [(bs, hs, q_tiles) for bs, hs in chunks]
    return [(bs, hs, q_tiles[w::nw]) for bs, hs in chunks for w in range(nw) if q_tiles[w::nw]]


def _run_backward(
    units: list[tuple[slice, slice, list[tuple[int, int]]]],
    nw: int,
    qt: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    dot: np.ndarray,
    lse: np.ndarray,
    delta: np.ndarray,
    mask5: np.ndarray | None,
    t: Tiling,
    gr: _Grads,
) -> None:
    """Run the units; units sharing a (batch, head) chunk get private dk/dv, summed afterwards."""
    shared = len({(bs.start, hs.start) for bs, hs, _ in units}) < len(units)
    tasks, private = [], []
    for bs, hs, q_tiles in units:
        at = (bs, hs)
        dk, dv = (np.zeros_like(g[at]) for g in (gr.dk, gr.dv)) if shared else (gr.dk[at], gr.dv[at])
        private.append((at, dk, dv))
        sub = _Grads(gr.dq[at], dk, dv)  # dq rows of distinct query tiles never overlap
        m5 = None if mask5 is None else mask5[at]
        args = (qt[at], k[at], v[at], dot[at], lse[at], delta[at], m5, t, sub, q_tiles)
        tasks.append(partial(_backward_chunk, *args))
    run_tasks(tasks, nw)
    if shared:
        for at, dk, dv in private:
            gr.dk[at] += dk
            gr.dv[at] += dv


@register("attention_backward", device="cpu", dtypes=FLOAT_DTYPES)
def attention_backward_cpu(
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
    block_q: int | None = None,
    block_k: int | None = None,
    workers: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FlashAttention-2 backward from the forward's ``out`` and ``lse``; tiles as :func:`attention_cpu`.

    For float16/bfloat16/float8 inputs ``out`` and ``lse`` come rounded to that dtype, and rebuilding the
    probabilities from them costs 1.5-3x the error of recomputing them (found by the conformance matrix
    against ``ref``): they are recomputed in float32 by one forward pass first (checked, not used).
    """
    q, k, v, out, grad_out, lse, mask = _as_arrays(q, k, v, out, grad_out, lse, mask)
    s = _check_attention(q, k, v, mask, op="attention_backward")
    _check_backward(q, out, grad_out, lse, s)
    acc = accumulation_dtype(q.dtype)
    if acc != q.dtype:  # low precision: the forward's statistics again, in the accumulation dtype
        t0 = _tiling("attention_backward", s, acc.itemsize, causal, block_q, block_k)  # explicit tiles: the
        out, lse = attention_cpu(  # numpy forward whose rounding the backward's tiles share (not the native)
            q.astype(acc), k.astype(acc), v.astype(acc), causal=causal, mask=mask, scale=scale, return_lse=True,
            block_q=t0.bq, block_k=t0.bk, workers=workers,
        )  # fmt: skip
    t = _tiling("attention_backward", s, acc.itemsize, causal, block_q, block_k)
    sc = _scale(scale, s.d)
    qt = _pack(q, s, acc, sc)  # (B, Hkv, N*G, D)
    dot = _pack(grad_out, s, acc)  # (B, Hkv, N*G, Dv)
    delta = np.einsum("bhrd,bhrd->bhr", dot, _pack(out, s, acc))  # (B, Hkv, N*G): rowsum(dO * O)
    lse_p = _pack_rows(lse, s, acc)  # (B, Hkv, N*G)
    ka, va = k.astype(acc, copy=False), v.astype(acc, copy=False)
    mask5 = _mask_view(mask, s)
    gr = _Grads(np.zeros_like(qt), np.zeros(k.shape, acc), np.zeros(v.shape, acc))
    nw = _workers_for("attention_backward", workers, s, causal, passes=2.5)
    _run_backward(_backward_units(s, t, nw), nw, qt, ka, va, dot, lse_p, delta, mask5, t, gr)
    gr.dq *= acc.type(sc)
    return _unpack(gr.dq, s).astype(q.dtype), gr.dk.astype(q.dtype), gr.dv.astype(q.dtype)
