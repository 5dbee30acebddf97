"""The native library's convolution GEMM (``opstrata_sgemm_fma_f32``): values against a float64
reference, bits fixed per shape (not by the tiling or the thread count), the portable loop, the conv path
choosing it; and the worker pool the GEMM, im2col, depthwise and max pooling split their work over."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops.kernels.conv import conv2d_cpu
from opstrata.ops.native import library as _native
from opstrata.ops.native.build import PORTABLE_CFLAGS
from opstrata.ops.native.kernels import fma_gemm_available


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    built = _native.library()
    if built is None:
        pytest.skip("the native library is not available on this machine")
    return built


def _gemm(
    lib: ctypes.CDLL, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None, threads: int = 1
) -> np.ndarray:
    """bias + a @ b through the C entry point; a (G, M, K) or (M, K) shared, b (G, K, N)."""
    groups, k, n = b.shape
    m = a.shape[-2]
    c = np.full((groups, m, n), np.nan, np.float32)
    sa = m * k if a.ndim == 3 else 0
    rc = lib.opstrata_sgemm_fma_f32(
        a.ctypes.data, b.ctypes.data, c.ctypes.data, None if bias is None else bias.ctypes.data,
        m, n, k, k, n, n, groups, sa, k * n, m * n, m if bias is not None and bias.ndim == 2 else 0, threads,
    )  # fmt: skip
    assert rc == 0
    return c


def _reference(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The float64 product and a bound on float32 rounding error for each entry (k terms)."""
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    if bias is not None:
        want = want + (bias[..., :, None] if bias.ndim == 2 else bias[:, None])
        scale = scale + np.abs(bias[..., :, None] if bias.ndim == 2 else bias[:, None])
    k = a.shape[-1]
    return want, 2.0 * (k + 2) * np.finfo(np.float32).eps * scale + 1e-30


@settings(max_examples=80, deadline=None)
@given(
    m=st.integers(1, 40), k=st.integers(1, 70), n=st.integers(1, 70), groups=st.integers(1, 3),
    shared=st.booleans(), bias=st.booleans(), seed=st.integers(0, 999),
)  # fmt: skip
def test_the_gemm_matches_float64_within_the_fp32_error_bound(
    lib, m, k, n, groups, shared, bias, seed
) -> None:
    """Narrow (n <= 16: dot products along k) and wide (the register strips) products, a weight shared
    by every group or one per group, with and without the bias: within k-term fp32 rounding, every
    entry written."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k) if shared else (groups, m, k)).astype(np.float32)
    b = rng.standard_normal((groups, k, n)).astype(np.float32)
    bv = rng.standard_normal((groups, m)).astype(np.float32) if bias else None
    got = _gemm(lib, a, b, bv)
    want, tol = _reference(np.broadcast_to(a, (groups, m, k)), b, bv)
    assert np.all(np.abs(got - want) <= tol), np.max(np.abs(got - want) / tol)


@pytest.mark.parametrize("n", [4, 9, 16, 17, 33, 64])
def test_bits_depend_on_the_shape_not_on_the_row_tiling(lib, n: int) -> None:
    """Any row's bits are the same whichever register tile (or remainder) computed it: the product of a
    row slice equals the matching rows of the full product exactly, and a rerun gives the same bits."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal((1, 37, 300)).astype(np.float32)
    b = rng.standard_normal((1, 300, n)).astype(np.float32)
    full = _gemm(lib, a, b)
    np.testing.assert_array_equal(full, _gemm(lib, a, b))
    for start in (1, 3, 13, 25, 36):
        np.testing.assert_array_equal(_gemm(lib, np.ascontiguousarray(a[:, start:]), b), full[:, start:])


@pytest.mark.parametrize("m, k, n", [(256, 300, 16), (70, 400, 100), (24, 2000, 40), (512, 1024, 4)])
def test_bits_do_not_depend_on_the_thread_count(lib, m: int, k: int, n: int) -> None:
    """Threads split rows and column strips, never a sum: 1, 2, 3 and 8 threads give the same bits (the
    shapes are large enough to be split: >= 1M multiply-adds per thread)."""
    rng = np.random.default_rng(m)
    a = rng.standard_normal((1, m, k)).astype(np.float32)
    b = rng.standard_normal((1, k, n)).astype(np.float32)
    bias = rng.standard_normal((1, m)).astype(np.float32)
    one = _gemm(lib, a, b, bias, threads=1)
    for threads in (2, 3, 8):
        np.testing.assert_array_equal(_gemm(lib, a, b, bias, threads=threads), one)


def test_threaded_calls_from_many_python_threads(lib) -> None:
    """Several Python threads calling threaded products at once: one runs on the pool, the others alone;
    every result is right and nothing waits forever."""
    import concurrent.futures as cf

    rng = np.random.default_rng(5)
    a = rng.standard_normal((1, 128, 512)).astype(np.float32)
    b = rng.standard_normal((1, 512, 96)).astype(np.float32)
    want = _gemm(lib, a, b)
    with cf.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: _gemm(lib, a, b, threads=4), range(16)))
    for got in results:
        np.testing.assert_array_equal(got, want)


