"""Reductions: ref against float64 numpy (np.var with ddof, np.argmax), cpu against ref."""

from __future__ import annotations

import math
import warnings
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import opstrata.ops as ops
from opstrata.ops import OpError
from opstrata.ops._dtypes import FLOAT_DTYPES, INT_DTYPES, LOW_PRECISION_DTYPES, accumulation_dtype
from opstrata.ops.testing import TOLERANCES, assert_close

SETTINGS = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
DEVICES = ("ref", "cpu")
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)
SEEDS = st.integers(0, 2**32 - 1)


def sample(seed: int, shape: tuple[int, ...], dtype: Any, lo: float = -4.0, hi: float = 4.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(int(lo), info.min), min(int(hi), info.max) + 1, size=shape).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def f64(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


@st.composite
def shape_and_axis(draw: Any, shapes: Any = SHAPES) -> tuple[tuple[int, ...], Any]:
    """A shape and an axis argument for it: None, an int (maybe negative) or a tuple of distinct axes."""
    shape = draw(shapes)
    nd = len(shape)
    options = [st.none(), hnp.valid_tuple_axes(nd)]
    if nd:
        options.append(st.integers(-nd, nd - 1))
    return shape, draw(st.one_of(options))


def axes_of(shape: tuple[int, ...], axis: Any) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(len(shape)))
    return tuple(a % len(shape) for a in (axis if isinstance(axis, tuple) else (axis,)))


def check_sum_like(
    actual: np.ndarray, expected: np.ndarray, x: np.ndarray, axis: Any, dtype: np.dtype
) -> None:
    """Float result within dtype tolerance plus accumulation error ~ eps(acc) * sum|x| (cancellation)."""
    assert actual.dtype == dtype
    rtol, atol = TOLERANCES[dtype]
    eps = float(np.finfo(accumulation_dtype(dtype)).eps)
    scale = np.sum(np.abs(f64(x)), axis=axis, keepdims=False) if x.size else 0.0
    slack = 8 * eps * np.max(scale, initial=0.0)
    assert_close(f64(actual), f64(expected), rtol=rtol, atol=atol + slack, check_dtype=False)


# --------------------------------------------------------------------------- sum, mean


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("op", ["sum", "mean"])
@SETTINGS
@given(sa=shape_and_axis(), seed=SEEDS)
def test_sum_mean_float(op: str, dtype: np.dtype, keepdims: bool, sa: Any, seed: int) -> None:
    shape, axis = sa
    x = sample(seed, shape, dtype)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns on the mean of nothing (NaN)
        expected = getattr(np, op)(f64(x), axis=axis, keepdims=keepdims)
    ref = getattr(ops, op)(x, axis=axis, keepdims=keepdims, device="ref")
    assert isinstance(ref, np.ndarray) and ref.shape == np.shape(expected)
    check_sum_like(ref, expected, x, axis, dtype)
    check_sum_like(getattr(ops, op)(x, axis=axis, keepdims=keepdims, device="cpu"), ref, x, axis, dtype)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
@SETTINGS
@given(sa=shape_and_axis(), seed=SEEDS)
def test_sum_int_accumulates_and_returns_int64(dtype: np.dtype, sa: Any, seed: int) -> None:
    shape, axis = sa
    x = sample(seed, shape, dtype, -128, 255)
    expected = np.sum(x.astype(np.int64), axis=axis)
    for device in DEVICES:
        r = ops.sum(x, axis=axis, device=device)
        assert r.dtype == np.int64
        np.testing.assert_array_equal(r, expected)


