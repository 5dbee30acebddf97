"""ONNX reductions (prod, reduce_l1/l2/log_sum/log_sum_exp/sum_square) and bool max/min: ref and cpu against
float64 numpy, empty-set identities, hypothesis over shapes and axes, and error paths."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import opstrata.ops as ops
from opstrata.ops import OpError

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEVICES = ("ref", "cpu")

#: name -> (public function, float64 numpy reference, exact on ints)
REDUCTIONS: dict[str, tuple[Any, Any, bool]] = {
    "prod": (ops.prod, lambda t, a, k: np.prod(t, axis=a, keepdims=k), True),
    "reduce_l1": (ops.reduce_l1, lambda t, a, k: np.sum(np.abs(t), axis=a, keepdims=k), True),
    "reduce_l2": (ops.reduce_l2, lambda t, a, k: np.sqrt(np.sum(t**2, axis=a, keepdims=k)), False),
    "reduce_sum_square": (ops.reduce_sum_square, lambda t, a, k: np.sum(t**2, axis=a, keepdims=k), True),
    "reduce_log_sum": (ops.reduce_log_sum, lambda t, a, k: np.log(np.sum(t, axis=a, keepdims=k)), False),
    "reduce_log_sum_exp": (
        ops.reduce_log_sum_exp,
        lambda t, a, k: np.log(np.sum(np.exp(t), axis=a, keepdims=k)),
        False,
    ),
}
#: per-dtype (rtol, atol) against the float64 reference (one rounding of the result, plus accumulation)
TOL = {
    np.dtype(np.float64): (1e-12, 1e-12),
    np.dtype(np.float32): (1e-5, 1e-6),
    np.dtype(np.float16): (2e-3, 1e-3),
    np.dtype(ml_dtypes.bfloat16): (1.6e-2, 1e-2),
}
FLOAT_DTYPES = list(TOL)
INT_DTYPES = [np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.int8)]


def _sample(seed: int, shape: tuple[int, ...], dtype: np.dtype, positive: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype.kind in "iu":
        return rng.integers(1 if positive else -3, 4, size=shape).astype(dtype)
    lo = 0.5 if positive else -1.5
    return rng.uniform(lo, 1.5, size=shape).astype(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(REDUCTIONS))
@pytest.mark.parametrize(("axis", "keepdims"), [(None, False), (1, True), ((0, 2), False), (-1, True)])
def test_float_reductions_match_float64_numpy(
    name: str, dtype: np.dtype, device: str, axis: Any, keepdims: bool
) -> None:
    fn, ref, _ = REDUCTIONS[name]
    x = _sample(0, (3, 4, 5), dtype, positive=name == "reduce_log_sum")
    got = fn(x, axis=axis, keepdims=keepdims, device=device)
    want = ref(x.astype(np.float64), axis, keepdims)
    assert got.dtype == dtype and got.shape == np.shape(want)
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_int_reductions_return_int64_or_float64(name: str, dtype: np.dtype, device: str) -> None:
    fn, ref, exact = REDUCTIONS[name]
    x = _sample(1, (2, 3, 4), dtype, positive=True)
    got = fn(x, axis=(1, 2), device=device)
    want = ref(x.astype(np.int64 if exact else np.float64), (1, 2), False)
    assert got.dtype == (np.int64 if exact else np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("name", "identity"),
    [("prod", 1.0), ("reduce_l1", 0.0), ("reduce_l2", 0.0), ("reduce_sum_square", 0.0),
     ("reduce_log_sum", -np.inf), ("reduce_log_sum_exp", -np.inf)],
)  # fmt: skip
def test_empty_reduction_is_the_onnx_identity(name: str, identity: float, device: str) -> None:
    got = REDUCTIONS[name][0](np.zeros((2, 0, 3), np.float32), axis=1, keepdims=True, device=device)
    assert got.shape == (2, 1, 3)
    np.testing.assert_array_equal(got, np.full((2, 1, 3), identity, np.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_log_sum_exp_does_not_overflow(device: str) -> None:
    x = np.array([[1000.0, 1000.0], [-np.inf, -np.inf]], np.float32)
    got = ops.reduce_log_sum_exp(x, axis=1, device=device)
    np.testing.assert_allclose(got, [1000.0 + np.log(2.0), -np.inf], rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_max_min_take_bool(device: str) -> None:
    x = np.array([[True, False], [False, False]])
    np.testing.assert_array_equal(ops.max(x, axis=1, device=device), [True, False])
    np.testing.assert_array_equal(ops.min(x, axis=0, device=device), [False, False])
    assert ops.max(x, device=device).dtype == np.bool_


@given(
    x=hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=4, max_side=4), elements=st.floats(-2, 2)),
    data=st.data(),
    name=st.sampled_from(sorted(REDUCTIONS)),
    keepdims=st.booleans(),
)
@SETTINGS
def test_cpu_agrees_with_ref_on_any_shape_and_axes(
    x: np.ndarray, data: Any, name: str, keepdims: bool
) -> None:
    axes = data.draw(st.lists(st.integers(0, x.ndim - 1), unique=True, max_size=x.ndim))
    axis = tuple(axes) if axes else None
    fn, ref, _ = REDUCTIONS[name]
    if name == "reduce_log_sum":
        x = np.abs(x)
    a = fn(x, axis=axis, keepdims=keepdims, device="ref")
    b = fn(x, axis=axis, keepdims=keepdims, device="cpu")
    want = ref(x, axis if axis is not None else tuple(range(x.ndim)), keepdims)
    assert a.shape == b.shape == np.shape(want)
    np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(a, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_bool_input_is_an_op_error_naming_the_op(name: str) -> None:
    with pytest.raises(OpError, match=rf"{name}: argument 'x' expected"):
        REDUCTIONS[name][0](np.array([True, False]))


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_bad_axis_is_an_op_error(name: str) -> None:
    with pytest.raises(OpError, match=rf"{name}: argument 'axis' expected an axis in \[-2, 2\)"):
        REDUCTIONS[name][0](np.ones((2, 3), np.float32), axis=2)
    with pytest.raises(OpError, match="distinct axes"):
        REDUCTIONS[name][0](np.ones((2, 3), np.float32), axis=(0, -2))
