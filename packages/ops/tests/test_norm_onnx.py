"""ONNX normalisations (instance_norm, group_norm, lrn, lp_normalize, mean_variance_norm, layer_norm_stats)
against float64 numpy references (the ONNX spec formulas), per-dtype tolerances, hypothesis over shapes,
and error paths."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops import OpError

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEVICES = ("ref", "cpu")
TOL = {
    np.dtype(np.float64): (1e-10, 1e-10),
    np.dtype(np.float32): (1e-5, 1e-5),
    np.dtype(np.float16): (3e-3, 3e-3),
    np.dtype(ml_dtypes.bfloat16): (2e-2, 3e-2),
}


def _x(seed: int, shape: tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _close(got: np.ndarray, want: np.ndarray, dtype: Any) -> None:
    rtol, atol = TOL[np.dtype(dtype)]
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)


def _standardize(t: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    mu = t.mean(axis=axes, keepdims=True)
    return (t - mu) / np.sqrt(((t - mu) ** 2).mean(axis=axes, keepdims=True) + eps)


def _per_channel(p: np.ndarray, ndim: int) -> np.ndarray:
    return p.astype(np.float64).reshape((1, -1) + (1,) * (ndim - 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 2, 2)])
def test_instance_norm(shape: tuple[int, ...], dtype: Any, device: str) -> None:
    x, s, b = _x(0, shape, dtype), _x(1, (shape[1],), dtype), _x(2, (shape[1],), dtype)
    got = ops.instance_norm(x, s, b, eps=1e-3, device=device)
    t = x.astype(np.float64)
    want = _standardize(t, tuple(range(2, t.ndim)), 1e-3) * _per_channel(s, t.ndim) + _per_channel(b, t.ndim)
    _close(got, want, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_norm(groups: int, dtype: Any, device: str) -> None:
    x, s, b = _x(3, (2, 4, 3, 3), dtype), _x(4, (4,), dtype), _x(5, (4,), dtype)
    got = ops.group_norm(x, s, b, num_groups=groups, eps=1e-5, device=device)
    t = x.astype(np.float64)
    want = _standardize(t.reshape(2, groups, -1), (2,), 1e-5).reshape(t.shape)
    _close(got, want * _per_channel(s, 4) + _per_channel(b, 4), dtype)


def _lrn_ref(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """The ONNX spec: channels [c - floor((size-1)/2), c + ceil((size-1)/2)]."""
    t, c = x.astype(np.float64), x.shape[1]
    out = np.empty_like(t)
    for i in range(c):
        lo, hi = max(0, i - (size - 1) // 2), min(c, i + -(-(size - 1) // 2) + 1)
        sq = (t[:, lo:hi] ** 2).sum(axis=1)
        out[:, i] = t[:, i] / (bias + alpha / size * sq) ** beta
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_lrn(size: int, dtype: Any, device: str) -> None:
    x = _x(6, (2, 5, 3, 3), dtype)
    got = ops.lrn(x, size=size, alpha=0.1, beta=0.75, bias=2.0, device=device)
    _close(got, _lrn_ref(x, size, 0.1, 0.75, 2.0), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize(("p", "axis"), [(1, -1), (2, 0), (2, 1)])
def test_lp_normalize(p: int, axis: int, dtype: Any, device: str) -> None:
    x = _x(7, (3, 4, 5), dtype)
    t = x.astype(np.float64)
    norm = np.linalg.norm(t, ord=p, axis=axis, keepdims=True)
    _close(ops.lp_normalize(x, axis=axis, p=p, device=device), t / norm, dtype)


def test_lp_normalize_zero_norm_gives_zero() -> None:
    np.testing.assert_array_equal(ops.lp_normalize(np.zeros((2, 3), np.float32)), np.zeros((2, 3)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("axes", [(0, 2, 3), (1,), (0, 1, 2, 3)])
def test_mean_variance_norm(axes: tuple[int, ...], dtype: Any, device: str) -> None:
    x = _x(8, (2, 3, 4, 4), dtype)
    t = x.astype(np.float64)
    mu = t.mean(axis=axes, keepdims=True)
    want = (t - mu) / (np.sqrt(((t - mu) ** 2).mean(axis=axes, keepdims=True)) + 1e-9)
    _close(ops.mean_variance_norm(x, axes=axes, device=device), want, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_layer_norm_stats(axis: int, dtype: Any, device: str) -> None:
    x = _x(9, (2, 3, 4), dtype)
    mean, inv = ops.layer_norm_stats(x, axis=axis, eps=1e-4, device=device)
    t = x.astype(np.float64)
    dims = tuple(range(axis % 3, 3))
    mu = t.mean(axis=dims, keepdims=True)
    want_inv = 1 / np.sqrt(((t - mu) ** 2).mean(axis=dims, keepdims=True) + 1e-4)
    stat = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    assert mean.dtype == inv.dtype == stat
    np.testing.assert_allclose(mean, mu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inv, want_inv, rtol=1e-5, atol=1e-6)


@given(
    n=st.integers(1, 3),
    g=st.sampled_from([1, 2, 3]),
    per=st.integers(1, 3),
    spatial=st.lists(st.integers(1, 4), min_size=0, max_size=2),
)
@SETTINGS
def test_group_norm_with_one_channel_per_group_is_instance_norm(
    n: int, g: int, per: int, spatial: list[int]
) -> None:
    x = _x(n * 10 + g, (n, g, *spatial, per))
    s, b = _x(1, (g,)), _x(2, (g,))
    np.testing.assert_allclose(
        ops.group_norm(x, s, b, num_groups=g), ops.instance_norm(x, s, b), rtol=1e-9, atol=1e-9
    )


def test_errors_name_the_op_argument_and_fix() -> None:
    x = np.ones((2, 4, 3), np.float32)
    with pytest.raises(OpError, match="group_norm: argument 'num_groups' expected a divisor of C = 4"):
        ops.group_norm(x, num_groups=3)
    with pytest.raises(OpError, match=r"instance_norm: argument 'scale' expected shape \(4,\)"):
        ops.instance_norm(x, np.ones(3, np.float32))
    with pytest.raises(OpError, match="lrn: argument 'size' expected an int >= 1"):
        ops.lrn(x, size=0)
    with pytest.raises(OpError, match="lp_normalize: argument 'p' expected 1 or 2"):
        ops.lp_normalize(x, p=3)
    with pytest.raises(OpError, match=r"mean_variance_norm: argument 'axes' expected an axis in \[-3, 3\)"):
        ops.mean_variance_norm(x, axes=(3,))
    with pytest.raises(OpError, match="instance_norm: argument 'x' expected one of"):
        ops.instance_norm(x.astype(np.int32))
    with pytest.raises(OpError, match="layer_norm_stats: argument 'eps' expected a number >= 0"):
        ops.layer_norm_stats(x, eps=-1.0)
