"""Elementwise and activation ops: ref against independent float64/math formulas, cpu against ref."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import opstrata.ops as ops
from opstrata.ops import OpError
from opstrata.ops._dtypes import ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, LOW_PRECISION_DTYPES
from opstrata.ops.kernels import activation as act
from opstrata.ops.kernels.activation import ERF_ATANH_POLY, gelu_exact_f32
from opstrata.ops.testing import TOLERANCES, assert_close

SETTINGS = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
DEVICES = ("ref", "cpu")
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
PAIRS = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=0, max_side=4)
SEEDS = st.integers(0, 2**32 - 1)
SIGNED_INTS = tuple(d for d in INT_DTYPES if d.kind == "i")


def sample(
    seed: int, shape: tuple[int, ...], dtype: np.dtype, lo: float = -4.0, hi: float = 4.0
) -> np.ndarray:
    """Random values in [lo, hi] representable in ``dtype`` (rounded to it; ints clipped to its range)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(
            builtins_max(int(lo), info.min), builtins_min(int(hi), info.max) + 1, size=shape
        ).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


builtins_max, builtins_min = max, min


def f64(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def check(actual: np.ndarray, expected: Any, dtype: np.dtype, **tol: float) -> None:
    """actual has ``dtype`` and matches ``expected`` (float64 or exact) within the dtype's tolerance."""
    assert isinstance(actual, np.ndarray), type(actual)
    assert actual.dtype == dtype, (actual.dtype, dtype)
    expected = np.asarray(expected)
    if dtype.kind in "iub":
        np.testing.assert_array_equal(actual, expected.astype(dtype))
        return
    rtol, atol = TOLERANCES[dtype]
    assert_close(
        f64(actual), f64(expected), rtol=tol.get("rtol", rtol), atol=tol.get("atol", atol), check_dtype=False
    )


def vec(fn: Callable[[float], float]) -> Callable[[np.ndarray], np.ndarray]:
    """An elementwise float64 oracle from a scalar Python function."""
    return lambda x: np.vectorize(fn, otypes=[np.float64])(f64(x))


# --------------------------------------------------------------------------- binary arithmetic

BINARY: dict[str, tuple[Callable[[Any, Any], Any], tuple[float, float], tuple[float, float]]] = {
    # op: (float64 oracle, a range, b range)
    "add": (lambda a, b: a + b, (-4, 4), (-4, 4)),
    "sub": (lambda a, b: a - b, (-4, 4), (-4, 4)),
    "mul": (lambda a, b: a * b, (-4, 4), (-4, 4)),
    "div": (lambda a, b: a / b, (-4, 4), (0.5, 4)),
    "pow": (lambda a, b: a**b, (0.5, 3), (-2, 2)),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("op", sorted(BINARY))
@SETTINGS
@given(shapes=PAIRS, seed=SEEDS)
def test_binary_float(op: str, dtype: np.dtype, shapes: Any, seed: int) -> None:
    oracle, (alo, ahi), (blo, bhi) = BINARY[op]
    (sa, sb), result = shapes.input_shapes, shapes.result_shape
    a, b = sample(seed, sa, dtype, alo, ahi), sample(seed + 1, sb, dtype, blo, bhi)
    fn = getattr(ops, op)
    ref = fn(a, b, device="ref")
    assert ref.shape == result
    check(ref, oracle(f64(a), f64(b)), dtype)
    check(fn(a, b, device="cpu"), ref, dtype)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
@SETTINGS
@given(shapes=PAIRS, seed=SEEDS)
def test_binary_int_wraps_like_int64_modulo(op: str, dtype: np.dtype, shapes: Any, seed: int) -> None:
    (sa, sb) = shapes.input_shapes
    a, b = sample(seed, sa, dtype, -300, 300), sample(seed + 1, sb, dtype, -300, 300)
    expected = BINARY[op][0](a.astype(np.int64), b.astype(np.int64)).astype(dtype)  # wraps mod 2**bits
    for device in DEVICES:
        check(getattr(ops, op)(a, b, device=device), expected, dtype)


def test_pow_square_fast_path_matches_general_pow() -> None:
    x = sample(3, (4, 5), np.float32)
    for device in DEVICES:
        check(ops.pow(x, 2.0, device=device), f64(x) ** 2, np.dtype(np.float32))
        check(ops.pow(x.astype(ml_dtypes.bfloat16), 2, device=device), f64(x.astype(ml_dtypes.bfloat16)) ** 2,
              np.dtype(ml_dtypes.bfloat16))  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_division_by_zero_is_ieee_and_silent(device: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = ops.div(np.array([1.0, -1.0, 0.0]), 0.0, device=device)
    np.testing.assert_array_equal(r, [np.inf, -np.inf, np.nan])


@pytest.mark.parametrize(
    ("a", "b", "dtype"),
    [
        (np.ones(2, ml_dtypes.bfloat16), np.ones(2, np.float32), np.float32),
        (np.ones(2, ml_dtypes.bfloat16), np.ones(2, np.float16), np.float32),
        (np.ones(2, np.int32), np.ones(2, ml_dtypes.bfloat16), ml_dtypes.bfloat16),
        (np.ones(2, np.int8), np.ones(2, np.uint8), np.int16),  # numpy's rule
        (np.ones(2, ml_dtypes.float8_e4m3fn), 2.5, ml_dtypes.float8_e4m3fn),  # Python scalars are weak
        (np.ones(2, np.int8), 3, np.int8),
        (np.ones(2, np.int32), 2.5, np.float64),  # numpy's rule for int array * float scalar
        (np.ones(2, np.float32), np.float64(2.0), np.float64),  # numpy scalars are strong
    ],
)
@pytest.mark.parametrize("device", DEVICES)
def test_promotion(a: Any, b: Any, dtype: Any, device: str) -> None:
    r = ops.add(a, b, device=device)
    assert r.dtype == np.dtype(dtype)
    assert ops.mul(b, a, device=device).dtype == np.dtype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int32], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_out_buffer_is_written_and_returned(dtype: Any, device: str) -> None:
    a, b = np.arange(6).reshape(2, 3).astype(dtype), np.arange(3).astype(dtype)
    out = np.empty((2, 3), dtype)
    r = ops.add(a, b, out=out, device=device)
    assert r is out
    np.testing.assert_array_equal(out.astype(np.float64), f64(a) + f64(b))


def test_out_buffer_wrong_shape_or_dtype_is_an_op_error() -> None:
    with pytest.raises(OpError, match=r"add: argument 'out' expected .*\(2, 3\).*got shape \(3,\)"):
        ops.add(np.ones((2, 3)), 1.0, out=np.empty(3))
    with pytest.raises(OpError, match=r"mul: argument 'out'.*float64.*float32"):
        ops.mul(np.ones(3), 1.0, out=np.empty(3, np.float32))


# --------------------------------------------------------------------------- comparisons


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("op", ["equal", "less", "greater"])
@SETTINGS
@given(shapes=PAIRS, seed=SEEDS)
def test_comparisons(op: str, dtype: np.dtype, shapes: Any, seed: int) -> None:
    (sa, sb) = shapes.input_shapes
    a, b = sample(seed, sa, dtype, -2, 2), sample(seed + 1, sb, dtype, -2, 2)  # small range: many ties
    oracle = {"equal": np.equal, "less": np.less, "greater": np.greater}[op]
    expected = oracle(f64(a), f64(b))
    for device in DEVICES:
        r = getattr(ops, op)(a, b, device=device)
        assert r.dtype == np.bool_
        np.testing.assert_array_equal(r, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_comparisons_with_nan(device: str) -> None:
    x = np.array([np.nan, 1.0], ml_dtypes.bfloat16)
    np.testing.assert_array_equal(ops.equal(x, x, device=device), [False, True])
    np.testing.assert_array_equal(ops.less(x, 2.0, device=device), [False, True])


# --------------------------------------------------------------------------- unary math

UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], tuple[float, float]]] = {
    # op: (independent float64 oracle, input range)
    "neg": (lambda x: -f64(x), (-4, 4)),
    "abs": (vec(math.fabs), (-4, 4)),
    "exp": (vec(math.exp), (-4, 4)),
    "log": (vec(math.log), (0.05, 8)),
    "sqrt": (vec(math.sqrt), (0.0, 8)),
    "rsqrt": (vec(lambda v: 1 / math.sqrt(v)), (0.05, 8)),
    "tanh": (vec(math.tanh), (-4, 4)),
    "erf": (vec(math.erf), (-4, 4)),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-f64(x))), (-8, 8)),
    "silu": (lambda x: f64(x) / (1 + np.exp(-f64(x))), (-8, 8)),
    "relu": (lambda x: np.maximum(f64(x), 0), (-4, 4)),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("op", sorted(UNARY))
