"""Quantization kernels (kernels/quantize.py) against onnx's reference evaluator and exact integer
oracles on ref and cpu; hypothesis properties (round trip, saturation); error paths name the op,
the argument and the fix."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import opstrata.ops as ops
from opstrata.ops import OpError

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEVICES = ("ref", "cpu")
rng = np.random.default_rng(0)


def reference(op: str, inputs: list[np.ndarray | None], opset: int = 21, **attrs: Any) -> list[np.ndarray]:
    """Outputs of onnx's reference evaluator on one ``op`` node (None inputs are omitted)."""
    names = [f"i{k}" if a is not None else "" for k, a in enumerate(inputs)]
    outs = {"DynamicQuantizeLinear": ["y", "s", "z"]}.get(op, ["y"])
    node = helper.make_node(op, names, outs, **attrs)
    feeds = {n: a for n, a in zip(names, inputs, strict=True) if a is not None}
    vi = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in feeds.items()
    ]
    ov = [helper.make_tensor_value_info(o, 0, None) for o in outs]
    model = helper.make_model(
        helper.make_graph([node], "g", vi, ov), opset_imports=[helper.make_opsetid("", opset)]
    )
    return list(ReferenceEvaluator(model).run(None, feeds))


# --------------------------------------------------------------------------- QuantizeLinear


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qdtype", [np.int8, np.uint8, np.int16, np.uint16])
def test_quantize_per_tensor_matches_onnx(device: str, qdtype: Any) -> None:
    x = (rng.standard_normal((3, 4, 5)) * 100).astype(np.float32)
    x[0, 0, :4] = [0.5, 1.5, 2.5, -2.5]  # ties round to even
    s, zp = np.float32(0.5), np.array(3, qdtype)
    got = ops.quantize_linear(x, s, zp, device=device)
    (want,) = reference("QuantizeLinear", [x, s, zp])
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_quantize_per_axis_and_blocked_match_onnx(device: str) -> None:
    x = (rng.standard_normal((2, 6, 4)) * 50).astype(np.float32)
    s = np.array([0.5, 1.0, 2.0, 0.25, 4.0, 1.5], np.float32)
    zp = np.array([0, 10, 20, 30, 40, 50], np.uint8)
    np.testing.assert_array_equal(
        ops.quantize_linear(x, s, zp, axis=1, device=device),
        reference("QuantizeLinear", [x, s, zp], axis=1)[0],
    )
    sb = rng.uniform(0.1, 2, (2, 2, 4)).astype(np.float32)  # blocks of 4 (last one short) along axis 1
    zb = rng.integers(-10, 10, (2, 2, 4)).astype(np.int8)
    got = ops.quantize_linear(x, sb, zb, axis=1, block_size=4, device=device)
    np.testing.assert_array_equal(got, reference("QuantizeLinear", [x, sb, zb], axis=1, block_size=4)[0])


def test_quantize_int32_saturates_exactly() -> None:
    """int32 output (DequantizeLinear's input type; an extension of QuantizeLinear) rounds half to even."""
    x = np.array([2.5, -2.5, 3.5, 1e12, -1e12], np.float64)
    got = ops.quantize_linear(x, np.float64(1.0), np.int32(10))
    np.testing.assert_array_equal(got, [12, 8, 14, 2**31 - 1, -(2**31)])


def test_quantize_output_dtype_default_and_float8() -> None:
    x = np.array([-1.0, 0.0, 1.0, 1e6, -1e6, np.inf], np.float32)
    assert ops.quantize_linear(x[:3], np.float32(1)).dtype == np.uint8
    assert ops.quantize_linear(x[:3], np.float32(1), output_dtype=np.int16).dtype == np.int16
    e4 = np.dtype(ml_dtypes.float8_e4m3fn)
    y = ops.quantize_linear(x, np.float32(1), output_dtype=e4)
    assert y.dtype == e4 and float(y[3]) == 448.0 and float(y[4]) == -448.0 and float(y[5]) == 448.0
    assert np.isnan(float(ops.quantize_linear(x, np.float32(1), output_dtype=e4, saturate=False)[3]))


@given(
    hnp.arrays(np.float32, hnp.array_shapes(max_dims=3, max_side=5), elements=st.floats(-1e4, 1e4, width=32)),
    st.floats(0.0625, 10, width=32),
    st.integers(0, 255),
)
@SETTINGS
def test_quantize_properties(x: np.ndarray, scale: float, zp: int) -> None:
    """Quantize is saturating and round-trips to within half a step inside the representable range."""
    q = ops.quantize_linear(x, np.float32(scale), np.uint8(zp))
    assert q.dtype == np.uint8 and q.shape == x.shape
    back = ops.dequantize_linear(q, np.float32(scale), np.uint8(zp))
    inside = (x / np.float32(scale) + zp >= 0) & (x / np.float32(scale) + zp <= 255)
    assert np.all(np.abs(back - x)[inside] <= scale / 2 * (1 + 1e-5) + 1e-6)
    assert np.all(q[x / np.float32(scale) + zp > 255.5] == 255)


