"""The native library's convolution GEMM (``opstrata_sgemm_fma_f32``): values against a float64
reference, bits fixed per shape (not by the tiling), the portable loop, and the conv path choosing it."""

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


def _gemm(lib: ctypes.CDLL, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """bias + a @ b through the C entry point; a (G, M, K) or (M, K) shared, b (G, K, N)."""
    groups, k, n = b.shape
    m = a.shape[-2]
    c = np.full((groups, m, n), np.nan, np.float32)
    sa = m * k if a.ndim == 3 else 0
    rc = lib.opstrata_sgemm_fma_f32(
        a.ctypes.data, b.ctypes.data, c.ctypes.data, None if bias is None else bias.ctypes.data,
        m, n, k, k, n, n, groups, sa, k * n, m * n, m if bias is not None and bias.ndim == 2 else 0,
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
