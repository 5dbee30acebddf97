"""A linear layer over its packed weight (``opstrata_linear_packed_f32``: W^T cut into the strip GEMM's
32-column strips, each a contiguous panel): the bits of the strip GEMM reading W^T in place (each output
the in-order chain over k), within fp32 rounding of float64; the same bits at any thread count; chosen by
the linear binder for read-only weights in its row / size window, the BLAS elsewhere; one packed copy per
weight; its refusals."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops.native import kernels as nk


@pytest.fixture(scope="module")
def lib(fma_lib: ctypes.CDLL) -> ctypes.CDLL:
    return fma_lib


def _packed(lib, x: np.ndarray, w: np.ndarray, threads: int = 1) -> np.ndarray:
    m, k = x.shape
    n = w.shape[0]
    out = np.full((m, n), np.nan, np.float32)
    packed = nk._linear_weights(w)
    assert (
        lib.opstrata_linear_packed_f32(
            x.ctypes.data, packed.ctypes.data, out.ctypes.data, m, n, k, k, n, threads
        )
        == 0
    )
    return out


def _in_place(lib, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The strip GEMM on W^T as it lies (rows n floats apart): the tiles' chains the packed form must keep."""
    m, k = x.shape
    n = w.shape[0]
    wt = np.ascontiguousarray(w.T)
    out = np.empty((m, n), np.float32)
    rc = lib.opstrata_sgemm_fma_f32(
        x.ctypes.data, wt.ctypes.data, out.ctypes.data, None, m, n, k, k, n, n, 1, 0, 0, 0, 0, 1
    )
    assert rc == 0
    return out


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 200), n=st.integers(17, 120), seed=st.integers(0, 999))
def test_the_packed_weight_gives_the_strip_gemms_bits(lib, m, k, n, seed) -> None:
    """Any rows, depth and width (a last strip of 1-48 columns included): the in-place strip GEMM's bits,
    within fp32 tolerance of float64, the same at two threads."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    got = _packed(lib, x, w)
    np.testing.assert_array_equal(got, _in_place(lib, x, w))
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.sqrt(k))
    np.testing.assert_array_equal(_packed(lib, x, w, threads=2), got)


@pytest.mark.parametrize("n", [1, 16, 32, 33, 48, 49, 64, 80, 2048])
def test_the_strips_cover_every_column_once(n: int) -> None:
    """The packed layout's strips tile the columns in order: 32 wide, a remainder of 1-16 joined to the last."""
    strips = nk._linear_strips(n)
    assert [j for j, _ in strips] == list(range(0, 32 * len(strips), 32))
    assert sum(w for _, w in strips) == n and all(1 <= w <= 48 for _, w in strips)
    assert all(w == 32 for _, w in strips[:-1])
    w = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    packed = nk._linear_weights(w)
    j, width = strips[-1]
    np.testing.assert_array_equal(packed[j * 3 :].reshape(3, width), w[j:].T)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def test_the_binder_packs_read_only_weights_in_its_window(lib) -> None:
    """A read-only weight of >= 32768 values with <= 256 rows runs the packed call (one copy per weight,
    shared by every binding); a writeable weight, more rows or a small weight keep numpy's BLAS call; every
    form computes the same product within fp32 tolerance."""
    rng = np.random.default_rng(0)
    w = _frozen(rng.standard_normal((384, 128)).astype(np.float32))
    b = rng.standard_normal(384).astype(np.float32)
    for rows, packed in ((32, True), (256, True), (257, False)):
        x = rng.standard_normal((rows, 128)).astype(np.float32)
        out = np.empty((rows, 384), np.float32)
        call = ops.bind("linear", x, w, b, out=out)
        names = [getattr(s, "name", None) for s in getattr(call, "steps", [call])]
        assert ("opstrata_linear_packed_f32" in names) is packed, (rows, names)
        call()
        np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-4, atol=1e-4)
    assert nk._packed_linear_weight(w) is nk._packed_linear_weight(w)
    x = rng.standard_normal((8, 128)).astype(np.float32)
    out = np.empty((8, 384), np.float32)
    writeable = w.copy()
    names = [
        getattr(s, "name", None) for s in getattr(ops.bind("linear", x, writeable, b, out=out), "steps", [])
    ]
    assert "opstrata_linear_packed_f32" not in names
    small = _frozen(rng.standard_normal((64, 128)).astype(np.float32))
    call = ops.bind("linear", x, small, None, out=np.empty((8, 64), np.float32))
    assert getattr(call, "name", None) != "opstrata_linear_packed_f32"


def test_a_packed_copy_leaves_with_its_weight(lib) -> None:
    w = _frozen(np.ones((256, 128), np.float32))
    nk._packed_linear_weight(w)
    key = id(w)
    assert key in nk._linear_packs
    del w
    gc.collect()
    assert key not in nk._linear_packs


def test_refuses_an_empty_product(lib) -> None:
    x = np.ones((1, 4), np.float32)
    out = np.zeros((1, 4), np.float32)
    packed = np.ones(16, np.float32)
    for m, n, k in ((0, 4, 4), (1, 0, 4), (1, 4, 0)):
        assert (
            lib.opstrata_linear_packed_f32(
                x.ctypes.data, packed.ctypes.data, out.ctypes.data, m, n, k, 4, 4, 1
            )
            == -3
        )
    assert not out.any()