# --------------------------------------------------------------------------- DequantizeLinear


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qdtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32])
def test_dequantize_matches_onnx(device: str, qdtype: Any) -> None:
    info = np.iinfo(qdtype)
    x = rng.integers(max(info.min, -1000), min(info.max, 1000), (3, 4)).astype(qdtype)
    s = np.array([0.5, 2.0, 0.1, 3.0], np.float32)
    zp = np.array([0, 1, 2, 3], qdtype)
    got = ops.dequantize_linear(x, s, zp, axis=1, device=device)
    (want,) = reference("DequantizeLinear", [x, s, zp], axis=1)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_dequantize_blocked_float8_and_output_dtype() -> None:
    x = rng.integers(-100, 100, (4, 6)).astype(np.int8)
    s = rng.uniform(0.1, 1, (4, 2)).astype(np.float32)
    got = ops.dequantize_linear(x, s, axis=1, block_size=3)
    np.testing.assert_allclose(got, reference("DequantizeLinear", [x, s], axis=1, block_size=3)[0], rtol=1e-6)
    f8 = np.array([1.0, -2.0, 448.0], np.float32).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(ops.dequantize_linear(f8, np.float32(2)), [2.0, -4.0, 896.0])
    h = ops.dequantize_linear(x, np.float32(1), output_dtype=np.float16)
    assert h.dtype == np.float16


# --------------------------------------------------------------------------- DynamicQuantizeLinear


@pytest.mark.parametrize("device", DEVICES)
def test_dynamic_quantize_matches_onnx(device: str) -> None:
    for x in (rng.standard_normal((3, 7)).astype(np.float32), np.array([1.0, 2.0, 3.0], np.float32)):
        got = ops.dynamic_quantize_linear(x, device=device)
        want = reference("DynamicQuantizeLinear", [x], opset=11)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)


# --------------------------------------------------------------------------- integer matmul / conv


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", [np.int8, np.uint8])
def test_matmul_integer_exact(device: str, dt: Any) -> None:
    info = np.iinfo(dt)
    a = rng.integers(info.min, info.max + 1, (2, 3, 5)).astype(dt)
    b = rng.integers(info.min, info.max + 1, (5, 4)).astype(dt)
    za, zb = np.array([1, 2, 3], dt), np.array([4, 5, 6, 7], dt)
    got = ops.matmul_integer(a, b, za, zb, device=device)
    want = (a.astype(np.int64) - za.astype(np.int64)[:, None]) @ (b.astype(np.int64) - zb.astype(np.int64))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_conv_integer_matches_float_conv(device: str) -> None:
    x = rng.integers(0, 256, (2, 4, 6, 5)).astype(np.uint8)
    w = rng.integers(0, 256, (6, 2, 3, 2)).astype(np.uint8)
    got = ops.conv_integer(
        x, w, np.uint8(7), np.uint8(128), pads=[1, 0, 1, 1], stride=[2, 1], groups=2, device=device
    )
    want = ops.conv_nd(
        x.astype(np.float64) - 7, w.astype(np.float64) - 128, pads=[1, 0, 1, 1], stride=[2, 1], groups=2
    )
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_qlinear_matmul_matches_onnx(device: str) -> None:
    a = rng.integers(0, 256, (2, 4)).astype(np.uint8)
    b = rng.integers(0, 256, (4, 3)).astype(np.uint8)
    args = [
        a,
        np.float32(0.02),
        np.uint8(113),
        b,
        np.float32(0.003),
        np.uint8(114),
        np.float32(0.05),
        np.uint8(118),
    ]
    np.testing.assert_array_equal(
        ops.qlinear_matmul(*args, device=device), reference("QLinearMatMul", args)[0]
    )


