"""The native narrow GEMM with the output rows in vector lanes (``opstrata_sgemm_lanes_f32``: n <= 16
columns, weights packed once in blocks of 16 rows): each output the strips' multiply-add chain, so the
bits of a wide product's columns; within fp32 rounding of float64; the same bits at any thread count; its
epilogues; chosen by conv2d for images of at most 16 outputs; its refusals."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops.native import kernels as nk, library as _native
from opstrata.ops.native.build import PORTABLE_CFLAGS


@pytest.fixture(scope="module")
def lib(fma_lib: ctypes.CDLL) -> ctypes.CDLL:
    return fma_lib


def _lanes(lib, a, b, bias=None, threads=1, act=0, params=None, res=None) -> np.ndarray:
    """bias + a @ b per group through the lanes kernel; a (G, M, K), b (G, K, N)."""
    groups, m, k = a.shape
    n = b.shape[-1]
    packed = nk._lanes_weights(a)
    c = np.full((groups, m, n), np.nan, np.float32)
    rc = lib.opstrata_sgemm_lanes_f32(
        packed.ctypes.data, b.ctypes.data, c.ctypes.data, None if bias is None else bias.ctypes.data,
        m, n, k, k, n, n, groups, packed[0].size, k * n, m * n, m, threads, act,
        None if params is None else params.ctypes.data, None if res is None else res.ctypes.data,
    )  # fmt: skip
    assert rc == 0
    return c


def _strips(lib, a, b, bias=None) -> np.ndarray:
    """The same product's columns from a wide one (> 16 columns: the strip tiles' in-order chains)."""
    groups, m, k = a.shape
    n = b.shape[-1]
    wide = np.concatenate([b, np.ones((groups, k, 40 - n), np.float32)], axis=2)
    c = np.empty((groups, m, 40), np.float32)
    rc = lib.opstrata_sgemm_fma_f32(
        a.ctypes.data, wide.ctypes.data, c.ctypes.data, None if bias is None else bias.ctypes.data,
        m, 40, k, k, 40, 40, groups, m * k, k * 40, m * 40, m, 1,
    )  # fmt: skip
    assert rc == 0
    return c[:, :, :n]


@settings(max_examples=80, deadline=None)
@given(
    m=st.integers(1, 70), k=st.integers(1, 300), n=st.integers(1, 16), groups=st.integers(1, 3),
    bias=st.booleans(), seed=st.integers(0, 999),
)  # fmt: skip
def test_the_lanes_give_the_strips_bits(lib, m, k, n, groups, bias, seed) -> None:
    """Any rows (partial blocks of 16 included), depth, 1-16 columns and groups: the wide product's bits,
    and within k-term fp32 rounding of the float64 product."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((groups, m, k)).astype(np.float32)
    b = rng.standard_normal((groups, k, n)).astype(np.float32)
    bv = rng.standard_normal((groups, m)).astype(np.float32) if bias else None
    got = _lanes(lib, a, b, bv)
    np.testing.assert_array_equal(got.view(np.int32), _strips(lib, a, b, bv).view(np.int32))
    want = np.matmul(a.astype(np.float64), b.astype(np.float64)) + (0 if bv is None else bv[..., None])
    scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64)) + 1e-30
    assert np.all(np.abs(got - want) <= 2.0 * (k + 2) * np.finfo(np.float32).eps * (scale + np.abs(want)))


@pytest.mark.parametrize("m, k, n", [(256, 2304, 16), (512, 1200, 4), (300, 900, 9), (64, 5000, 1)])
def test_bits_do_not_depend_on_the_thread_count(lib, m, k, n) -> None:
    """Threads take blocks of 32 rows, never a sum: 1, 2, 3 and 8 threads give the same bits."""
    rng = np.random.default_rng(m + n)
    a = rng.standard_normal((1, m, k)).astype(np.float32)
    b = rng.standard_normal((1, k, n)).astype(np.float32)
    bias = rng.standard_normal((1, m)).astype(np.float32)
    one = _lanes(lib, a, b, bias)
    for threads in (2, 3, 8):
        np.testing.assert_array_equal(_lanes(lib, a, b, bias, threads=threads), one)


def test_the_epilogue_gives_the_unfused_bits(lib) -> None:
    """ReLU and the residual add + ReLU applied as the rows are stored: the unfused product followed by the
    same float32 operations."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((1, 37, 50)).astype(np.float32)
    b = rng.standard_normal((1, 50, 9)).astype(np.float32)
    r = rng.standard_normal((1, 37, 9)).astype(np.float32)
    plain = _lanes(lib, a, b)
    np.testing.assert_array_equal(_lanes(lib, a, b, act=1), np.where(plain < 0, np.float32(0), plain))
    s = plain + r
    np.testing.assert_array_equal(_lanes(lib, a, b, act=5, res=r), np.where(s < 0, np.float32(0), s))


@pytest.mark.parametrize("hw, k", [(4, 3), (3, 3), (2, 3), (4, 1), (1, 1)])
def test_conv2d_on_small_images_takes_the_lanes(lib, hw: int, k: int) -> None:
    """A convolution with at most 16 outputs per plane runs on the lanes kernel eagerly and bound (same
    bits), within fp32 tolerance of numpy's im2col + sgemm."""
    rng = np.random.default_rng(hw * 10 + k)
    x = rng.standard_normal((2, 24, hw, hw)).astype(np.float32)
    w = rng.standard_normal((40, 24, k, k)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    eager = ops.conv2d(x, w, b, padding=k // 2)
    out = np.empty_like(eager)
    call = ops.bind("conv2d", x, w, b, padding=k // 2, out=out)
    assert call is not None
    names = [getattr(s, "name", None) for s in getattr(call, "steps", [call])]
    assert "opstrata_sgemm_lanes_f32" in names
    call()
    np.testing.assert_array_equal(out, eager)
    ops.testing.assert_close(eager, ops.conv2d(x, w, b, padding=k // 2, device="ref"))


def test_the_kernel_refuses_what_it_cannot_run(lib, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No columns, more than 16, a bad epilogue kind: -3, nothing written; a portable build answers -2;
    the binding's error names the kernel, the code and the fix."""
    a = np.ones((1, 5, 7), np.float32)
    packed = nk._lanes_weights(a)
    c = np.full((5, 20), 3.0, np.float32)
    b = np.ones((7, 20), np.float32)
    for n, act in ((0, 0), (17, 0), (4, 9)):
        rc = lib.opstrata_sgemm_lanes_f32(packed.ctypes.data, b.ctypes.data, c.ctypes.data, None, 5, n, 7, 7, 20, 20,
                                          1, packed.size, 0, 0, 0, 1, act, None, None)  # fmt: skip
        assert rc == -3
    assert (c == 3.0).all()
    monkeypatch.setenv("OPSTRATA_CACHE_DIR", str(tmp_path / "cache"))
    portable, _ = ops.build_library(
        "opstrata_native_portable", _native.SOURCE, _native._SIGNATURES, cflags=PORTABLE_CFLAGS,
        abi=("opstrata_native_abi", _native.ABI),
    )  # fmt: skip
    rc = portable.opstrata_sgemm_lanes_f32(packed.ctypes.data, b.ctypes.data, c.ctypes.data, None, 5, 4, 7, 7, 20,
                                           20, 1, packed.size, 0, 0, 0, 1, 0, None, None)  # fmt: skip
    assert rc == -2
    err = nk._lanes_error(-3)
    assert "narrow GEMM" in str(err) and "code -3" in str(err) and "rebuild" in str(err)
