"""The ONNX activations of kernels/activation.py (HardSigmoid ... Hardmax): ref against float64 formulas
and onnx's reference evaluator, cpu against ref, stability at large |x|, error paths."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import opstrata.ops as ops
from opstrata.ops import OpError
from opstrata.ops._dtypes import FLOAT_DTYPES, INT_DTYPES
from opstrata.ops.testing import TOLERANCES, assert_close

SETTINGS = settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
DEVICES = ("ref", "cpu")
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
SEEDS = st.integers(0, 2**32 - 1)


def f64(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def sample(seed: int, shape: Any, dtype: Any, lo: float = -5.0, hi: float = 5.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(dtype)


def close(actual: np.ndarray, expected: Any, dtype: Any, scale: float = 1.0) -> None:
    dtype = np.dtype(dtype)
    assert actual.dtype == dtype, (actual.dtype, dtype)
    rtol, atol = TOLERANCES[dtype]
    assert_close(f64(actual), f64(expected), rtol=rtol * scale, atol=atol * scale, check_dtype=False)


def _sigmoid(t: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.tanh(0.5 * t))


def _softplus(t: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, t)


SA, SG = 1.67326319217681884765625, 1.05070102214813232421875

# op: (ONNX name, attrs for the test, float64 formula of x and the attrs)
ACTS: dict[str, tuple[str, dict[str, float], Any]] = {
    "hard_sigmoid": ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, lambda t, alpha, beta: np.clip(alpha * t + beta, 0, 1)),
    "hard_swish": ("HardSwish", {}, lambda t: t * np.clip(t / 6 + 0.5, 0, 1)),
    "elu": ("Elu", {"alpha": 0.7}, lambda t, alpha: np.where(t < 0, alpha * np.expm1(t), t)),
    "selu": ("Selu", {"alpha": SA, "gamma": SG}, lambda t, alpha, gamma: gamma * np.where(t > 0, t, alpha * np.expm1(t))),
    "celu": ("Celu", {"alpha": 1.5}, lambda t, alpha: np.maximum(t, 0) + np.minimum(0, alpha * np.expm1(t / alpha))),
    "leaky_relu": ("LeakyRelu", {"alpha": 0.1}, lambda t, alpha: np.where(t < 0, alpha * t, t)),
    "thresholded_relu": ("ThresholdedRelu", {"alpha": 0.8}, lambda t, alpha: np.where(t > alpha, t, 0)),
    "softplus": ("Softplus", {}, _softplus),
    "softsign": ("Softsign", {}, lambda t: t / (1 + np.abs(t))),
    "mish": ("Mish", {}, lambda t: t * np.tanh(_softplus(t))),
    "swish": ("Swish", {"alpha": 1.3}, lambda t, alpha: t * _sigmoid(alpha * t)),
}  # fmt: skip


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("op", sorted(ACTS))
@SETTINGS
@given(shape=SHAPES, seed=SEEDS)
def test_activation_matches_formula(op: str, dtype: np.dtype, shape: Any, seed: int) -> None:
    _, attrs, formula = ACTS[op]
    x = sample(seed, shape, dtype)
    ref = getattr(ops, op)(x, **attrs, device="ref")
    assert ref.shape == x.shape
    close(ref, formula(f64(x), **attrs), dtype, scale=2)
    close(getattr(ops, op)(x, **attrs, device="cpu"), ref, dtype, scale=2)


@pytest.mark.parametrize("op", sorted(ACTS))
@pytest.mark.parametrize("defaults", [False, True])
def test_activation_matches_onnx_reference(op: str, defaults: bool) -> None:
    onnx = pytest.importorskip("onnx")
    reference = pytest.importorskip("onnx.reference")
    name, attrs, _ = ACTS[op]
    if name == "Swish" and not onnx.defs.has("Swish"):
        pytest.skip("the installed onnx has no Swish (opset 24)")
    attrs = {} if defaults else attrs
    x = sample(11, (4, 6), np.float32)
    node = onnx.helper.make_node(name, ["x"], ["y"], **attrs)
    (want,) = reference.ReferenceEvaluator(node).run(None, {"x": x})
    for device in DEVICES:
        close(getattr(ops, op)(x, **attrs, device=device), want, np.float32, scale=4)


@pytest.mark.parametrize("op", ["softplus", "mish", "swish", "elu", "selu", "celu", "softsign"])
def test_activation_is_stable_at_large_magnitudes(op: str) -> None:
    x = np.array([-1e4, -100.0, 100.0, 1e4, -np.inf, np.inf], np.float32)
    for device in DEVICES:
        with np.errstate(all="raise"):
            y = getattr(ops, op)(x, device=device)
        assert np.isfinite(y[:4]).all(), (op, y)
    assert ops.softplus(np.array([1e4], np.float32))[0] == np.float32(1e4)
    assert ops.softplus(np.array([-100.0]))[0] == pytest.approx(math.exp(-100))


def test_activation_nan_propagates() -> None:
    x = np.array([np.nan], np.float32)
    for device in DEVICES:  # ONNX: "x > alpha ? x : 0", and NaN > alpha is false
        assert ops.thresholded_relu(x, device=device)[0] == 0
    for op in set(ACTS) - {"thresholded_relu"}:
        for device in DEVICES:
            assert np.isnan(getattr(ops, op)(x, device=device)).all(), op


@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda: ops.elu(np.ones(2, np.int32)), r"elu: argument 'x' expected .*got int32. Fix: cast 'x'"),
        (lambda: ops.leaky_relu(np.ones(2), alpha="0.1"), r"leaky_relu: argument 'alpha' expected a real number"),
        (lambda: ops.celu(np.ones(2), alpha=0.0), r"celu: argument 'alpha' expected a nonzero alpha"),
        (lambda: ops.hardmax(np.ones((2, 3)), axis=2), r"hardmax: argument 'axis' expected an axis in \[-2, 2\)"),
        (lambda: ops.hardmax(np.float32(1.0)), r"hardmax: argument 'axis' expected .*rank >= 1"),
        (lambda: ops.prelu(np.ones((2, 3)), np.ones(2)), r"prelu: argument 'slope' expected a shape that broadcasts"),
        (lambda: ops.prelu(np.ones(3), np.ones(1, bool)), r"prelu: argument 'slope' expected .*got bool"),
        (lambda: ops.shrink(np.ones(2, bool)), r"shrink: argument 'x' expected .*got bool"),
    ],
)  # fmt: skip
def test_errors_name_op_argument_expected_actual(call: Any, pattern: str) -> None:
    with pytest.raises(OpError, match=pattern):
        call()


# --------------------------------------------------------------------------- prelu


@pytest.mark.parametrize("dtype", [*FLOAT_DTYPES, np.dtype(np.int32), np.dtype(np.int64)], ids=str)
@pytest.mark.parametrize("slope_shape", [(), (1,), (5,), (4, 1), (3, 4, 5)])
def test_prelu(dtype: np.dtype, slope_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    if dtype.kind == "i":
        x = rng.integers(-9, 9, size=(3, 4, 5)).astype(dtype)
        slope = rng.integers(-3, 3, size=slope_shape).astype(dtype)
    else:
        x, slope = sample(1, (3, 4, 5), dtype), sample(2, slope_shape, dtype, 0, 1)
    want = np.where(f64(x) < 0, f64(slope) * f64(x), f64(x))
    for device in DEVICES:
        got = ops.prelu(x, slope, device=device)
        assert got.shape == x.shape
        if dtype.kind == "i":
            np.testing.assert_array_equal(got, want.astype(dtype))
        else:
            close(got, want, dtype)


# --------------------------------------------------------------------------- shrink


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("bias, lambd", [(0.0, 0.5), (1.5, 1.5), (0.25, 0.0)])
def test_shrink_float(dtype: np.dtype, bias: float, lambd: float) -> None:
    x = sample(3, (50,), dtype, -3, 3)
    t = f64(x)
    want = np.where(t < -lambd, t + bias, np.where(t > lambd, t - bias, 0))
    for device in DEVICES:
        close(ops.shrink(x, bias=bias, lambd=lambd, device=device), want, dtype, scale=2)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_shrink_int_matches_onnx_reference(dtype: np.dtype) -> None:
    onnx = pytest.importorskip("onnx")
    reference = pytest.importorskip("onnx.reference")
    info = np.iinfo(dtype)
    x = np.arange(max(info.min, -8), 9).astype(dtype)
    node = onnx.helper.make_node("Shrink", ["x"], ["y"], bias=1.0, lambd=2.0)
    (want,) = reference.ReferenceEvaluator(node).run(None, {"x": x})
    for device in DEVICES:
        got = ops.shrink(x, bias=1.0, lambd=2.0, device=device)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- hardmax


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, ml_dtypes.bfloat16], ids=str)
@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5), seed=SEEDS, data=st.data())
def test_hardmax(dtype: Any, shape: Any, seed: int, data: Any) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = np.round(sample(seed, shape, np.float32, -2, 2)).astype(dtype)  # rounding makes ties likely
    want = np.zeros(shape, np.float64)
    if x.size:
        first = np.argmax(f64(x), axis=axis)  # numpy picks the first maximum, as ONNX
        np.put_along_axis(want, np.expand_dims(first, axis), 1, axis=axis)
    for device in DEVICES:
        got = ops.hardmax(x, axis=axis, device=device)
        assert got.dtype == np.dtype(dtype) and got.shape == x.shape
        np.testing.assert_array_equal(f64(got), want)


def test_hardmax_matches_onnx_reference() -> None:
    onnx = pytest.importorskip("onnx")
    reference = pytest.importorskip("onnx.reference")
    x = np.array([[3, 0, 3, 1], [0, 2, 2, -1], [5, 5, 5, 5]], np.float32)
    for axis in (-1, 0, 1):
        node = onnx.helper.make_node("Hardmax", ["x"], ["y"], axis=axis)
        (want,) = reference.ReferenceEvaluator(node).run(None, {"x": x})
        for device in DEVICES:
            np.testing.assert_array_equal(ops.hardmax(x, axis=axis, device=device), want)
