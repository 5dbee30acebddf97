"""Linear quantization kernels — quantize_linear, dequantize_linear, dynamic_quantize_linear,
matmul_integer, conv_integer, qlinear_matmul, qlinear_conv — registered on ``ref`` and ``cpu``.

Semantics follow the ONNX operator specification (QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv): per-tensor,
per-axis and blocked (``block_size``) scales, round half to even, saturation to the output type's
range (float8 outputs saturate to the largest finite value unless ``saturate=False``), exact int32
accumulation of integer products. Plain numpy implementations, one registered on both devices.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .._dtypes import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    float8_e4m3fn,
    float8_e5m2,
    float32,
    float64,
    int4,
    int8,
    int16,
    int32,
    int64,
    uint4,
    uint8,
    uint16,
)
from .._errors import OpError, check_dtype
from .._registry import call, register
from .conv_nd import _padded, _window, _windows, grouped_correlate

__all__ = [
    "QCONV_ACTIVATIONS",
    "QUANT_DTYPES",
    "conv_integer",
    "dequantize_linear",
    "dynamic_quantize_linear",
    "matmul_integer",
    "qlinear_conv",
    "qlinear_matmul",
    "qmatmul",
    "quantize_linear",
]

#: Integer dtypes QuantizeLinear/DequantizeLinear produce and take.
QUANT_INT_DTYPES: tuple[np.dtype, ...] = (int8, uint8, int16, uint16, int32, int4, uint4)
#: Float8 dtypes (ml_dtypes) QuantizeLinear/DequantizeLinear produce and take.
QUANT_FLOAT8_DTYPES: tuple[np.dtype, ...] = (float8_e4m3fn, float8_e5m2)
QUANT_DTYPES: tuple[np.dtype, ...] = QUANT_INT_DTYPES + QUANT_FLOAT8_DTYPES
MM_DTYPES: tuple[np.dtype, ...] = (int8, uint8)
_SCALE_DTYPES: tuple[np.dtype, ...] = (float32, float64, np.dtype(np.float16), FLOAT_DTYPES[3])


# --------------------------------------------------------------------------- scale / zero point layout


def _broadcast_param(
    op: str, name: str, value: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int
) -> np.ndarray:
    """Scale or zero point reshaped (per-axis) or repeated (blocked) so it broadcasts against ``shape``."""
    if value.ndim == 0 or (value.size == 1 and not block_size):
        return value.reshape(())
    axis = _axis(op, axis, len(shape))
    if not block_size:
        if value.ndim != 1 or value.size != shape[axis]:
            raise OpError(
                op, name, f"a scalar or a 1-D tensor of {shape[axis]} values (axis {axis} of x {shape})",
                f"shape {value.shape}", fix="pass one value per slice of the quantization axis",
            )  # fmt: skip
        dims = [1] * len(shape)
        dims[axis] = value.size
        return value.reshape(dims)
    if value.ndim != len(shape) or any(
        v != s for i, (v, s) in enumerate(zip(value.shape, shape, strict=True)) if i != axis
    ):
        raise OpError(
            op, name, f"x's shape {shape} except axis {axis} (blocked quantization)", f"shape {value.shape}",
            fix="give the scale the rank of x with ceil(x.shape[axis] / block_size) along axis",
        )  # fmt: skip
    if value.shape[axis] != -(-shape[axis] // block_size):
        raise OpError(
            op, name, f"{-(-shape[axis] // block_size)} blocks along axis {axis} (block_size={block_size})",
            f"{value.shape[axis]}", fix="use ceil(x.shape[axis] / block_size) blocks",
        )  # fmt: skip
    return np.repeat(value, block_size, axis=axis).take(np.arange(shape[axis]), axis=axis)


def _axis(op: str, axis: Any, rank: int) -> int:
    """``axis`` normalised to [0, rank); checked only where a per-axis or blocked parameter needs it."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -rank <= axis < rank:
        raise OpError(op, "axis", f"an int in [{-rank}, {rank - 1}]", repr(axis))
    return int(axis) % rank


def _block(op: str, block_size: Any) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 0:
        raise OpError(op, "block_size", "an int >= 0 (0: per-tensor/per-axis)", repr(block_size))
    return int(block_size)


