"""Hypothesis properties: round-trip error within half a step inside the range, parameter shapes per
granularity, and observers that never produce non-positive or non-finite scales."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from opstrata.quant import MinMaxObserver, dequantize, make_observer, quantize_array

_FLOATS = st.floats(-1e3, 1e3, allow_nan=False, width=32)


@settings(max_examples=80, deadline=None)
@given(
    hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=6), elements=_FLOATS),
    st.sampled_from(["int8", "uint8", "int4", "uint4"]),
    st.booleans(),
)
def test_round_trip_error_at_most_half_a_step(x: np.ndarray, dtype: str, symmetric: bool) -> None:
    o = MinMaxObserver(dtype, symmetric=symmetric)
    o.observe(x)
    p = o.compute()
    err = np.abs(dequantize(quantize_array(x, p), p) - x)
    # float32 rounding of x / scale and (q - zp) * scale adds a few ulps of the values
    assert (err <= float(p.scale) / 2 * (1 + 1e-4) + 4 * np.spacing(np.abs(x).max() + 1)).all()


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=4, max_side=5), elements=_FLOATS),
    st.integers(0, 3),
    st.sampled_from(["int8", "uint8", "int4", "float8_e4m3fn"]),
)
def test_per_channel_shapes_and_error(x: np.ndarray, axis: int, dtype: str) -> None:
    axis %= x.ndim
    o = MinMaxObserver(dtype, axis=axis)
    o.observe(x)
    p = o.compute()
    assert p.scale.shape == (x.shape[axis],) and p.zero_point.shape == p.scale.shape and p.axis == axis
    assert (p.scale > 0).all() and np.isfinite(p.scale).all()
    if dtype != "float8_e4m3fn":
        dims = [1] * x.ndim
        dims[axis] = -1
        err = np.abs(dequantize(quantize_array(x, p), p) - x)
        assert (err <= p.scale.reshape(dims) / 2 * (1 + 1e-4) + 4 * np.spacing(np.abs(x).max() + 1)).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.sampled_from([2, 4, 8]), st.integers(1, 3), st.integers(0, 1))
def test_per_group_shapes(blocks: int, group: int, other: int, axis: int) -> None:
    shape = [other, other]
    shape[axis] = blocks * group
    x = np.random.default_rng(blocks * 7 + group).standard_normal(shape).astype(np.float32)
    o = MinMaxObserver("int4", axis=axis, group_size=group)
    o.observe(x)
    p = o.compute()
    want = list(shape)
    want[axis] = blocks
    assert p.scale.shape == tuple(want) and p.block_size == group
    assert (
        np.abs(dequantize(quantize_array(x, p), p) - x) <= np.repeat(p.scale, group, axis) / 2 + 1e-6
    ).all()


@settings(max_examples=30, deadline=None)
@given(
    hnp.arrays(np.float32, (4, 16), elements=_FLOATS),
    st.sampled_from(["minmax", "moving_average", "percentile", "entropy", "mse"]),
    st.booleans(),
)
def test_every_observer_yields_positive_finite_scales(x: np.ndarray, name: str, symmetric: bool) -> None:
    o = make_observer(name, "int8", symmetric=symmetric, axis=0)
    o.observe(x)
    o.observe(x * 0.5)
    p = o.compute()
    assert p.scale.shape == (4,) and (p.scale > 0).all() and np.isfinite(p.scale).all()
