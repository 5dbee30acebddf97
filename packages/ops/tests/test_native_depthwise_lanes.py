"""The channels-in-lanes depthwise convolution (``opstrata_depthwise_lanes_f32``: 16 channels per AVX-512
vector, for planes narrower than a vector): the plane loop's bits (each output the bias plus its taps in
row-major order), within fp32 rounding of float64; the same bits at any thread count; its epilogues (ReLU,
clip, hard-swish) equal to the unfused output followed by the same float32 operations; chosen by conv2d
(eager and bound) for narrow planes; its refusals."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from test_native import depthwise64

import opstrata.ops as ops
from opstrata.ops.native import kernels as nk


@pytest.fixture(scope="module")
def lib(fma_lib: ctypes.CDLL) -> ctypes.CDLL:
    return fma_lib


def _out_hw(h, wd, k, stride, dil, pads) -> tuple[int, int]:
    ho = (h + pads[0] + pads[2] - dil[0] * (k[0] - 1) - 1) // stride[0] + 1
    wo = (wd + pads[1] + pads[3] - dil[1] * (k[1] - 1) - 1) // stride[1] + 1
    return ho, wo


def _run(lib, fn, x, w, b, k, stride, dil, pads, threads=1, act=None, params=None) -> tuple[int, np.ndarray]:
    """(return code, output) of one native depthwise entry point on NCHW ``x`` (output pre-filled with NaN)."""
    n, c, h, wd = x.shape
    ho, wo = _out_hw(h, wd, k, stride, dil, pads)
    out = np.full((n, c, ho, wo), np.nan, np.float32)
    dims = (n, c, h, wd, *k, *stride, *dil, pads[0], pads[1], ho, wo, threads)
    ptrs = (x.ctypes.data, w.ctypes.data, None if b is None else b.ctypes.data, out.ctypes.data)
    extra = () if act is None else (act, None if params is None else params.ctypes.data)
    return getattr(lib, fn)(*ptrs, *dims, *extra), out


def _lanes(lib, *args, **kw) -> np.ndarray:
    rc, out = _run(lib, "opstrata_depthwise_lanes_f32", *args, act=kw.pop("act", 0), **kw)
    assert rc == 0
    return out


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 40),
    h=st.integers(1, 9),
    wd=st.integers(1, 15),
    k=st.tuples(st.integers(1, 5), st.integers(1, 5)),
    stride=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    dil=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    pads=st.tuples(*[st.integers(0, 2)] * 4),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_lanes_give_the_plane_loops_bits(lib, n, c, h, wd, k, stride, dil, pads, with_bias, seed) -> None:
    """Any channels (a partial last block of 16 included), kernel, stride, dilation and padding: the bits
    of the plane / 8-channel loop, within fp32 tolerance of the float64 definition, the same at 2 threads."""
    ho, wo = _out_hw(h, wd, k, stride, dil, pads)
    if ho < 1 or wo < 1:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    w = rng.standard_normal((c, 1, *k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32) if with_bias else None
    got = _lanes(lib, x, w, b, k, stride, dil, pads)
    rc, plane = _run(lib, "opstrata_depthwise_conv2d_f32", x, w, b, k, stride, dil, pads)
    assert rc == 0
    np.testing.assert_allclose(got, depthwise64(x, w, b, stride, pads, dil), rtol=1e-5, atol=1e-5)
    # the same FMA chain as the plane loop, except that a tap in the padding adds w * 0 where the
    # plane loop of a narrow image skips it: equal values (a signed zero may differ)
    np.testing.assert_array_equal(got, plane)
    np.testing.assert_array_equal(_lanes(lib, x, w, b, k, stride, dil, pads, threads=2), got)


def test_the_epilogues_give_the_unfused_bits(lib) -> None:
    """ReLU, clip and hard-swish applied as each output is stored: the plain output followed by the same
    float32 operations (hard-swish as ``min(max(h * alpha + beta, 0), 1) * h``, each rounded)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 37, 6, 6)).astype(np.float32)
    w = rng.standard_normal((37, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(37).astype(np.float32)
    geo = ((3, 3), (1, 1), (1, 1), (1, 1, 1, 1))
    plain = _lanes(lib, x, w, b, *geo)
    np.testing.assert_array_equal(
        _lanes(lib, x, w, b, *geo, act=1), np.where(plain < 0, np.float32(0), plain)
    )
    clip = np.array([-0.5, 0.75, 0, 0], np.float32)
    np.testing.assert_array_equal(_lanes(lib, x, w, b, *geo, act=2, params=clip), np.clip(plain, -0.5, 0.75))
    hs = np.array([1 / 6, 0.5, 0.0, 1.0], np.float32)
    t = np.minimum(np.maximum(plain * hs[0] + hs[1], hs[2]), hs[3])
    np.testing.assert_array_equal(_lanes(lib, x, w, b, *geo, act=3, params=hs), t * plain)


def test_refuses_a_residual_or_unknown_epilogue(lib) -> None:
    """Kinds 4 and 5 (a residual) and unknown kinds return -3 without writing; a kind that needs
    constants refuses a NULL pointer."""
    x = np.ones((1, 16, 4, 4), np.float32)
    w = np.ones((16, 1, 3, 3), np.float32)
    geo = ((3, 3), (1, 1), (1, 1), (1, 1, 1, 1))
    for act, params in ((4, None), (5, None), (9, None), (-1, None), (2, None)):
        rc, out = _run(lib, "opstrata_depthwise_lanes_f32", x, w, None, *geo, act=act, params=params)
        assert rc == -3 and np.isnan(out).all()
    # a plane whose lane offsets (16 x its pixels) pass 32 bits is refused before any memory is read
    big = (1, 1, 1 << 14, 1 << 14, 3, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, None)
    assert lib.opstrata_depthwise_lanes_f32(x.ctypes.data, w.ctypes.data, None, x.ctypes.data, *big) == -4
    with pytest.raises(ValueError, match="epilogue"):
        raise nk._depthwise_lanes_error(-3, 4, 4)
    with pytest.raises(ValueError, match="32-bit"):
        raise nk._depthwise_lanes_error(-4, 4, 4)


@pytest.mark.parametrize("hw, k, stride", [(8, 5, 1), (8, 3, 2), (4, 3, 1), (2, 5, 1), (16, 5, 2)])
def test_conv2d_on_narrow_planes_takes_the_lanes(lib, hw: int, k: int, stride: int) -> None:
    """A depthwise conv2d whose planes are narrower than 16 runs the lanes kernel eagerly and bound (the
    same bits); bound, it applies a ReLU / hard-swish epilogue itself and declines a residual one."""
    rng = np.random.default_rng(hw * 10 + k)
    c = 40
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    kw = {"stride": stride, "padding": k // 2, "groups": c}
    eager = ops.conv2d(x, w, b, **kw)
    np.testing.assert_allclose(
        eager, depthwise64(x, w, b, (stride,) * 2, (k // 2,) * 4, (1, 1)), rtol=1e-5, atol=1e-5
    )
    out = np.empty_like(eager)
    call = ops.bind("conv2d", x, w, b, out=out, **kw)
    assert getattr(call, "name", None) == "opstrata_depthwise_lanes_f32"
    call()
    np.testing.assert_array_equal(out, eager)
    relu = ops.bind("conv2d", x, w, b, out=out, epilogue=("relu",), **kw)
    assert relu is not None
    relu()
    np.testing.assert_array_equal(out, np.maximum(eager, 0))
    hs = ops.bind("conv2d", x, w, b, out=out, epilogue=("hardswish", 1 / 6, 0.5, 0.0, 1.0), **kw)
    assert hs is not None
    hs()
    t = np.minimum(np.maximum(eager * np.float32(1 / 6) + np.float32(0.5), np.float32(0)), np.float32(1))
    np.testing.assert_array_equal(out, t * eager)
    res = rng.standard_normal(out.shape).astype(np.float32)
    assert ops.bind("conv2d", x, w, b, out=out, epilogue=("add", res), **kw) is None


def test_wide_planes_keep_the_plane_loop(lib) -> None:
    """Planes of 16 columns or more run the plane loop (their rows fill whole vectors)."""
    x = np.ones((1, 16, 16, 16), np.float32)
    w = np.ones((16, 1, 3, 3), np.float32)
    out = np.empty((1, 16, 16, 16), np.float32)
    call = ops.bind("conv2d", x, w, None, padding=1, groups=16, out=out)
    assert getattr(call, "name", None) == "opstrata_depthwise_conv2d_f32"
    assert ops.bind("conv2d", x, w, None, padding=1, groups=16, out=out, epilogue=("relu",)) is None