@pytest.mark.parametrize("device", DEVICES)
def test_qlinear_conv_matches_onnx(device: str) -> None:
    x = rng.integers(-128, 128, (1, 2, 5, 5)).astype(np.int8)
    w = rng.integers(-128, 128, (3, 2, 3, 3)).astype(np.int8)
    ws = np.array([0.01, 0.02, 0.03], np.float32)
    bias = np.array([100, -200, 300], np.int32)
    args = [x, np.float32(0.05), np.int8(1), w, ws, np.zeros(3, np.int8), np.float32(0.5), np.int8(-3), bias]
    got = ops.qlinear_conv(*args, pads=1, device=device)
    (want,) = reference("QLinearConv", args, opset=10, pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- errors


def test_errors_name_op_argument_and_fix() -> None:
    x = np.ones((2, 3), np.float32)
    with pytest.raises(OpError, match=r"quantize_linear: argument 'x' expected"):
        ops.quantize_linear(np.ones(3, np.int8), np.float32(1))
    with pytest.raises(
        OpError, match=r"quantize_linear: argument 'scale' expected a scalar or a 1-D tensor of 3"
    ):
        ops.quantize_linear(x, np.ones(2, np.float32), axis=1)
    with pytest.raises(OpError, match=r"argument 'axis'"):
        ops.quantize_linear(x, np.ones(3, np.float32), axis=5)
    with pytest.raises(OpError, match=r"argument 'zero_point' expected output_dtype int8.*Fix"):
        ops.quantize_linear(x, np.float32(1), np.uint8(0), output_dtype=np.int8)
    with pytest.raises(OpError, match=r"argument 'scale' expected 2 blocks"):
        ops.quantize_linear(x, np.ones((2, 3), np.float32), axis=1, block_size=2)
    with pytest.raises(OpError, match=r"dequantize_linear: argument 'zero_point' expected x's dtype int8"):
        ops.dequantize_linear(np.ones(3, np.int8), np.float32(1), np.uint8(0))
    with pytest.raises(OpError, match=r"matmul_integer: argument 'a' expected"):
        ops.matmul_integer(np.ones((2, 2), np.int32), np.ones((2, 2), np.int8))
    with pytest.raises(OpError, match=r"matmul_integer: argument 'a_zero_point'.*Fix: cast it to int8"):
        ops.matmul_integer(np.ones((2, 2), np.int8), np.ones((2, 2), np.int8), np.uint8(0))
    with pytest.raises(OpError, match=r"qlinear_conv: argument 'bias' expected int32"):
        ops.qlinear_conv(
            np.ones((1, 1, 3, 3), np.uint8), np.float32(1), np.uint8(0), np.ones((2, 1, 1, 1), np.uint8),
            np.float32(1), np.uint8(0), np.float32(1), np.uint8(0), np.ones(2, np.float32),
        )  # fmt: skip


# ---------------------------------------------------------------- 4-bit integers (ml_dtypes int4/uint4)


@pytest.mark.parametrize(("dtype", "lo", "hi"), [(ml_dtypes.int4, -8, 7), (ml_dtypes.uint4, 0, 15)])
@given(values=st.lists(st.floats(-40, 40, allow_nan=False, width=32), min_size=1, max_size=16),
       scale=st.sampled_from([0.5, 1.0, 3.0]), zp=st.integers(0, 7))  # fmt: skip
@settings(max_examples=25, deadline=None)
def test_int4_quantize_saturates_and_dequantize_inverts(dtype, lo, hi, values, scale, zp) -> None:
    x = np.array(values, np.float32)
    z = np.array(zp if lo == 0 else zp - 4, dtype)
    q = ops.quantize_linear(x, np.float32(scale), z)
    want = np.clip(np.rint(x.astype(np.float64) / np.float32(scale)) + int(z), lo, hi)  # rint: half to even
    assert q.dtype == np.dtype(dtype) and q.astype(np.int64).tolist() == want.astype(np.int64).tolist()
    back = ops.dequantize_linear(q, np.float32(scale), z)
    np.testing.assert_array_equal(back, ((want - int(z)) * np.float32(scale)).astype(np.float32))


def test_int4_blocked_dequantize_matches_per_block_scales() -> None:
    q = np.array([[-8, 7, 1, 0], [3, -3, 2, -1]], ml_dtypes.int4)
    scale = np.array([[0.5, 2.0], [1.0, 4.0]], np.float32)  # one scale per block of 2 along axis 1
    got = ops.dequantize_linear(q, scale, axis=1, block_size=2)
    want = q.astype(np.float32) * np.repeat(scale, 2, axis=1)
    np.testing.assert_array_equal(got, want)


@given(
    m=st.integers(1, 6),
    k=st.integers(1, 700),
    n=st.integers(1, 6),
    signed_a=st.booleans(),
    seed=st.integers(0, 99),
)
@settings(max_examples=25, deadline=None)
def test_matmul_integer_cpu_blas_path_is_exact(m, k, n, signed_a, seed) -> None:
    """cpu runs the product through float64 BLAS; it must equal ref's int64 product bit for bit, extremes
    included (every partial sum stays far below 2**53)."""
    rng = np.random.default_rng(seed)
    a_dt = np.int8 if signed_a else np.uint8
    info = np.iinfo(a_dt)
    a = rng.choice([info.min, info.max, 0, 1], size=(m, k)).astype(a_dt)
    b = rng.choice([-128, 127, 0, -1], size=(k, n)).astype(np.int8)
    a_zp = np.array(info.max if not signed_a else info.min, a_dt)
    b_zp = rng.integers(-128, 128, size=n).astype(np.int8)
    want = ops.matmul_integer(a, b, a_zp, b_zp, device="ref")
    np.testing.assert_array_equal(ops.matmul_integer(a, b, a_zp, b_zp, device="cpu"), want)
    assert want.dtype == np.int32


# --------------------------------------------------------------------------- dynamic_qmatmul


def _dynamic_qmatmul_onnx(
    x: np.ndarray, w: np.ndarray, w_scale: np.ndarray, w_zp: Any, bias: Any
) -> np.ndarray:
    """DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(x_scale * w_scale) (-> Add) in onnx's reference."""
    from onnx import TensorProto, numpy_helper

    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.asarray(w_scale, np.float32), "ws")]
    mi_in = ["xq", "w", "xz"]
    if w_zp is not None:
        inits.append(numpy_helper.from_array(np.asarray(w_zp), "wz"))
        mi_in.append("wz")
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", mi_in, ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xs", "ws"], ["s"]),
        helper.make_node("Mul", ["accf", "s"], ["y0"]),
    ]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "b"))
        nodes.append(helper.make_node("Add", ["y0", "b"], ["y"]))
    out = "y" if bias is not None else "y0"
    g = helper.make_graph(
        nodes, "dqmm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


@SETTINGS
@given(
    lead=st.lists(st.integers(1, 5), min_size=1, max_size=3), k=st.integers(1, 40), n=st.integers(1, 24),
    signed=st.booleans(), per_column=st.booleans(), with_zp=st.booleans(), with_bias=st.booleans(),
    device=st.sampled_from(DEVICES), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_dynamic_qmatmul_equals_the_onnx_chain(
    lead: list[int], k: int, n: int, signed: bool, per_column: bool, with_zp: bool, with_bias: bool,
    device: str, seed: int,
) -> None:  # fmt: skip
    r = np.random.default_rng(seed)
    x = (r.standard_normal((*lead, k)) * r.uniform(0.1, 10)).astype(np.float32)
    dt = np.int8 if signed else np.uint8
    info = np.iinfo(dt)
    w = r.integers(info.min, info.max + 1, (k, n)).astype(dt)
    w_scale = r.uniform(1e-3, 1e-1, n if per_column else ()).astype(np.float32)
    w_zp = r.integers(info.min, info.max + 1, n if per_column else ()).astype(dt) if with_zp else None
    bias = r.standard_normal(n).astype(np.float32) if with_bias else None
    got = ops.dynamic_qmatmul(x, w, w_scale, w_zp, bias, device=device)
    want = _dynamic_qmatmul_onnx(x, w, w_scale, w_zp, bias)
    assert got.dtype == np.float32 and got.shape == (*lead, n)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6 * float(np.abs(want).max(initial=1.0)))


def test_dynamic_qmatmul_errors_name_the_argument() -> None:
    x = np.ones((2, 4), np.float32)
    w = np.ones((4, 3), np.int8)
    with pytest.raises(OpError, match=r"dynamic_qmatmul.*x"):
        ops.dynamic_qmatmul(x.astype(np.float64), w, np.float32(1))
    with pytest.raises(OpError, match=r"dynamic_qmatmul.*b"):
        ops.dynamic_qmatmul(x, np.ones((5, 3), np.int8), np.float32(1))
    with pytest.raises(OpError, match=r"dynamic_qmatmul.*b_scale"):
        ops.dynamic_qmatmul(x, w, np.ones(2, np.float32))
    with pytest.raises(OpError, match=r"dynamic_qmatmul.*bias"):
        ops.dynamic_qmatmul(x, w, np.float32(1), None, np.ones(4, np.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_qconv_is_the_dequantized_float_conv(device: str) -> None:
    """qconv = conv(x - x_zp, w - w_zp) * scale (per output channel) + bias, as the QDQ Conv computes."""
    x = rng.integers(0, 256, (2, 4, 6, 5)).astype(np.uint8)
    w = rng.integers(-128, 128, (6, 2, 3, 2)).astype(np.int8)
    w_zp = rng.integers(-3, 4, 6).astype(np.int8)
    scale = rng.uniform(0.001, 0.1, 6).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    geo = {"pads": [1, 0, 1, 1], "stride": [2, 1], "groups": 2}
    got = ops.qconv(x, np.uint8(7), w, w_zp, scale, bias, device=device, **geo)
    acc = ops.conv_nd(
        x.astype(np.float64) - 7, w.astype(np.float64) - w_zp.reshape(-1, 1, 1, 1).astype(np.float64), **geo
    )
    want = acc * scale.reshape(1, -1, 1, 1).astype(np.float64) + bias.reshape(1, -1, 1, 1)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max()))
    out = np.empty_like(got)
    assert ops.qconv(x, np.uint8(7), w, w_zp, scale, bias, out=out, device=device, **geo) is out
    np.testing.assert_array_equal(out, got)


def test_qconv_errors_name_the_argument() -> None:
    x, w = np.ones((1, 2, 4, 4), np.uint8), np.ones((3, 2, 3, 3), np.int8)
    with pytest.raises(OpError, match=r"qconv.*x"):
        ops.qconv(x.astype(np.float32), 0, w, 0, np.float32(1))
    with pytest.raises(OpError, match=r"qconv.*w"):
        ops.qconv(x, 0, np.ones((3, 2, 3), np.int8), 0, np.float32(1))
    with pytest.raises(OpError, match=r"qconv.*scale"):
        ops.qconv(x, 0, w, 0, np.ones(2, np.float32))
    with pytest.raises(OpError, match=r"qconv.*bias"):
        ops.qconv(x, 0, w, 0, np.float32(1), np.ones(2, np.float32))
    with pytest.raises(OpError, match=r"qconv.*out"):
        ops.qconv(x, 0, w, 0, np.float32(1), out=np.empty((1, 3, 2, 2), np.float64))


#: qconv_quantize's (alpha, beta) per activation in these tests (clip: Relu6's bounds)
_ACT_PARAMS = {"none": (1 / 6, 0.5), "relu": (1 / 6, 0.5), "hardswish": (1 / 6, 0.5), "clip": (0.0, 6.0)}


def _act_steps(y: np.ndarray, activation: str) -> np.ndarray:
    """The activation as the separate ONNX nodes compute it (Relu; HardSwish = x * HardSigmoid(1/6, 1/2);
    Clip(0, 6))."""
    if activation == "clip":
        return ops.clip(y, min=np.float32(0.0), max=np.float32(6.0))
    if activation == "relu":
        return ops.relu(y)
    if activation == "hardswish":
        return ops.hard_swish(y)
    return y


@settings(max_examples=40, deadline=None)
@given(
    groups=st.sampled_from([1, 2, "depthwise"]), k=st.integers(1, 3), stride=st.integers(1, 2),
    activation=st.sampled_from(["none", "relu", "hardswish", "clip"]), out_dt=st.sampled_from([np.uint8, np.int8]),
    y_scale=st.floats(1e-3, 0.5), y_zp=st.integers(-128, 255), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_qconv_quantize_is_qconv_then_the_activation_then_quantize_linear(
    groups, k, stride, activation, out_dt, y_scale, y_zp, seed
) -> None:
    """The fused op's bytes equal qconv -> Relu / HardSwish -> quantize_linear run one by one, on both devices,
    for int8 and uint8 codes, grouped and depthwise."""
    r = np.random.default_rng(seed)
    g = 4 if groups == "depthwise" else groups
    x = r.integers(0, 256, (2, 4, 7, 6)).astype(np.uint8)
    w = r.integers(-128, 128, (8 if groups != "depthwise" else 4, 4 // g, k, k)).astype(np.int8)
    oc = w.shape[0]
    scale = r.uniform(1e-4, 2e-3, oc).astype(np.float32)
    bias = r.standard_normal(oc).astype(np.float32)
    zp = np.asarray(np.clip(y_zp, *((0, 255) if out_dt == np.uint8 else (-128, 127))), out_dt)
    geo = {"stride": [stride, stride], "pads": [k // 2] * 4, "groups": g}
    ys = np.float32(y_scale)
    for device in DEVICES:
        y = ops.qconv(x, np.uint8(3), w, np.int8(0), scale, bias, device=device, **geo)
        want = ops.quantize_linear(_act_steps(y, activation), ys, zp, device=device)
        alpha, beta = _ACT_PARAMS[activation]
        got = ops.qconv_quantize(x, np.uint8(3), w, np.int8(0), scale, bias, ys, zp, activation=activation,
                                 alpha=alpha, beta=beta, device=device, **geo)  # fmt: skip
        assert got.dtype == np.dtype(out_dt) and got.shape == y.shape
        np.testing.assert_array_equal(got, want, err_msg=device)
        out = np.empty_like(got)
        assert ops.qconv_quantize(x, np.uint8(3), w, np.int8(0), scale, bias, ys, zp, activation=activation,
                                  alpha=alpha, beta=beta, out=out, device=device, **geo) is out  # fmt: skip
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["none", "relu", "hardswish"])
def test_qconv_quantize_adds_a_residual_before_the_activation(device: str, activation: str) -> None:
    """``residual``: QuantizeLinear(act(qconv + r)) as Add -> act -> QuantizeLinear compute it."""
    r = np.random.default_rng(4)
    x = r.integers(0, 256, (2, 4, 6, 6)).astype(np.uint8)
    w = r.integers(-128, 128, (4, 4, 3, 3)).astype(np.int8)
    scale, res = (
        r.uniform(1e-4, 1e-3, 4).astype(np.float32),
        r.standard_normal((2, 4, 6, 6)).astype(np.float32),
    )
    geo = {"pads": [1, 1, 1, 1]}
    y = ops.qconv(x, np.uint8(9), w, np.int8(0), scale, device=device, **geo)
    want = ops.quantize_linear(_act_steps(res + y, activation), np.float32(0.02), np.uint8(60), device=device)
    got = ops.qconv_quantize(x, np.uint8(9), w, np.int8(0), scale, None, np.float32(0.02), np.uint8(60),
                             activation=activation, residual=res, device=device, **geo)  # fmt: skip
    np.testing.assert_array_equal(got, want)
    with pytest.raises(OpError, match=r"qconv_quantize.*residual.*output shape"):
        ops.qconv_quantize(x, np.uint8(9), w, np.int8(0), scale, None, np.float32(0.02), np.uint8(60),
                           residual=res[:, :, :1], device=device, **geo)  # fmt: skip
    with pytest.raises(OpError, match=r"qconv_quantize.*residual.*float32"):
        ops.qconv_quantize(x, np.uint8(9), w, np.int8(0), scale, None, np.float32(0.02), np.uint8(60),
                           residual=res.astype(np.float64), device=device, **geo)  # fmt: skip


def test_qconv_quantize_keeps_nan_and_infinities_as_the_separate_nodes() -> None:
    """A non-finite per-channel scale makes inf / NaN conv results: the fused activation keeps NaN where
    Relu / HardSwish do (NaN -> code 0, not the zero point's code) and infinities saturate the same."""
    x = np.arange(2 * 3 * 4 * 4).reshape(2, 3, 4, 4).astype(np.uint8)
    w = np.ones((4, 3, 1, 1), np.int8)
    w[1] = -1
    scale = np.array([np.inf, np.inf, np.nan, 0.01], np.float32)
    zp = np.uint8(100)
    for activation in ("none", "relu", "hardswish", "clip"):
        alpha, beta = _ACT_PARAMS[activation]
        with np.errstate(invalid="ignore", over="ignore"):
            y = ops.qconv(x, np.uint8(1), w, np.int8(0), scale)
            want = ops.quantize_linear(_act_steps(y, activation), np.float32(0.1), zp)
            got = ops.qconv_quantize(x, np.uint8(1), w, np.int8(0), scale, None, np.float32(0.1), zp,
                                     activation=activation, alpha=alpha, beta=beta)  # fmt: skip
        np.testing.assert_array_equal(got, want, err_msg=activation)
        assert got[0, 2, 0, 0] == 0  # NaN stays NaN through every activation: code 0, not the zero point
    with np.errstate(invalid="ignore", over="ignore"):
        hs = ops.qconv_quantize(
            x, np.uint8(1), w, np.int8(0), scale, None, np.float32(0.1), zp, activation="hardswish"
        )
    assert hs[0, 1, 1, 1] == 0 and hs[0, 0, 1, 1] == 255  # 0 * -inf = NaN; inf saturates


def test_qconv_quantize_errors_name_the_argument_and_the_fix() -> None:
    x, w = np.ones((1, 2, 4, 4), np.uint8), np.ones((3, 2, 3, 3), np.int8)
    s, z = np.float32(0.1), np.uint8(0)
    with pytest.raises(OpError, match=r"qconv_quantize.*activation.*one of"):
        ops.qconv_quantize(x, 0, w, 0, np.float32(1), None, s, z, activation="gelu")
    with pytest.raises(OpError, match=r"qconv_quantize.*y_scale.*float32 scalar"):
        ops.qconv_quantize(x, 0, w, 0, np.float32(1), None, np.ones(3, np.float32), z)
    with pytest.raises(OpError, match=r"qconv_quantize.*y_zero_point.*per-axis"):
        ops.qconv_quantize(x, 0, w, 0, np.float32(1), None, s, np.zeros(3, np.uint8))
    with pytest.raises(OpError, match=r"qconv_quantize.*y_zero_point"):
        ops.qconv_quantize(x, 0, w, 0, np.float32(1), None, s, np.int32(0))
    with pytest.raises(OpError, match=r"qconv_quantize.*alpha"):
        ops.qconv_quantize(x, 0, w, 0, np.float32(1), None, s, z, activation="hardswish", alpha=float("nan"))
    with pytest.raises(OpError, match=r"qconv_quantize.*alpha.*clip's bounds may be infinite"):
        ops.qconv_quantize(x, 0, w, 0, np.float32(1), None, s, z, activation="hardswish", beta=float("inf"))
    one_sided = ops.qconv_quantize(x, np.uint8(0), w, np.int8(0), np.float32(1), None, s, z, activation="clip",
                                   alpha=float("-inf"), beta=2.0)  # fmt: skip
    assert one_sided.max() == 20  # everything clipped to 2.0 / 0.1
    with pytest.raises(OpError, match=r"qconv_quantize.*out.*uint8"):
        ops.qconv_quantize(x, 0, w, 0, np.float32(1), None, s, z, out=np.empty((1, 3, 2, 2), np.int8))
    with pytest.raises(OpError, match=r"qconv_quantize.*x"):
        ops.qconv_quantize(x.astype(np.float32), 0, w, 0, np.float32(1), None, s, z)
    with pytest.raises(OpError, match=r"qconv_quantize.*scale.*per output channel"):
        ops.qconv_quantize(x, 0, w, 0, np.ones(2, np.float32), None, s, z)


@settings(max_examples=40, deadline=None)
@given(
    x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=6),
                 elements=st.floats(-1e6, 1e6, width=32, allow_subnormal=True)),
)  # fmt: skip
def test_token_quantize_is_symmetric_per_row(x: np.ndarray) -> None:
    """One scale per row: max|x| / 127 (floored at float32's smallest normal), values rint(x / s) in
    [-127, 127]; dequantized, each row is within half a step of x."""
    q, s = ops.token_quantize(x)
    assert q.dtype == np.int8 and q.shape == x.shape and s.shape == (*x.shape[:-1], 1)
    amax = np.abs(x).max(axis=-1, keepdims=True) if x.shape[-1] else np.zeros_like(s)
    want_s = (
        np.maximum(amax / np.float32(127), ops.TOKEN_SCALE_MIN)
        if x.shape[-1]
        else np.full_like(s, ops.TOKEN_SCALE_MIN)
    )
    np.testing.assert_array_equal(s, want_s.astype(np.float32))
    assert np.abs(q.astype(np.int32)).max(initial=0) <= 127
    np.testing.assert_array_equal(q, np.clip(np.rint(x / s), -127, 127).astype(np.int8))
    assert np.all(np.abs(q * s.astype(np.float64) - x) <= s * 0.5001 + 1e-30)


def test_dynamic_qmatmul_per_token_scales_each_row() -> None:
    r = np.random.default_rng(5)
    x = (r.standard_normal((2, 3, 16)) * np.array([0.01, 1.0, 100.0]).reshape(1, 3, 1)).astype(np.float32)
    b = r.integers(-127, 128, (16, 8)).astype(np.int8)
    sc, bias = r.uniform(0.001, 0.01, 8).astype(np.float32), r.standard_normal(8).astype(np.float32)
    q, s = ops.token_quantize(x)
    want = (q.astype(np.int64) @ b.astype(np.int64)).astype(np.float32) * (s * sc) + bias
    for device in DEVICES:
        got = ops.dynamic_qmatmul(x, b, sc, None, bias, per_token=True, device=device)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max()))
    # per token, a row of small values keeps its precision; one scale for the tensor would not
    exact = x @ (b.astype(np.float32) * sc) + bias
    per_tensor = ops.dynamic_qmatmul(x, b, sc, None, bias)
    row0 = (slice(None), 0)
    assert np.abs(want[row0] - exact[row0]).max() < np.abs(per_tensor[row0] - exact[row0]).max()


@pytest.mark.parametrize("device", DEVICES)
def test_dequant_matmul_is_matmul_of_the_dequantized_weight(device: str) -> None:
    """Per column, per block along K (int4) and per tensor: x @ dequantize_linear(w) in float32; out= too."""
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    cases = [
        (rng.integers(-128, 128, (64, 5)).astype(np.int8), rng.uniform(0.01, 0.1, 5).astype(np.float32), 1, 0),
        (rng.integers(-8, 8, (64, 5)).astype(ml_dtypes.int4), rng.uniform(0.01, 0.1, (2, 5)).astype(np.float32), 0, 32),
        (rng.integers(0, 256, (64, 5)).astype(np.uint8), np.float32(0.02), 1, 0),
    ]  # fmt: skip
    for w, s, axis, bs in cases:
        want = x @ ops.dequantize_linear(w, s, axis=axis, block_size=bs)
        got = ops.dequant_matmul(x, w, s, axis=axis, block_size=bs, device=device)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max()))
        out = np.empty((2, 3, 5), np.float32)
        assert ops.dequant_matmul(x, w, s, axis=axis, block_size=bs, out=out, device=device) is out
        np.testing.assert_array_equal(out, got)


