"""GPTQ (Frantar et al., 2022): round weights one input channel at a time and push each rounding error
onto the channels not yet rounded, weighted by the inverse Hessian of the layer's inputs.

For a linear layer ``y = x @ W`` the error GPTQ minimises is ``|| X W - X Q ||²`` over the calibration
activations ``X``; round-to-nearest ignores ``X`` and rounds every weight on its own. The Hessian of that
objective is ``H = 2 Xᵀ X / n`` (one K x K matrix per layer, K = input channels), collected in one pass
over the calibration data by :class:`HessianObserver`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._dtypes import qdtype
from ._errors import QuantError
from ._qparams import params_from_range

__all__ = ["GPTQResult", "HessianObserver", "gptq_quantize", "layer_sqnr_db"]


class HessianObserver:
    """Accumulates ``2 Xᵀ X / n`` of a layer input whose last axis (``transpose``: first) holds the K channels."""

    def __init__(self, channels: int, *, transpose: bool = False) -> None:
        self.k, self.transpose = channels, transpose
        self._xtx = np.zeros((channels, channels), np.float64)
        self.rows = 0

    def observe(self, x: np.ndarray) -> None:
        """Add one batch of activations."""
        a = np.asarray(x, np.float64)
        a = a.T if self.transpose else a
        if a.shape[-1] != self.k:
            raise QuantError("gptq(calibration)", f"an activation has {a.shape[-1]} channels on its last axis, "
                             f"the layer's weight expects {self.k}", "calibrate with the model's own inputs")  # fmt: skip
        rows = a.reshape(-1, self.k)
        self._xtx += rows.T @ rows
        self.rows += rows.shape[0]

    def hessian(self) -> np.ndarray:
        """``2 Xᵀ X / n`` over every row seen."""
        if not self.rows:
            raise QuantError("gptq(calibration)", "no activations were observed for a layer",
                             "pass calibration data that reaches every quantized node")  # fmt: skip
        return 2.0 * self._xtx / self.rows


@dataclass(frozen=True)
class GPTQResult:
    """Integer weights ``q`` [N, K] (one row per output channel), their ``scale``/``zero_point`` [N, G]
    (G = K / group_size, or 1 per channel), and the dequantized weights GPTQ settled on."""

    q: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray
    dequantized: np.ndarray


def _inverse_cholesky(h: np.ndarray, damp: float, where: str) -> np.ndarray:
    """Upper Cholesky factor of ``(H + damp * mean(diag H) * I)⁻¹`` (the form GPTQ's updates use)."""
    k = h.shape[0]
    h = h + damp * float(np.mean(np.diag(h))) * np.eye(k)
    try:
        lower = np.linalg.cholesky(h)
        inv = np.linalg.inv(lower)
        return np.linalg.cholesky(inv.T @ inv).T
    except np.linalg.LinAlgError:
        raise QuantError(where, f"the Hessian is not positive definite even with damp={damp}",
                         "raise damp (e.g. 0.1) or calibrate with more (and more varied) samples") from None  # fmt: skip


def gptq_quantize(
    w: np.ndarray,
    hessian: np.ndarray,
    *,
    dtype: str = "int4",
    symmetric: bool = True,
    group_size: int = 0,
    block: int = 128,
    damp: float = 0.01,
    where: str = "gptq",
) -> GPTQResult:
    """GPTQ of ``w`` [N output channels, K input channels] against the layer-input Hessian [K, K].

    ``group_size`` > 0: one scale per ``group_size`` input channels per output channel, computed from
    the weights as GPTQ has updated them when the group starts (as the reference implementation does);
    0: one scale per output channel from the original weights.
    """
    w64 = np.array(w, np.float64)
    n, k = w64.shape
    if hessian.shape != (k, k):
        raise QuantError(where, f"Hessian of shape {hessian.shape} does not fit a weight with {k} input channels",
                         "collect it from this layer's input")  # fmt: skip
    if group_size and k % group_size:
        raise QuantError(where, f"group_size {group_size} does not divide the {k} input channels",
                         "use a group size dividing K, or 0 for per-channel scales")  # fmt: skip
    qt = qdtype(dtype)
    h = np.array(hessian, np.float64)
    dead = np.diag(h) == 0  # channels never active: their weights cannot matter
    h[dead, dead] = 1.0
    w64[:, dead] = 0.0
    hinv = _inverse_cholesky(h, damp, where)
    groups = k // group_size if group_size else 1
    scale = np.zeros((n, groups), np.float32)
    zp = np.zeros((n, groups), qt.dtype)
    q = np.zeros((n, k), np.int32)
    if not group_size:
        p = params_from_range(w64.min(1), w64.max(1), qt.dtype, symmetric=symmetric)
        scale[:, 0], zp[:, 0] = p.scale, p.zero_point
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        err = np.zeros((n, b1 - b0), np.float64)
        for i in range(b0, b1):
            if group_size and i % group_size == 0:
                g = i // group_size
                cols = w64[:, i : i + group_size]
                p = params_from_range(cols.min(1), cols.max(1), qt.dtype, symmetric=symmetric)
                scale[:, g], zp[:, g] = p.scale, p.zero_point
            g = i // group_size if group_size else 0
            s, z = scale[:, g].astype(np.float64), zp[:, g].astype(np.float64)
            col = w64[:, i]
            qi = np.clip(np.rint(col / s) + z, qt.qmin, qt.qmax)
            q[:, i] = qi
            e = (col - (qi - z) * s) / hinv[i, i]
            w64[:, i:b1] -= np.outer(e, hinv[i, i:b1])  # the channels left in this block absorb the error
            err[:, i - b0] = e
        w64[:, b1:] -= err @ hinv[b0:b1, b1:]  # then every channel after the block, at once
    deq = (q - zp.astype(np.int32).repeat(k // groups, axis=1)) * scale.astype(np.float64).repeat(
        k // groups, axis=1
    )
    return GPTQResult(q.astype(qt.dtype), scale, zp, deq.astype(np.float32))


def layer_sqnr_db(x: np.ndarray, w: np.ndarray, w_hat: np.ndarray) -> float:
    """SQNR of a linear layer's output ``x @ w`` when ``w`` is replaced by ``w_hat`` (both [K, N]), in dB."""
    y = x @ w.astype(np.float64)
    noise = float(np.sum((y - x @ w_hat.astype(np.float64)) ** 2))
    return float("inf") if noise == 0 else 10.0 * float(np.log10(float(np.sum(y**2)) / noise))
