"""Quantization ops of the ONNX operator specification: QuantizeLinear, DequantizeLinear (per-tensor,
per-axis, blocked; ``output_dtype``, ``saturate``, ``precision``), DynamicQuantizeLinear, MatMulInteger,
ConvInteger, QLinearMatMul, QLinearConv, and BitCast (opset 26: reinterpret the bytes as another
dtype of the same width).

Each executor kernel is one opstrata.ops call (module ``opstrata.ops.kernels.quantize``); BitCast is a
host numpy view. Conv geometry (auto_pad, pads, strides, dilations) is shared with ``conv.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import opstrata.ops as ops

from .._ir import OPSTRATA_DOMAIN, Node
from .._shape_rules import RuleContext, TypeShape, float_dtype, matmul_shape
from ..onnx.context import ImportContext
from ..onnx.export import register_export
from ..onnx.types import dtype_from_onnx
from .common import Arr
from .conv import _export_window, _input_rank, _need_spatial, _spatial, _window_attrs, conv_geometry
from .registry import HOST, define

_I32 = np.dtype(np.int32)
_U8 = np.dtype(np.uint8)


def _opt(x: list[Any], i: int) -> Any:
    """Input ``i`` of the executor's list, None when omitted."""
    return x[i] if i < len(x) else None


def _onnx_dtype(n: Node, attr: str) -> np.dtype | None:
    """The dtype an ONNX elem-type attribute names (0 or absent: None)."""
    t = int(n.attrs.get(attr) or 0)
    return dtype_from_onnx(t, f"node '{n.name}' attribute '{attr}'") if t else None


# --------------------------------------------------------------------------- Quantize / Dequantize


def _quantize_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    if ctx.dtype(0) is not None and ctx.dtype(0) != np.int32:
        float_dtype(ctx)
    zp, out = ctx.dtype(2), _onnx_dtype(n, "output_dtype")
    if zp is not None and out is not None and zp != out:
        raise ctx.fail(
            f"type mismatch: output_dtype {out} but the zero point is {zp}",
            "make output_dtype match the zero point",
        )
    return [(zp or out or _U8, ctx.shape(0))]


def _run_quantize(n: Node, x: list[Arr]) -> list[Arr]:
    a = n.attrs
    return [
        ops.quantize_linear(
            x[0], x[1], _opt(x, 2), axis=a.get("axis", 1), block_size=a.get("block_size", 0),
            saturate=bool(a.get("saturate", 1)), output_dtype=_onnx_dtype(n, "output_dtype"),
            precision=_onnx_dtype(n, "precision"),
        )
    ]  # fmt: skip


def _dequantize_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(_onnx_dtype(n, "output_dtype") or ctx.dtype(1), ctx.shape(0))]


def _run_dequantize(n: Node, x: list[Arr]) -> list[Arr]:
    a = n.attrs
    return [
        ops.dequantize_linear(
            x[0], x[1], _opt(x, 2), axis=a.get("axis", 1), block_size=a.get("block_size", 0),
            output_dtype=_onnx_dtype(n, "output_dtype"),
        )
    ]  # fmt: skip


def _dynamic_quantize_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(0, "f", "float32")
    return [(_U8, ctx.shape(0)), (np.dtype(np.float32), ()), (_U8, ())]


def _run_dynamic_quantize(n: Node, x: list[Arr]) -> list[Arr]:
    return list(ops.dynamic_quantize_linear(x[0]))


# --------------------------------------------------------------------------- integer matmul


def _matmul_integer_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(_I32, matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))]


def _run_matmul_integer(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.matmul_integer(x[0], x[1], _opt(x, 2), _opt(x, 3))]


def _qlinear_matmul_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(ctx.dtype(7) or ctx.dtype(0), matmul_shape(ctx, ctx.shape(0), ctx.shape(3)))]


def _run_qlinear_matmul(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.qlinear_matmul(*x[:8])]


