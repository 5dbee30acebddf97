"""Pooling: ref against scalar loops written from torch's pooling definition, cpu against ref, every float dtype."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops._dtypes import FLOAT_DTYPES
from opstrata.ops.testing import assert_close, tolerances

SETTINGS = settings(max_examples=12, deadline=None)
DTYPES = pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)


def close(actual: np.ndarray, expected: np.ndarray) -> None:
    rtol, atol = tolerances(expected.dtype)
    if "float8" in expected.dtype.name:
        atol = max(atol, float(ml_dtypes.finfo(expected.dtype).smallest_subnormal))
    assert_close(actual, expected, rtol=rtol, atol=atol)


def out_len(size: int, k: int, s: int, d: int, p0: int, p1: int, ceil: bool) -> int:
    """torch's pooling_output_shape, generalised to asymmetric pads."""
    span = size + p0 + p1 - d * (k - 1) - 1
    n = (math.ceil(span / s) if ceil else span // s) + 1
    if ceil and (n - 1) * s >= size + p0:
        n -= 1
    return n


def pool_loops(x, k, s, pads, d, ceil, mode, count_include_pad=True) -> np.ndarray:
    """One output element at a time in float64 (torch's CPU max/avg pool kernels, scalar form)."""
    x = x.astype(np.float64)
    n_, c_, h, w = x.shape
    pt, pl, pb, pr = pads
    ho, wo = out_len(h, k[0], s[0], d[0], pt, pb, ceil), out_len(w, k[1], s[1], d[1], pl, pr, ceil)
    out = np.zeros((n_, c_, ho, wo))
    for n in range(n_):
        for c in range(c_):
            for i in range(ho):
                for j in range(wo):
                    if mode == "max":
                        vals = [
                            x[n, c, i * s[0] - pt + p * d[0], j * s[1] - pl + q * d[1]]
                            for p in range(k[0])
                            for q in range(k[1])
                            if 0 <= i * s[0] - pt + p * d[0] < h and 0 <= j * s[1] - pl + q * d[1] < w
                        ]
                        out[n, c, i, j] = max(vals, default=-math.inf)  # dilation can skip every real element
                        continue
                    h0, w0 = i * s[0] - pt, j * s[1] - pl
                    h1, w1 = min(h0 + k[0], h + pb), min(w0 + k[1], w + pr)
                    size = (h1 - h0) * (w1 - w0)
                    h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, h), min(w1, w)
                    total = sum(x[n, c, r, q] for r in range(h0, h1) for q in range(w0, w1))
                    out[n, c, i, j] = total / (size if count_include_pad else (h1 - h0) * (w1 - w0))
    return out