def _saturate_int(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    info = ml_dtypes.iinfo(dtype)  # numpy's iinfo does not know int4/uint4
    return np.clip(v, info.min, info.max).astype(dtype)


def _to_float8(v: np.ndarray, dtype: np.dtype, saturate: bool) -> np.ndarray:
    """Round to float8 (nearest even); ``saturate`` clamps finite overflow to the largest finite value."""
    if saturate:
        big = float(ml_dtypes.finfo(dtype).max)  # np.finfo refuses float8 with older numpy / ml_dtypes
        v = np.where(np.isinf(v), v, np.clip(v, -big, big))
        v = np.where(np.isinf(v), np.sign(v) * big, v)
    return v.astype(float32).astype(dtype)


# --------------------------------------------------------------------------- QuantizeLinear


def _quantize_linear(
    x: Any,
    scale: Any,
    zero_point: Any = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    saturate: bool = True,
    output_dtype: Any = None,
    precision: Any = None,
) -> np.ndarray:
    x, s = np.asarray(x), np.asarray(scale)
    ax, bs = axis, _block("quantize_linear", block_size)
    out = np.dtype(output_dtype) if output_dtype is not None else None
    if zero_point is not None:
        zp = np.asarray(zero_point)
        if out is not None and zp.dtype != out:
            raise OpError(
                "quantize_linear", "zero_point", f"output_dtype {out}", str(zp.dtype),
                fix="make output_dtype and the zero point's dtype agree",
            )  # fmt: skip
        out = zp.dtype
    out = out if out is not None else uint8
    if out not in QUANT_DTYPES:
        raise OpError(
            "quantize_linear", "output_dtype", f"one of {', '.join(d.name for d in QUANT_DTYPES)}", str(out)
        )
    work = np.dtype(precision) if precision is not None else np.result_type(x.dtype, s.dtype)
    if x.dtype == int32:
        work = float64  # int32 / float32 divides in float64 (numpy, ONNX's reference)
    elif work.itemsize < 2 or work not in (float64, float32, np.dtype(np.float16)):
        work = float32
    s_b = _broadcast_param("quantize_linear", "scale", s, x.shape, ax, bs)
    v = x.astype(work) / s_b.astype(work)
    if out in QUANT_FLOAT8_DTYPES:
        if zero_point is not None:
            v = v + _broadcast_param("quantize_linear", "zero_point", zp, x.shape, ax, bs).astype(float32)
        return _to_float8(np.asarray(v), out, bool(saturate))
    q = np.rint(v.astype(float64))
    if zero_point is not None:
        q = q + _broadcast_param("quantize_linear", "zero_point", zp, x.shape, ax, bs).astype(float64)
    return _saturate_int(np.nan_to_num(q), out)


_QX_DTYPES = (*FLOAT_DTYPES, int32)  # int32 x: QuantizeLinear-10/13
register("quantize_linear", device="ref", dtypes=_QX_DTYPES)(_quantize_linear)
register("quantize_linear", device="cpu", dtypes=_QX_DTYPES)(_quantize_linear)


def quantize_linear(
    x: Any,
    scale: Any,
    zero_point: Any = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    saturate: bool = True,
    output_dtype: Any = None,
    precision: Any = None,
    device: str | None = None,
) -> np.ndarray:
    """``saturate(rint(x / scale) + zero_point)`` (ONNX QuantizeLinear): per-tensor, per-axis or blocked.

    The output dtype is the zero point's, else ``output_dtype``, else uint8; float8 outputs round to
    nearest even and saturate unless ``saturate=False``.

    >>> quantize_linear(np.array([0.0, 1.5, 2.5, 300.0], np.float32), np.float32(1.0)).tolist()
    [0, 2, 2, 255]
    """
    x = np.asarray(x)
    check_dtype("quantize_linear", "x", x, _QX_DTYPES)
    if np.asarray(scale).dtype not in FLOAT_DTYPES:
        raise OpError("quantize_linear", "scale", "a floating dtype", str(np.asarray(scale).dtype))
    return call(
        "quantize_linear", x, scale, zero_point, axis=axis, block_size=block_size, saturate=saturate,
        output_dtype=output_dtype, precision=precision, device=device,
    )  # fmt: skip


# --------------------------------------------------------------------------- DequantizeLinear


def _dequantize_linear(
    x: Any,
    scale: Any,
    zero_point: Any = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: Any = None,
) -> np.ndarray:
    x, s = np.asarray(x), np.asarray(scale)
    ax, bs = axis, _block("dequantize_linear", block_size)
    work = float64 if s.dtype == float64 else float32
    s_b = _broadcast_param("dequantize_linear", "scale", s, x.shape, ax, bs).astype(work)
    if x.dtype in QUANT_FLOAT8_DTYPES:
        if zero_point is not None and np.any(np.asarray(zero_point).astype(float32) != 0):
            raise OpError("dequantize_linear", "zero_point", "zeros for a float8 x", "non-zero values")
        d = x.astype(work)
    else:
        d = x.astype(int64)
        if zero_point is not None:
            zp = np.asarray(zero_point)
            if zp.dtype != x.dtype:
                raise OpError(
                    "dequantize_linear", "zero_point", f"x's dtype {x.dtype}", str(zp.dtype),
                    fix="cast the zero point to x's dtype",
                )  # fmt: skip
            d = d - _broadcast_param("dequantize_linear", "zero_point", zp, x.shape, ax, bs).astype(int64)
        d = d.astype(work)
    out = np.dtype(output_dtype) if output_dtype is not None else s.dtype
    return np.asarray(d * s_b).astype(out)


_DQX_DTYPES = (*ALL_DTYPES, int4, uint4)  # x's dtype dispatches; the public function checks QUANT_DTYPES
register("dequantize_linear", device="ref", dtypes=_DQX_DTYPES)(_dequantize_linear)
register("dequantize_linear", device="cpu", dtypes=_DQX_DTYPES)(_dequantize_linear)


def dequantize_linear(
    x: Any,
    scale: Any,
    zero_point: Any = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: Any = None,
    device: str | None = None,
) -> np.ndarray:
    """``(x - zero_point) * scale`` (ONNX DequantizeLinear), exact integer subtraction; the scale's dtype
    (or ``output_dtype``).

    >>> dequantize_linear(np.array([0, 3, 128], np.uint8), np.float32(2.0), np.uint8(128)).tolist()
    [-256.0, -250.0, 0.0]
    """
    x = np.asarray(x)
    check_dtype("dequantize_linear", "x", x, QUANT_DTYPES)
    if np.asarray(scale).dtype not in FLOAT_DTYPES:
        raise OpError("dequantize_linear", "scale", "a floating dtype", str(np.asarray(scale).dtype))
    return call(
        "dequantize_linear", x, scale, zero_point, axis=axis, block_size=block_size,
        output_dtype=output_dtype, device=device,
    )  # fmt: skip


# --------------------------------------------------------------------------- DynamicQuantizeLinear


def _dynamic_quantize_linear(x: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.asarray(x).astype(float32)
    hi = np.float32(max(0.0, float(np.max(x)))) if x.size else np.float32(0)
    lo = np.float32(min(0.0, float(np.min(x)))) if x.size else np.float32(0)
    scale = np.float32(1.0) if hi == lo else np.float32((hi - lo) / np.float32(255))
    zp = np.rint(np.clip(np.float32(0) - lo / scale, 0, 255))
    y = np.clip(np.rint(x / scale) + zp, 0, 255).astype(uint8)
    return y, np.array(scale, float32), np.array(zp, uint8)


register("dynamic_quantize_linear", device="ref", dtypes=(float32,))(_dynamic_quantize_linear)
register("dynamic_quantize_linear", device="cpu", dtypes=(float32,))(_dynamic_quantize_linear)


def dynamic_quantize_linear(
    x: Any, *, device: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX DynamicQuantizeLinear: uint8 ``y``, float32 ``scale``, uint8 ``zero_point`` from x's range
    (widened to include 0).

    >>> [a.tolist() for a in dynamic_quantize_linear(np.array([0.0, 2.55], np.float32))]
    [[0, 255], 0.009999999776482582, 0]
    """
    x = np.asarray(x)
    check_dtype("dynamic_quantize_linear", "x", x, (float32,))
    return call("dynamic_quantize_linear", x, device=device)


# --------------------------------------------------------------------------- integer matmul / conv


def _centered(op: str, name: str, x: np.ndarray, zp: Any, zp_name: str, axis: int | None) -> np.ndarray:
    """``x - zero_point`` in int32; a 1-D zero point of more than one value lies along ``axis``."""
    v = x.astype(int32)
    if zp is None:
        return v
    z = np.asarray(zp)
    if z.dtype != x.dtype:
        raise OpError(op, zp_name, f"{name}'s dtype {x.dtype}", str(z.dtype), fix=f"cast it to {x.dtype}")
    if z.size > 1:
        if z.ndim != 1 or axis is None or z.size != x.shape[axis]:
            raise OpError(
                op, zp_name, "a scalar or one value per " + ("row" if axis == x.ndim - 2 else "column/channel"),
                f"shape {z.shape} for {name} of shape {x.shape}",
            )  # fmt: skip
        dims = [1] * x.ndim
        dims[axis] = z.size
        z = z.reshape(dims)
    return v - z.astype(int32)


def _matmul_integer(a: Any, b: Any, a_zero_point: Any = None, b_zero_point: Any = None) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    ra = _centered(
        "matmul_integer", "a", a, a_zero_point, "a_zero_point", a.ndim - 2 if a.ndim >= 2 else None
    )
    rb = _centered(
        "matmul_integer", "b", b, b_zero_point, "b_zero_point", b.ndim - 1 if b.ndim >= 2 else None
    )
    return np.matmul(ra.astype(int64), rb.astype(int64)).astype(int32)


def _matmul_integer_blas(a: Any, b: Any, a_zero_point: Any = None, b_zero_point: Any = None) -> np.ndarray:
    """The same product through float64 BLAS: exact, since |a - zp|, |b - zp| <= 255 makes every partial
    sum a multiple-of-one below 255 * 255 * K < 2**53 for any K numpy can hold (numpy's int64 matmul has
    no BLAS and runs ~100x slower)."""
    a, b = np.asarray(a), np.asarray(b)
    ra = _centered(
        "matmul_integer", "a", a, a_zero_point, "a_zero_point", a.ndim - 2 if a.ndim >= 2 else None
    )
    rb = _centered(
        "matmul_integer", "b", b, b_zero_point, "b_zero_point", b.ndim - 1 if b.ndim >= 2 else None
    )
    return np.matmul(ra.astype(float64), rb.astype(float64)).astype(int32)


register("matmul_integer", device="ref", dtypes=MM_DTYPES)(_matmul_integer)
register("matmul_integer", device="cpu", dtypes=MM_DTYPES)(_matmul_integer_blas)


def _check_int8(op: str, name: str, x: Any) -> np.ndarray:
    x = np.asarray(x)
    check_dtype(op, name, x, MM_DTYPES)
    return x


def matmul_integer(
    a: Any, b: Any, a_zero_point: Any = None, b_zero_point: Any = None, *, device: str | None = None
) -> np.ndarray:
    """``(a - a_zero_point) @ (b - b_zero_point)`` in int32 (ONNX MatMulInteger); int8/uint8 operands,
    per-tensor or per-row (a) / per-column (b) zero points.

    >>> matmul_integer(np.array([[2, 3]], np.uint8), np.array([[1], [1]], np.uint8), np.uint8(1)).tolist()
    [[3]]
    """
    a, b = _check_int8("matmul_integer", "a", a), _check_int8("matmul_integer", "b", b)
    return call("matmul_integer", a, b, a_zero_point, b_zero_point, device=device)


#: the smallest per-token scale (float32's smallest normal): an all-zero row quantizes to zeros
TOKEN_SCALE_MIN = np.float32(np.finfo(np.float32).tiny)


def token_quantize(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 quantization of each row (last axis) of float32 ``x``, as per-token dynamic
    quantization computes it: ``s = max(max|x_row| / 127, TOKEN_SCALE_MIN)`` (float32),
    ``q = clip(rint(x / s), -127, 127)``. Returns ``(q int8, s (..., 1) float32)``; a row holding a NaN
    gets a NaN scale (its products come out NaN) and zeros.

    >>> q, s = token_quantize(np.array([[1.0, -2.0], [0.0, 0.0]], np.float32))
    >>> q.tolist(), s.ravel().tolist() == [np.float32(2) / np.float32(127), TOKEN_SCALE_MIN]
    ([[64, -127], [0, 0]], True)
    """
    x = np.asarray(x, float32)
    with np.errstate(invalid="ignore"):
        amax = np.abs(x).max(axis=-1, keepdims=True) if x.shape[-1] else np.zeros((*x.shape[:-1], 1), float32)
        s = np.maximum(amax / np.float32(127), TOKEN_SCALE_MIN).astype(float32)
        s[np.isnan(amax)] = np.nan
        q = np.clip(np.rint(np.nan_to_num(x / s)), -127, 127).astype(np.int8)
    return q, s


def _dynamic_qmatmul_with(matmul: Any) -> Any:
    """The dynamic-quantized product through ``matmul`` (the exact int64 one or the float64-BLAS one)."""

    def kernel(
        x: Any, b: Any, b_scale: Any, b_zero_point: Any = None, bias: Any = None, *, per_token: bool = False,
        out: Any = None,
    ) -> np.ndarray:  # fmt: skip
        if per_token:
            q, s = token_quantize(x)
            acc = matmul(q, b, None, b_zero_point)
        else:
            q, s, z = _dynamic_quantize_linear(x)
            acc = matmul(q, b, z, b_zero_point)
        y = acc.astype(float32) * (s * np.asarray(b_scale).astype(float32)).astype(float32)
        if bias is not None:
            y = y + np.asarray(bias).astype(float32)
        if out is not None:
            np.copyto(out, y)
            return out
        return y.astype(float32, copy=False)

    return kernel


register("dynamic_qmatmul", device="ref", dtypes=(float32,))(_dynamic_qmatmul_with(_matmul_integer))
register("dynamic_qmatmul", device="cpu", dtypes=(float32,))(_dynamic_qmatmul_with(_matmul_integer_blas))


def _check_matmul_epilogue(op: str, scale_name: str, scale: Any, bias: Any, n: int) -> None:
    """A float scale (scalar or one per column) and an optional bias of one value per column, for n columns."""
    sc = np.asarray(scale)
    if sc.dtype.kind != "f" or sc.size not in (1, n) or sc.ndim > 1:
        raise OpError(op, scale_name, f"a float scalar or ({n},) per column", f"{sc.dtype}{list(sc.shape)}")
    if bias is not None and np.shape(bias) != (n,):
        raise OpError(op, "bias", f"shape ({n},)", str(np.shape(bias)))


def _check_float_out(
    op: str, out: Any, want: tuple[int, ...], operand: np.ndarray, operand_name: str
) -> None:
    """``out``: a writeable float32 array of shape ``want``, apart from ``operand``'s memory."""
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != float32
        or out.shape != want
        or not out.flags.writeable
    ):
        got = f"{out.dtype}{list(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__
        raise OpError(
            op, "out", f"a writeable float32 array of shape {list(want)}", got, fix="pass a matching out"
        )
    if np.may_share_memory(out, operand):
        raise OpError(op, "out", f"memory apart from {operand_name}", f"an array overlapping {operand_name}",
                      fix="pass a separate out")  # fmt: skip


def dynamic_qmatmul(
    x: Any,
    b: Any,
    b_scale: Any,
    b_zero_point: Any = None,
    bias: Any = None,
    *,
    per_token: bool = False,
    out: np.ndarray | None = None,
    device: str | None = None,
) -> np.ndarray:
    """``x`` (..., K) float32 quantized on the fly (ONNX DynamicQuantizeLinear: uint8, per tensor), times
    the int8/uint8 weight ``b`` (K, N) exactly in int32, scaled back to float32 by ``x_scale * b_scale``
    (per tensor or per column), plus ``bias`` (N,): what DynamicQuantizeLinear -> MatMulInteger -> Cast ->
    Mul (-> Add) computes, as one op (onnxruntime's DynamicQuantizeMatMul) that a native kernel can fuse.
    ``per_token``: x quantized per row instead, symmetric int8 (:func:`token_quantize`), scaled back per row.
    ``out``: a float32 array of the result's shape to write into (e.g. an arena view), not overlapping x.

    >>> w = np.array([[2], [1]], np.int8)
    >>> dynamic_qmatmul(np.array([[1.0, 2.0]], np.float32), w, np.float32(0.5)).round(2).tolist()
    [[2.0]]
    """
    op = "dynamic_qmatmul"
    x = np.asarray(x)
    check_dtype(op, "x", x, (float32,))
    b = _check_int8(op, "b", b)
    if b.ndim != 2 or x.ndim < 1 or x.shape[-1] != b.shape[0]:
        raise OpError(op, "b", f"a 2-D (K={x.shape[-1] if x.ndim else '?'}, N) weight", f"shape {b.shape}",
                      fix="pass x (..., K) and b (K, N)")  # fmt: skip
    n = b.shape[1]
    _check_matmul_epilogue(op, "b_scale", b_scale, bias, n)
    kw: dict[str, Any] = {"per_token": True} if per_token else {}  # kernels without the option still fit
    if out is None:
        return call(op, x, b, b_scale, b_zero_point, bias, device=device, **kw)
    _check_float_out(op, out, (*x.shape[:-1], n), x, "x")
    return call(op, x, b, b_scale, b_zero_point, bias, out=out, device=device, **kw)


def _conv_int(x: np.ndarray, w: np.ndarray, stride: Any, pads: Any, dilation: Any, groups: Any) -> np.ndarray:
    """Exact N-D cross-correlation of int32 ``x`` (N, C, *spatial) and ``w`` (M, C/groups, *k), in int32."""
    op = "conv_integer"
    if x.ndim < 3 or w.ndim != x.ndim:
        raise OpError(op, "x", "(N, C, *spatial) and w of the same rank", f"x {x.shape}, w {w.shape}")
    g, c, m = int(groups), x.shape[1], w.shape[0]
    if g < 1 or c % g or m % g or w.shape[1] != c // g:
        raise OpError(
            op, "w", f"shape (M, C/groups={c}/{g}, *kernel) with M divisible by groups", str(w.shape)
        )
    win = _window(op, x, w.shape[2:], stride, pads, dilation, False)
    cols = _windows(_padded(x, win, int64, 0), win)  # (N, C, *out, *k)
    return grouped_correlate(cols, w, g, win, int64).astype(int32)


def _conv_integer(
    x: Any,
    w: Any,
    x_zero_point: Any = None,
    w_zero_point: Any = None,
    *,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> np.ndarray:
    x, w = np.asarray(x), np.asarray(w)
    if x_zero_point is not None and np.asarray(x_zero_point).size != 1:
        raise OpError(
            "conv_integer", "x_zero_point", "a scalar (per-tensor)", f"shape {np.shape(x_zero_point)}"
        )
    rx = _centered("conv_integer", "x", x, x_zero_point, "x_zero_point", None)
    rw = _centered("conv_integer", "w", w, w_zero_point, "w_zero_point", 0)
    return _conv_int(rx, rw, stride, pads, dilation, groups)


register("conv_integer", device="ref", dtypes=MM_DTYPES)(_conv_integer)
register("conv_integer", device="cpu", dtypes=MM_DTYPES)(_conv_integer)


def conv_integer(
    x: Any,
    w: Any,
    x_zero_point: Any = None,
    w_zero_point: Any = None,
    *,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    device: str | None = None,
) -> np.ndarray:
    """N-D convolution of ``x - x_zero_point`` with ``w - w_zero_point`` in int32 (ONNX ConvInteger);
    ``pads`` is ONNX's ``[begin..., end...]``; w's zero point is a scalar or one per output channel."""
    x, w = _check_int8("conv_integer", "x", x), _check_int8("conv_integer", "w", w)
    return call(
        "conv_integer", x, w, x_zero_point, w_zero_point, stride=stride, pads=pads, dilation=dilation,
        groups=groups, device=device,
    )  # fmt: skip


def _requantize(acc: np.ndarray, multiplier: np.ndarray, y_zero_point: Any, dtype: np.dtype) -> np.ndarray:
    """``saturate(rint(acc * multiplier) + y_zero_point)``; the multiplier is float32, the product float64."""
    v = np.rint(acc.astype(float64) * multiplier.astype(float64))
    if y_zero_point is not None:
        v = v + np.asarray(y_zero_point).astype(float64)
    return _saturate_int(v, dtype)


def _out_dtype(op: str, x: np.ndarray, y_zero_point: Any) -> np.dtype:
    if y_zero_point is None:
        return x.dtype
    d = np.asarray(y_zero_point).dtype
    if d not in MM_DTYPES:
        raise OpError(op, "y_zero_point", "int8 or uint8", str(d))
    return d


def _scale(op: str, name: str, s: Any) -> np.ndarray:
    s = np.asarray(s)
    if s.dtype not in FLOAT_DTYPES:
        raise OpError(op, name, "a floating dtype", str(s.dtype))
    return s.astype(float32)


def _qlinear_matmul(
    a: Any,
    a_scale: Any,
    a_zero_point: Any,
    b: Any,
    b_scale: Any,
    b_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any,
) -> np.ndarray:
    op = "qlinear_matmul"
    a, b = np.asarray(a), np.asarray(b)
    acc = _matmul_integer(a, b, a_zero_point, b_zero_point)
    sa, sb, sy = (
        _scale(op, "a_scale", a_scale),
        _scale(op, "b_scale", b_scale),
        _scale(op, "y_scale", y_scale),
    )
    if sa.size > 1:
        sa = sa.reshape(-1, 1)  # per row of a
    return _requantize(acc, sa * sb / sy, y_zero_point, _out_dtype(op, a, y_zero_point))


register("qlinear_matmul", device="ref")(_qlinear_matmul)
register("qlinear_matmul", device="cpu")(_qlinear_matmul)


def qlinear_matmul(
    a: Any,
    a_scale: Any,
    a_zero_point: Any,
    b: Any,
    b_scale: Any,
    b_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any,
    *,
    device: str | None = None,
) -> np.ndarray:
    """Quantized matmul (ONNX QLinearMatMul): int32 accumulation, requantized with
    ``a_scale * b_scale / y_scale`` (float32), round half to even, saturated to y's dtype."""
    a, b = _check_int8("qlinear_matmul", "a", a), _check_int8("qlinear_matmul", "b", b)
    return call(
        "qlinear_matmul", a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point,
        device=device,
    )  # fmt: skip


def _qlinear_conv(
    x: Any,
    x_scale: Any,
    x_zero_point: Any,
    w: Any,
    w_scale: Any,
    w_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> np.ndarray:
    op = "qlinear_conv"
    x = np.asarray(x)
    acc = _conv_integer(
        x, w, x_zero_point, w_zero_point, stride=stride, pads=pads, dilation=dilation, groups=groups
    )
    if bias is not None:
        bb = np.asarray(bias)
        if bb.dtype != int32 or bb.shape != (acc.shape[1],):
            raise OpError(op, "bias", f"int32 of shape ({acc.shape[1]},)", f"{bb.dtype}{list(bb.shape)}")
        acc = acc + bb.reshape((1, -1) + (1,) * (acc.ndim - 2))
    sx, sw, sy = (
        _scale(op, "x_scale", x_scale),
        _scale(op, "w_scale", w_scale),
        _scale(op, "y_scale", y_scale),
    )
    if sw.size > 1:
        sw = sw.reshape((1, -1) + (1,) * (acc.ndim - 2))  # per output channel
    return _requantize(acc, sx * sw / sy, y_zero_point, _out_dtype(op, x, y_zero_point))


register("qlinear_conv", device="ref")(_qlinear_conv)
register("qlinear_conv", device="cpu")(_qlinear_conv)


def qlinear_conv(
    x: Any,
    x_scale: Any,
    x_zero_point: Any,
    w: Any,
    w_scale: Any,
    w_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    device: str | None = None,
) -> np.ndarray:
    """Quantized N-D convolution (ONNX QLinearConv): int32 accumulation plus int32 bias, requantized
    with ``x_scale * w_scale / y_scale`` (w_scale per tensor or per output channel)."""
    x, w = _check_int8("qlinear_conv", "x", x), _check_int8("qlinear_conv", "w", w)
    return call(
        "qlinear_conv", x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, bias,
        stride=stride, pads=pads, dilation=dilation, groups=groups, device=device,
    )  # fmt: skip


def _qconv(
    x: Any,
    x_zero_point: Any,
    w: Any,
    w_zero_point: Any,
    scale: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    out: Any = None,
) -> np.ndarray:
    acc = _conv_integer(
        x, w, x_zero_point, w_zero_point, stride=stride, pads=pads, dilation=dilation, groups=groups
    )
    per_channel = (1, -1) + (1,) * (acc.ndim - 2)
    y = acc.astype(float32) * np.asarray(scale, float32).reshape(per_channel if np.size(scale) > 1 else ())
    if bias is not None:
        y = y + np.asarray(bias, float32).reshape(per_channel)
    if out is not None:
        np.copyto(out, y)
        return out
    return y.astype(float32, copy=False)


register("qconv", device="ref", dtypes=MM_DTYPES)(_qconv)
register("qconv", device="cpu", dtypes=MM_DTYPES)(_qconv)


def _check_qconv_operands(op: str, x: Any, w: Any, scale: Any, bias: Any) -> tuple[np.ndarray, np.ndarray]:
    """qconv's operand checks (int8/uint8 x and w of the same rank, a scalar or per-output-channel float
    scale, a per-channel bias); returns x and w as arrays."""
    x, w = _check_int8(op, "x", x), _check_int8(op, "w", w)
    if x.ndim < 3 or w.ndim != x.ndim:
        raise OpError(op, "w", f"(M, C/groups, *kernel) of x's rank {x.ndim}", f"shape {w.shape}",
                      fix="pass x (N, C, *spatial) and w (M, C/groups, *kernel)")  # fmt: skip
    m = w.shape[0]
    sc = np.asarray(scale)
    if sc.dtype.kind != "f" or sc.size not in (1, m) or sc.ndim > 1:
        raise OpError(
            op, "scale", f"a float scalar or ({m},) per output channel", f"{sc.dtype}{list(sc.shape)}"
        )
    if bias is not None and np.shape(bias) != (m,):
        raise OpError(op, "bias", f"shape ({m},)", str(np.shape(bias)))
    return x, w


def qconv(
    x: Any,
    x_zero_point: Any,
    w: Any,
    w_zero_point: Any,
    scale: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    out: np.ndarray | None = None,
    device: str | None = None,
) -> np.ndarray:
    """A dequantizing integer convolution: ``conv(x - x_zp, w - w_zp)`` exactly in int32, times ``scale``
    (``x_scale * w_scale``: a scalar or one per output channel), plus a float ``bias`` per output channel,
    as float32 — what ``Conv(DequantizeLinear(x_q), DequantizeLinear(w_q), bias)`` computes in a QDQ
    model, as one op a native kernel can run on int8 (graph's ``ai.opstrata::QConv``). ``out``: a float32
    array of the result's shape to write into.

    >>> x = np.full((1, 1, 2, 2), 3, np.uint8)
    >>> qconv(x, np.uint8(1), np.ones((1, 1, 2, 2), np.int8), np.int8(0), np.float32(0.5)).tolist()
    [[[[4.0]]]]
    """
    op = "qconv"
    x, w = _check_qconv_operands(op, x, w, scale, bias)
    kw = {"stride": stride, "pads": pads, "dilation": dilation, "groups": groups, "device": device}
    if out is None:
        return call(op, x, x_zero_point, w, w_zero_point, scale, bias, **kw)
    if not isinstance(out, np.ndarray) or out.dtype != float32 or not out.flags.writeable:
        got = f"{out.dtype}{list(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__
        raise OpError(
            op, "out", "a writeable float32 array of the result's shape", got, fix="pass a matching out"
        )
    return call(op, x, x_zero_point, w, w_zero_point, scale, bias, out=out, **kw)


#: the activations qconv_quantize applies between the float result and its quantization
QCONV_ACTIVATIONS = ("none", "relu", "hardswish", "clip")


def _qconv_activation(y: np.ndarray, activation: str, alpha: float, beta: float) -> np.ndarray:
    """The activation in float32, step by step as graph's FusedElementwise runs it (same bits):
    relu ``max(y, 0)``; hardswish ``min(max(y * alpha + beta, 0), 1) * y``; clip ``min(max(y, alpha), beta)``."""
    if activation == "clip":
        return np.minimum(np.maximum(y, np.float32(alpha)), np.float32(beta))
    if activation == "relu":
        return np.maximum(y, np.float32(0))
    if activation == "hardswish":
        t = np.minimum(np.maximum(y * np.float32(alpha) + np.float32(beta), np.float32(0)), np.float32(1))
        return t * y
    return y


def _qconv_quantize(
    x: Any,
    x_zero_point: Any,
    w: Any,
    w_zero_point: Any,
    scale: Any,
    bias: Any,
    y_scale: Any,
    y_zero_point: Any,
    *,
    activation: str = "none",
    alpha: float = 1.0 / 6.0,
    beta: float = 0.5,
    residual: Any = None,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    out: Any = None,
) -> np.ndarray:
    y = _qconv(x, x_zero_point, w, w_zero_point, scale, bias, stride=stride, pads=pads, dilation=dilation,
               groups=groups)  # fmt: skip
    if residual is not None:
        r = np.asarray(residual, float32)
        if r.shape != y.shape:
            raise OpError("qconv_quantize", "residual", f"the convolution's output shape {list(y.shape)}",
                          f"{list(r.shape)}", fix="broadcast the residual first or keep the Add separate")  # fmt: skip
        y = y + r
    q = _quantize_linear(_qconv_activation(y, activation, alpha, beta), y_scale, y_zero_point)
    if out is not None:
        np.copyto(out, q)
        return out
    return q


register("qconv_quantize", device="ref", dtypes=MM_DTYPES)(_qconv_quantize)
register("qconv_quantize", device="cpu", dtypes=MM_DTYPES)(_qconv_quantize)


def qconv_quantize(
    x: Any,
    x_zero_point: Any,
    w: Any,
    w_zero_point: Any,
    scale: Any,
    bias: Any,
    y_scale: Any,
    y_zero_point: Any,
    *,
    activation: str = "none",
    alpha: float = 1.0 / 6.0,
    beta: float = 0.5,
    residual: Any = None,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    out: np.ndarray | None = None,
    device: str | None = None,
) -> np.ndarray:
    """:func:`qconv`'s float32 result, plus ``residual`` (a float32 array of the result's shape, or None),
    through ``activation`` (``"none"``, ``"relu"``, ``"hardswish"`` with ``alpha`` / ``beta``, or ``"clip"``
    to ``[alpha, beta]``), then ONNX
    QuantizeLinear with a scalar ``y_scale`` and ``y_zero_point`` (int8 or uint8: the output dtype) --
    ``QuantizeLinear(act(Conv(DQ(x), DQ(w), b) [+ r]))`` of a QDQ model as one op, so a native kernel never
    writes the float tensor (QLinearConv with a fused residual add and activation). The bytes equal the
    steps run one by one.

    >>> x = np.full((1, 1, 2, 2), 3, np.uint8)
    >>> w = np.ones((1, 1, 2, 2), np.int8)
    >>> qconv_quantize(x, np.uint8(1), w, np.int8(0), np.float32(0.5), None, np.float32(0.5), np.uint8(10)).tolist()
    [[[[18]]]]
    """
    op = "qconv_quantize"
    x, w = _check_qconv_operands(op, x, w, scale, bias)
    if activation not in QCONV_ACTIVATIONS:
        raise OpError(op, "activation", f"one of {QCONV_ACTIVATIONS}", repr(activation),
                      fix="fuse other activations as a separate node")  # fmt: skip
    ys, yz = np.asarray(y_scale), np.asarray(y_zero_point)
    if ys.dtype != float32 or ys.size != 1:
        raise OpError(op, "y_scale", "a float32 scalar", f"{ys.dtype}{list(ys.shape)}")
    if yz.dtype not in MM_DTYPES or yz.size != 1:
        raise OpError(op, "y_zero_point", "an int8 or uint8 scalar", f"{yz.dtype}{list(yz.shape)}",
                      fix="per-axis output quantization runs as qconv then quantize_linear")  # fmt: skip
    if (
        np.isnan(alpha)
        or np.isnan(beta)
        or (activation != "clip" and not (np.isfinite(alpha) and np.isfinite(beta)))
    ):
        raise OpError(
            op,
            "alpha/beta",
            "finite floats (clip's bounds may be infinite)",
            f"alpha={alpha!r}, beta={beta!r}",
        )
    if residual is not None:
        r = np.asarray(residual)
        if r.dtype != float32:
            raise OpError(
                op,
                "residual",
                "a float32 array of the convolution's output shape",
                f"{r.dtype}{list(r.shape)}",
            )
    kw = {
        "activation": activation, "alpha": float(alpha), "beta": float(beta), "stride": stride, "pads": pads,
        "dilation": dilation, "groups": groups, "device": device,
    }  # fmt: skip
    if residual is not None:
        kw["residual"] = residual
    if out is not None and (
        not isinstance(out, np.ndarray) or out.dtype != yz.dtype or not out.flags.writeable
    ):
        got = f"{out.dtype}{list(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__
        raise OpError(op, "out", f"a writeable {yz.dtype} array of the result's shape", got,
                      fix="pass a matching out")  # fmt: skip
    if out is None:
        return call(op, x, x_zero_point, w, w_zero_point, scale, bias, y_scale, y_zero_point, **kw)
    return call(op, x, x_zero_point, w, w_zero_point, scale, bias, y_scale, y_zero_point, out=out, **kw)


def _qmatmul_with(
    matmul_integer: Any,
) -> Any:
    """The ``qmatmul`` kernel over a ``matmul_integer`` kernel (the reference's or the BLAS one)."""

    def kernel(
        a: Any, a_zero_point: Any, w: Any, w_zero_point: Any, scale: Any, bias: Any = None, *, out: Any = None
    ) -> np.ndarray:
        acc = matmul_integer(a, w, a_zero_point, w_zero_point)
        y = acc.astype(float32) * np.asarray(scale, float32)
        if bias is not None:
            y = y + np.asarray(bias, float32)
        if out is not None:
            np.copyto(out, y)
            return out
        return y.astype(float32, copy=False)

    return kernel


register("qmatmul", device="ref", dtypes=MM_DTYPES)(_qmatmul_with(_matmul_integer))
register("qmatmul", device="cpu", dtypes=MM_DTYPES)(_qmatmul_with(_matmul_integer_blas))


def qmatmul(
    a: Any,
    a_zero_point: Any,
    w: Any,
    w_zero_point: Any,
    scale: Any,
    bias: Any = None,
    *,
    out: np.ndarray | None = None,
    device: str | None = None,
) -> np.ndarray:
    """A dequantizing integer matmul: ``(a - a_zp) @ (w - w_zp)`` exactly in int32, times ``scale``
    (``a_scale * w_scale``: a scalar or one per column), plus a float ``bias`` per column, as float32 --
    what ``MatMul(DequantizeLinear(a_q), DequantizeLinear(w_q))`` (+ a Gemm's bias) computes in a QDQ
    model, as one op a native kernel can run on int8 (graph's ``ai.opstrata::QMatMul``). ``a`` (..., K),
    ``w`` (K, N); ``out``: a float32 array of the result's shape to write into.

    >>> qmatmul(np.full((1, 2), 3, np.uint8), np.uint8(1), np.ones((2, 1), np.int8), np.int8(0), np.float32(0.5)).tolist()
    [[2.0]]
    """
    op = "qmatmul"
    a, w = _check_int8(op, "a", a), _check_int8(op, "w", w)
    if w.ndim != 2 or a.ndim < 1 or a.shape[-1] != w.shape[0]:
        raise OpError(op, "w", f"(K, N) with K = a's last dim {a.shape[-1] if a.ndim else '?'}",
                      f"shape {w.shape}", fix="pass a (..., K) and w (K, N)")  # fmt: skip
    n = w.shape[1]
    _check_matmul_epilogue(op, "scale", scale, bias, n)
    if out is None:
        return call(op, a, a_zero_point, w, w_zero_point, scale, bias, device=device)
    _check_float_out(op, out, (*a.shape[:-1], n), a, "a")
    return call(op, a, a_zero_point, w, w_zero_point, scale, bias, out=out, device=device)


def _dequant_matmul(
    x: Any,
    w: Any,
    w_scale: Any,
    w_zero_point: Any = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    out: Any = None,
) -> np.ndarray:
    wf = _dequantize_linear(w, w_scale, w_zero_point, axis=axis, block_size=block_size, output_dtype=float32)
    y = np.matmul(np.asarray(x, float32), wf)
    if out is not None:
        np.copyto(out, y)
        return out
    return y


register("dequant_matmul", device="ref", dtypes=(float32,))(_dequant_matmul)
register("dequant_matmul", device="cpu", dtypes=(float32,))(_dequant_matmul)


def dequant_matmul(
    x: Any,
    w: Any,
    w_scale: Any,
    w_zero_point: Any = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    out: np.ndarray | None = None,
    device: str | None = None,
) -> np.ndarray:
    """``x @ dequantize_linear(w, w_scale, w_zero_point, axis, block_size)``: a weight-only quantized
    Linear (int8/uint8/int4/uint4 ``w`` (K, N), scales per tensor, per column (axis 1) or per block of
    ``block_size`` rows (axis 0, ONNX opset-21 blocks)) as one op, so a native kernel can dequantize
    tiles of ``w`` on the fly instead of keeping a float copy. ``x`` (..., K) float32.

    >>> w = np.array([[2], [-1]], np.int8)
    >>> dequant_matmul(np.array([[1.0, 3.0]], np.float32), w, np.float32(0.5)).tolist()
    [[-0.5]]
    """
    op = "dequant_matmul"
    x = np.asarray(x)
    check_dtype(op, "x", x, (float32,))
    w = np.asarray(w)
    check_dtype(op, "w", w, (int8, uint8, int4, uint4))
    if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[0]:
        raise OpError(op, "w", f"a 2-D (K={x.shape[-1] if x.ndim else '?'}, N) weight", f"shape {w.shape}",
                      fix="pass x (..., K) and w (K, N)")  # fmt: skip
    kw: dict[str, Any] = {"axis": axis, "block_size": block_size, "device": device}
    if out is not None:
        _check_float_out(op, out, (*x.shape[:-1], w.shape[1]), x, "x")
        kw["out"] = out
    return call(op, x, w, w_scale, w_zero_point, **kw)