# --------------------------------------------------------------------------- integer conv


def _import_qconv(ctx: ImportContext) -> None:
    """ConvInteger / QLinearConv: the window attributes with defaults filled in, as Conv does."""
    wi = 1 if ctx.op_type == "ConvInteger" else 3
    w = ctx.const(wi)
    if "kernel_shape" in ctx.attrs:
        nd: int | None = len(ctx.attrs["kernel_shape"])
    elif w is not None:
        nd = w.ndim - 2
    else:
        r = _input_rank(ctx)
        nd = None if r is None else r - 2
    attrs = _window_attrs(ctx, nd, pool=False)
    if "kernel_shape" not in attrs and w is not None:
        attrs["kernel_shape"] = list(w.shape[2:])
    attrs["group"] = int(ctx.attrs.get("group", 1))
    ctx.emit(ctx.op_type, ctx.inputs, ctx.outputs, attrs)


def _qconv_shape(n: Node, ctx: RuleContext, xi: int, wi: int) -> Any:
    x, w = ctx.shape(xi), ctx.shape(wi)
    if x is None:
        return None
    _need_spatial(ctx, x, n.op_type)
    if w is None:
        return (x[0], None, *([None] * (len(x) - 2)))
    kernel = n.attrs.get("kernel_shape") or list(w[2:])
    if not all(isinstance(k, int) for k in kernel):
        return (x[0], w[0], *([None] * (len(x) - 2)))
    return (x[0], w[0], *_spatial(n, ctx, x, kernel))


def _conv_integer_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(_I32, _qconv_shape(n, ctx, 0, 1))]


def _qlinear_conv_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(ctx.dtype(7) or ctx.dtype(0), _qconv_shape(n, ctx, 0, 3))]


def _window(n: Node, x: Arr, w: Arr) -> dict[str, Any]:
    kernel = n.attrs.get("kernel_shape") or w.shape[2:]
    s, d, pads = conv_geometry(n, x, kernel)
    return {"stride": s, "dilation": d, "pads": pads, "groups": n.attrs.get("group", 1)}


def _run_conv_integer(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.conv_integer(x[0], x[1], _opt(x, 2), _opt(x, 3), **_window(n, x[0], x[1]))]


def _run_qlinear_conv(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.qlinear_conv(*x[:8], _opt(x, 8), **_window(n, x[0], x[3]))]


# --------------------------------------------------------------------------- QMatMul (fused QDQ MatMul / Gemm)


def _qmatmul_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(0, "iu", "int8/uint8 activations")
    ctx.need_dtype(2, "iu", "an int8/uint8 weight")
    return [(np.dtype(np.float32), matmul_shape(ctx, ctx.shape(0), ctx.shape(2)))]


def _run_qmatmul(n: Node, x: list[Arr]) -> list[Arr]:
    """``matmul_integer(a, w, a_zp, w_zp) * scale (+ bias)``: the exact int32 product, scaled once
    (``ops.qmatmul``, one op a native kernel runs, where opstrata-ops has it: >= 0.4.57)."""
    if hasattr(ops, "qmatmul"):
        return [ops.qmatmul(x[0], x[1], x[2], x[3], n.attrs["scale"], n.attrs.get("bias"))]
    acc = ops.matmul_integer(x[0], x[2], x[1], x[3])
    y = acc.astype(np.float32) * n.attrs["scale"]
    bias = n.attrs.get("bias")
    if bias is not None:
        y += bias
    return [y]


def _dynamic_qmatmul_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(0, "f", "float32 activations")
    ctx.need_dtype(1, "iu", "an int8/uint8 weight")
    return [(np.dtype(np.float32), matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))]


def _run_dynamic_qmatmul(n: Node, x: list[Arr]) -> list[Arr]:
    """``ops.dynamic_qmatmul``: x quantized on the fly, the exact int32 product, scaled once (+ bias)."""
    w_zp = x[2] if len(x) > 2 else None
    kw = {"per_token": True} if n.attrs.get("per_token") else {}
    return [ops.dynamic_qmatmul(x[0], x[1], n.attrs["w_scale"], w_zp, n.attrs.get("bias"), **kw)]


