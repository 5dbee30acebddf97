"""layer_norm / rms_norm / batch_norm: ref against float64 formulas (ONNX / torch definitions), cpu against ref."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import opstrata.ops as ops
from opstrata.ops import OpError
from opstrata.ops._dtypes import FLOAT_DTYPES
from opstrata.ops.testing import TOLERANCES, assert_close

SETTINGS = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
DEVICES = ("ref", "cpu")
SEEDS = st.integers(0, 2**32 - 1)


def sample(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: Any, lo: float = -4.0, hi: float = 4.0
) -> np.ndarray:
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def f64(x: Any) -> np.ndarray:
    return None if x is None else np.asarray(x).astype(np.float64)


def check(actual: np.ndarray, expected: np.ndarray, dtype: np.dtype, *, extra_atol: float = 0.0) -> None:
    assert actual.dtype == dtype and actual.shape == expected.shape
    rtol, atol = TOLERANCES[dtype]
    assert_close(f64(actual), f64(expected), rtol=rtol, atol=atol + extra_atol, check_dtype=False)


def centering_error(x: np.ndarray, w: Any, axis: int, eps: float, dtype: Any) -> float:
    """Error bound from computing ``x - mean`` in the compute dtype, amplified by ``1/sqrt(var + eps)``.

    Two nearly equal values (var << eps) make layer_norm ill-conditioned: one rounding of the mean
    (relative to max|x|) becomes ``max|x| / sqrt(var + eps)`` times larger in the output.
    """
    x64 = f64(x)
    axes = tuple(range(axis % x.ndim, x.ndim))
    var = x64.var(axis=axes) if x.size else np.zeros(1)
    unit = float(np.finfo(np.float32 if np.dtype(dtype).itemsize <= 4 else np.float64).eps)
    scale = np.abs(x64).max(initial=0.0) / np.sqrt(var.min(initial=np.inf) + eps)
    wmax = 1.0 if w is None else max(1.0, float(np.abs(f64(w)).max(initial=0.0)))
    return 4 * unit * float(scale) * wmax


def affine(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any, use: bool) -> np.ndarray | None:
    return sample(rng, shape, dtype, -2, 2) if use else None


# --------------------------------------------------------------------------- layer_norm, rms_norm


def layer_norm_oracle(x: np.ndarray, w: Any, b: Any, axis: int, eps: float) -> np.ndarray:
    dims = tuple(range(axis % x.ndim, x.ndim))
    y = (f64(x) - f64(x).mean(axis=dims, keepdims=True)) / np.sqrt(f64(x).var(axis=dims, keepdims=True) + eps)
    return y * (1 if w is None else f64(w)) + (0 if b is None else f64(b))


def rms_norm_oracle(x: np.ndarray, w: Any, axis: int, eps: float) -> np.ndarray:
    dims = tuple(range(axis % x.ndim, x.ndim))
    rms = np.sqrt(np.mean(np.square(f64(x)), axis=dims, keepdims=True) + eps)
    return f64(x) / rms * (1 if w is None else f64(w))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@SETTINGS
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=6),
    seed=SEEDS,
    use=st.tuples(st.booleans(), st.booleans()),
    data=st.data(),
)
def test_layer_norm(dtype: np.dtype, shape: tuple[int, ...], seed: int, use: Any, data: Any) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(seed)
    x = sample(rng, shape, dtype)
    norm_shape = shape[axis % len(shape) :]
    w, b = affine(rng, norm_shape, dtype, use[0]), affine(rng, norm_shape, dtype, use[1])
    ref = ops.layer_norm(x, w, b, axis=axis, eps=1e-5, device="ref")
    cond = centering_error(x, w, axis, 1e-5, dtype)
    check(ref, layer_norm_oracle(x, w, b, axis, 1e-5), dtype, extra_atol=cond)
    check(ops.layer_norm(x, w, b, axis=axis, eps=1e-5, device="cpu"), ref, dtype, extra_atol=2 * cond)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@SETTINGS
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=6),
    seed=SEEDS,
    use=st.tuples(st.booleans(), st.booleans()),
    data=st.data(),
)
def test_layer_norm_out_in_place_and_separate(
    dtype: np.dtype, shape: tuple[int, ...], seed: int, use: Any, data: Any
) -> None:
    """out= (x itself, as the runtime's SkipLayerNorm writes, or another buffer) gives the fresh result's bits."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    device = data.draw(st.sampled_from(DEVICES))
    rng = np.random.default_rng(seed)
    x = sample(rng, shape, dtype)
    norm_shape = shape[axis % len(shape) :]
    w, b = affine(rng, norm_shape, dtype, use[0]), affine(rng, norm_shape, dtype, use[1])
    want = ops.layer_norm(x, w, b, axis=axis, device=device)
    other = np.empty_like(x)
    assert ops.layer_norm(x, w, b, axis=axis, out=other, device=device) is other
    np.testing.assert_array_equal(other, want)
    y = x.copy()
    assert ops.layer_norm(y, w, b, axis=axis, out=y, device=device) is y
    np.testing.assert_array_equal(y, want)


def test_layer_norm_out_errors_and_strided_out() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(
        OpError, match=r"layer_norm: argument 'out' expected an ndarray of shape \(3, 4\) and dtype float32"
    ):
        ops.layer_norm(x, out=np.empty((3, 4), np.float64))
    big = np.arange(16, dtype=np.float32).reshape(4, 4)
    with pytest.raises(
        OpError, match="argument 'out' expected a buffer that is x itself or does not overlap x"
    ):
        ops.layer_norm(big[1:], out=big[:-1])
    w = np.ones(4, np.float32)
    with pytest.raises(OpError, match="does not overlap weight"):
        ops.layer_norm(x, w, out=np.broadcast_to(w, (3, 4)))
    strided = np.empty((3, 8), np.float32)[:, ::2]  # not C-contiguous: normalized fresh, copied in
    np.testing.assert_array_equal(ops.layer_norm(x, out=strided), ops.layer_norm(x))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@SETTINGS
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=6),
    seed=SEEDS,
    use_w=st.booleans(),
    data=st.data(),
)
def test_rms_norm(dtype: np.dtype, shape: tuple[int, ...], seed: int, use_w: bool, data: Any) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(seed)
    x = sample(rng, shape, dtype)
    w = affine(rng, shape[axis % len(shape) :], dtype, use_w)
    ref = ops.rms_norm(x, w, axis=axis, device="ref")
    check(ref, rms_norm_oracle(x, w, axis, 1e-6), dtype)
    check(ops.rms_norm(x, w, axis=axis, device="cpu"), ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_layer_norm_known_values_and_mixed_param_dtypes(device: str) -> None:
    x = np.array([[1.0, 3.0], [2.0, 2.0]], np.float32)
    y = ops.layer_norm(x, np.array([2.0, 2.0]), np.array([0.5, 0.5], np.float16), eps=0.0, device=device)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y[0], [-1.5, 2.5], rtol=1e-6)
    assert np.isnan(y[1]).all()  # zero variance with eps=0: 0/0, as the formula says
    np.testing.assert_allclose(ops.layer_norm(x, device=device)[1], [0.0, 0.0])  # eps keeps it finite


