"""matmul, linear, gemm: ref against float64 formulas, cpu against ref, every float dtype, error paths."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops._dtypes import FLOAT_DTYPES
from opstrata.ops.testing import assert_close, tolerances

SETTINGS = settings(max_examples=12, deadline=None)
DTYPES = pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)


def rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return rng.uniform(-1, 1, shape).astype(dtype)


def close(actual: np.ndarray, expected: np.ndarray) -> None:
    """assert_close with the dtype's tolerances; float8 also allows one subnormal step near zero."""
    rtol, atol = tolerances(expected.dtype)
    if "float8" in expected.dtype.name:
        atol = max(atol, float(ml_dtypes.finfo(expected.dtype).smallest_subnormal))
    assert_close(actual, expected, rtol=rtol, atol=atol)


def f64(*arrays: np.ndarray) -> list[np.ndarray]:
    return [a.astype(np.float64) for a in arrays]


@st.composite
def batch_shapes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Broadcast-compatible batch shapes for a and b: size-1 dims and missing leading dims of b."""
    dims = draw(st.lists(st.integers(0, 3), max_size=2))
    a = tuple(d if draw(st.booleans()) else 1 for d in dims)
    b = tuple(d if draw(st.booleans()) else 1 for d in dims)
    return a, b[draw(st.integers(0, len(dims))) :]


matmul_case = st.tuples(
    batch_shapes(), st.integers(1, 5), st.integers(0, 6), st.integers(1, 5), st.integers(0, 3)
)


@DTYPES
@SETTINGS
@given(case=matmul_case, seed=st.integers(0, 2**16))
def test_matmul_ref_matches_float64_and_cpu_matches_ref(dtype, case, seed) -> None:
    (ba, bb), m, k, n, vec = case
    rng = np.random.default_rng(seed)
    a_shape = (k,) if vec == 1 else (*ba, m, k)
    b_shape = (k,) if vec == 2 else (*bb, k, n)
    a, b = rand(rng, a_shape, dtype), rand(rng, b_shape, dtype)
    expected = np.matmul(*f64(a, b)).astype(dtype)
    ref = ops.matmul(a, b, device="ref")
    close(ref, expected)
    close(ops.matmul(a, b, device="cpu"), ref)


@DTYPES
@SETTINGS
@given(
    lead=st.lists(st.integers(0, 3), max_size=2),
    i=st.integers(0, 6),
    o=st.integers(0, 5),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_linear_ref_matches_float64_and_cpu_matches_ref(dtype, lead, i, o, bias, seed) -> None:
    rng = np.random.default_rng(seed)
    x, w = rand(rng, (*lead, i), dtype), rand(rng, (o, i), dtype)
    b = rand(rng, (o,), dtype) if bias else None
    x64, w64 = f64(x, w)
    expected = (x64 @ w64.T + (0 if b is None else b.astype(np.float64))).astype(dtype)
    ref = ops.linear(x, w, b, device="ref")
    close(ref, expected)
    close(ops.linear(x, w, b, device="cpu"), ref)


@pytest.mark.parametrize("device", ["cpu", "ref"])
def test_batched_activations_any_layout_match_float64(device) -> None:
    """(batch, seq, hidden) inputs as one flattened GEMM: contiguous, transposed views, F-ordered weights."""
    rng = np.random.default_rng(3)
    x = rand(rng, (3, 5, 8), np.float32)
    w = rand(rng, (6, 8), np.float32)  # linear's (out, in)
    b = rand(rng, (6,), np.float32)
    expected = (x.astype(np.float64) @ w.T.astype(np.float64) + b).astype(np.float32)
    for xx in (x, np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2), x[:, ::-1][:, ::-1]):
        for ww in (w, np.asfortranarray(w)):
            close(ops.linear(xx, ww, b, device=device), expected)
            close(ops.matmul(xx, ww.T, device=device), expected - b)
    empty = ops.matmul(np.zeros((2, 0, 8), np.float32), w.T, device=device)
    assert empty.shape == (2, 0, 6)


@pytest.mark.parametrize("device", ["cpu", "ref"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=str)
def test_out_receives_the_result(device, dtype) -> None:
    rng = np.random.default_rng(5)
    x, w, b = rand(rng, (2, 3, 8), dtype), rand(rng, (6, 8), dtype), rand(rng, (6,), dtype)
    want_lin = ops.linear(x, w, b, device=device)
    want_mm = ops.matmul(x, w.T, device=device)
    for make in (lambda: np.empty((2, 3, 6), dtype), lambda: np.empty((6, 3, 2), dtype).T):
        out = make()  # C-ordered, and a non-contiguous view of the right shape
        assert ops.linear(x, w, b, out=out, device=device) is out
        np.testing.assert_array_equal(out, want_lin)
        assert ops.matmul(x, np.asfortranarray(w).T, out=out, device=device) is out
        close(out, want_mm)
    with pytest.raises(ops.OpError, match=r"linear: argument 'out' expected an ndarray of shape \(2, 3, 6\)"):
        ops.linear(x, w, b, out=np.empty((2, 3, 5), dtype), device=device)
    with pytest.raises(ops.OpError, match=r"matmul: argument 'out' expected .* dtype"):
        ops.matmul(x, w.T, out=np.empty((2, 3, 6), np.int32), device=device)


@DTYPES
@SETTINGS
@given(
    mkn=st.tuples(st.integers(1, 5), st.integers(0, 5), st.integers(1, 5)),
    trans=st.tuples(st.booleans(), st.booleans()),
    c_kind=st.sampled_from(["none", "full", "row", "col", "scalar"]),
    ab=st.tuples(st.sampled_from([1.0, 0.5, -2.0]), st.sampled_from([1.0, 0.0, 0.25])),
    seed=st.integers(0, 2**16),
)
def test_gemm_ref_matches_onnx_formula_and_cpu_matches_ref(dtype, mkn, trans, c_kind, ab, seed) -> None:
    (m, k, n), (ta, tb), (alpha, beta) = mkn, trans, ab
    rng = np.random.default_rng(seed)
    a = rand(rng, (k, m) if ta else (m, k), dtype)
    b = rand(rng, (n, k) if tb else (k, n), dtype)
    c_shape = {"none": None, "full": (m, n), "row": (n,), "col": (m, 1), "scalar": ()}[c_kind]
    c = None if c_shape is None else rand(rng, c_shape, dtype)
    a64, b64 = f64(a, b)
    y = alpha * ((a64.T if ta else a64) @ (b64.T if tb else b64))
    expected = (y + (0 if c is None else beta * c.astype(np.float64))).astype(dtype)
    kw = dict(alpha=alpha, beta=beta, trans_a=ta, trans_b=tb)
    ref = ops.gemm(a, b, c, device="ref", **kw)
    close(ref, expected)
    close(ops.gemm(a, b, c, device="cpu", **kw), ref)


@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_matmul_numpy_edge_semantics(device) -> None:
    rng = np.random.default_rng(0)
    a, b = rand(rng, (2, 1, 3, 4), np.float32), rand(rng, (5, 4, 2), np.float32)
    assert ops.matmul(a, b, device=device).shape == (2, 5, 3, 2)  # batch broadcasting
    assert ops.matmul(a[0, 0, 0], b, device=device).shape == (5, 2)  # 1-D @ batched
    assert ops.matmul(a[0, 0, 0], b[0, :, 0], device=device).shape == ()  # 1-D @ 1-D: a scalar
    zero_k = ops.matmul(np.ones((3, 0), np.float16), np.ones((0, 2), np.float16), device=device)
    assert zero_k.dtype == np.float16 and zero_k.tolist() == [[0, 0]] * 3  # empty inner dim sums to 0
    assert ops.matmul(np.ones((0, 3, 4)), np.ones((4, 2)), device=device).shape == (0, 3, 2)


@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_low_precision_accumulates_in_float32(device) -> None:
    # 4096 ones summed in bfloat16 would stop at 256; the float32 accumulator gets 4096 exactly
    a = np.ones((1, 4096), ml_dtypes.bfloat16)
    assert float(ops.matmul(a, a.T, device=device)[0, 0]) == 4096.0
    assert float(ops.linear(a, a, device=device)[0, 0]) == 4096.0


@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_gemm_beta_zero_still_propagates_nan_like_onnx(device) -> None:
    c = np.array([[np.nan]], np.float32)
    assert np.isnan(
        ops.gemm(np.ones((1, 1), np.float32), np.ones((1, 1), np.float32), c, beta=0.0, device=device)
    )


@pytest.mark.parametrize("device", ["ref", "cpu"])
@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (
            lambda d: ops.matmul(np.ones((2, 3)), np.ones((4, 5)), device=d),
            r"matmul: argument 'b'.*\(2, 3\) @ \(4, 5\)",
        ),
        (
            lambda d: ops.matmul(np.ones((2, 2, 3)), np.ones((3, 3, 2)), device=d),
            r"matmul: argument 'b'.*batch dims",
        ),
        (
            lambda d: ops.matmul(np.ones(3), np.ones(3, np.float32), device=d),
            r"matmul: argument 'b'.*float64.*float32",
        ),
        (
            lambda d: ops.matmul(np.ones(()), np.ones(3), device=d),
            r"matmul: argument 'a' expected at least 1 dims",
        ),
        (
            lambda d: ops.linear(np.ones((2, 3)), np.ones((4, 5)), device=d),
            r"linear: argument 'weight'.*\(4, 5\)",
        ),
        (
            lambda d: ops.linear(np.ones((2, 3)), np.ones(3), device=d),
            r"linear: argument 'weight' expected 2 dims",
        ),
        (
            lambda d: ops.linear(np.ones((2, 3)), np.ones((4, 3)), np.ones(3), device=d),
            r"linear: argument 'bias'.*\(4,\)",
        ),
        (lambda d: ops.gemm(np.ones((2, 3)), np.ones((2, 3)), device=d), r"gemm: argument 'b'.*inner dims"),
        (
            lambda d: ops.gemm(np.ones((2, 3)), np.ones((3, 4)), np.ones(3), device=d),
            r"gemm: argument 'c'.*\(2, 4\)",
        ),
    ],
)
def test_errors_name_op_and_argument(device, call, pattern) -> None:
    with pytest.raises(ops.OpError, match=pattern):
        call(device)


def test_integer_inputs_have_no_kernel() -> None:
    with pytest.raises(NotImplementedError, match="matmul"):
        ops.matmul(np.ones((2, 2), np.int32), np.ones((2, 2), np.int32), device="ref")