@SETTINGS
@given(shape=SHAPES, seed=SEEDS)
def test_unary_float(op: str, dtype: np.dtype, shape: tuple[int, ...], seed: int) -> None:
    oracle, (lo, hi) = UNARY[op]
    x = sample(seed, shape, dtype, lo, hi)
    fn = getattr(ops, op)
    ref = fn(x, device="ref")
    check(ref, oracle(x), dtype)
    check(fn(x, device="cpu"), ref, dtype)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
@pytest.mark.parametrize("op", ["neg", "abs", "relu"])
@SETTINGS
@given(shape=SHAPES, seed=SEEDS)
def test_unary_int(op: str, dtype: np.dtype, shape: tuple[int, ...], seed: int) -> None:
    if op == "neg" and dtype.kind == "u":
        return  # neg is registered for signed ints only (tested in test_wrong_dtype_is_an_op_error)
    x = sample(seed, shape, dtype, -100, 100)
    expected = {"neg": np.negative, "abs": np.abs, "relu": lambda v: np.maximum(v, 0)}[op](x.astype(np.int64))
    for device in DEVICES:
        check(getattr(ops, op)(x, device=device), expected, dtype)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@SETTINGS
@given(shape=SHAPES, seed=SEEDS)
def test_gelu(approximate: str, dtype: np.dtype, shape: tuple[int, ...], seed: int) -> None:
    x = sample(seed, shape, dtype, -5, 5)
    if approximate == "none":
        oracle = vec(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))
    else:
        oracle = vec(lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))))
    ref = ops.gelu(x, approximate=approximate, device="ref")
    check(ref, oracle(x), dtype)
    check(ops.gelu(x, approximate=approximate, device="cpu"), ref, dtype)


