"""The native max pooling's stride-2 path (ResNet's, SqueezeNet's and MobileNet's pools: taps as stride-2
lanes of registers, NaN checked per window and the plane redone keeping it): the reference's values for any
kernel height and width up to 16, stride, padding, dilation and ceil mode, NaN / inf / signed zeros kept,
and the separable passes' bits where both apply."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops.native import library as _native


@pytest.fixture(scope="module", autouse=True)
def _library() -> None:
    if _native.library() is None:
        pytest.skip("the native library is not available on this machine")


def _same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal values with NaN where NaN, and signed zeros told apart."""
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@settings(max_examples=120, deadline=None)
@given(
    c=st.integers(1, 5), h=st.integers(1, 40), w=st.integers(1, 70), kh=st.integers(1, 5), kw=st.integers(1, 16),
    sh=st.integers(1, 3), dh=st.integers(1, 2), ceil=st.booleans(), specials=st.booleans(), data=st.data(),
)  # fmt: skip
def test_stride_two_pools_give_the_reference(c, h, w, kh, kw, sh, dh, ceil, specials, data) -> None:
    """Every output equals the float64 reference (the max over the window's in-image taps), NaN winning,
    -inf where a window holds no tap; rows wider than 16 outputs span several vector chunks."""
    ph = data.draw(st.integers(0, (dh * (kh - 1) + 1) // 2))
    pw = data.draw(st.integers(0, kw // 2))
    rng = np.random.default_rng(h * 97 + w)
    x = rng.standard_normal((2, c, h, w)).astype(np.float32)
    x[0, 0, 0, 0] = -0.0
    if specials:
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=min(flat.size, 5), replace=False)
        flat[idx] = np.array([np.nan, np.inf, -np.inf, np.nan, 0.0], np.float32)[: len(idx)]
    kw_ = {
        "kernel_size": (kh, kw),
        "stride": (sh, 2),
        "padding": (ph, pw),
        "dilation": (dh, 1),
        "ceil_mode": ceil,
    }
    try:
        want = ops.max_pool2d(x.astype(np.float64), device="ref", **kw_).astype(np.float32)
    except ops.OpError:
        return  # the window does not fit the padded image
    got = ops.max_pool2d(x, **kw_)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", [(3, 31, 31), (2, 15, 15), (4, 8, 40)])
def test_stride_two_keeps_the_separable_passes_bits(shape) -> None:
    """Ties between +0 and -0 resolve as the separable passes resolve them (the first tap in row-then-column
    order wins), so the stride-2 path's bits equal stride 1's outputs taken every other column."""
    rng = np.random.default_rng(len(shape))
    x = rng.choice(np.array([0.0, -0.0, -1.0], np.float32), size=(1, *shape))
    one = ops.max_pool2d(x, kernel_size=3, stride=(2, 1))
    two = ops.max_pool2d(x, kernel_size=3, stride=(2, 2))
    _same(two, one[..., ::2])


def test_a_nan_after_finite_taps_is_kept_and_its_plane_only_redone() -> None:
    """A NaN in the middle of a window wins over the finite taps before and after it; other planes keep
    their values."""
    x = np.arange(2 * 9 * 9, dtype=np.float32).reshape(1, 2, 9, 9)
    x[0, 1, 4, 4] = np.nan
    got = ops.max_pool2d(x, kernel_size=3, stride=2)
    assert np.isnan(got[0, 1, 1:3, 1:3]).all() and np.isnan(got[0, 1]).sum() == 4
    np.testing.assert_array_equal(got[0, 0], ops.max_pool2d(x[:, :1], kernel_size=3, stride=2)[0, 0])
