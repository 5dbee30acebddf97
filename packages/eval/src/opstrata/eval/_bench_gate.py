"""The regression gate: a bootstrap confidence interval of a timing ratio, and a verdict the noise supports.

``ratio`` is candidate time over baseline time (above 1: the candidate is slower). With paired
samples (an interleaved run: round i of each) the interval is of the median per-round ratio, which
cancels drifts of a shared machine; otherwise of the ratio of medians. The verdict is ``slower``
only when the whole interval lies above ``1 + threshold``, ``faster`` only when it lies below
``1 - threshold``, ``same`` when it lies inside that band, and ``inconclusive`` otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["DEFAULT_THRESHOLD", "Verdict", "gate"]

#: Smallest change worth a verdict: 5 %.
DEFAULT_THRESHOLD = 0.05


@dataclass(frozen=True)
class Verdict:
    """A ratio with its confidence interval and what it supports."""

    ratio: float  # candidate / baseline (point estimate)
    low: float  # confidence interval
    high: float
    verdict: str  # faster | slower | same | inconclusive
    threshold: float
    confidence: float
    paired: bool

    def __str__(self) -> str:
        pct = (self.ratio - 1.0) * 100
        return (
            f"{self.verdict}: x{self.ratio:.3f} ({pct:+.1f}%), {self.confidence:.0%} CI "
            f"[{self.low:.3f}, {self.high:.3f}]"
        )


def _check(samples: Sequence[float], what: str) -> np.ndarray:
    arr = np.asarray(samples, dtype=np.float64)
    if arr.ndim != 1 or arr.size < 3:
        raise ValueError(f"gate: {what} needs at least 3 timing samples, got {arr.size}; run more rounds")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(
            f"gate: {what} samples must be positive finite times, got {arr.min()!r}..{arr.max()!r}"
        )
    return arr


def gate(
    baseline: Sequence[float], candidate: Sequence[float], *, paired: bool = False,
    threshold: float = DEFAULT_THRESHOLD, confidence: float = 0.95, resamples: int = 2000, seed: int = 0,
) -> Verdict:  # fmt: skip
    """The verdict on ``candidate`` against ``baseline`` timing samples (seconds, or any one unit)."""
    if not 0 < confidence < 1 or threshold < 0:
        raise ValueError(
            f"gate: need 0 < confidence < 1 and threshold >= 0, got {confidence!r}, {threshold!r}"
        )
    b, c = _check(baseline, "baseline"), _check(candidate, "candidate")
    rng = np.random.default_rng(seed)
    if paired:
        if b.size != c.size:
            raise ValueError(f"gate: paired samples need equal counts, got {b.size} and {c.size}")
        logs = np.log(c / b)
        idx = rng.integers(0, logs.size, (resamples, logs.size))
        stats = np.exp(np.median(logs[idx], axis=1))
        point = math.exp(float(np.median(logs)))
    else:
        ib = rng.integers(0, b.size, (resamples, b.size))
        ic = rng.integers(0, c.size, (resamples, c.size))
        stats = np.median(c[ic], axis=1) / np.median(b[ib], axis=1)
        point = float(np.median(c) / np.median(b))
    alpha = (1 - confidence) / 2
    low, high = (float(x) for x in np.quantile(stats, [alpha, 1 - alpha]))
    if low > 1 + threshold:
        verdict = "slower"
    elif high < 1 - threshold:
        verdict = "faster"
    elif low >= 1 - threshold and high <= 1 + threshold:
        verdict = "same"
    else:
        verdict = "inconclusive"
    return Verdict(point, low, high, verdict, threshold, confidence, paired)
