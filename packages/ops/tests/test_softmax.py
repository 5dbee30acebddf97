"""softmax / log_softmax: ref against the naive float64 formula (with -inf masks), cpu against ref."""

from __future__ import annotations

import warnings
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import opstrata.ops as ops
from opstrata.ops import OpError
from opstrata.ops._dtypes import FLOAT_DTYPES
from opstrata.ops.testing import TOLERANCES, assert_close

SETTINGS = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
DEVICES = ("ref", "cpu")
SEEDS = st.integers(0, 2**32 - 1)


def f64(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def masked_logits(seed: int, shape: tuple[int, ...], dtype: Any, p_mask: float) -> np.ndarray:
    """Logits in [-4, 4] rounded to ``dtype``, a fraction ``p_mask`` of them -inf (attention-style masks)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-4, 4, size=shape)
    x[rng.random(shape) < p_mask] = -np.inf
    return x.astype(dtype)


def oracle(x: np.ndarray, axis: int, log: bool) -> np.ndarray:
    """Textbook float64 formula without max-shift (safe for |x| <= 4); all -inf slices -> 0 / -inf."""
    x = f64(x)
    with np.errstate(all="ignore"):
        s = np.exp(x).sum(axis=axis, keepdims=True)
        dead = s == 0
        if log:
            return np.where(dead, -np.inf, x - np.log(s))
        return np.where(dead, 0.0, np.exp(x) / s)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@SETTINGS
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=6),
    seed=SEEDS,
    p_mask=st.sampled_from([0.0, 0.3, 0.8]),
    data=st.data(),
)
def test_softmax_family(
    op: str, dtype: np.dtype, shape: tuple[int, ...], seed: int, p_mask: float, data: Any
) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    if dtype == ml_dtypes.float8_e4m3fn:
        p_mask = 0.0  # e4m3fn has no infinities (-inf casts to NaN): it cannot carry a mask
    x = masked_logits(seed, shape, dtype, p_mask)
    fn = getattr(ops, op)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # -inf entries and dead slices make no warnings
        ref = fn(x, axis=axis, device="ref")
        cpu = fn(x, axis=axis, device="cpu")
    rtol, atol = TOLERANCES[dtype]
    for actual, expected in ((ref, oracle(x, axis, op == "log_softmax")), (cpu, ref)):
        assert actual.dtype == dtype and actual.shape == x.shape
        assert not np.isnan(f64(actual)).any()
        assert_close(f64(actual), f64(expected), rtol=rtol, atol=atol, check_dtype=False)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_large_logits_do_not_overflow(dtype: np.dtype, device: str) -> None:
    base = np.array([[0.0, -1.0, 2.0, 0.5]])
    big = float(np.round(float(ml_dtypes.finfo(dtype).max) * 0.5))  # exp(big) overflows every dtype
    x = (base + big).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = ops.softmax(x, device=device)
        lp = ops.log_softmax(x, device=device)
    expected = oracle(f64(x) - big, -1, log=False)  # shift invariance
    rtol, atol = TOLERANCES[dtype]
    assert_close(f64(p), expected, rtol=rtol, atol=atol, check_dtype=False)
    assert_close(f64(lp), np.log(expected), rtol=rtol, atol=atol, check_dtype=False)


@pytest.mark.parametrize("device", DEVICES)
def test_fully_masked_rows_are_zero_not_nan(device: str) -> None:
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 0.0]], np.float32)
    np.testing.assert_array_equal(ops.softmax(x, device=device), [[0, 0, 0], [0.5, 0, 0.5]])
    lp = ops.log_softmax(x, device=device)
    np.testing.assert_array_equal(lp[0], [-np.inf] * 3)
    np.testing.assert_allclose(np.exp(lp), ops.softmax(x, device=device))  # exp(log_softmax) == softmax


@pytest.mark.parametrize("device", DEVICES)
def test_positive_inf_and_nan_poison_their_slice(device: str) -> None:
    x = np.array([[np.inf, 0.0], [np.nan, 0.0], [1.0, 0.0]])
    p = ops.softmax(x, device=device)
    assert np.isnan(p[0, 0]) and np.isnan(p[1]).all() and not np.isnan(p[2]).any()


@pytest.mark.parametrize("device", DEVICES)
def test_rows_sum_to_one_along_any_axis(device: str) -> None:
    x = np.random.default_rng(0).normal(size=(3, 4, 5)) * 30
    for axis in range(-3, 3):
        np.testing.assert_allclose(ops.softmax(x, axis=axis, device=device).sum(axis=axis), 1.0, rtol=1e-12)


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (
            lambda: ops.softmax(np.ones((2, 3)), axis=2),
            r"softmax: argument 'axis' expected an axis in \[-2, 2\).*got 2",
        ),
        (
            lambda: ops.log_softmax(np.ones(3), axis=None),
            r"log_softmax: argument 'axis' expected an int, got NoneType",
        ),
        (
            lambda: ops.softmax(np.ones(3, np.int64)),
            r"softmax: argument 'x' expected one of \(float64.*got int64",
        ),
        (lambda: ops.softmax(np.array(1.0)), r"softmax: argument 'axis' expected an axis in \[-0, 0\)"),
    ],
)
def test_errors_name_op_argument_expected_actual(call: Any, pattern: str) -> None:
    with pytest.raises(OpError, match=pattern):
        call()


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=str)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_decomposition_is_the_definition(op: str, dtype: Any) -> None:
    """With the cpu kernel removed, the decomposition runs (audited once) and keeps the masking contract."""
    x = masked_logits(3, (4, 6), dtype, 0.4)
    x[0] = -np.inf  # a fully masked row
    expected = getattr(ops, op)(x, axis=0, device="ref")
    ops.unregister(op, device="cpu")
    with ops.fallback_policy("allow"):
        got = getattr(ops, op)(x, axis=0, device="cpu")
    assert ops.fallback_report().count(op, path="decomposition") == 1
    rtol, atol = TOLERANCES[np.dtype(dtype)]
    assert_close(got, expected, rtol=rtol, atol=atol)
