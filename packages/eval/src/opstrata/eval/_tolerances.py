"""Per-dtype default tolerances (torch.testing's table, plus fp8) and the dtype classes comparison needs.

================  ========  ========  =====================================================
dtype             rtol      atol      why
================  ========  ========  =====================================================
float64           1e-7      1e-7      torch.testing
float32           1.3e-6    1e-5      torch.testing
float16           1e-3      1e-5      torch.testing
bfloat16          1.6e-2    1e-5      torch.testing
float8_e4m3fn     0.125     2**-9     one step of 3 mantissa bits (eps); atol: smallest subnormal
float8_e5m2       0.25      2**-16    one step of 2 mantissa bits (eps); atol: smallest subnormal
complex64/128     as float32 / float64 (the tolerances of their parts)
integers, bool    0         0         exact
================  ========  ========  =====================================================

fp8: torch.testing compares fp8 bitwise (0/0). A value computed in higher precision and rounded to
fp8 can honestly land one representable step off, and one step is at most ``eps * |x|`` (relative),
so rtol = eps admits every one-step difference and rejects two steps or more (except just below a
power of two, where steps are half as large); atol = the smallest subnormal admits one step around
zero. Pass ``rtol=0, atol=0`` for torch's bitwise check. Other ml_dtypes floats (fp8 variants, fp6, fp4) follow the
same rule from their ``ml_dtypes.finfo``.
"""

from __future__ import annotations

import functools
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["DEFAULT_TOLERANCES", "default_tolerances", "dtype_class", "float_part"]

#: (rtol, atol) by dtype name; a float dtype not listed uses (eps, smallest subnormal) of its finfo.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float8_e4m3fn": (0.125, 2.0**-9),
    "float8_e5m2": (0.25, 2.0**-16),
    "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
}


@functools.cache
def dtype_class(dtype: Any) -> str:
    """``"float"``, ``"complex"``, ``"int"`` or ``"bool"`` (ml_dtypes' bfloat16/fp8/int4 included)."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return "float"
    if dt.kind == "c":
        return "complex"
    if dt.kind in "iu":
        return "int"
    if dt.kind == "b":
        return "bool"
    if dt.kind == "V":
        try:
            ml_dtypes.finfo(dt)
            return "float"
        except (ValueError, TypeError):
            pass
        try:
            ml_dtypes.iinfo(dt)
            return "int"
        except (ValueError, TypeError):
            pass
    raise TypeError(
        f"cannot compare arrays of dtype {dt}: expected a float, complex, integer or bool dtype; "
        "convert the array first (e.g. np.asarray(x, dtype=np.float32))"
    )


def float_part(dtype: Any) -> np.dtype:
    """The real dtype of a complex dtype (complex64 -> float32); other dtypes unchanged."""
    dt = np.dtype(dtype)
    return np.dtype(f"float{dt.itemsize * 4}") if dt.kind == "c" else dt


@functools.cache
def _one(dtype: np.dtype) -> tuple[float, float]:
    known = DEFAULT_TOLERANCES.get(dtype.name)
    if known is not None:
        return known
    if dtype_class(dtype) == "float":
        info = ml_dtypes.finfo(dtype)
        return float(info.eps), float(info.smallest_subnormal)
    if dtype_class(dtype) == "complex":
        return _one(float_part(dtype))
    return 0.0, 0.0


def default_tolerances(*dtypes: Any) -> tuple[float, float]:
    """(rtol, atol): the loosest defaults over ``dtypes`` (as torch.testing.default_tolerances)."""
    if not dtypes:
        raise TypeError("default_tolerances() needs at least one dtype, e.g. default_tolerances(np.float32)")
    pairs = [_one(np.dtype(d)) for d in dtypes]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)
