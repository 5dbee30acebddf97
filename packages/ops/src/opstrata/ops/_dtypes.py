"""The dtypes opstrata kernels accept, and the promotion and accumulation rules they follow.

bfloat16 and the float8 formats are the ``ml_dtypes`` numpy dtypes. Rule of accumulation:
low-precision floats (float16, bfloat16, float8_*) are reduced and multiplied in float32 and the
result is cast back to the input dtype unless an op says otherwise; float64 stays float64.

Rule of promotion (:func:`result_dtype`, used by binary ops on mixed inputs):

1. Equal dtypes keep their dtype.
2. Without low-precision floats, numpy's rules apply (``int32 + float32 -> float64``,
   ``int8 + uint8 -> int16``, ``uint64 + int64 -> float64``).
3. With a low-precision float (float16, bfloat16, float8_*):
   - a float32 or float64 input wins: ``bfloat16 + float32 -> float32``;
   - two *different* low-precision floats meet in float32: ``bfloat16 + float16 -> float32``,
     ``float8_e4m3fn + bfloat16 -> float32`` (no exact common narrow type; float32 holds both);
   - ints and bools do not widen it: ``bfloat16 + int64 -> bfloat16`` (torch's rule; numpy would
     give float64, silently doubling memory and changing numerics of a bf16 model).
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
#: 4-bit integers (ml_dtypes; one value per byte in memory, packed two per byte only in ONNX files)
int4 = np.dtype(ml_dtypes.int4)
uint4 = np.dtype(ml_dtypes.uint4)
int8 = np.dtype(np.int8)
uint8 = np.dtype(np.uint8)
int16 = np.dtype(np.int16)
uint16 = np.dtype(np.uint16)
int32 = np.dtype(np.int32)
uint32 = np.dtype(np.uint32)
int64 = np.dtype(np.int64)
uint64 = np.dtype(np.uint64)
bool_ = np.dtype(np.bool_)

#: Floating dtypes, widest first.
FLOAT_DTYPES: tuple[np.dtype, ...] = (float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2)
#: Floats narrower than float32: accumulate in float32.
LOW_PRECISION_DTYPES: tuple[np.dtype, ...] = (float16, bfloat16, float8_e4m3fn, float8_e5m2)
#: Integer dtypes, signed and unsigned, 8 to 64 bits (ONNX's integer tensor types).
INT_DTYPES: tuple[np.dtype, ...] = (int8, uint8, int16, uint16, int32, uint32, int64, uint64)
INDEX_DTYPES: tuple[np.dtype, ...] = (int32, int64)
NUMERIC_DTYPES: tuple[np.dtype, ...] = FLOAT_DTYPES + INT_DTYPES
ALL_DTYPES: tuple[np.dtype, ...] = (*NUMERIC_DTYPES, bool_)
#: ONNX string tensors: numpy object arrays holding ``str`` (numpy has no variable-length string dtype
#: before 2.0, and ONNX strings have no fixed width).
STRING_DTYPE = np.dtype(object)
#: Every ONNX tensor dtype, strings included: the dtypes of pure data movement (reshape, gather, pad, ...).
TENSOR_DTYPES: tuple[np.dtype, ...] = (*ALL_DTYPES, STRING_DTYPE)

DTYPES_BY_NAME: dict[str, np.dtype] = {
    "float64": float64,
    "float32": float32,
    "float16": float16,
    "bfloat16": bfloat16,
    "float8_e4m3fn": float8_e4m3fn,
    "float8_e5m2": float8_e5m2,
    "int8": int8,
    "uint8": uint8,
    "int16": int16,
    "uint16": uint16,
    "int32": int32,
    "uint32": uint32,
    "int64": int64,
    "uint64": uint64,
    "bool": bool_,
}


def as_dtype(dtype: Any) -> np.dtype:
    """Normalise a dtype given as a name (``"bfloat16"``), numpy dtype or scalar type."""
    if isinstance(dtype, str) and dtype in DTYPES_BY_NAME:
        return DTYPES_BY_NAME[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES_BY_NAME)}") from None
    if dt not in ALL_DTYPES:
        raise TypeError(
            f"dtype {dt} is not supported by opstrata; expected one of {', '.join(DTYPES_BY_NAME)}"
        )
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
    if dt == uint64:  # int64 would misorder values >= 2**63; sums wrap modulo 2**64 either way
        return uint64
    if dt == bool_ or dt.kind in "iu":
        return int64
    raise TypeError(f"no accumulation rule for dtype {dt}")


def compute_dtype(dtype: Any) -> np.dtype:
    """The dtype elementwise math on ``dtype`` is evaluated in (float32 for low precision)."""
    dt = np.dtype(dtype)
    return float32 if dt in LOW_PRECISION_DTYPES else dt


def result_dtype(*dtypes: Any) -> np.dtype:
    """The dtype a binary/n-ary op returns for inputs of ``dtypes`` (module docstring, rule of promotion).

    >>> result_dtype("bfloat16", "float16")
    dtype('float32')
    """
    if not dtypes:
        raise TypeError("result_dtype: expected at least one dtype, got none")
    dts = [as_dtype(d) for d in dtypes]
    first = dts[0]
    if all(d == first for d in dts):
        return first
    low = {d for d in dts if d in LOW_PRECISION_DTYPES}
    if not low:
        return np.result_type(*dts)
    if float64 in dts:
        return float64
    if float32 in dts or len(low) > 1:
        return float32
    return next(iter(low))