def test_erf_cpu_float64_is_near_correctly_rounded() -> None:
    x = np.concatenate([np.linspace(-7, 7, 20001), [0.0, -0.0, 1e-300, -1e-12, 0.99999, 1.0, 1.00001]])
    expected = vec(math.erf)(x)
    assert_close(ops.erf(x, device="cpu"), expected, rtol=4e-16, atol=0)
    specials = np.array([np.inf, -np.inf, np.nan, 30.0, -30.0])
    for device in DEVICES:
        np.testing.assert_array_equal(ops.erf(specials, device=device), [1, -1, np.nan, 1, -1])
        assert np.signbit(ops.erf(np.array(-0.0), device=device))


def test_erf_cpu_float32_within_a_few_ulp() -> None:
    x = np.linspace(-6, 6, 20001, dtype=np.float32)
    expected = vec(math.erf)(x)
    assert_close(ops.erf(x, device="cpu").astype(np.float64), expected, rtol=3 * 2**-24, atol=1e-37)


def test_gelu_exact_f32_accuracy_specials_and_tiles(monkeypatch) -> None:
    x = np.concatenate([np.linspace(-12, 12, 60001), [0.0, 1e-30, -1e-6]]).astype(np.float32)
    expected = vec(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(x)
    got = gelu_exact_f32(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    assert np.abs(got - expected).max() <= 1e-6  # ~5e-7: tanh(u P(u^2)) is within 6e-8 of erf(u)
    small = np.abs(x) < 1
    assert_close(got[small].astype(np.float64), expected[small], rtol=2e-6, atol=1e-37)  # relative near 0
    special = np.float32([np.inf, np.nan, 1e30, -1e30, -1e4, 3e38])
    with np.errstate(all="ignore"):
        want = np.float32([np.inf, np.nan, 1e30, 0, 0, 3e38])  # g^2 overflows to inf: tanh saturates
        np.testing.assert_array_equal(gelu_exact_f32(special), want)
    monkeypatch.setattr(act, "GELU_TILE", 7)  # many tiles and a ragged last one: same numbers
    np.testing.assert_array_equal(gelu_exact_f32(x.reshape(4, -1)).reshape(-1), got)
    assert gelu_exact_f32(np.zeros((0, 4), np.float32)).shape == (0, 4)


def test_erf_atanh_polynomial_fits_and_saturates() -> None:
    """The constant table: tanh(u P(u^2)) is erf(u) to 6e-8; beyond u = 3.9 the argument keeps growing
    (> 9: tanh within 3.1e-8 of 1, as erf is), and beyond u = 8 tanh is exactly 1 in float32."""
    poly = lambda u: u * np.polynomial.polynomial.polyval(u * u, ERF_ATANH_POLY)  # noqa: E731
    u = np.linspace(0.0, 6.0, 30001)
    assert np.abs(np.tanh(poly(u)) - vec(math.erf)(u)).max() <= 6e-8
    far = np.concatenate([np.linspace(3.9, 200.0, 20001), np.logspace(2.4, 18, 400)])
    assert (poly(far) > 9.0).all()
    assert (poly(far[far >= 8.0]) > 10.0).all() and np.tanh(np.float32(10.0)) == 1.0


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=str)
def test_gelu_cpu_fast_erf_within_float_tolerance_everywhere(dtype: Any) -> None:
    x = np.concatenate([np.linspace(-12, 12, 48001), [-1e4, -30.0, 30.0, 1e4]]).astype(dtype)
    expected = vec(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(x)
    check(ops.gelu(x, device="cpu"), expected, np.dtype(dtype))
    assert (ops.gelu(np.float32([-1e4, -50.0]), device="cpu") == 0).all()  # no residue of 1 + erf


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_sigmoid_silu_stable_for_large_inputs(dtype: np.dtype, device: str) -> None:
    big = float(builtins_min(1000.0, float(ml_dtypes.finfo(dtype).max)))
    x = np.array([-big, -30.0, 30.0, big]).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warnings: nothing overflows
        s = ops.sigmoid(x, device=device)
        si = ops.silu(x, device=device)
    expected = 1 / (1 + np.exp(-f64(x).clip(-700, 700)))
    check(s, expected, np.dtype(dtype))
    check(si, f64(x) * expected, np.dtype(dtype))
    assert ops.sigmoid(np.array([-100.0]), device=device)[0] == pytest.approx(math.exp(-100), rel=1e-14)


@pytest.mark.parametrize("device", DEVICES)
def test_relu_keeps_nan(device: str) -> None:
    r = ops.relu(np.array([np.nan, -1.0, 2.0], np.float16), device=device)
    np.testing.assert_array_equal(r, np.array([np.nan, 0, 2], np.float16))


# --------------------------------------------------------------------------- clip, where, cast


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES, ids=str)
@SETTINGS
@given(shape=SHAPES, seed=SEEDS, bounds=st.tuples(st.integers(-3, 3), st.integers(-3, 3)))
def test_clip(dtype: np.dtype, shape: tuple[int, ...], seed: int, bounds: tuple[int, int]) -> None:
    x = sample(seed, shape, dtype, -5, 5)
    lo, hi = bounds
    if dtype.kind == "u":
        lo, hi = builtins_max(lo, 0), builtins_max(hi, 0)
    expected = np.minimum(np.maximum(f64(x), lo), hi)  # torch.clamp: min > max gives max
    for device in DEVICES:
        check(ops.clip(x, min=lo, max=hi, device=device), expected, dtype)
        check(ops.clip(x, min=lo, device=device), np.maximum(f64(x), lo), dtype)
        check(ops.clip(x, max=hi, device=device), np.minimum(f64(x), hi), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_clip_edges(device: str) -> None:
    r = ops.clip(np.array([np.nan, -5.0, 5.0]), min=-1.0, max=1.0, device=device)
    np.testing.assert_array_equal(r, [np.nan, -1, 1])
    u = ops.clip(np.array([0, 7, 255], np.uint8), min=-10, max=300, device=device)  # bounds saturate
    np.testing.assert_array_equal(u, [0, 7, 255])
    assert u.dtype == np.uint8
    arr = ops.clip(np.arange(6.0).reshape(2, 3), min=np.array([1.0, 2.0, 3.0]), device=device)
    np.testing.assert_array_equal(arr, [[1, 2, 3], [3, 4, 5]])


def test_clip_errors() -> None:
    with pytest.raises(OpError, match="clip: argument 'min' expected at least one of 'min' or 'max'"):
        ops.clip(np.ones(3))
    with pytest.raises(OpError, match="clip: argument 'min' expected an integer bound"):
        ops.clip(np.ones(3, np.int32), min=0.5)
    with pytest.raises(OpError, match="clip: argument 'max' expected a shape broadcastable"):
        ops.clip(np.ones(3), max=np.ones((2, 3)))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@SETTINGS
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=4), seed=SEEDS)
def test_where(dtype: np.dtype, shapes: Any, seed: int) -> None:
    sc, sa, sb = shapes.input_shapes
    cond = sample(seed, sc, np.dtype(np.bool_))
    a, b = sample(seed + 1, sa, dtype), sample(seed + 2, sb, dtype)
    c_, a_, b_ = np.broadcast_arrays(cond, a, b)
    expected = np.array(
        [ai if ci else bi for ci, ai, bi in zip(c_.ravel(), a_.ravel(), b_.ravel(), strict=True)], dtype
    )
    for device in DEVICES:
        r = ops.where(cond, a, b, device=device)
        assert r.dtype == dtype and r.shape == shapes.result_shape
        np.testing.assert_array_equal(f64(r).ravel(), f64(expected))