# --------------------------------------------------------------------------- QConv (fused QDQ Conv)


def _qconv_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(0, "iu", "int8/uint8 activations")
    ctx.need_dtype(2, "iu", "an int8/uint8 weight")
    return [(np.dtype(np.float32), _qconv_shape(n, ctx, 0, 2))]


def _run_qconv(n: Node, x: list[Arr]) -> list[Arr]:
    """``ops.qconv``: the exact int32 convolution of the quantized values, scaled per output channel (+ bias)."""
    return [
        ops.qconv(x[0], x[1], x[2], x[3], n.attrs["scale"], n.attrs.get("bias"), **_window(n, x[0], x[2]))
    ]


# --------------------------------------------------------------------------- QConvQuantize (QConv -> act -> Q)


#: QConvQuantize's attributes that are ``ops.qconv_quantize`` keywords of the same name (absent: its defaults)
QCONV_QUANTIZE_ATTRS = ("activation", "alpha", "beta")


def _qconv_quantize_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(0, "iu", "int8/uint8 activations")
    ctx.need_dtype(2, "iu", "an int8/uint8 weight")
    ctx.need_dtype(5, "iu", "an int8/uint8 output zero point")
    return [(ctx.dtype(5), _qconv_shape(n, ctx, 0, 2))]


def _run_qconv_quantize(n: Node, x: list[Arr]) -> list[Arr]:
    """``ops.qconv_quantize``: QConv's float result through the activation, quantized with (y_scale, y_zp)."""
    a = n.attrs
    extra = {k: a[k] for k in QCONV_QUANTIZE_ATTRS if k in a}
    if len(x) > 6 and x[6] is not None:
        extra["residual"] = x[6]
    return [
        ops.qconv_quantize(
            x[0], x[1], x[2], x[3], a["scale"], a.get("bias"), x[4], x[5], **extra, **_window(n, x[0], x[2])
        )
    ]


# --------------------------------------------------------------------------- DequantMatMul (weight-only)


def _dequant_matmul_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(0, "f", "float32 activations")
    return [(np.dtype(np.float32), matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))]


def _run_dequant_matmul(n: Node, x: list[Arr]) -> list[Arr]:
    """``ops.dequant_matmul``: x times the dequantized weight, the weight kept quantized."""
    zp = x[3] if len(x) > 3 else None
    return [
        ops.dequant_matmul(
            x[0], x[1], x[2], zp, axis=n.attrs.get("axis", 1), block_size=n.attrs.get("block_size", 0)
        )
    ]


# --------------------------------------------------------------------------- BitCast


def _bitcast_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    to, src = _onnx_dtype(n, "to"), ctx.dtype(0)
    if to is None:
        raise ctx.fail("BitCast needs the 'to' attribute", "set 'to' to an ONNX element type")
    if src is not None and (src.itemsize != to.itemsize or object in (src.type, to.type)):
        raise ctx.fail(
            f"BitCast from {src} ({src.itemsize * 8} bits) to {to} ({to.itemsize * 8} bits): the widths differ "
            "(or a type is a string)",
            "bit-cast between types of one width (use Cast to convert values)",
        )
    return [(to, ctx.shape(0))]


def _run_bitcast(n: Node, x: list[Arr]) -> list[Arr]:
    to = _onnx_dtype(n, "to")
    return [np.array(x[0], order="C").view(to)]


# --------------------------------------------------------------------------- the rows