@pytest.mark.parametrize("device", DEVICES)
def test_norms_on_empty_and_non_contiguous(device: str) -> None:
    assert ops.layer_norm(np.ones((0, 4)), device=device).shape == (0, 4)
    assert ops.rms_norm(np.ones((3, 0)), device=device).shape == (3, 0)
    x = np.random.default_rng(1).normal(size=(4, 6)).T  # (6, 4) Fortran-ordered view
    check(ops.layer_norm(x, device=device), layer_norm_oracle(x, None, None, -1, 1e-5), np.dtype(np.float64))
    check(ops.rms_norm(x, axis=0, device=device), rms_norm_oracle(x, None, 0, 1e-6), np.dtype(np.float64))
    xc = np.ascontiguousarray(x)  # the cpu kernel centres a contiguous input straight into its buffer
    before = xc.copy()
    check(ops.layer_norm(xc, device=device), layer_norm_oracle(x, None, None, -1, 1e-5), np.dtype(np.float64))
    np.testing.assert_array_equal(xc, before)  # the input is never written


# --------------------------------------------------------------------------- batch_norm


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@SETTINGS
@given(
    shape=hnp.array_shapes(min_dims=2, max_dims=4, min_side=0, max_side=5),
    seed=SEEDS,
    use=st.tuples(st.booleans(), st.booleans()),
)
def test_batch_norm(dtype: np.dtype, shape: tuple[int, ...], seed: int, use: Any) -> None:
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = sample(rng, shape, dtype)
    mean, var = sample(rng, (c,), dtype, -1, 1), sample(rng, (c,), dtype, 0.25, 4)
    w, b = affine(rng, (c,), dtype, use[0]), affine(rng, (c,), dtype, use[1])
    per_c = (1, c) + (1,) * (len(shape) - 2)
    expected = (f64(x) - f64(mean).reshape(per_c)) / np.sqrt(f64(var).reshape(per_c) + 1e-5)
    expected = expected * (1 if w is None else f64(w).reshape(per_c)) + (
        0 if b is None else f64(b).reshape(per_c)
    )
    ref = ops.batch_norm(x, mean, var, w, b, device="ref")
    check(ref, expected, dtype)
    check(ops.batch_norm(x, mean, var, w, b, device="cpu"), ref, dtype)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (
            lambda d: ops.layer_norm(np.ones((2, 3, 4)), np.ones(4), axis=1, device=d),
            r"layer_norm: argument 'weight' expected shape \(3, 4\) \(x.shape\[axis:\]\), got \(4,\)",
        ),
        (
            lambda d: ops.layer_norm(np.ones((2, 3)), None, np.ones(3, np.int32), device=d),
            r"layer_norm: argument 'bias' expected a floating dtype, got int32",
        ),
        (
            lambda d: ops.layer_norm(np.ones((2, 3)), axis=2, device=d),
            r"layer_norm: argument 'axis' expected an axis in",
        ),
        (
            lambda d: ops.rms_norm(np.ones((2, 3)), np.ones(2), device=d),
            r"rms_norm: argument 'weight' expected shape \(3,\)",
        ),
        (
            lambda d: ops.batch_norm(np.ones(3), np.ones(3), np.ones(3), device=d),
            r"batch_norm: argument 'x' expected at least 2 dims \(N, C, \.\.\.\), got 1 dims",
        ),
        (
            lambda d: ops.batch_norm(np.ones((2, 3, 4)), np.ones(4), np.ones(3), device=d),
            r"batch_norm: argument 'mean' expected shape \(3,\)",
        ),
        (
            lambda d: ops.batch_norm(np.ones((2, 3)), np.ones(3), None, device=d),
            r"batch_norm: argument 'var' expected an array of shape \(C,\)",
        ),
        (
            lambda d: ops.rms_norm(np.ones(3), eps=-1.0, device=d),
            r"rms_norm: argument 'eps' expected a number >= 0",
        ),
        (
            lambda d: ops.layer_norm(np.ones(3, np.int8), device=d),
            r"layer_norm: argument 'x' expected one of .*int8",
        ),
    ],
)
def test_errors_name_op_argument_expected_actual(call: Any, pattern: str, device: str) -> None:
    with pytest.raises(OpError, match=pattern):
        call(device)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=str)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_decomposition_is_the_definition(op: str, dtype: Any) -> None:
    """With the cpu kernel removed, the decomposition runs (audited once) and matches ref."""
    rng = np.random.default_rng(5)
    x, w = sample(rng, (2, 3, 8), dtype), sample(rng, (3, 8), dtype)
    expected = getattr(ops, op)(x, w, axis=1, device="ref")
    ops.unregister(op, device="cpu")
    with ops.fallback_policy("allow"):
        got = getattr(ops, op)(x, w, axis=1, device="cpu")
    assert ops.fallback_report().count(op, path="decomposition") == 1
    check(got, expected, np.dtype(dtype))