def test_dequant_matmul_errors_name_the_argument() -> None:
    x, w = np.ones((2, 4), np.float32), np.ones((4, 3), np.int8)
    with pytest.raises(OpError, match=r"dequant_matmul.*x"):
        ops.dequant_matmul(x.astype(np.float64), w, np.float32(1))
    with pytest.raises(OpError, match=r"dequant_matmul.*w"):
        ops.dequant_matmul(x, w.astype(np.float32), np.float32(1))
    with pytest.raises(OpError, match=r"dequant_matmul.*w"):
        ops.dequant_matmul(x, np.ones((5, 3), np.int8), np.float32(1))
    with pytest.raises(OpError, match=r"dequant_matmul.*out"):
        ops.dequant_matmul(x, w, np.float32(1), out=np.empty((2, 4), np.float32))


@settings(max_examples=40, deadline=None)
@given(
    lead=st.sampled_from([(), (1,), (3,), (2, 3)]), k=st.integers(1, 40), n=st.integers(1, 20),
    a_dt=st.sampled_from([np.uint8, np.int8]), w_dt=st.sampled_from([np.int8, np.uint8]),
    per_column=st.booleans(), with_bias=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_qmatmul_is_the_exact_integer_product_scaled_once(
    lead, k, n, a_dt, w_dt, per_column, with_bias, seed
) -> None:
    """qmatmul = (a - a_zp) @ (w - w_zp) in exact integers, then float32 ``acc * scale`` and ``+ bias`` each
    rounded once (the QDQ MatMul / Gemm that graph's QMatMul stands for), on every device, into ``out`` too."""
    r = np.random.default_rng(seed)
    ai, wi = np.iinfo(a_dt), np.iinfo(w_dt)
    a = r.integers(ai.min, ai.max + 1, (*lead, k)).astype(a_dt)
    w = r.integers(wi.min, wi.max + 1, (k, n)).astype(w_dt)
    a_zp = np.asarray(r.integers(ai.min, ai.max + 1), a_dt)
    w_zp = r.integers(wi.min, wi.max + 1, n if per_column else ()).astype(w_dt)
    scale = r.uniform(1e-3, 1e-1, n if per_column else ()).astype(np.float32)
    bias = r.standard_normal(n).astype(np.float32) if with_bias else None
    acc = (a.astype(np.int64) - int(a_zp)) @ (w.astype(np.int64) - w_zp.astype(np.int64))
    want = acc.astype(np.float32) * scale
    if bias is not None:
        want = want + bias
    for device in DEVICES:
        got = ops.qmatmul(a, a_zp, w, w_zp, scale, bias, device=device)
        assert got.dtype == np.float32 and got.shape == (*lead, n)
        np.testing.assert_array_equal(got, want, err_msg=device)
        out = np.full((*lead, n), np.nan, np.float32)
        assert ops.qmatmul(a, a_zp, w, w_zp, scale, bias, out=out, device=device) is out
        np.testing.assert_array_equal(out, want, err_msg=device)


def test_qmatmul_errors_name_the_argument_and_the_fix() -> None:
    a, w = np.ones((2, 4), np.uint8), np.ones((4, 3), np.int8)
    with pytest.raises(OpError, match=r"qmatmul.*a"):
        ops.qmatmul(a.astype(np.float32), 0, w, 0, np.float32(1))
    with pytest.raises(OpError, match=r"qmatmul.*w.*\(K, N\)"):
        ops.qmatmul(a, 0, np.ones((5, 3), np.int8), 0, np.float32(1))
    with pytest.raises(OpError, match=r"qmatmul.*scale"):
        ops.qmatmul(a, 0, w, 0, np.ones(2, np.float32))
    with pytest.raises(OpError, match=r"qmatmul.*bias"):
        ops.qmatmul(a, 0, w, 0, np.float32(1), np.ones(4, np.float32))
    with pytest.raises(OpError, match=r"qmatmul.*out.*\[2, 3\]"):
        ops.qmatmul(a, 0, w, 0, np.float32(1), out=np.empty((2, 3), np.float64))
