"""Backward kernels of layer_norm and rms_norm on ``ref`` and ``cpu`` (normalized dims ``axis..end``).

With ``xhat = (x - mean) * rstd`` and ``gw = grad * weight`` (Ba et al. 2016):
``dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))``, ``dweight = sum(grad * xhat)``,
``dbias = sum(grad)`` over the leading dims. rms_norm is the same without the mean terms.

Saved statistics: by default both recompute ``mean`` and ``rstd`` from ``x`` (cheap next to the
backward itself, and nothing to keep alive between passes). A caller that saved them from the
forward may pass ``mean=`` / ``rstd=`` of shape ``x.shape[:axis]`` (or with trailing 1s).
The cpu kernels stream over row chunks (``block_rows``, autotuned) so their two temporaries stay
cache-sized; weight/bias gradients accumulate in float32 (float64 for float64) across chunks.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._dtypes import compute_dtype
from .._errors import OpError
from .._registry import call, register
from ..kernels.elementwise import FLOATS, cast_back, checked, ieee, nd, upcast
from ..kernels.normalization import _check_eps, _trailing
from ..tune.autotune import Tunable, autotuned
from .matmul import check_grad

__all__ = ["layer_norm_backward", "rms_norm_backward"]

#: Default bytes of one chunk's float32 rows on cpu (measured best on 4096x1024 and 8192x512: ~1.7x over
#: unchunked); ``block_rows`` overrides it.
CHUNK_BYTES = 1024 * 1024

LAYER_NORM_BACKWARD = Tunable(
    op="layer_norm_backward",
    device="cpu",
    version="1",
    params={"block_rows": [None, 32, 128, 512, 2048]},
    default={"block_rows": None},
)
RMS_NORM_BACKWARD = Tunable(
    op="rms_norm_backward",
    device="cpu",
    version="1",
    params={"block_rows": [None, 32, 128, 512, 2048]},
    default={"block_rows": None},
)


def _stat(op: str, name: str, s: Any, rows: int, lead: tuple[int, ...]) -> np.ndarray | None:
    """A saved per-row statistic as a float ``(rows, 1)`` array, or None to recompute."""
    if s is None:
        return None
    s = nd(s)
    squeezed = s.shape[: len(lead)] if s.shape[len(lead) :] == (1,) * (s.ndim - len(lead)) else None
    if s.dtype.kind not in "fV" or squeezed != lead:
        raise OpError(
            op,
            name,
            f"a float array of shape {lead} (x.shape[:axis]), trailing 1s allowed",
            f"{s.dtype} {s.shape}",
        )
    return s.reshape(rows, 1)


def _prepare(
    op: str, x: Any, weight: Any, grad: Any, axis: int, eps: float, stats: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, int, dict[str, np.ndarray | None]]:
    """Validate; return x, weight and grad as (rows, n) views, the axis and the saved statistics."""
    _check_eps(op, eps)
    x = checked(op, "x", x, FLOATS)
    x, a, (w,) = _trailing(op, x, axis, {"weight": weight})
    grad = nd(grad)
    check_grad(op, grad, x.shape, "x", x)
    rows, n = math.prod(x.shape[:a]), math.prod(x.shape[a:])
    saved = {k: _stat(op, k, v, rows, x.shape[:a]) for k, v in stats.items()}
    return x.reshape(rows, n), None if w is None else w.reshape(n), grad.reshape(rows, n), a, saved


def _block(op: str, block_rows: int | None, n: int, rows: int) -> int:
    if block_rows is None:
        return max(1, min(rows, CHUNK_BYTES // max(1, 4 * n)))
    if isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1:
        raise OpError(op, "block_rows", "an int >= 1 or None", repr(block_rows))
    return block_rows


# --------------------------------------------------------------------------- ref


def _ref_backward(
    x: np.ndarray, w: np.ndarray | None, g: np.ndarray, eps: float, centered: bool, mean: Any, rstd: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t, gt = upcast(x), upcast(g)
    mu = (t.mean(axis=1, keepdims=True) if mean is None else mean.astype(t.dtype)) if centered else 0.0
    if rstd is None:
        var = ((t - mu) ** 2).mean(axis=1, keepdims=True)
        rstd = 1.0 / np.sqrt(var + eps)
    else:
        rstd = rstd.astype(t.dtype)
    xhat = (t - mu) * rstd
    gw = gt if w is None else gt * w.astype(t.dtype)
    inner = gw - xhat * (gw * xhat).mean(axis=1, keepdims=True)
    if centered:
        inner = inner - gw.mean(axis=1, keepdims=True)
    return rstd * inner, (gt * xhat).sum(axis=0), gt.sum(axis=0)


@register("layer_norm_backward", device="ref", dtypes=FLOATS)
@ieee
def layer_norm_backward_ref(
    x: Any, weight: Any, grad: Any, *, axis: int = -1, eps: float = 1e-5, mean: Any = None, rstd: Any = None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    x0 = nd(x)
    x2, w, g2, a, st = _prepare(
        "layer_norm_backward", x, weight, grad, axis, eps, {"mean": mean, "rstd": rstd}
    )
    dx, dw, db = _ref_backward(x2, w, g2, eps, True, st["mean"], st["rstd"])
    norm = x0.shape[a:]
    return (
        cast_back(dx.reshape(x0.shape), x0.dtype),
        None if w is None else cast_back(dw.reshape(norm), x0.dtype),
        cast_back(db.reshape(norm), x0.dtype),
    )


@register("rms_norm_backward", device="ref", dtypes=FLOATS)
@ieee
def rms_norm_backward_ref(
    x: Any, weight: Any, grad: Any, *, axis: int = -1, eps: float = 1e-6, rstd: Any = None
) -> tuple[np.ndarray, np.ndarray | None]:
    x0 = nd(x)
    x2, w, g2, a, st = _prepare("rms_norm_backward", x, weight, grad, axis, eps, {"rstd": rstd})
    dx, dw, _ = _ref_backward(x2, w, g2, eps, False, None, st["rstd"])
    return cast_back(dx.reshape(x0.shape), x0.dtype), None if w is None else cast_back(
        dw.reshape(x0.shape[a:]), x0.dtype
    )


# --------------------------------------------------------------------------- cpu


def _chunk(
    xc: np.ndarray,
    gc: np.ndarray,
    w: np.ndarray | None,
    eps: float,
    centered: bool,
    mean: np.ndarray | None,
    rstd: np.ndarray | None,
    acc: tuple[np.ndarray, np.ndarray],
) -> np.ndarray:
    """dx of one row chunk in the compute dtype; adds the chunk's dweight/dbias into ``acc``."""
    cdt = acc[0].dtype
    n = xc.shape[1]
    t = np.array(xc, dtype=cdt, copy=True)  # (r, n) buffer 1: becomes xhat
    if centered:
        t -= t.mean(axis=1, keepdims=True) if mean is None else mean.astype(cdt)
    if rstd is None:
        r = np.einsum("ij,ij->i", t, t)[:, None]  # (r, 1) sum of squares, no temporary
        r /= n
        r += eps
        np.sqrt(r, out=r)
        np.reciprocal(r, out=r)
    else:
        r = rstd.astype(cdt)
    t *= r  # xhat
    g = gc.astype(cdt, copy=False)
    np.add(acc[0], np.einsum("ij,ij->j", g, t), out=acc[0])  # dweight partial
    np.add(acc[1], g.sum(axis=0), out=acc[1])  # dbias partial
    gw = g * w if w is not None else g.copy()  # (r, n) buffer 2
    proj = np.einsum("ij,ij->i", gw, t)[:, None]  # (r, 1)
    proj /= n
    gw_mean = gw.mean(axis=1, keepdims=True) if centered else None  # (r, 1)
    t *= proj
    gw -= t
    if gw_mean is not None:
        gw -= gw_mean
    gw *= r
    return gw


