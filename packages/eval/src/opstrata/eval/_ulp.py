"""ULP distance: how many representable values of a dtype lie between two numbers of that dtype.

float32/float64 map their bit patterns to ordered integers; narrower floats (float16, bfloat16, fp8,
fp6, fp4 from ml_dtypes) rank values in a sorted table of every finite value of the dtype, so each
dtype is exact without hand-written bit layouts.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from ._tolerances import dtype_class, float_part

__all__ = ["ulp_distance"]


@functools.cache
def _table(dtype: np.dtype) -> np.ndarray:
    """Every finite value of a float dtype of at most 2 bytes, sorted, -0 merged with +0 (float64)."""
    bits = np.arange(2 ** (8 * dtype.itemsize), dtype=np.uint64).astype(f"u{dtype.itemsize}")
    with warnings.catch_warnings(), np.errstate(invalid="ignore"):
        warnings.simplefilter("ignore")  # NaN bit patterns
        values = bits.view(dtype).astype(np.float64)
    return np.unique(values[np.isfinite(values)])


def _ordered(x: np.ndarray) -> np.ndarray:
    """float32/float64 bit patterns as integers in the order of the values (+0 and -0 both 0)."""
    ints = x.view(np.int32 if x.dtype.itemsize == 4 else np.int64).astype(np.int64)
    mag = ints & np.int64(np.iinfo(np.int64).max if x.dtype.itemsize == 8 else 0x7FFFFFFF)
    return np.where(ints < 0, -mag, mag)


def _float_ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise ULP distance of two finite float arrays of the same dtype, as float64."""
    if a.dtype.itemsize <= 2:
        table = _table(a.dtype)
        ra = np.searchsorted(table, a.astype(np.float64))
        rb = np.searchsorted(table, b.astype(np.float64))
        return np.abs(ra - rb).astype(np.float64)
    oa, ob = _ordered(a), _ordered(b)
    same_sign = (oa >= 0) == (ob >= 0)
    with np.errstate(over="ignore"):
        near = np.abs(np.where(same_sign, oa - ob, 0)).astype(np.float64)
    far = np.abs(oa).astype(np.float64) + np.abs(ob).astype(np.float64)
    return np.where(same_sign, near, far)


def _real_ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    fin = np.isfinite(a) & np.isfinite(b)
    out = np.zeros(a.shape, np.float64)
    if fin.any():
        out[fin] = _float_ulps(a[fin], b[fin])
    agree = (np.isnan(a) & np.isnan(b)) | (~fin & (a == b))
    out[~fin & ~agree] = np.inf
    return out


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ULP distance between ``a`` and ``b`` rounded to ``a``'s dtype, elementwise (float64).

    Matching NaNs and equal infinities are 0; any other non-finite disagreement is inf. Integers
    and bools count the difference of their values; complex numbers the larger of their parts'.
    """
    kind = dtype_class(a.dtype)
    if kind in ("int", "bool"):
        return np.abs(a.astype(np.float64) - b.astype(np.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overflow to inf and complex -> real casts are handled below
        bb = b.astype(a.dtype)
    if kind == "complex":
        part = float_part(a.dtype)
        return np.maximum(
            _real_ulps(a.real.astype(part), bb.real.astype(part)),
            _real_ulps(a.imag.astype(part), bb.imag.astype(part)),
        )
    return _real_ulps(a, bb)