def test_special_values_propagate(lib) -> None:
    """inf and NaN in either operand reach the outputs they touch, as in any IEEE product."""
    a = np.ones((1, 5, 20), np.float32)
    b = np.ones((1, 20, 40), np.float32)
    a[0, 1, 3] = np.nan
    b[0, 7, 30] = np.inf
    got = _gemm(lib, a, b)[0]
    assert np.isnan(got[1]).all()
    assert np.isinf(got[[0, 2, 3, 4], 30]).all() and np.isfinite(got[[0, 2, 3, 4], :30]).all()


def test_the_portable_loop_gives_the_strips_bits(
    lib, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built without -march=native the library has only the portable fused multiply-add loop and says so;
    its wide products carry the AVX-512 strips' bits (the same fma chain over k)."""
    monkeypatch.setenv("OPSTRATA_CACHE_DIR", str(tmp_path / "cache"))
    portable, _ = ops.build_library(
        "opstrata_native_portable", _native.SOURCE, _native._SIGNATURES, cflags=PORTABLE_CFLAGS,
        abi=("opstrata_native_abi", _native.ABI),
    )  # fmt: skip
    assert portable.opstrata_sgemm_fma_fast() == 0
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 13, 50)).astype(np.float32)
    b = rng.standard_normal((2, 50, 45)).astype(np.float32)
    bias = rng.standard_normal((2, 13)).astype(np.float32)
    got = _gemm(portable, a, b, bias)
    want, tol = _reference(a, b, bias)
    assert np.all(np.abs(got - want) <= tol)
    if fma_gemm_available(lib):
        np.testing.assert_array_equal(got, _gemm(lib, a, b, bias))


@pytest.mark.parametrize("hw", [2, 4, 8, 13])
def test_conv2d_without_the_fma_tiles_keeps_numpys_gemm(
    lib, hw: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library without the AVX-512 tiles: the convolution keeps numpy's GEMM, bit for bit; with them
    (where built) it is within fp32 tolerance of that and bound calls give its bits."""
    rng = np.random.default_rng(hw)
    x = rng.standard_normal((1, 6, hw, hw)).astype(np.float32)
    w = rng.standard_normal((10, 6, 3, 3)).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    kw = {"stride": 1, "padding": 1}
    fast = fma_gemm_available(lib)
    with_tiles = ops.conv2d(x, w, b, **kw)
    monkeypatch.setattr(lib, "_opstrata_fma_fast", False, raising=False)
    np.testing.assert_array_equal(ops.conv2d(x, w, b, **kw), conv2d_cpu(x, w, b, **kw))
    monkeypatch.setattr(lib, "_opstrata_fma_fast", fast, raising=False)
    ops.testing.assert_close(with_tiles, conv2d_cpu(x, w, b, **kw))
    out = np.empty_like(with_tiles)
    call = ops.bind("conv2d", x, w, b, out=out, **kw)
    assert call is not None
    call()
    np.testing.assert_array_equal(out, with_tiles)


@pytest.mark.parametrize(
    "case",
    ["conv3x3", "conv1x1", "depthwise_planes", "depthwise_channels", "max_pool", "max_pool_nan"],
)
def test_native_conv_and_pool_bits_do_not_depend_on_intra_op_threads(lib, case: str) -> None:
    """im2col, the GEMM, depthwise (both layouts) and max pooling split planes, channel blocks, rows and
    strips over the session's threads (ops.intra_op_threads); 1, 2 and 5 threads give the same bits, and
    bound calls (threads fixed when bound) the eager bits."""
    rng = np.random.default_rng(len(case))
    if case.startswith("max_pool"):
        x = rng.standard_normal((2, 48, 33, 33)).astype(np.float32)
        if case == "max_pool_nan":
            x[1, 7, 3, 4] = np.nan
        kw = {"kernel_size": 3, "stride": 2, "padding": 1}
        fn = lambda: ops.max_pool2d(x, **kw)  # noqa: E731
        bind = lambda out: ops.bind("max_pool2d", x, out=out, **kw)  # noqa: E731
    else:
        if case == "depthwise_planes":
            x, w, groups = rng.standard_normal((1, 64, 24, 24)), rng.standard_normal((64, 1, 3, 3)), 64
        elif case == "depthwise_channels":
            x, w, groups = rng.standard_normal((2, 600, 4, 4)), rng.standard_normal((600, 1, 5, 5)), 600
        elif case == "conv1x1":
            x, w, groups = rng.standard_normal((1, 96, 20, 20)), rng.standard_normal((160, 96, 1, 1)), 1
        else:
            x, w, groups = rng.standard_normal((1, 64, 20, 20)), rng.standard_normal((96, 64, 3, 3)), 1
        x, w = x.astype(np.float32), w.astype(np.float32)
        b = rng.standard_normal(w.shape[0]).astype(np.float32)
        kw = {"stride": 1, "padding": w.shape[-1] // 2, "groups": groups}
        fn = lambda: ops.conv2d(x, w, b, **kw)  # noqa: E731
        bind = lambda out: ops.bind("conv2d", x, w, b, out=out, **kw)  # noqa: E731
    with ops.intra_op_threads(1):
        one = fn()
    for threads in (2, 5):
        with ops.intra_op_threads(threads):
            np.testing.assert_array_equal(fn(), one)
            out = np.empty_like(one)
            call = bind(out)
        assert call is not None
        call()
        np.testing.assert_array_equal(out, one)
    if case == "max_pool_nan":
        assert np.isnan(one[1, 7]).any() and not np.isnan(one[0]).any()
