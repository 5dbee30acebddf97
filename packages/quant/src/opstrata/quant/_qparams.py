"""QuantParams and the numpy reference quantize/dequantize (ONNX QuantizeLinear/DequantizeLinear semantics).

``quantize_array`` is ``saturate(rint(x / scale) + zero_point)`` with round half to even, computed in float32 as
the ONNX reference does; float8 targets have no zero point and saturate to the largest finite value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._dtypes import QDType, qdtype
from ._errors import QuantError
from ._granularity import param_shape

__all__ = ["QuantParams", "dequantize", "params_from_range", "quantize_array"]

_TINY = float(np.finfo(np.float32).tiny)


@dataclass(frozen=True, eq=False)
class QuantParams:
    """Scale and zero point of one tensor: ``axis`` None is per-tensor, ``block_size`` > 0 is per-group.

    ``scale`` is float32 (``()``, ``(C,)`` or the blocked shape), ``zero_point`` has ``dtype``.
    """

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None
    block_size: int
    dtype: np.dtype

    @property
    def qtype(self) -> QDType:
        """The :class:`QDType` of ``dtype`` (range, bits, float8 or not)."""
        return qdtype(self.dtype)

    def __repr__(self) -> str:
        s = self.scale
        gran = "per-tensor" if self.axis is None else f"axis={self.axis}" + (
            f", block_size={self.block_size}" if self.block_size else "")  # fmt: skip
        sc = f"{float(s):.6g}" if s.ndim == 0 else f"shape {s.shape}"
        return f"QuantParams({self.qtype.name}, {gran}, scale {sc})"


def params_from_range(
    lo: Any, hi: Any, dtype: Any, *, symmetric: bool, axis: int | None = None, block_size: int = 0
) -> QuantParams:
    """Scale and zero point that map the range [lo, hi] (arrays of the scale's shape) onto ``dtype``.

    Symmetric: zero maps to 0 (int) or the mid code (uint), scale = max|x| / (qmax - zero point) (the
    restricted range: in-range values never reach -128 / -8, as TensorRT and onnxruntime's weights do).
    Asymmetric: the range is widened to include 0 (so zero is exact), scale = (hi - lo) / (qmax - qmin).
    Float8: scale = max|x| / largest finite value, zero point 0.
    """
    qt = qdtype(dtype)
    lo64, hi64 = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    if qt.is_float or symmetric:
        amax = np.maximum(np.abs(lo64), np.abs(hi64))
        if qt.is_float:
            zp = np.zeros(amax.shape, np.float64)
            scale = amax / qt.qmax
        elif qt.signed:
            zp = np.zeros(amax.shape, np.float64)
            scale = amax / qt.qmax
        else:
            mid = float((qt.qmax + 1) // 2)
            zp = np.full(amax.shape, mid)
            scale = amax / (qt.qmax - mid)
    else:
        lo64, hi64 = np.minimum(lo64, 0.0), np.maximum(hi64, 0.0)
        scale = (hi64 - lo64) / (qt.qmax - qt.qmin)
        safe = np.where(scale > 0, scale, 1.0)
        zp = np.clip(np.rint(qt.qmin - lo64 / safe), qt.qmin, qt.qmax)
    scale = np.where(np.isfinite(scale) & (scale > 0), np.maximum(scale, _TINY), 1.0).astype(np.float32)
    return QuantParams(scale, zp.astype(qt.dtype), axis, int(block_size), qt.dtype)


def _expand(p: np.ndarray, shape: tuple[int, ...], params: QuantParams, what: str) -> np.ndarray:
    """A scale or zero point broadcast against a tensor of ``shape`` (per-axis reshape, blocks repeated)."""
    if params.axis is None:
        if p.size != 1:
            raise QuantError(what, f"a per-tensor {what.split('(')[0]} must be a scalar, got shape {p.shape}",
                             "set axis= for per-channel parameters")  # fmt: skip
        return p.reshape(())
    expected = param_shape(shape, params.axis, params.block_size, what)
    if p.shape != expected:
        raise QuantError(
            what, f"parameters of shape {p.shape} do not fit a tensor of shape {shape} "
            f"(axis={params.axis}, block_size={params.block_size}: expected {expected})",
            "compute the parameters from a tensor of this shape",
        )  # fmt: skip
    ax = params.axis % len(shape)
    if not params.block_size:
        dims = [1] * len(shape)
        dims[ax] = shape[ax]
        return p.reshape(dims)
    return np.repeat(p, params.block_size, axis=ax)


def quantize_array(x: Any, params: QuantParams) -> np.ndarray:
    """``saturate(rint(x / scale) + zero_point)`` as ONNX QuantizeLinear computes it, in ``params.dtype``."""
    x = np.asarray(x)
    if x.dtype.kind != "f" and x.dtype.name not in ("bfloat16",):
        raise QuantError(
            "quantize_array(x)", f"expected a float tensor, got dtype {x.dtype}", "cast x to float32"
        )
    qt = params.qtype
    s = _expand(np.asarray(params.scale, np.float32), x.shape, params, "quantize_array(scale)")
    v = x.astype(np.float32) / s
    if qt.is_float:
        v = np.where(np.isnan(v), v, np.clip(v, qt.qmin, qt.qmax))
        return v.astype(qt.dtype)
    zp = _expand(
        np.asarray(params.zero_point).astype(np.float32), x.shape, params, "quantize_array(zero_point)"
    )
    q = np.rint(np.nan_to_num(v, nan=0.0)) + zp
    return np.clip(q, qt.qmin, qt.qmax).astype(np.int32).astype(qt.dtype)


def dequantize(q: Any, params: QuantParams) -> np.ndarray:
    """``(q - zero_point) * scale`` in float32, as ONNX DequantizeLinear computes it."""
    q = np.asarray(q)
    qt = params.qtype
    if q.dtype != qt.dtype:
        raise QuantError("dequantize(q)", f"expected dtype {qt.name} (the params' dtype), got {q.dtype}",
                         "pass the output of quantize_array(x, params)")  # fmt: skip
    s = _expand(np.asarray(params.scale, np.float32), q.shape, params, "dequantize(scale)")
    if qt.is_float:
        return (q.astype(np.float32) * s).astype(np.float32)
    zp = _expand(np.asarray(params.zero_point).astype(np.int32), q.shape, params, "dequantize(zero_point)")
    return ((q.astype(np.int32) - zp).astype(np.float32) * s).astype(np.float32)
