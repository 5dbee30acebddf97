"""The native convolutions without an im2col buffer -- direct (``opstrata_conv_direct_f32``: stride 1,
output rows as wide as the input's) and gathered strips (``opstrata_conv_gather_f32``: strided and other
layers) -- bit for bit the C im2col + strip GEMM they replace (the same multiply-add chain per output),
within fp32 rounding of a float64 reference, the same bits at any thread count, chosen by ``ops.conv2d``
and ``ops.bind`` where they apply, and their refusals."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops.kernels.conv import _check_conv, conv2d_ref
from opstrata.ops.native import kernels as nk, library as _native
from opstrata.ops.native.build import PORTABLE_CFLAGS


@pytest.fixture(scope="module")
def lib(fma_lib: ctypes.CDLL) -> ctypes.CDLL:
    return fma_lib


def _direct(lib, x, w, b, g, threads: int = 1, epi=None) -> np.ndarray:
    out = np.full((x.shape[0], w.shape[0], *g.out_hw), np.nan, np.float32)
    packed = nk._direct_weights(w, g.groups)
    args = list(nk._direct_conv_args(x, packed, w.shape, b, out, g, epi))
    args[17] = threads
    assert lib.opstrata_conv_direct_f32(*args) == 0
    return out


def _im2col_gemm(lib, x, w, b, g) -> np.ndarray:
    """The path the direct kernel replaces: C im2col into columns, then the strip GEMM per image."""
    n, _c = x.shape[:2]
    o, cg, kh, kw = w.shape
    ho, wo = g.out_hw
    cols = np.empty((n, g.groups, cg * kh * kw, ho * wo), np.float32)
    lib.opstrata_im2col_f32(*nk._im2col_args(x, cols, g, kh, kw))
    out = np.full((n, o, ho, wo), np.nan, np.float32)
    wm = w.reshape(g.groups, o // g.groups, cg * kh * kw)
    out4 = out.reshape(n, g.groups, o // g.groups, ho * wo)
    for img in range(n):
        assert lib.opstrata_sgemm_fma_f32(*nk._fma_conv_args(wm, cols, out4, b, img)) == 0
    return out


def _case(seed, n, c, o, h, w, kh, kw, dh, dw, pt, pl, groups, bias=True):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c * groups, h, w)).astype(np.float32)
    wt = rng.standard_normal((o * groups, c, kh, kw)).astype(np.float32)
    b = rng.standard_normal(o * groups).astype(np.float32) if bias else None
    pr = dw * (kw - 1) - pl  # the right pad that keeps the width
    pads = (pt, pl, max(0, dh * (kh - 1) - pt), pr)
    return x, wt, b, pads


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 2), c=st.integers(1, 6), o=st.integers(1, 30), h=st.integers(1, 19), w=st.integers(1, 21),
    kh=st.integers(1, 5), kw=st.integers(1, 5), dh=st.integers(1, 2), dw=st.integers(1, 2),
    groups=st.integers(1, 3), bias=st.booleans(), data=st.data(),
)  # fmt: skip
def test_direct_gives_the_im2col_gemm_bits(lib, n, c, o, h, w, kh, kw, dh, dw, groups, bias, data) -> None:
    """Any kernel size, dilation, top padding and width-keeping left / right padding, groups, images and
    output widths (a remainder of 1-16 columns joins the last strip): within fp32 rounding of the
    reference, and above 16 outputs per plane (where im2col's GEMM takes the strips, not the narrow dot
    products) the same bits as im2col + the strip GEMM."""
    pt = data.draw(st.integers(0, dh * (kh - 1)))
    pl = data.draw(st.integers(0, dw * (kw - 1)))
    x, wt, b, pads = _case(n * 31 + o, n, c, o, h, w, kh, kw, dh, dw, pt, pl, groups, bias)
    try:
        g = _check_conv(x, wt, b, 1, pads, (dh, dw), groups)
    except ops.OpError:
        return  # the dilated kernel is taller than the padded image
    assert g.out_hw[1] == w
    got = _direct(lib, x, wt, b, g)
    if g.out_hw[0] * g.out_hw[1] > 16:
        np.testing.assert_array_equal(got.view(np.int32), _im2col_gemm(lib, x, wt, b, g).view(np.int32))
    want = conv2d_ref(x.astype(np.float64), wt.astype(np.float64), None if b is None else b.astype(np.float64),
                      padding=pads, dilation=(dh, dw), groups=groups)  # fmt: skip
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("shape", [(64, 64, 16), (16, 64, 15), (32, 48, 31)])
def test_bits_do_not_depend_on_the_thread_count(lib, shape) -> None:
    """Threads split column strips and row blocks of 24, never a sum: 1, 2, 3 and 8 threads agree."""
    c, o, hw = shape
    x, wt, b, pads = _case(hw, 1, c, o, hw, hw, 3, 3, 1, 1, 1, 1, 1)
    g = _check_conv(x, wt, b, 1, pads, 1, 1)
    one = _direct(lib, x, wt, b, g)
    for threads in (2, 3, 8):
        np.testing.assert_array_equal(_direct(lib, x, wt, b, g, threads=threads), one)


def test_special_values_reach_the_outputs_they_touch(lib) -> None:
    """A NaN in the image reaches the outputs whose window holds it (padding zeros do not stop it) and no
    other; an inf weight row gives inf or NaN in its channel only."""
    x, wt, b, pads = _case(3, 1, 4, 8, 9, 9, 3, 3, 1, 1, 1, 1, 1)
    x[0, 2, 0, 0] = np.nan
    g = _check_conv(x, wt, b, 1, pads, 1, 1)
    got = _direct(lib, x, wt, b, g)
    nan = np.isnan(got[0])
    assert nan[:, :2, :2].all() and nan.sum() == 8 * 4
    wt[5, 1, 1, 1] = np.inf
    got = _direct(lib, x, wt, b, g)
    assert not np.isfinite(got[0, 5]).any() and np.isfinite(np.delete(got[0], 5, axis=0)[:, 3:, 3:]).all()


@pytest.mark.parametrize("epilogue", ["relu", "add_relu"])
def test_ops_conv2d_and_bind_take_the_direct_kernel(lib, epilogue: str) -> None:
    """A 3x3 pad-1 convolution runs on the direct kernel eagerly and bound (one native call, its epilogue
    applied as it stores), with the im2col path's bits; a strided or narrow one keeps im2col."""
    x, wt, b, _pads = _case(7, 2, 12, 40, 14, 14, 3, 3, 1, 1, 1, 1, 1)
    wt.flags.writeable = False  # as a session's weights: packed once, one native call
    g = _check_conv(x, wt, b, 1, 1, 1, 1)
    assert nk._direct_conv(g, x, 3, 3)
    want = _im2col_gemm(lib, x, wt, b, g)
    eager = ops.conv2d(x, wt, b, padding=1)
    np.testing.assert_array_equal(eager.view(np.int32), want.view(np.int32))
    out = np.empty_like(eager)
    res = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    epi = ("relu",) if epilogue == "relu" else ("add_relu", res)
    call = ops.bind("conv2d", x, wt, b, padding=1, out=out, epilogue=epi)
    assert call is not None and getattr(call, "name", "") == "opstrata_conv_direct_f32"
    call()
    h = want if epilogue == "relu" else want + res
    np.testing.assert_array_equal(out, np.where(h < 0, np.float32(0), h))
    strided = _check_conv(x, wt, b, 2, 1, 1, 1)
    narrow = _check_conv(x[:, :, :4, :4], wt, b, 1, 1, 1, 1)  # 16 outputs: the narrow products
    assert not nk._direct_conv(strided, x, 3, 3) and not nk._direct_conv(narrow, x[:, :, :4, :4], 3, 3)