@pytest.mark.parametrize("dtype", LOW_PRECISION_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_low_precision_sum_accumulates_in_float32(dtype: np.dtype, device: str) -> None:
    # In bfloat16 arithmetic 256 + 1 == 256: a native running sum of ones would stall at 256
    # (float16: 2048, float8_e4m3fn: 16, whose largest finite value is 448).
    n = 256 if dtype == ml_dtypes.float8_e4m3fn else 4096
    x = np.ones(n, dtype)
    assert f64(ops.sum(x, device=device)) == n
    assert f64(ops.mean(x, device=device)) == 1.0
    assert ops.sum(x, device=device).dtype == dtype


# --------------------------------------------------------------------------- max, min, argmax


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES, ids=str)
@pytest.mark.parametrize("op", ["max", "min"])
@SETTINGS
@given(sa=shape_and_axis(), seed=SEEDS, keepdims=st.booleans())
def test_max_min(op: str, dtype: np.dtype, sa: Any, seed: int, keepdims: bool) -> None:
    shape, axis = sa
    x = sample(seed, shape, dtype, -100, 100)
    fn = getattr(ops, op)
    if any(shape[a] == 0 for a in axes_of(shape, axis)):
        for device in DEVICES:
            with pytest.raises(OpError, match=rf"{op}: argument 'x' expected a non-empty dimension"):
                fn(x, axis=axis, device=device)
        return
    expected = getattr(np, op)(f64(x), axis=axis, keepdims=keepdims)
    for device in DEVICES:
        r = fn(x, axis=axis, keepdims=keepdims, device=device)
        assert r.dtype == dtype and r.shape == np.shape(expected)
        np.testing.assert_array_equal(f64(r), expected)  # exact: no arithmetic


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES, ids=str)
@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6), seed=SEEDS, data=st.data())
def test_argmax_first_of_ties(dtype: np.dtype, shape: tuple[int, ...], seed: int, data: Any) -> None:
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1))
    keepdims = data.draw(st.booleans())
    x = sample(seed, shape, dtype, -2, 2)  # few distinct values: many ties
    expected = np.argmax(f64(x), axis=axis, keepdims=keepdims)
    for device in DEVICES:
        r = ops.argmax(x, axis=axis, keepdims=keepdims, device=device)
        assert r.dtype == np.int64
        np.testing.assert_array_equal(r, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_propagates_and_is_the_argmax(device: str) -> None:
    x = np.array([[1.0, np.nan, 5.0, np.nan], [1.0, 2.0, 3.0, 0.0]], ml_dtypes.bfloat16)
    np.testing.assert_array_equal(ops.argmax(x, axis=1, device=device), [1, 2])
    np.testing.assert_array_equal(f64(ops.max(x, axis=1, device=device)), [np.nan, 3.0])
    np.testing.assert_array_equal(f64(ops.min(x, axis=1, device=device)), [np.nan, 0.0])


# --------------------------------------------------------------------------- var


@pytest.mark.parametrize("correction", [0, 1, 2.5])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@SETTINGS
@given(sa=shape_and_axis(), seed=SEEDS, keepdims=st.booleans())
def test_var_torch_correction(dtype: np.dtype, correction: float, sa: Any, seed: int, keepdims: bool) -> None:
    shape, axis = sa
    x = sample(seed, shape, dtype, -3, 5)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = np.var(f64(x), axis=axis, ddof=correction, keepdims=keepdims)  # max(N - ddof, 0) divisor
    expected = f64(np.asarray(expected).astype(dtype))  # float8_e4m3fn has no inf: 0.5/0 is NaN there
    ref = ops.var(x, axis=axis, correction=correction, keepdims=keepdims, device="ref")
    n = math.prod(shape[a] for a in axes_of(shape, axis))
    rtol, atol = TOLERANCES[dtype]
    slack = 16 * float(np.finfo(accumulation_dtype(dtype)).eps) * 25 * max(n, 1)  # (sum of squares) * eps
    for actual, want in (
        (ref, expected),
        (ops.var(x, axis=axis, correction=correction, keepdims=keepdims, device="cpu"), ref),
    ):
        assert actual.dtype == dtype and actual.shape == np.shape(expected)
        assert_close(f64(actual), f64(want), rtol=rtol, atol=atol + slack, check_dtype=False)


@pytest.mark.parametrize("device", DEVICES)
def test_var_degenerate(device: str) -> None:
    assert np.isnan(ops.var(np.array([3.0]), device=device))  # 0 / 0
    assert np.isinf(ops.var(np.array([1.0, 2.0]), correction=3, device=device))  # 0.5 / 0
    assert ops.var(np.array([1.0, 2.0, 3.0, 4.0]), correction=0, device=device) == 1.25


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (
            lambda: ops.sum(np.ones((2, 3)), axis=2),
            r"sum: argument 'axis' expected an axis in \[-2, 2\).*got 2",
        ),
        (lambda: ops.mean(np.ones((2, 3)), axis=(0, -2)), r"mean: argument 'axis' expected distinct axes"),
        (lambda: ops.max(np.ones(3), axis=1.0), r"max: argument 'axis' expected an int, got float 1.0"),
        (lambda: ops.argmax(np.ones(3), axis=(0,)), r"argmax: argument 'axis' expected an int, got tuple"),
        (lambda: ops.argmax(np.ones((2, 0)), axis=1), r"argmax: argument 'x' expected a non-empty dimension"),
        (lambda: ops.mean(np.ones(3, np.int16)), r"mean: argument 'x' expected one of \(float64.*got int16"),
        (lambda: ops.sum(np.ones(3, bool)), r"sum: argument 'x' expected .*got bool"),
        (lambda: ops.var(np.ones(3), correction="1"), r"var: argument 'correction' expected a number"),
    ],
)
def test_errors_name_op_argument_expected_actual(call: Any, pattern: str) -> None:
    with pytest.raises(OpError, match=pattern):
        call()


