"""``compare(actual, expected) -> Metrics``: every error measure of one pair of arrays, in one pass.

All measures are computed in float64 (complex128 for complex inputs) whatever the input dtypes;
the ULP distance is counted in the dtype of ``actual``. Non-finite values: a NaN facing a NaN and
an infinity facing the same infinity agree (zero error); any other pair with a non-finite side
disagrees and makes max_abs, max_rel, mean_abs and ulp_max inf and sqnr_db -inf (cosine is then
over the pairs where both sides are finite). Empty arrays are vacuously identical.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ._tolerances import default_tolerances, dtype_class
from ._ulp import ulp_distance

__all__ = ["Metrics", "as_array", "check_tolerances", "close_mask", "compare"]


@dataclass(frozen=True)
class Metrics:
    """Errors of ``actual`` against ``expected``; ``within`` says whether every element is close."""

    max_abs: float  # max |actual - expected|
    max_rel: float  # max |actual - expected| / |expected| (inf where expected is 0 and actual is not)
    mean_abs: float  # mean |actual - expected|
    ulp_max: float  # max ULP distance in actual's dtype (expected rounded to it first)
    sqnr_db: float  # 10 log10(sum expected^2 / sum (actual - expected)^2); inf when identical
    cosine: float  # cosine similarity; 1.0 when both are all zero, 0.0 when only one is
    mismatch_fraction: float  # share of elements not close at (rtol, atol), NaN matching NaN
    n: int  # number of elements
    shape: tuple[int, ...]
    dtype: np.dtype  # dtype of actual
    max_abs_scaled: float = 0.0  # max_abs / max |expected| (robust where expected crosses zero)
    nonfinite_mismatch: int = 0  # elements where one side is NaN/inf and the other disagrees
    rtol: float = 0.0  # the tolerances mismatch_fraction used
    atol: float = 0.0

    @property
    def within(self) -> bool:
        """True when every element is close at (rtol, atol)."""
        return self.mismatch_fraction == 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (dtype as its name, shape as a list, non-finite floats as strings)."""
        out = asdict(self)
        out["dtype"] = self.dtype.name
        out["shape"] = list(self.shape)
        return {k: (repr(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


def as_array(x: Any, name: str) -> np.ndarray:
    """``x`` as a numpy array of a comparable dtype; TypeError naming ``name`` otherwise."""
    arr = x if isinstance(x, np.ndarray) else np.asarray(x)
    try:
        dtype_class(arr.dtype)
    except TypeError as exc:
        raise TypeError(f"{name}: {exc}") from None
    return arr


def check_tolerances(rtol: float | None, atol: float | None, *dtypes: Any) -> tuple[float, float]:
    """The (rtol, atol) to use: both given, or both None for the dtypes' defaults (as torch.testing)."""
    if (rtol is None) != (atol is None):
        missing = "atol" if atol is None else "rtol"
        raise ValueError(
            f"Both 'rtol' and 'atol' must be either specified or omitted, but got no {missing}; "
            f"pass both (e.g. rtol=1e-5, atol=1e-8) or neither for the per-dtype defaults"
        )
    if rtol is None or atol is None:
        return default_tolerances(*dtypes)
    for label, v in (("rtol", rtol), ("atol", atol)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ValueError(f"{label} must be a finite number >= 0, got {v!r}")
    return float(rtol), float(atol)


def _work(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays in float64, or complex128 when either is complex."""
    complex_ = "complex" in (dtype_class(a.dtype), dtype_class(b.dtype))
    t = np.complex128 if complex_ else np.float64
    return a.astype(t), b.astype(t)


def close_mask(a: np.ndarray, b: np.ndarray, rtol: float, atol: float, equal_nan: bool) -> np.ndarray:
    """torch.isclose in exact float64 math: ``|a - b| <= atol + rtol * |b|``, equal infinities, NaNs."""
    if dtype_class(a.dtype) in ("int", "bool") and dtype_class(b.dtype) in ("int", "bool"):
        if rtol == 0 and atol == 0:
            return np.asarray(a == b)
    A, B = _work(a, b)
    with np.errstate(invalid="ignore", over="ignore"):
        ok = (A == B) | (np.isfinite(A) & np.isfinite(B) & (np.abs(A - B) <= atol + rtol * np.abs(B)))
    if equal_nan:
        ok |= np.isnan(A) & np.isnan(B)
    return ok


def _sums(A: np.ndarray, B: np.ndarray) -> tuple[float, float, float, float]:
    """(sum |B|^2, sum |A-B|^2, Re <A, B>, |A| |B|) scaled by the largest magnitude (no overflow)."""
    s = max(float(np.max(np.abs(A), initial=0.0)), float(np.max(np.abs(B), initial=0.0)))
    if s == 0.0:
        return 0.0, 0.0, 0.0, 0.0
    A, B = A / s, B / s
    signal = float(np.sum(np.abs(B) ** 2))
    noise = float(np.sum(np.abs(A - B) ** 2))
    dot = float(np.real(np.vdot(B, A)))
    norms = math.sqrt(float(np.sum(np.abs(A) ** 2))) * math.sqrt(signal)
    return signal, noise, dot, norms


def compare(actual: Any, expected: Any, *, rtol: float | None = None, atol: float | None = None) -> Metrics:
    """Every error measure of ``actual`` against ``expected`` (same shape; dtypes may differ).

    ``mismatch_fraction`` uses the loosest default tolerances of the two dtypes unless ``rtol`` and
    ``atol`` are given; NaN matches NaN there (so ``compare(x, x)`` is exact even with NaNs).
    """
    a = as_array(actual, "actual")
    b = as_array(expected, "expected")
    if a.shape != b.shape:
        raise ValueError(
            f"compare: actual has shape {a.shape}, expected has shape {b.shape}; "
            "compare arrays of the same shape (reshape, transpose or slice one of them first)"
        )
    rtol_, atol_ = check_tolerances(rtol, atol, a.dtype, b.dtype)
    n = int(a.size)
    common = dict(n=n, shape=tuple(a.shape), dtype=a.dtype, rtol=rtol_, atol=atol_)
    if n == 0:
        return Metrics(0.0, 0.0, 0.0, 0.0, math.inf, 1.0, 0.0, **common)  # type: ignore[arg-type]
    A, B = _work(a, b)
    finite = np.isfinite(A) & np.isfinite(B)
    agree = (np.isnan(A) & np.isnan(B)) | (~finite & (A == B))
    bad = ~(finite | agree)
    n_bad = int(bad.sum())
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.where(finite, np.abs(A - B), 0.0)
        absb = np.where(finite, np.abs(B), 1.0)
        rel = np.where(diff == 0.0, 0.0, diff / absb)
    fa, fb = A[finite], B[finite]
    peak = float(np.max(np.abs(fb), initial=0.0))
    if n_bad:
        max_abs = max_rel = mean_abs = max_scaled = math.inf
    else:
        max_abs, max_rel, mean_abs = float(diff.max()), float(rel.max()), float(diff.mean())
        max_scaled = max_abs / peak if peak > 0 else max_abs
    signal, noise, dot, norms = _sums(fa, fb)
    if n_bad:
        sqnr = -math.inf
    elif noise == 0.0:
        sqnr = math.inf
    elif signal == 0.0:
        sqnr = -math.inf
    else:
        sqnr = 10.0 * math.log10(signal / noise)
    if noise == 0.0:  # identical where finite (incl. both all zero)
        cosine = 1.0
    elif norms > 0.0:
        cosine = max(-1.0, min(1.0, dot / norms))
    else:  # one side all zero, the other not
        cosine = 0.0
    ulp = float(np.max(ulp_distance(a, b)))
    mismatch = (n - int(np.count_nonzero(close_mask(a, b, rtol_, atol_, True)))) / n
    return Metrics(
        max_abs, max_rel, mean_abs, ulp, sqnr, cosine, mismatch,
        max_abs_scaled=max_scaled, nonfinite_mismatch=n_bad, **common,  # type: ignore[arg-type]
    )  # fmt: skip
