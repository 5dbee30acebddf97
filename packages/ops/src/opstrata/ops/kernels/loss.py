"""cross_entropy on ``ref`` and ``cpu`` with torch.nn.functional.cross_entropy semantics.

For logits ``(N, C, d1, ...)`` and integer targets ``(N, d1, ...)``:
``loss_i = (1 - eps) * (-log p[i, t_i]) + eps * mean_c(-log p[i, c])`` (label smoothing as in
Szegedy et al. 2016, "Rethinking the Inception Architecture"), ``log p = log_softmax(logits, axis=1)``.
Positions whose target equals ``ignore_index`` contribute 0 and are not counted by ``"mean"``; if every
position is ignored, ``"mean"`` is NaN (0/0) as in torch. Unbatched ``(C,)`` logits take a 0-d target.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtypes import accumulation_dtype
from .._errors import OpError, check_dtype, check_ndim
from .._registry import call, register
from .elementwise import FLOATS, cast_back, checked, ieee, nd, upcast
from .reduce import mean_over
from .softmax import log_softmax_ref, safe_sum, shifted_buffer

REDUCTIONS: tuple[str, ...] = ("mean", "sum", "none")


def cross_entropy(
    logits: Any,
    target: Any,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    device: str | None = None,
) -> np.ndarray:
    """Softmax cross-entropy of ``logits`` against integer class indices ``target`` (torch semantics).

    logits: float ``(N, C)`` or ``(N, C, d1, ...)``; target: integer ``(N,)`` / ``(N, d1, ...)`` with
    values in ``[0, C)`` or ``ignore_index``. reduction ``"mean"`` (over non-ignored positions),
    ``"sum"`` or ``"none"`` (shape of target, 0 at ignored positions). Low-precision logits compute and
    accumulate in float32; the result has the logits' dtype.

    >>> round(float(cross_entropy(np.array([[0.0, 0.0]]), np.array([1]))), 4)
    0.6931
    """
    logits = checked("cross_entropy", "logits", logits, FLOATS)
    return call(
        "cross_entropy",
        logits,
        target,
        reduction=reduction,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        device=device,
    )


def _prepare(
    logits: Any,
    target: Any,
    reduction: str,
    ignore_index: int,
    label_smoothing: float,
    op: str = "cross_entropy",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Validate; return (logits (N, C, ...), safe target (N, ...), valid mask (N, ...), unbatched)."""
    logits, target = nd(logits), nd(target)
    check_ndim(op, "logits", logits, (1, None), layout="N, C, d1, ...")
    check_dtype(op, "target", target, "integer")
    if reduction not in REDUCTIONS:
        raise OpError(op, "reduction", f"one of {REDUCTIONS}", repr(reduction))
    if isinstance(label_smoothing, bool) or not 0.0 <= label_smoothing <= 1.0:
        raise OpError(op, "label_smoothing", "a float in [0, 1]", repr(label_smoothing))
    unbatched = logits.ndim == 1
    if unbatched:
        logits, target = logits[None], target[None]  # (1, C), (1,)
    want = (logits.shape[0], *logits.shape[2:])
    if target.shape != want:
        raise OpError(op, "target", f"shape {want} (logits.shape without the class dim 1)", str(target.shape))
    valid = target != ignore_index
    n_classes = logits.shape[1]
    bad = valid & ((target < 0) | (target >= n_classes))
    if bad.any():
        raise OpError(
            op,
            "target",
            f"class indices in [0, {n_classes}) or ignore_index={ignore_index}",
            str(target[bad][:5]),
        )
    return logits, np.where(valid, target, 0).astype(np.intp), valid, unbatched


def _reduce(
    loss: np.ndarray, valid: np.ndarray, reduction: str, dtype: np.dtype, unbatched: bool
) -> np.ndarray:
    """Apply the reduction to per-position losses (compute dtype) and round to ``dtype`` once."""
    loss = np.where(valid, loss, 0)  # ignored positions: 0 (also clears their NaN/inf)
    if reduction == "none":
        return cast_back(loss[0] if unbatched else loss, dtype)
    acc = accumulation_dtype(dtype)
    total = loss.sum(dtype=acc)
    return cast_back(total / valid.sum() if reduction == "mean" else total, dtype)


@register("cross_entropy", device="ref", dtypes=FLOATS)
@ieee
def cross_entropy_ref(
    logits: Any,
    target: Any,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> np.ndarray:
    x, t, valid, unbatched = _prepare(logits, target, reduction, ignore_index, label_smoothing)
    logp = log_softmax_ref(upcast(x), axis=1)  # (N, C, ...) in the compute dtype
    loss = -np.take_along_axis(logp, t[:, None], axis=1)[:, 0]  # (N, ...) negative log-likelihood
    if label_smoothing:  # skipped at 0 so -inf logits do not turn 0 * inf into NaN
        loss = (1 - label_smoothing) * loss + label_smoothing * -mean_over(logp, 1)
    return _reduce(loss, valid, reduction, x.dtype, unbatched)


@register("cross_entropy", device="cpu", dtypes=FLOATS)
@ieee
def cross_entropy_cpu(
    logits: Any,
    target: Any,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> np.ndarray:
    x, t, valid, unbatched = _prepare(logits, target, reduction, ignore_index, label_smoothing)
    z = shifted_buffer(x, 1)  # (N, C, ...) x - max, the only full-size buffer
    picked = np.take_along_axis(z, t[:, None], axis=1)[:, 0]  # (N, ...)
    mean_z = mean_over(z, 1) if label_smoothing else None  # (N, ...), read before z is overwritten
    np.exp(z, out=z)
    lse = np.log(safe_sum(z, 1)[:, 0])  # (N, ...) log-sum-exp of the shifted logits
    loss = lse - picked  # -log p[target]
    if mean_z is not None:
        loss *= 1 - label_smoothing
        loss += label_smoothing * (lse - mean_z)
    return _reduce(loss, valid, reduction, x.dtype, unbatched)