def _cpu_backward(
    op: str,
    x2: np.ndarray,
    w: np.ndarray | None,
    g2: np.ndarray,
    eps: float,
    centered: bool,
    st: dict[str, Any],
    block_rows: int | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, n = x2.shape
    cdt = compute_dtype(x2.dtype)
    dx = np.empty((rows, n), x2.dtype)
    acc = (np.zeros(n, cdt), np.zeros(n, cdt))
    wc = None if w is None else w.astype(cdt, copy=False)
    step = _block(op, block_rows, n, rows)
    mean, rstd = st.get("mean"), st.get("rstd")
    for s in range(0, rows, step):
        sl = slice(s, min(rows, s + step))
        out = _chunk(
            x2[sl],
            g2[sl],
            wc,
            eps,
            centered,
            None if mean is None else mean[sl],
            None if rstd is None else rstd[sl],
            acc,
        )
        cast_back(out, x2.dtype, out=dx[sl])
    return dx, acc[0], acc[1]


@register("layer_norm_backward", device="cpu", dtypes=FLOATS)
@autotuned(LAYER_NORM_BACKWARD)
@ieee
def layer_norm_backward_cpu(
    x: Any,
    weight: Any,
    grad: Any,
    *,
    axis: int = -1,
    eps: float = 1e-5,
    mean: Any = None,
    rstd: Any = None,
    block_rows: int | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """cpu kernel; ``block_rows`` (rows per chunk) is the tuning knob, default from ``CHUNK_BYTES``."""
    x0 = nd(x)
    x2, w, g2, a, st = _prepare(
        "layer_norm_backward", x, weight, grad, axis, eps, {"mean": mean, "rstd": rstd}
    )
    dx, dw, db = _cpu_backward("layer_norm_backward", x2, w, g2, eps, True, st, block_rows)
    norm = x0.shape[a:]
    return (
        dx.reshape(x0.shape),
        None if w is None else cast_back(dw.reshape(norm), x0.dtype),
        cast_back(db.reshape(norm), x0.dtype),
    )


@register("rms_norm_backward", device="cpu", dtypes=FLOATS)
@autotuned(RMS_NORM_BACKWARD)
@ieee
def rms_norm_backward_cpu(
    x: Any,
    weight: Any,
    grad: Any,
    *,
    axis: int = -1,
    eps: float = 1e-6,
    rstd: Any = None,
    block_rows: int | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """cpu kernel; ``block_rows`` as for :func:`layer_norm_backward_cpu`."""
    x0 = nd(x)
    x2, w, g2, a, st = _prepare("rms_norm_backward", x, weight, grad, axis, eps, {"rstd": rstd})
    dx, dw, _ = _cpu_backward("rms_norm_backward", x2, w, g2, eps, False, st, block_rows)
    return dx.reshape(x0.shape), None if w is None else cast_back(dw.reshape(x0.shape[a:]), x0.dtype)


# --------------------------------------------------------------------------- public


def layer_norm_backward(
    x: Any,
    weight: Any,
    grad: Any,
    *,
    axis: int = -1,
    eps: float = 1e-5,
    mean: Any = None,
    rstd: Any = None,
    device: str | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Gradients ``(dx, dweight, dbias)`` of :func:`layer_norm` (``dweight`` None when ``weight`` is None).

    ``mean``/``rstd`` (shape ``x.shape[:axis]``) are optional saved forward statistics; without
    them they are recomputed from ``x``. ``dbias`` is ``grad`` summed over the leading dims
    (returned whether or not the forward had a bias).

    >>> dx, dw, db = layer_norm_backward(np.array([[1.0, 3.0]]), np.ones(2), np.ones((1, 2)), eps=0.0)
    >>> dx.tolist(), dw.tolist(), db.tolist()
    ([[0.0, 0.0]], [-1.0, 1.0], [1.0, 1.0])
    """
    return call(
        "layer_norm_backward", x, weight, grad, axis=axis, eps=eps, mean=mean, rstd=rstd, device=device
    )


def rms_norm_backward(
    x: Any,
    weight: Any,
    grad: Any,
    *,
    axis: int = -1,
    eps: float = 1e-6,
    rstd: Any = None,
    device: str | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Gradients ``(dx, dweight)`` of :func:`rms_norm` (``dweight`` None when ``weight`` is None).

    ``rstd`` (shape ``x.shape[:axis]``) is the optional saved ``1/sqrt(mean(x^2) + eps)``.

    >>> dx, dw = rms_norm_backward(np.array([[3.0, 4.0]]), None, np.array([[1.0, 0.0]]), eps=0.0)
    >>> np.round(dx, 4).tolist(), dw
    ([[0.181, -0.1358]], None)
    """
    return call("rms_norm_backward", x, weight, grad, axis=axis, eps=eps, rstd=rstd, device=device)
