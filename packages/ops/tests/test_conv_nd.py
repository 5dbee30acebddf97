"""N-D conv, conv-transpose and pooling (opstrata.ops.kernels.conv_nd) against torch (1-D/2-D/3-D), the fast
2-D kernels, per-dtype tolerances, hypothesis over geometry, and error paths."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops import OpError

torch = pytest.importorskip("torch")
F = torch.nn.functional

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEVICES = ("ref", "cpu")
TOL = {
    np.dtype(np.float64): (1e-10, 1e-10),
    np.dtype(np.float32): (1e-5, 1e-5),
    np.dtype(np.float16): (2e-3, 2e-3),
    np.dtype(ml_dtypes.bfloat16): (1.6e-2, 2e-2),
}
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
MAXP = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVGP = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
UNPOOL = {1: F.max_unpool1d, 2: F.max_unpool2d, 3: F.max_unpool3d}


def _x(seed: int, shape: tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _t(a: np.ndarray) -> Any:
    return torch.tensor(np.asarray(a, np.float64))


def _close(got: np.ndarray, want: Any, dtype: Any) -> None:
    rtol, atol = TOL[np.dtype(dtype)]
    assert got.dtype == np.dtype(dtype)
    w = want.numpy() if hasattr(want, "numpy") else want
    assert got.shape == w.shape
    np.testing.assert_allclose(got.astype(np.float64), w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_conv_nd_matches_torch(nd: int, dtype: Any, device: str) -> None:
    x, w, b = _x(0, (2, 4, *([6] * nd)), dtype), _x(1, (6, 2, *([3] * nd)), dtype), _x(2, (6,), dtype)
    got = ops.conv_nd(x, w, b, stride=2, pads=1, dilation=2 if nd < 3 else 1, groups=2, device=device)
    want = CONV[nd](_t(x), _t(w), _t(b), stride=2, padding=1, dilation=2 if nd < 3 else 1, groups=2)
    _close(got, want, dtype)


def test_conv_nd_2d_agrees_with_conv2d() -> None:
    x, w = _x(3, (1, 3, 7, 5), np.float32), _x(4, (4, 3, 3, 2), np.float32)
    got = ops.conv_nd(x, w, pads=[1, 0, 2, 1], stride=[1, 2])
    want = ops.conv2d(x, w, padding=(1, 0, 2, 1), stride=(1, 2))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_conv_transpose_nd_matches_torch(nd: int, dtype: Any, device: str) -> None:
    x, w, b = _x(5, (2, 4, *([4] * nd)), dtype), _x(6, (4, 3, *([3] * nd)), dtype), _x(7, (6,), dtype)
    got = ops.conv_transpose_nd(
        x, w, b, stride=2, pads=1, dilation=2, groups=2, output_padding=1, device=device
    )
    want = CONVT[nd](_t(x), _t(w), _t(b), stride=2, padding=1, dilation=2, groups=2, output_padding=1)
    _close(got, want, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ceil", [False, True])
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_max_pool_nd_and_indices_match_torch(nd: int, ceil: bool, device: str) -> None:
    x = _x(8, (2, 3, *([7] * nd)))
    y, idx = ops.max_pool_nd(
        x, kernel_size=3, stride=2, pads=1, dilation=2, ceil_mode=ceil, return_indices=True, device=device
    )
    ty, ti = MAXP[nd](_t(x), 3, 2, 1, 2, ceil_mode=ceil, return_indices=True)
    _close(y, ty, np.float64)
    plane = np.arange(6).reshape(2, 3, *([1] * nd)) * 7**nd  # ONNX indices include the (n, c) offset
    np.testing.assert_array_equal(idx - plane, ti.numpy())
    assert idx.dtype == np.int64


def test_max_pool_nd_storage_order_is_column_major() -> None:
    x = np.array([[[[1.0, 9.0], [3.0, 4.0]]]])
    _, row = ops.max_pool_nd(x, kernel_size=2, return_indices=True)
    _, col = ops.max_pool_nd(x, kernel_size=2, return_indices=True, storage_order=1)
    assert row.item() == 1 and col.item() == 2


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64])
def test_max_pool_nd_is_exact_on_ints(dtype: Any) -> None:
    x = np.random.default_rng(0).integers(0, 100, size=(1, 2, 5, 5)).astype(dtype)
    got = ops.max_pool_nd(x, kernel_size=2, stride=2, pads=1)
    want = F.max_pool2d(torch.tensor(x.astype(np.float64)), 2, 2, 1).numpy().astype(dtype)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.dtype(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize(
    ("ceil", "include_pad"), [(False, False), (True, False), (True, True), (False, True)]
)
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_avg_pool_nd_matches_torch(nd: int, ceil: bool, include_pad: bool, dtype: Any, device: str) -> None:
    x = _x(9, (2, 3, *([6] * nd)), dtype)
    got = ops.avg_pool_nd(
        x, kernel_size=3, stride=2, pads=1, ceil_mode=ceil, count_include_pad=include_pad, device=device
    )
    want = AVGP[nd](_t(x), 3, 2, 1, ceil_mode=ceil, count_include_pad=include_pad)
    _close(got, want, dtype)


def test_avg_pool_nd_with_dilations_averages_the_dilated_taps() -> None:
    x = np.arange(7.0).reshape(1, 1, 7)
    got = ops.avg_pool_nd(x, kernel_size=2, dilation=3)
    np.testing.assert_allclose(got, [[[1.5, 2.5, 3.5, 4.5]]])  # (x[i] + x[i+3]) / 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("nd", [1, 2])
def test_lp_pool_nd_matches_torch(nd: int, p: int, device: str) -> None:
    x = _x(10, (2, 3, *([6] * nd)))
    got = ops.lp_pool_nd(x, kernel_size=2, stride=2, p=p, device=device)
    want = (F.lp_pool1d if nd == 1 else F.lp_pool2d)(_t(np.abs(x)), p, 2, 2)
    _close(got, want, np.float64)


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_max_unpool_nd_inverts_max_pool(nd: int) -> None:
    x = _x(11, (2, 3, *([4] * nd)))
    y, idx = ops.max_pool_nd(x, kernel_size=2, stride=2, return_indices=True)
    got = ops.max_unpool_nd(y, idx, output_size=x.shape[2:])
    ty, ti = MAXP[nd](_t(x), 2, 2, return_indices=True)
    np.testing.assert_array_equal(got, UNPOOL[nd](ty, ti, 2, 2, output_size=x.shape[2:]).numpy())


@given(
    nd=st.integers(1, 3),
    size=st.integers(3, 7),
    k=st.integers(1, 3),
    s=st.integers(1, 3),
    d=st.integers(1, 2),
    p=st.integers(0, 1),
    g=st.sampled_from([1, 2]),
)
@SETTINGS
def test_conv_nd_any_geometry_matches_torch(
    nd: int, size: int, k: int, s: int, d: int, p: int, g: int
) -> None:
    if size + 2 * p < d * (k - 1) + 1:
        return
    x, w = _x(size, (1, 2, *([size] * nd))), _x(k, (4, 2 // g, *([k] * nd)))
    got = ops.conv_nd(x, w, stride=s, pads=p, dilation=d, groups=g)
    _close(got, CONV[nd](_t(x), _t(w), stride=s, padding=p, dilation=d, groups=g), np.float64)
    xt = _x(size + 1, (1, 2, *([size] * nd)))
    wt = _x(k + 1, (2, 4 // g, *([k] * nd)))
    op = min(s, d) - 1
    got_t = ops.conv_transpose_nd(xt, wt, stride=s, pads=0, dilation=d, groups=g, output_padding=op)
    want_t = CONVT[nd](_t(xt), _t(wt), stride=s, dilation=d, groups=g, output_padding=op)
    _close(got_t, want_t, np.float64)


@given(
    nd=st.integers(1, 3), size=st.integers(2, 7), k=st.integers(1, 3), s=st.integers(1, 3), ceil=st.booleans()
)
@SETTINGS
def test_pools_any_geometry_match_torch(nd: int, size: int, k: int, s: int, ceil: bool) -> None:
    if size < k:
        return
    p = k // 2
    x = _x(size * 7 + k, (1, 2, *([size] * nd)))
    _close(
        ops.max_pool_nd(x, kernel_size=k, stride=s, pads=p, ceil_mode=ceil),
        MAXP[nd](_t(x), k, s, p, ceil_mode=ceil),
        np.float64,
    )
    want = AVGP[nd](_t(x), k, s, p, ceil_mode=ceil, count_include_pad=False)
    _close(ops.avg_pool_nd(x, kernel_size=k, stride=s, pads=p, ceil_mode=ceil), want, np.float64)


def test_errors_name_the_op_argument_and_fix() -> None:
    x = np.ones((1, 2, 5), np.float32)
    with pytest.raises(
        OpError, match=r"conv_nd: argument 'x' expected one of \(float64.*got int32. Fix: cast"
    ):
        ops.conv_nd(x.astype(np.int32), np.ones((1, 2, 3), np.int32))
    with pytest.raises(OpError, match="conv_nd: argument 'weight' expected x's dtype float32"):
        ops.conv_nd(x, np.ones((1, 2, 3)))
    with pytest.raises(OpError, match=r"conv_nd: argument 'weight' expected dim 1 = C_in / groups"):
        ops.conv_nd(x, np.ones((1, 3, 3), np.float32))
    with pytest.raises(OpError, match=r"conv_nd: argument 'pads' expected an int >= 0 or 2 of them"):
        ops.conv_nd(x, np.ones((1, 2, 3), np.float32), pads=[1, 1, 1])
    with pytest.raises(OpError, match=r"max_pool_nd: argument 'x' expected padded spatial dims.*Fix:"):
        ops.max_pool_nd(x, kernel_size=7)
    with pytest.raises(
        OpError, match=r"max_pool_nd: argument 'x' expected at least 3 dims \(\(N, C, \*spatial\)\)"
    ):
        ops.max_pool_nd(np.ones((2, 5)), kernel_size=2)
    with pytest.raises(OpError, match="lp_pool_nd: argument 'p' expected a number > 0"):
        ops.lp_pool_nd(x, kernel_size=2, p=0)
    with pytest.raises(OpError, match="max_unpool_nd: argument 'indices' expected flat indices"):
        ops.max_unpool_nd(x, np.full(x.shape, 99), output_size=(5,))
    with pytest.raises(OpError, match="avg_pool_nd: argument 'stride' expected an int >= 1"):
        ops.avg_pool_nd(x, kernel_size=2, stride=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn])
def test_max_pool_nd_is_exact_in_every_float_dtype(dtype: Any) -> None:
    x = _x(12, (1, 2, 6, 5), dtype)
    got = ops.max_pool_nd(x, kernel_size=(2, 3), stride=2, pads=[1, 1, 0, 1])
    # torch pads symmetrically: the same windows, plus one more row that the crop drops
    want = F.max_pool2d(_t(x), (2, 3), 2, (1, 1))[:, :, : got.shape[2], : got.shape[3]]
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.astype(np.float64), want.numpy())