@st.composite
def pool_cases(draw: st.DrawFn, dilation: bool) -> dict:
    k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) if dilation else (1, 1)
    eff = (d[0] * (k[0] - 1) + 1, d[1] * (k[1] - 1) + 1)
    ph, pw = st.integers(0, eff[0] // 2), st.integers(0, eff[1] // 2)
    pads = draw(st.one_of(st.tuples(ph, pw).map(lambda p: p * 2), st.tuples(ph, pw, ph, pw)))
    stride = draw(st.one_of(st.none(), st.tuples(st.integers(1, 3), st.integers(1, 3))))
    h = draw(st.integers(max(1, eff[0] - pads[0] - pads[2]), 7))
    w = draw(st.integers(max(1, eff[1] - pads[1] - pads[3]), 7))
    shape = (draw(st.integers(0, 2)), draw(st.integers(1, 3)), h, w)
    return dict(shape=shape, k=k, stride=stride, pads=pads, d=d, ceil=draw(st.booleans()))


def rand(shape, dtype, seed) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(dtype)


def max_attrs(c: dict) -> dict:
    return dict(
        kernel_size=c["k"], stride=c["stride"], padding=c["pads"], dilation=c["d"], ceil_mode=c["ceil"]
    )


def avg_attrs(c: dict, cip: bool) -> dict:
    return dict(
        kernel_size=c["k"], stride=c["stride"], padding=c["pads"], ceil_mode=c["ceil"], count_include_pad=cip
    )


@DTYPES
@SETTINGS
@given(case=pool_cases(dilation=True), seed=st.integers(0, 2**16))
def test_max_pool2d_ref_matches_loops_and_cpu_matches_ref(dtype, case, seed) -> None:
    x = rand(case["shape"], dtype, seed)
    stride = case["stride"] or case["k"]
    expected = pool_loops(x, case["k"], stride, case["pads"], case["d"], case["ceil"], "max").astype(dtype)
    ref = ops.max_pool2d(x, device="ref", **max_attrs(case))
    assert_close(ref, expected, rtol=0, atol=0)  # max is exact
    assert_close(ops.max_pool2d(x, device="cpu", **max_attrs(case)), ref, rtol=0, atol=0)


@DTYPES
@SETTINGS
@given(case=pool_cases(dilation=False), cip=st.booleans(), seed=st.integers(0, 2**16))
def test_avg_pool2d_ref_matches_loops_and_cpu_matches_ref(dtype, case, cip, seed) -> None:
    x = rand(case["shape"], dtype, seed)
    stride = case["stride"] or case["k"]
    expected = pool_loops(x, case["k"], stride, case["pads"], (1, 1), case["ceil"], "avg", cip).astype(dtype)
    ref = ops.avg_pool2d(x, device="ref", **avg_attrs(case, cip))
    close(ref, expected)
    close(ops.avg_pool2d(x, device="cpu", **avg_attrs(case, cip)), ref)


@DTYPES
@SETTINGS
@given(shape=st.lists(st.integers(0, 4), min_size=3, max_size=5), seed=st.integers(0, 2**16))
def test_global_avg_pool_matches_mean_and_cpu_matches_ref(dtype, shape, seed) -> None:
    shape[2:] = [max(1, s) for s in shape[2:]]
    x = rand(tuple(shape), dtype, seed)
    expected = x.astype(np.float64).mean(axis=tuple(range(2, x.ndim)), keepdims=True).astype(dtype)
    ref = ops.global_avg_pool(x, device="ref")
    assert ref.shape == (*x.shape[:2], *[1] * (x.ndim - 2))
    close(ref, expected)
    close(ops.global_avg_pool(x, device="cpu"), ref)


@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_known_values(device) -> None:
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    assert ops.max_pool2d(x, kernel_size=2, device=device)[0, 0].tolist() == [[5, 7], [13, 15]]
    assert ops.avg_pool2d(x, kernel_size=2, device=device)[0, 0].tolist() == [[2.5, 4.5], [10.5, 12.5]]
    # corner window with padding 1: 1 real element (0.0) of 4 counted, or of 1
    assert ops.avg_pool2d(x, kernel_size=2, padding=1, device=device)[0, 0, 0, 0] == 0.0
    assert ops.avg_pool2d(x + 4, kernel_size=2, padding=1, device=device)[0, 0, 0, 0] == 1.0
    assert (
        ops.avg_pool2d(x + 4, kernel_size=2, padding=1, count_include_pad=False, device=device)[0, 0, 0, 0]
        == 4.0
    )
    # ceil_mode keeps a partial last window: 5 -> 3 outputs instead of 2
    assert ops.max_pool2d(np.ones((1, 1, 5, 5)), kernel_size=2, ceil_mode=True, device=device).shape == (
        1,
        1,
        3,
        3,
    )
    assert ops.global_avg_pool(x, device=device).ravel().tolist() == [7.5]


@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_float8_max_pool_with_padding_has_no_nan(device) -> None:
    # float8_e4m3fn has no -inf; padding must not leak NaN into the result
    x = np.full((1, 1, 3, 3), -1.0).astype(ml_dtypes.float8_e4m3fn)
    out = ops.max_pool2d(x, kernel_size=3, stride=1, padding=1, device=device)
    assert out.dtype == x.dtype and np.all(out.astype(np.float32) == -1.0)


@pytest.mark.parametrize("device", ["ref", "cpu"])
@pytest.mark.parametrize(
    ("fn", "pattern"),
    [
        (
            lambda d: ops.max_pool2d(np.ones((2, 3, 4)), kernel_size=2, device=d),
            r"max_pool2d: argument 'x' expected 4 dims",
        ),
        (
            lambda d: ops.max_pool2d(np.ones((1, 1, 4, 4)), kernel_size=2, padding=2, device=d),
            r"max_pool2d: argument 'padding' expected at most half",
        ),
        (
            lambda d: ops.avg_pool2d(np.ones((1, 1, 4, 4)), kernel_size=0, device=d),
            r"avg_pool2d: argument 'kernel_size' expected an int >= 1",
        ),
        (
            lambda d: ops.avg_pool2d(np.ones((1, 1, 2, 2)), kernel_size=3, device=d),
            r"avg_pool2d: argument 'x' expected padded H, W",
        ),
        (
            lambda d: ops.global_avg_pool(np.ones((2, 3)), device=d),
            r"global_avg_pool: argument 'x' expected at least 3 dims",
        ),
    ],
)
def test_errors_name_op_and_argument(device, fn, pattern) -> None:
    with pytest.raises(ops.OpError, match=pattern):
        fn(device)