def test_where_errors() -> None:
    with pytest.raises(OpError, match=r"where: argument 'cond' expected one of \(bool\), got int64"):
        ops.where(np.array([1, 0]), 1.0, 2.0)
    with pytest.raises(OpError, match="where: argument 'cond' expected a shape that broadcasts"):
        ops.where(np.array([True, False, True]), np.ones(2), 0.0)


def _cast_values(src: np.dtype, dst: np.dtype) -> np.ndarray:
    """Values every pair can hold: |v| <= 100, non-negative if either side is unsigned, fractions for floats."""
    lo = 0 if "u" in (src.kind, dst.kind) else -100
    v = np.array([lo, 0, 1, 3, 7.5, 42.25, 100, -2.75 if lo else 2.75, 0.5])
    return v.astype(src)


@pytest.mark.parametrize("dst", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("src", ALL_DTYPES, ids=str)
def test_cast_every_pair(src: np.dtype, dst: np.dtype) -> None:
    x = _cast_values(src, dst)
    if dst == np.bool_:
        expected = f64(x) != 0
    elif dst.kind in "iu":
        expected = np.trunc(f64(x)).astype(np.int64).astype(dst)  # toward zero, like C and numpy
    else:
        expected = f64(x).astype(dst)  # one correct rounding from the exact value
    for device in DEVICES:
        r = ops.cast(x, dtype=dst, device=device)
        assert r.dtype == dst and r is not x
        np.testing.assert_array_equal(f64(r), f64(expected))
        assert ops.cast(x[:0].reshape(0, 0), dtype=str(dst), device=device).shape == (0, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_cast_is_not_saturating(device: str) -> None:
    x = np.array([1000.0, -1e6, 1e6])
    assert np.isnan(ops.cast(x[:1], dtype="float8_e4m3fn", device=device).astype(np.float64)).all()
    np.testing.assert_array_equal(f64(ops.cast(x[1:], dtype="float8_e5m2", device=device)), [-np.inf, np.inf])
    assert f64(ops.cast(np.array([448.0]), dtype="float8_e4m3fn", device=device))[0] == 448.0


def test_cast_bad_dtype() -> None:
    with pytest.raises(OpError, match="cast: argument 'dtype' expected a supported dtype, got 'complex64'"):
        ops.cast(np.ones(2), dtype="complex64")


# --------------------------------------------------------------------------- shapes and errors


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=str)
def test_empty_and_zero_dim(device: str, dtype: Any) -> None:
    e = np.ones((0, 3), dtype)
    assert ops.add(e, np.ones(3, dtype), device=device).shape == (0, 3)
    for op in ("exp", "erf", "sigmoid", "gelu", "silu", "rsqrt", "relu", "neg", "abs"):
        assert getattr(ops, op)(e, device=device).shape == (0, 3)
        r = getattr(ops, op)(np.array(0.5, dtype), device=device)
        assert isinstance(r, np.ndarray) and r.shape == () and r.dtype == np.dtype(dtype)


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (
            lambda: ops.exp(np.ones(2, np.int32)),
            r"exp: argument 'x' expected one of \(float64.*\), got int32",
        ),
        (lambda: ops.div(np.ones(2, np.int32), np.ones(2, np.int64)), r"div: argument 'a' expected one of"),
        (lambda: ops.neg(np.ones(2, np.uint8)), r"neg: argument 'x' expected .*got uint8"),
        (lambda: ops.add(np.ones(2, np.complex64), 1), r"add: argument 'a' expected .*got complex64"),
        (
            lambda: ops.add(np.ones((2, 3)), np.ones(4)),
            r"add: argument 'b' expected shapes that broadcast.*\(4,\)",
        ),
        (lambda: ops.gelu(np.ones(2), approximate="fast"), r"gelu: argument 'approximate' expected one of"),
        (lambda: ops.sigmoid(np.ones(2, bool)), r"sigmoid: argument 'x' expected .*got bool"),
    ],
)
def test_errors_name_op_argument_expected_actual(call: Callable[[], Any], pattern: str) -> None:
    with pytest.raises(OpError, match=pattern):
        call()


