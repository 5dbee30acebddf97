"""quantize/dequantize against onnx.reference's QuantizeLinear/DequantizeLinear (per-tensor, per-axis,
blocked, int8/uint8/int4/uint4/float8) and params_from_range against hand computations."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as h
from onnx.reference import ReferenceEvaluator

from opstrata.graph import dtype_to_onnx, tensor_from_array
from opstrata.quant import QuantError, QuantParams, dequantize, params_from_range, qdtype, quantize_array

DTYPES = ["int8", "uint8", "int4", "uint4", "float8_e4m3fn", "float8_e5m2"]


def _ref_model(op: str, x: np.ndarray, p: QuantParams) -> ReferenceEvaluator:
    attrs = {}
    if p.axis is not None:
        attrs["axis"] = p.axis
    if p.block_size:
        attrs["block_size"] = p.block_size
    out_t = T.FLOAT if op == "DequantizeLinear" else dtype_to_onnx(p.dtype)
    in_t = dtype_to_onnx(x.dtype)
    g = h.make_graph(
        [h.make_node(op, ["x", "s", "z"], ["y"], **attrs)], "g", [h.make_tensor_value_info("x", in_t, x.shape)],
        [h.make_tensor_value_info("y", out_t, x.shape)],
        [tensor_from_array(np.asarray(p.scale, np.float32), "s"), tensor_from_array(np.asarray(p.zero_point), "z")],
    )  # fmt: skip
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    m.ir_version = 10
    return ReferenceEvaluator(m)


@functools.cache
def _reference_cannot(op: str, dtype: str) -> str | None:
    """Why the installed onnx's ReferenceEvaluator cannot run ``op`` with ``dtype`` codes as ml_dtypes arrays
    (onnx < 1.19 has its own int4/float8 types and maps no ml_dtypes dtype), or None when it can: probed
    on a two-element tensor."""
    p = params_from_range(-1.0, 1.0, dtype, symmetric=True)
    x = np.array([0.5, -1.0], np.float32)
    if op == "DequantizeLinear":
        x = quantize_array(x, p)
    try:
        out = _ref_model(op, x, p).run(None, {"x": x})[0]
    except (KeyError, RuntimeError, TypeError, ValueError) as exc:
        return (
            f"installed onnx {onnx.__version__}'s ReferenceEvaluator (the test's oracle) cannot run {op} on "
            f"{dtype} arrays from ml_dtypes: {type(exc).__name__}: {exc}"
        )
    # onnx < 1.19: onnx.reference.custom_element_types, a named uint8 field holding the bit patterns
    if qdtype(dtype).is_float and out.dtype != p.dtype and out.dtype.descr[0][0]:
        return (
            f"installed onnx {onnx.__version__}'s ReferenceEvaluator (the test's oracle) returns {op}'s {dtype} "
            f"codes in its own element type ({out.dtype.descr[0][0]}: raw bit patterns), not as ml_dtypes values"
        )
    return None


def _needs_reference(op: str, dtype: str) -> None:
    reason = _reference_cannot(op, dtype)
    if reason is not None:
        pytest.skip(reason)


def _params(x: np.ndarray, dtype: str, symmetric: bool, axis: int | None, block: int) -> QuantParams:
    from opstrata.quant import MinMaxObserver

    o = MinMaxObserver(dtype, symmetric=symmetric, axis=axis, group_size=block)
    o.observe(x)
    return o.compute()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("axis", "block"), [(None, 0), (1, 0), (0, 0), (0, 16), (1, 8)])
def test_quantize_and_dequantize_match_onnx_reference(dtype: str, axis: int | None, block: int) -> None:
    x0 = (np.random.default_rng(3).standard_normal((32, 24)) * 3).astype(np.float32)
    p = _params(x0, dtype, qdtype(dtype).signed, axis, block)
    x = x0 * 1.5  # beyond the calibrated range: saturates
    x[0, 0] = 1e4
    q = quantize_array(x, p)
    assert q.dtype == np.dtype(qdtype(dtype).dtype)
    _needs_reference("QuantizeLinear", dtype)
    want = _ref_model("QuantizeLinear", x, p).run(None, {"x": x})[0]
    np.testing.assert_array_equal(q.astype(np.float32), want.astype(np.float32))
    d = dequantize(q, p)
    _needs_reference("DequantizeLinear", dtype)
    want_d = _ref_model("DequantizeLinear", q, p).run(None, {"x": q})[0]
    np.testing.assert_array_equal(d, want_d)


def test_onnx_type_of_every_dtype() -> None:
    """QDType.onnx_type maps the ml_dtypes types too (onnx < 1.19's helper cannot)."""
    want = [T.INT8, T.UINT8, T.INT4, T.UINT4, T.FLOAT8E4M3FN, T.FLOAT8E5M2]
    assert [qdtype(d).onnx_type() for d in DTYPES] == want


def test_rounding_is_half_to_even_and_saturating() -> None:
    p = params_from_range(-127.0, 127.0, "int8", symmetric=True)  # scale 1
    assert float(p.scale) == 1.0
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 300.0, -300.0], np.float32)
    assert quantize_array(x, p).tolist() == [0, 2, 2, 0, -2, 127, -128]


def test_params_from_range_hand_computed() -> None:
    p = params_from_range(-1.0, 3.0, "uint8", symmetric=False)
    assert np.isclose(float(p.scale), 4.0 / 255) and int(p.zero_point) == 64  # rint(0 + 1 / (4/255)) = 64
    p = params_from_range(0.5, 3.0, "uint8", symmetric=False)  # range widened to include 0
    assert np.isclose(float(p.scale), 3.0 / 255) and int(p.zero_point) == 0
    p = params_from_range(-2.0, 1.0, "int8", symmetric=True)
    assert np.isclose(float(p.scale), 2.0 / 127) and int(p.zero_point) == 0
    p = params_from_range(-2.0, 1.0, "uint8", symmetric=True)
    assert np.isclose(float(p.scale), 2.0 / 127) and int(p.zero_point) == 128
    p = params_from_range(-2.0, 1.0, "int4", symmetric=True)
    assert np.isclose(float(p.scale), 2.0 / 7) and p.zero_point.dtype == np.dtype(ml_dtypes.int4)
    p = params_from_range(-3.0, 448.0 * 2, "fp8", symmetric=False)
    assert np.isclose(float(p.scale), 2.0) and float(p.zero_point) == 0.0
    p = params_from_range(0.0, 0.0, "int8", symmetric=True)  # all zeros: any positive scale, here 1
    assert float(p.scale) == 1.0


def test_per_channel_params_broadcast_along_axis() -> None:
    lo, hi = np.array([-1.0, -2.0, -4.0]), np.array([1.0, 2.0, 4.0])
    p = params_from_range(lo, hi, "int8", symmetric=True, axis=1)
    x = np.tile(hi.astype(np.float32), (5, 1))
    assert (quantize_array(x, p) == 127).all()


def test_shape_mismatch_and_dtype_errors_name_the_fix() -> None:
    p = params_from_range(np.zeros(3), np.ones(3), "int8", symmetric=True, axis=0)
    with pytest.raises(QuantError, match=r"do not fit a tensor of shape \(4, 2\).*Fix"):
        quantize_array(np.zeros((4, 2), np.float32), p)
    with pytest.raises(QuantError, match="expected a float tensor"):
        quantize_array(np.zeros(3, np.int32), p)
    with pytest.raises(QuantError, match="expected dtype int8"):
        dequantize(np.zeros(3, np.uint8), p)
    with pytest.raises(QuantError, match="unknown quantized dtype 'int3'"):
        qdtype("int3")
