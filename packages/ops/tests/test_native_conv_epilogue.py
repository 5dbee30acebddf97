"""A bound conv2d applying its epilogue as the GEMM stores each output (``ops.bind("conv2d", ...,
epilogue=...)``): bit for bit the bound conv followed by that epilogue, NaN / inf / signed zeros
included, at shapes taking the strip tiles and the narrow dot-product path; and the declines."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops

HS = (1 / 6, 0.5, 0.0, 1.0)  # the hard-swish constants the exporters write


@pytest.fixture(scope="module")
def lib(fma_lib: ctypes.CDLL) -> ctypes.CDLL:
    return fma_lib


def _specials(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    flat = a.reshape(-1)
    idx = rng.choice(flat.size, size=min(flat.size, 6), replace=False)
    flat[idx] = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 3.0], np.float32)[: len(idx)]
    return a


def _assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Identical bits (signed zeros told apart), NaN where NaN (a NaN's sign and payload carry nothing)."""
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.int32), want[~nan].view(np.int32))


def _reference(name: str, h: np.ndarray, r: np.ndarray) -> np.ndarray:
    """The epilogue as the elementwise VM runs it: numpy's float32 operations in the same order."""
    f = np.float32
    if name == "relu":
        return np.where(h < 0, f(0), h)
    if name == "clip":
        return np.minimum(np.maximum(h, f(-1.5)), f(2.0))
    if name == "hardswish":
        c = [f(v) for v in HS]
        return np.minimum(np.maximum(h * c[0] + c[1], c[2]), c[3]) * h
    if name == "add":
        return h + r
    s = h + r  # add_relu
    return np.where(s < 0, f(0), s)


def _epilogue(name: str, r: np.ndarray) -> tuple:
    return {"relu": ("relu",), "clip": ("clip", -1.5, 2.0), "hardswish": ("hardswish", *HS), "add": ("add", r),
            "add_relu": ("add_relu", r)}[name]  # fmt: skip


NAMES = ["relu", "clip", "hardswish", "add", "add_relu"]


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(NAMES), n=st.integers(1, 2), ci=st.integers(1, 9), co=st.integers(1, 40),
    hw=st.integers(1, 13), k=st.sampled_from([1, 3]), stride=st.sampled_from([1, 2]), seed=st.integers(0, 99),
)  # fmt: skip
def test_the_fused_epilogue_gives_the_unfused_bits(
    lib, name: str, n: int, ci: int, co: int, hw: int, k: int, stride: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    pad = k // 2
    x = _specials(rng.standard_normal((n, ci, hw, hw)).astype(np.float32), rng)
    w = rng.standard_normal((co, ci, k, k)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    kw = {"stride": stride, "padding": pad}
    plain = np.empty_like(ops.conv2d(x, w, b, **kw))
    ops.bind("conv2d", x, w, b, out=plain, **kw)()
    r = _specials(rng.standard_normal(plain.shape).astype(np.float32), rng)
    out = np.full_like(plain, 7.0)
    call = ops.bind("conv2d", x, w, b, out=out, epilogue=_epilogue(name, r), **kw)
    assert call is not None
    call()
    want = _reference(name, plain, r)
    _assert_same_bits(out, want)


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_give_the_same_bits(lib, threads: int) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 16, 15, 15)).astype(np.float32)
    w = rng.standard_normal((64, 16, 3, 3)).astype(np.float32)
    r = rng.standard_normal((1, 64, 15, 15)).astype(np.float32)
    outs = []
    for t in (1, threads):
        with ops.intra_op_threads(t):
            out = np.empty((1, 64, 15, 15), np.float32)
            ops.bind("conv2d", x, w, None, out=out, padding=1, epilogue=("add_relu", r))()
            outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_what_it_cannot_fuse_is_declined(lib) -> None:
    """Unknown names, wrong constants, a residual of another shape / dtype / aliasing the output, and a
    depthwise conv on planes of 16+ columns (the plane loop) or with a residual give None: the caller keeps
    its separate epilogue. (Narrower depthwise planes fuse kinds 1-3: test_native_depthwise_lanes.py.)"""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    out = np.empty((1, 8, 6, 6), np.float32)
    for bad in [("gelu",), ("silu",), ("clip", 0.0), ("hardswish", 1.0), ("add", np.empty((1, 8, 6, 5), np.float32)),
                ("add", np.empty((1, 8, 6, 6), np.float64)), ("add", out), "relu", ()]:  # fmt: skip
        assert ops.bind("conv2d", x, w, None, out=out, padding=1, epilogue=bad) is None, bad
    dw = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    wide = rng.standard_normal((1, 4, 6, 16)).astype(np.float32)
    assert ops.bind("conv2d", wide, dw, None, out=np.empty((1, 4, 6, 16), np.float32), padding=1, groups=4,
                    epilogue=("relu",)) is None  # fmt: skip
    res = np.zeros((1, 4, 6, 6), np.float32)
    assert ops.bind("conv2d", x, dw, None, out=np.empty((1, 4, 6, 6), np.float32), padding=1, groups=4,
                    epilogue=("add", res)) is None  # fmt: skip
    assert set(ops.CONV_EPILOGUES) == set(NAMES)
