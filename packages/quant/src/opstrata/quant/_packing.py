"""int4/uint4 packing: two 4-bit values per byte, the first in the low nibble (ONNX's INT4 layout)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ._errors import QuantError

__all__ = ["pack_int4", "unpack_int4"]


def pack_int4(values: Any) -> np.ndarray:
    """Flattened int4/uint4 values (ml_dtypes arrays or ints in [-8, 15]) packed into ``ceil(n / 2)`` bytes.

    >>> pack_int4(np.array([1, -1, 7], np.int8)).tolist()
    [241, 7]
    """
    v = np.asarray(values)
    if v.dtype in (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)):
        v = v.astype(np.int8)
    if v.dtype.kind not in "iu":
        raise QuantError("pack_int4(values)", f"expected int4/uint4 or integer values, got dtype {v.dtype}",
                         "quantize first (quantize_array(x, params) with an int4/uint4 QuantParams)")  # fmt: skip
    flat = v.reshape(-1).astype(np.int16)
    if flat.size and (flat.min() < -8 or flat.max() > 15):
        raise QuantError("pack_int4(values)", f"values in [{flat.min()}, {flat.max()}] do not fit 4 bits",
                         "pass values in [-8, 7] (int4) or [0, 15] (uint4)")  # fmt: skip
    nib = (flat & 0x0F).astype(np.uint8)
    if nib.size % 2:
        nib = np.concatenate([nib, np.zeros(1, np.uint8)])
    return (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8)


def unpack_int4(packed: Any, shape: tuple[int, ...] | int, dtype: Any = "int4") -> np.ndarray:
    """Inverse of :func:`pack_int4`: ``prod(shape)`` values of ``dtype`` (``"int4"`` or ``"uint4"``)."""
    p = np.asarray(packed)
    if p.dtype != np.uint8:
        raise QuantError(
            "unpack_int4(packed)", f"expected uint8 bytes, got dtype {p.dtype}", "pass pack_int4's output"
        )
    shp = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    n = int(np.prod(shp, dtype=np.int64))
    if p.size != (n + 1) // 2:
        raise QuantError("unpack_int4(packed)", f"{n} values need {(n + 1) // 2} bytes, got {p.size}",
                         "pass the shape the values were packed from")  # fmt: skip
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in ("int4", "uint4"):
        raise QuantError(
            "unpack_int4(dtype)", f"expected 'int4' or 'uint4', got {dtype!r}", "pass dtype='int4'"
        )
    nib = np.empty(p.size * 2, np.int16)
    nib[0::2], nib[1::2] = p & 0x0F, p >> 4
    nib = nib[:n]
    if name == "int4":
        nib = np.where(nib > 7, nib - 16, nib)
        return nib.astype(ml_dtypes.int4).reshape(shp)
    return nib.astype(ml_dtypes.uint4).reshape(shp)