define(
    "QuantizeLinear",
    shape=_quantize_rule, kernel=_run_quantize, uses=("quantize_linear",), dtypes="float, int32",
    doc="per-tensor, per-axis and blocked; round half to even, saturating",
)  # fmt: skip
define(
    "DequantizeLinear", shape=_dequantize_rule,
    kernel=_run_dequantize, uses=("dequantize_linear",), dtypes="int8/16/32, uint8/16, float8",
)  # fmt: skip
define(
    "DynamicQuantizeLinear", shape=_dynamic_quantize_rule, kernel=_run_dynamic_quantize,
    uses=("dynamic_quantize_linear",), dtypes="float32",
)  # fmt: skip
define(
    "MatMulInteger", shape=_matmul_integer_rule, kernel=_run_matmul_integer, uses=("matmul_integer",),
    dtypes="int8/uint8", doc="int32 accumulation",
)  # fmt: skip
define(
    "QLinearMatMul", shape=_qlinear_matmul_rule, kernel=_run_qlinear_matmul, uses=("qlinear_matmul",),
    dtypes="int8/uint8",
)  # fmt: skip
define(
    "ConvInteger", importer=_import_qconv, shape=_conv_integer_rule, kernel=_run_conv_integer,
    uses=("conv_integer",), dtypes="int8/uint8", doc="int32 accumulation",
)  # fmt: skip
define(
    "QLinearConv", importer=_import_qconv, shape=_qlinear_conv_rule, kernel=_run_qlinear_conv,
    uses=("qlinear_conv",), dtypes="int8/uint8",
)  # fmt: skip
register_export("ConvInteger", _export_window)
register_export("QLinearConv", _export_window)
define(
    "QMatMul", OPSTRATA_DOMAIN, shape=_qmatmul_rule, kernel=_run_qmatmul, uses=("qmatmul",),
    onnx=False, dtypes="int8/uint8 -> float32",
    doc="a QDQ MatMul/Gemm fused: (a_q, a_zp, w_q (K, N), w_zp), attrs scale, bias; exact int32 product, scaled once",
)  # fmt: skip
define(
    "QConv", OPSTRATA_DOMAIN, shape=_qconv_rule, kernel=_run_qconv, uses=("qconv",), onnx=False,
    dtypes="int8/uint8 -> float32",
    doc="a QDQ Conv fused: (x_q, x_zp, w_q, w_zp), Conv's window attrs, attrs scale (per channel), bias; exact int32",
)  # fmt: skip
define(
    "QConvQuantize", OPSTRATA_DOMAIN, shape=_qconv_quantize_rule, kernel=_run_qconv_quantize,
    uses=("qconv_quantize",), onnx=False, dtypes="int8/uint8 -> int8/uint8", dispatch_input=0,
    doc="QConv [+ residual] -> activation (none/relu/hardswish/clip: attrs activation, alpha, beta) -> QuantizeLinear "
    "fused: (x_q, x_zp, w_q, w_zp, y_scale, y_zp[, residual]); the float result is never written",
)  # fmt: skip
define(
    "DequantMatMul", OPSTRATA_DOMAIN, shape=_dequant_matmul_rule, kernel=_run_dequant_matmul,
    uses=("dequant_matmul",), onnx=False, dtypes="float32 x int8/uint8/int4/uint4 -> float32",
    doc="a weight-only MatMul(x, DequantizeLinear(w_q)) fused: (x, w_q (K, N), scale, zp), attrs axis, block_size",
)  # fmt: skip
define(
    "DynamicQMatMul", OPSTRATA_DOMAIN, shape=_dynamic_qmatmul_rule, kernel=_run_dynamic_qmatmul,
    uses=("dynamic_qmatmul",), onnx=False, dtypes="float32 x int8/uint8 -> float32",
    doc="DynamicQuantizeLinear -> MatMulInteger -> scale (-> bias) fused: (x, w_q (K, N), w_zp), attrs w_scale, bias, per_token",
)  # fmt: skip
define(
    "BitCast", shape=_bitcast_rule, kernel=_run_bitcast, uses=(HOST,), dtypes="all",
    doc="reinterprets the bytes (same width)",
)  # fmt: skip
