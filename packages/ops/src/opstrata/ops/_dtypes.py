"""The dtypes opstrata kernels accept, and the promotion and accumulation rules they follow.

bfloat16 and the float8 formats are the ``ml_dtypes`` numpy dtypes. Rule of accumulation:
low-precision floats (float16, bfloat16, float8_*) are reduced and multiplied in float32 and the
result is cast back to the input dtype unless an op says otherwise; float64 stays float64.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

float64 = np.dtype(np.float64)
float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
int8 = np.dtype(np.int8)
uint8 = np.dtype(np.uint8)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)

#: Floating dtypes, widest first.
FLOAT_DTYPES: tuple[np.dtype, ...] = (float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2)
#: Floats narrower than float32: accumulate in float32.
LOW_PRECISION_DTYPES: tuple[np.dtype, ...] = (float16, bfloat16, float8_e4m3fn, float8_e5m2)
INT_DTYPES: tuple[np.dtype, ...] = (int8, uint8, int32, int64)
INDEX_DTYPES: tuple[np.dtype, ...] = (int32, int64)
NUMERIC_DTYPES: tuple[np.dtype, ...] = FLOAT_DTYPES + INT_DTYPES
ALL_DTYPES: tuple[np.dtype, ...] = (*NUMERIC_DTYPES, bool_)

DTYPES_BY_NAME: dict[str, np.dtype] = {
    "float64": float64,
    "float32": float32,
    "float16": float16,
    "bfloat16": bfloat16,
    "float8_e4m3fn": float8_e4m3fn,
    "float8_e5m2": float8_e5m2,
    "int8": int8,
    "uint8": uint8,
    "int32": int32,
    "int64": int64,
    "bool": bool_,
}


def as_dtype(dtype: Any) -> np.dtype:
    """Normalise a dtype given as a name (``"bfloat16"``), numpy dtype or scalar type."""
    if isinstance(dtype, str) and dtype in DTYPES_BY_NAME:
        return DTYPES_BY_NAME[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(
            f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES_BY_NAME)}"
        ) from None
    if dt not in ALL_DTYPES:
        raise TypeError(f"dtype {dt} is not supported by opstrata; expected one of {', '.join(DTYPES_BY_NAME)}")
    return dt


def is_low_precision(dtype: Any) -> bool:
    """True for float16, bfloat16 and the float8 formats (they accumulate in float32)."""
    return np.dtype(dtype) in LOW_PRECISION_DTYPES


def accumulation_dtype(dtype: Any) -> np.dtype:
    """The dtype a reduction or matmul over ``dtype`` accumulates in."""
    dt = np.dtype(dtype)
    if dt in LOW_PRECISION_DTYPES or dt == float32:
        return float32
    if dt == float64:
        return float64
    if dt == bool_ or dt.kind in "iu":
        return int64
    raise TypeError(f"no accumulation rule for dtype {dt}")


def compute_dtype(dtype: Any) -> np.dtype:
    """The dtype elementwise math on ``dtype`` is evaluated in (float32 for low precision)."""
    dt = np.dtype(dtype)
    return float32 if dt in LOW_PRECISION_DTYPES else dt
