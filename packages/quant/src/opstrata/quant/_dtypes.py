"""Target dtypes of quantization: their numpy (ml_dtypes) type, integer range and ONNX element type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ._errors import QuantError

__all__ = ["QDType", "qdtype"]


@dataclass(frozen=True)
class QDType:
    """One quantized dtype: ``name``, numpy ``dtype``, representable range and whether it is a float8."""

    name: str
    dtype: np.dtype
    qmin: float
    qmax: float
    is_float: bool
    bits: int

    @property
    def signed(self) -> bool:
        """True for int8/int4 and the float8 types (symmetric ranges around zero)."""
        return self.qmin < 0

    @property
    def min_opset(self) -> int:
        """The lowest ai.onnx opset whose QuantizeLinear/DequantizeLinear take this dtype."""
        if self.bits == 4:
            return 21
        return 19 if self.is_float else 13

    def onnx_type(self) -> int:
        """The ONNX TensorProto element type (onnx < 1.19 cannot map the ml_dtypes types itself)."""
        from opstrata.graph import dtype_to_onnx

        return dtype_to_onnx(self.dtype)


def _int(name: str, dt: Any, lo: int, hi: int, bits: int) -> QDType:
    return QDType(name, np.dtype(dt), float(lo), float(hi), False, bits)


def _fp8(name: str, dt: Any) -> QDType:
    big = float(ml_dtypes.finfo(dt).max)
    return QDType(name, np.dtype(dt), -big, big, True, 8)


_TYPES = {
    "int8": _int("int8", np.int8, -128, 127, 8),
    "uint8": _int("uint8", np.uint8, 0, 255, 8),
    "int4": _int("int4", ml_dtypes.int4, -8, 7, 4),
    "uint4": _int("uint4", ml_dtypes.uint4, 0, 15, 4),
    "float8_e4m3fn": _fp8("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
    "float8_e5m2": _fp8("float8_e5m2", ml_dtypes.float8_e5m2),
}
_ALIASES = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
            "e4m3fn": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "e5m2": "float8_e5m2"}  # fmt: skip


def qdtype(dtype: Any, where: str = "dtype") -> QDType:
    """The :class:`QDType` for a name (``"int8"``, ``"uint4"``, ``"fp8_e4m3"``, ...), numpy dtype or QDType."""
    if isinstance(dtype, QDType):
        return dtype
    if isinstance(dtype, str):
        key = _ALIASES.get(dtype.lower(), dtype.lower())
    else:
        try:
            key = np.dtype(dtype).name
        except TypeError:
            key = repr(dtype)
    if key not in _TYPES:
        raise QuantError(
            where, f"unknown quantized dtype {dtype!r}",
            f"use one of {', '.join(_TYPES)} (aliases: {', '.join(_ALIASES)})",
        )  # fmt: skip
    return _TYPES[key]