@pytest.mark.parametrize("dtype", LOW_PRECISION_DTYPES, ids=str)
def test_low_precision_rounds_once_from_float32(dtype: np.dtype) -> None:
    # 1 + 2**-9 (float32 sum of two exact values) must round directly to the bf16/f16/f8 grid, not drift.
    a = np.array([1.0, 3.0, 0.25]).astype(dtype)
    for device in DEVICES:
        r = ops.mul(a, a, device=device)
        np.testing.assert_array_equal(f64(r), f64((f64(a) * f64(a)).astype(dtype)))


# --------------------------------------------------------------------------- decompositions


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=str)
@pytest.mark.parametrize(
    ("op", "kw"),
    [("rsqrt", {}), ("sigmoid", {}), ("silu", {}), ("gelu", {}), ("gelu", {"approximate": "tanh"})],
)
def test_decomposition_is_the_definition(op: str, kw: dict[str, Any], dtype: Any) -> None:
    """With the cpu kernel removed, the registered decomposition runs (audited once) and matches ref."""
    x = sample(7, (3, 17), np.dtype(dtype), 0.05 if op == "rsqrt" else -30, 30)
    expected = getattr(ops, op)(x, device="ref", **kw)
    ops.unregister(op, device="cpu")
    with ops.fallback_policy("allow"):
        got = getattr(ops, op)(x, device="cpu", **kw)
    assert ops.fallback_report().count(op, path="decomposition") == 1
    check(got, expected, np.dtype(dtype))
