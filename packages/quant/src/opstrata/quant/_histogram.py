"""Per-row histograms that grow their range batch by batch (the state of percentile/entropy/MSE observers).

Each row (one per scale) keeps ``bins`` counts over [lo, hi]; a batch outside the range widens it and the
old counts are redistributed onto the new bins through their cumulative distribution (uniform within a bin).
"""

from __future__ import annotations

import numpy as np

__all__ = ["RowHistogram"]


class RowHistogram:
    """Histograms of ``rows`` (2-D, one row per scale); ``absolute`` histograms |x| on [0, max|x|]."""

    def __init__(self, bins: int, absolute: bool) -> None:
        self.bins, self.absolute = int(bins), absolute
        self.counts: np.ndarray | None = None  # (K, bins) float64
        self.lo = self.hi = np.zeros(0)
        self.min = self.max = np.zeros(0)  # the exact signed extremes seen

    def add(self, rows: np.ndarray) -> None:
        """Count one batch (NaN entries are skipped; all-NaN rows leave their histogram unchanged)."""
        bmin, bmax = np.nanmin(rows, axis=1), np.nanmax(rows, axis=1)
        vals = np.abs(rows) if self.absolute else rows
        lo = np.zeros_like(bmin) if self.absolute else bmin
        hi = np.maximum(np.abs(bmin), np.abs(bmax)) if self.absolute else bmax
        lo, hi = np.nan_to_num(lo, nan=0.0), np.nan_to_num(hi, nan=0.0)
        if self.counts is None:
            self.counts = np.zeros((rows.shape[0], self.bins))
            self.lo, self.hi = lo.astype(np.float64), hi.astype(np.float64)
            self.min, self.max = np.nan_to_num(bmin, nan=np.inf), np.nan_to_num(bmax, nan=-np.inf)
        else:
            self.min = np.fmin(self.min, bmin)
            self.max = np.fmax(self.max, bmax)
            self._widen(np.minimum(self.lo, lo), np.maximum(self.hi, hi))
        width = self.width
        idx = np.floor((vals - self.lo[:, None]) / width[:, None])
        ok = ~np.isnan(idx)
        idx = np.clip(np.where(ok, idx, 0), 0, self.bins - 1).astype(np.int64)
        flat = (np.arange(rows.shape[0])[:, None] * self.bins + idx)[ok]
        self.counts += np.bincount(flat, minlength=self.counts.size).reshape(self.counts.shape)

    @property
    def width(self) -> np.ndarray:
        """Bin width per row (positive even for a constant row)."""
        return np.maximum(self.hi - self.lo, 1e-30) / self.bins

    def edges(self, k: int) -> np.ndarray:
        """The ``bins + 1`` bin edges of row ``k``."""
        return self.lo[k] + self.width[k] * np.arange(self.bins + 1)

    def _widen(self, lo: np.ndarray, hi: np.ndarray) -> None:
        assert self.counts is not None
        changed = np.nonzero((lo < self.lo) | (hi > self.hi))[0]
        for k in changed:
            old = self.edges(k)
            cdf = np.concatenate([[0.0], np.cumsum(self.counts[k])])
            new = lo[k] + np.maximum(hi[k] - lo[k], 1e-30) / self.bins * np.arange(self.bins + 1)
            self.counts[k] = np.diff(np.interp(new, old, cdf, left=0.0, right=cdf[-1]))
        self.lo, self.hi = lo, hi