def test_the_kernel_refuses_what_it_cannot_run(lib) -> None:
    """A bad epilogue kind, more than 64 taps and groups that do not divide the channels are refused
    (-3) and nothing is written; the binding's error names the kernel, the code and the fix."""
    x, wt, b, pads = _case(1, 1, 4, 8, 9, 9, 3, 3, 1, 1, 1, 1, 1)
    g = _check_conv(x, wt, b, 1, pads, 1, 1)
    out = np.full((1, 8, 9, 9), 7.0, np.float32)
    packed = nk._direct_weights(wt, 1)
    args = list(nk._direct_conv_args(x, packed, wt.shape, b, out, g))
    bad_kind = list(args)
    bad_kind[18] = 9
    too_many = list(args)
    too_many[10], too_many[11] = 9, 9  # 81 taps
    bad_groups = list(args)
    bad_groups[9] = 3
    for a in (bad_kind, too_many, bad_groups):
        assert lib.opstrata_conv_direct_f32(*a) == -3
    assert (out == 7.0).all()
    err = nk._direct_conv_error(-3)
    assert "conv2d (direct, native)" in str(err) and "code -3" in str(err) and "rebuild" in str(err)


def test_a_portable_library_has_no_direct_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Built without AVX-512 the entry point exists and answers -2, and ops keeps im2col + GEMM there (it
    asks fma_gemm_available first)."""
    monkeypatch.setenv("OPSTRATA_CACHE_DIR", str(tmp_path / "cache"))
    portable, _ = ops.build_library(
        "opstrata_native_portable", _native.SOURCE, _native._SIGNATURES, cflags=PORTABLE_CFLAGS,
        abi=("opstrata_native_abi", _native.ABI),
    )  # fmt: skip
    x, wt, b, pads = _case(2, 1, 3, 5, 8, 8, 3, 3, 1, 1, 1, 1, 1)
    g = _check_conv(x, wt, b, 1, pads, 1, 1)
    out = np.empty((1, 5, 8, 8), np.float32)
    packed = nk._direct_weights(wt, 1)
    assert portable.opstrata_conv_direct_f32(*nk._direct_conv_args(x, packed, wt.shape, b, out, g)) == -2
    assert portable.opstrata_conv_gather_f32(*nk._gather_conv_args(x, wt, b, out, g)) == -2
    assert not nk.fma_gemm_available(portable)


# --------------------------------------------------------------------------------------------------
# strided (and other not-same-width) convolutions: columns gathered strip by strip
# --------------------------------------------------------------------------------------------------


def _gather(lib, x, w, b, g, threads: int = 1, epi=None) -> np.ndarray:
    out = np.full((x.shape[0], w.shape[0], *g.out_hw), np.nan, np.float32)
    args = list(nk._gather_conv_args(x, w, b, out, g, epi))
    args[20] = threads
    assert lib.opstrata_conv_gather_f32(*args) == 0
    return out


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 2), c=st.integers(1, 5), o=st.integers(1, 30), h=st.integers(1, 24), w=st.integers(1, 24),
    kh=st.integers(1, 4), kw=st.integers(1, 4), sh=st.integers(1, 3), sw=st.integers(1, 3), dh=st.integers(1, 2),
    groups=st.integers(1, 3), bias=st.booleans(), data=st.data(),
)  # fmt: skip
def test_gathered_strips_give_the_im2col_gemm_bits(
    lib, n, c, o, h, w, kh, kw, sh, sw, dh, groups, bias, data
):
    """Any stride, kernel, dilation and padding: within fp32 rounding of the reference, and above 16 outputs
    per plane the bits of im2col + the strip GEMM (the same columns through the same tiles)."""
    pads = tuple(data.draw(st.integers(0, 2)) for _ in range(4))
    rng = np.random.default_rng(h * 31 + w)
    x = rng.standard_normal((n, c * groups, h, w)).astype(np.float32)
    wt = rng.standard_normal((o * groups, c, kh, kw)).astype(np.float32)
    b = rng.standard_normal(o * groups).astype(np.float32) if bias else None
    try:
        g = _check_conv(x, wt, b, (sh, sw), pads, (dh, 1), groups)
    except ops.OpError:
        return
    got = _gather(lib, x, wt, b, g)
    if g.out_hw[0] * g.out_hw[1] > 16:
        np.testing.assert_array_equal(got.view(np.int32), _im2col_gemm(lib, x, wt, b, g).view(np.int32))
    want = conv2d_ref(x.astype(np.float64), wt.astype(np.float64), None if b is None else b.astype(np.float64),
                      stride=(sh, sw), padding=pads, dilation=(dh, 1), groups=groups)  # fmt: skip
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("shape", [(3, 64, 64, 7, 2, 3), (64, 128, 16, 3, 2, 1), (16, 40, 9, 3, 2, 1)])
def test_gathered_bits_do_not_depend_on_the_thread_count(lib, shape) -> None:
    """Threads take strips, or row blocks of 24 when there are fewer strips than threads: 1, 2, 3 and 8
    threads give the same bits."""
    c, o, hw, k, s, p = shape
    rng = np.random.default_rng(hw)
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    wt = rng.standard_normal((o, c, k, k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    g = _check_conv(x, wt, b, s, p, 1, 1)
    one = _gather(lib, x, wt, b, g)
    for threads in (2, 3, 8):
        np.testing.assert_array_equal(_gather(lib, x, wt, b, g, threads=threads), one)


def test_ops_conv2d_and_bind_take_the_gathered_strips(lib) -> None:
    """A stride-2 convolution with more than 16 outputs per plane runs on the gathered strips eagerly and
    bound (its hard-swish epilogue applied after each tile), with im2col's bits; a refusal's error names
    the kernel and the fix."""
    x, wt, b, _ = _case(9, 1, 6, 24, 20, 20, 3, 3, 1, 1, 1, 1, 1)
    g = _check_conv(x, wt, b, 2, 1, 1, 1)
    assert nk._gather_conv(g, x, 3, 3) and not nk._direct_conv(g, x, 3, 3)
    want = _im2col_gemm(lib, x, wt, b, g)
    np.testing.assert_array_equal(ops.conv2d(x, wt, b, stride=2, padding=1), want)
    out = np.empty_like(want)
    call = ops.bind(
        "conv2d", x, wt, b, stride=2, padding=1, out=out, epilogue=("hardswish", 1 / 6, 0.5, 0.0, 1.0)
    )
    assert call is not None and call.name == "opstrata_conv_gather_f32"
    call()
    f = np.float32
    np.testing.assert_array_equal(out, np.minimum(np.maximum(want * f(1 / 6) + f(0.5), f(0)), f(1)) * want)
    args = list(nk._gather_conv_args(x, wt, b, out, g))
    args[9] = 4  # groups not dividing 6 channels
    assert lib.opstrata_conv_gather_f32(*args) == -3
    assert "gathered strips" in str(nk._gather_conv_error(-3)) and "panel" in str(nk._gather_conv_error(-1))


@pytest.mark.parametrize("hw", [9, 3])
def test_a_weight_that_may_change_is_packed_again_on_every_call(lib, hw: int) -> None:
    """The direct (9x9) and lanes (3x3) binders pack a read-only weight once (one native call) and a writeable
    one on every call (a weight fed as a model input): a changed weight gives the new result."""
    rng = np.random.default_rng(hw)
    x = rng.standard_normal((1, 5, hw, hw)).astype(np.float32)
    w = rng.standard_normal((7, 5, 3, 3)).astype(np.float32)
    out = np.empty((1, 7, hw, hw), np.float32)
    call = ops.bind("conv2d", x, w, padding=1, out=out)
    call()
    np.testing.assert_array_equal(out, ops.conv2d(x, w, padding=1))
    w *= 2
    call()
    np.testing.assert_array_equal(out, ops.conv2d(x, w, padding=1))
    frozen = w.copy()
    frozen.flags.writeable = False
    view = w[:, :3]
    view.flags.writeable = False  # a read-only view of memory that can still change
    assert (
        nk.immutable(frozen)
        and nk.immutable(frozen[:, :3])
        and not nk.immutable(w)
        and not nk.immutable(view)
    )
    once = ops.bind("conv2d", x, frozen, padding=1, out=out)
    steps = getattr(once, "steps", [once])
    assert all(isinstance(s, nk.NativeCall) for s in steps)
    once()
    np.testing.assert_array_equal(out, ops.conv2d(x, frozen, padding=1))