@pytest.mark.parametrize("device", DEVICES)
def test_errors_also_from_direct_kernel_calls(device: str) -> None:
    with pytest.raises(OpError, match="var: argument 'axis'"):
        ops.call("var", np.ones((2, 3)), axis=-3, device=device)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, ml_dtypes.bfloat16], ids=str)
def test_mean_decomposition_is_the_definition(dtype: Any) -> None:
    x = sample(2, (3, 4, 5), dtype)
    expected = ops.mean(x, axis=(0, 2), device="ref")
    ops.unregister("mean", device="cpu")
    with ops.fallback_policy("allow"):
        got = ops.mean(x, axis=(0, 2), device="cpu")
    assert ops.fallback_report().count("mean", path="decomposition") == 1
    rtol, atol = TOLERANCES[np.dtype(dtype)]
    assert_close(got, expected, rtol=rtol, atol=atol)


# ---------------------------------------------------------------- integer mean (ONNX ReduceMean, opset 18)


def _trunc_mean_reference(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Python ints: the exact sum over ``axes``, divided by the count and truncated toward zero."""
    moved = np.moveaxis(x, axes, tuple(range(x.ndim - len(axes), x.ndim)))
    flat = moved.reshape(*moved.shape[: x.ndim - len(axes)], -1)
    out = np.empty(flat.shape[:-1], x.dtype)
    for idx in np.ndindex(out.shape):
        vals = [int(v) for v in flat[idx]]
        total, n = sum(vals), len(vals)
        out[idx] = abs(total) // n * (1 if total >= 0 else -1)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ops.MEAN_INT_DTYPES, ids=str)
@settings(max_examples=15, deadline=None)
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), data=st.data())
def test_int_mean_truncates_toward_zero(device: str, dtype: Any, shape: tuple[int, ...], data: Any) -> None:
    lo = 0 if np.dtype(dtype).kind == "u" else -1000
    x = np.random.default_rng(data.draw(st.integers(0, 2**16))).integers(lo, 1000, size=shape).astype(dtype)
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    got = ops.mean(x, axis=axes, device=device)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, _trunc_mean_reference(x, axes))


def test_int_mean_errors() -> None:
    with pytest.raises(OpError, match=r"mean: argument 'x' expected a non-empty dimension to average"):
        ops.mean(np.zeros((2, 0), np.int32), axis=1)
    with pytest.raises(OpError, match=r"mean: argument 'x' expected one of .*got int8"):
        ops.mean(np.zeros(3, np.int8))
