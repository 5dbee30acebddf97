"""cross_entropy on ``ref`` and ``cpu`` with torch.nn.functional.cross_entropy semantics, and the ONNX
NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss pair (``nll_loss``, ``softmax_cross_entropy_loss``).

For logits ``(N, C, d1, ...)`` and integer targets ``(N, d1, ...)``:
``loss_i = (1 - eps) * (-log p[i, t_i]) + eps * mean_c(-log p[i, c])`` (label smoothing as in
Szegedy et al. 2016, "Rethinking the Inception Architecture"), ``log p = log_softmax(logits, axis=1)``.
Positions whose target equals ``ignore_index`` contribute 0 and are not counted by ``"mean"``; if every
position is ignored, ``"mean"`` is NaN (0/0) as in torch. Unbatched ``(C,)`` logits take a 0-d target.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtypes import accumulation_dtype, compute_dtype
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


# --------------------------------------------------------------------------- ONNX losses
# NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (ONNX operator spec, opset 12/13):
# ``loss[n, d...] = -input[n, target[n, d...], d...] * w[target[n, d...]]`` (w = 1 without weights),
# 0 where target == ignore_index; "mean" divides the sum by the sum of those per-position weights (the
# count of non-ignored positions without weights), so an all-ignored batch gives NaN (0/0) as onnxruntime.


def nll_loss(
    log_prob: Any,
    target: Any,
    weight: Any = None,
    *,
    reduction: str = "mean",
    ignore_index: int | None = None,
    device: str | None = None,
) -> np.ndarray:
    """Negative log-likelihood of classes ``target`` under ``log_prob`` (ONNX NegativeLogLikelihoodLoss).

    log_prob: float ``(N, C)`` or ``(N, C, d1, ...)``; target: integer ``(N,)`` / ``(N, d1, ...)`` in
    ``[0, C)`` or ``ignore_index``; weight: optional ``(C,)`` of log_prob's dtype. reduction ``"mean"``
    (weighted), ``"sum"`` or ``"none"`` (target's shape). Low precision computes in float32.

    >>> float(nll_loss(np.log(np.array([[0.5, 0.5]])), np.array([1])).round(4))
    0.6931
    """
    log_prob = checked("nll_loss", "log_prob", log_prob, FLOATS)
    return call(
        "nll_loss", log_prob, target, weight, reduction=reduction, ignore_index=ignore_index, device=device
    )


def softmax_cross_entropy_loss(
    scores: Any,
    labels: Any,
    weight: Any = None,
    *,
    reduction: str = "mean",
    ignore_index: int | None = None,
    device: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(loss, log_prob)`` of ONNX SoftmaxCrossEntropyLoss: :func:`nll_loss` of ``log_softmax(scores, 1)``.

    Shapes, weights, ignore_index and reduction as :func:`nll_loss`; log_prob has the scores' shape.

    >>> loss, _ = softmax_cross_entropy_loss(np.zeros((1, 2)), np.array([0]))
    >>> round(float(loss), 4)
    0.6931
    """
    scores = checked("softmax_cross_entropy_loss", "scores", scores, FLOATS)
    check_ndim("softmax_cross_entropy_loss", "scores", scores, (2, None), layout="N, C, d1, ...")
    log_prob = call("log_softmax", scores, axis=1, device=device)
    loss = call(
        "nll_loss", log_prob, labels, weight, reduction=reduction, ignore_index=ignore_index, device=device
    )
    return loss, log_prob


def _nll_prepare(
    x: Any, target: Any, weight: Any, reduction: str, ignore_index: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate; return (input (N, C, ...), safe target (N, ...), per-position weights (N, ...)), the
    weights in the compute dtype and 0 at ignored positions."""
    op = "nll_loss"
    x, target = nd(x), nd(target)
    check_ndim(op, "log_prob", x, (2, None), layout="N, C, d1, ...")
    check_dtype(op, "target", target, "integer")
    if reduction not in REDUCTIONS:
        raise OpError(op, "reduction", f"one of {REDUCTIONS}", repr(reduction))
    want = (x.shape[0], *x.shape[2:])
    if target.shape != want:
        raise OpError(
            op, "target", f"shape {want} (log_prob.shape without the class dim 1)", str(target.shape)
        )
    n_classes = x.shape[1]
    valid = np.ones(target.shape, bool) if ignore_index is None else target != ignore_index
    bad = valid & ((target < 0) | (target >= n_classes))
    if bad.any():
        raise OpError(
            op,
            "target",
            f"class indices in [0, {n_classes}) or ignore_index={ignore_index}",
            str(target[bad][:5]),
        )
    safe = np.where(valid, target, 0).astype(np.intp)
    cdt = compute_dtype(x.dtype)
    if weight is None:
        w = valid.astype(cdt)
    else:
        weight = checked(op, "weight", weight, FLOATS)
        if weight.shape != (n_classes,) or weight.dtype != x.dtype:
            raise OpError(
                op, "weight", f"{x.dtype} of shape ({n_classes},)", f"{weight.dtype} {weight.shape}"
            )
        w = np.where(valid, weight.astype(cdt)[safe], 0).astype(cdt)
    return x, safe, w


def _nll_reduce(loss: np.ndarray, w: np.ndarray, reduction: str, dtype: np.dtype) -> np.ndarray:
    """Apply the reduction to weighted per-position losses (compute dtype); round to ``dtype`` once."""
    if reduction == "none":
        return cast_back(loss, dtype)
    acc = accumulation_dtype(dtype)
    total = loss.sum(dtype=acc)
    return cast_back(total / w.sum(dtype=acc) if reduction == "mean" else total, dtype)


@register("nll_loss", device="ref", dtypes=FLOATS)
@ieee
def nll_loss_ref(
    log_prob: Any,
    target: Any,
    weight: Any = None,
    *,
    reduction: str = "mean",
    ignore_index: int | None = None,
) -> np.ndarray:
    x, t, w = _nll_prepare(log_prob, target, weight, reduction, ignore_index)
    loss = np.zeros(t.shape, w.dtype)
    for idx in np.ndindex(*t.shape):  # one position at a time: the obviously-correct oracle
        if w[idx]:
            loss[idx] = -float(x[(idx[0], t[idx], *idx[1:])]) * w[idx]
    return _nll_reduce(loss, w, reduction, x.dtype)


@register("nll_loss", device="cpu", dtypes=FLOATS)
@ieee
def nll_loss_cpu(
    log_prob: Any,
    target: Any,
    weight: Any = None,
    *,
    reduction: str = "mean",
    ignore_index: int | None = None,
) -> np.ndarray:
    x, t, w = _nll_prepare(log_prob, target, weight, reduction, ignore_index)
    picked = np.take_along_axis(x, t[:, None], axis=1)[:, 0].astype(w.dtype, copy=False)  # (N, ...)
    loss = np.where(w != 0, -picked * w, 0).astype(w.dtype, copy=False)  # ignored: 0 (clears inf/NaN)
    return _nll_reduce(loss, w, reduction, x.dtype)
