"""Math ops (kernels/math.py) and the 16/32/64-bit integer dtypes on the elementwise ops.

ref against float64 numpy / exact Python-integer oracles and onnx's reference evaluator, cpu against
ref; error paths name the op, the argument and the fix.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import opstrata.ops as ops
from opstrata.ops import OpError
from opstrata.ops._dtypes import FLOAT_DTYPES, INT_DTYPES
from opstrata.ops.testing import TOLERANCES, assert_close

SETTINGS = settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
DEVICES = ("ref", "cpu")
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
PAIRS = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=0, max_side=4)
SEEDS = st.integers(0, 2**32 - 1)
NEW_INTS = tuple(np.dtype(d) for d in (np.int16, np.uint16, np.uint32, np.uint64))


def sample(seed: int, shape: Any, dtype: Any, lo: float = -4.0, hi: float = 4.0) -> np.ndarray:
    """Random values in [lo, hi] in ``dtype`` (ints clipped to the dtype's range)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(
            max(int(lo), info.min), min(int(hi), info.max), size=shape, endpoint=True, dtype=dtype
        )
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def f64(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def close(actual: np.ndarray, expected: Any, dtype: Any, scale: float = 1.0) -> None:
    """``actual`` has ``dtype`` and matches ``expected`` within the dtype's tolerances (x ``scale``)."""
    dtype = np.dtype(dtype)
    assert actual.dtype == dtype, (actual.dtype, dtype)
    rtol, atol = TOLERANCES[dtype]
    assert_close(f64(actual), f64(expected), rtol=rtol * scale, atol=atol * scale, check_dtype=False)


# --------------------------------------------------------------------------- float unary math

# op: (float64 oracle, sample range)
UNARY: dict[str, tuple[Any, tuple[float, float]]] = {
    "sin": (np.sin, (-4, 4)),
    "cos": (np.cos, (-4, 4)),
    "tan": (np.tan, (-1.2, 1.2)),
    "asin": (np.arcsin, (-0.95, 0.95)),
    "acos": (np.arccos, (-0.95, 0.95)),
    "atan": (np.arctan, (-4, 4)),
    "sinh": (np.sinh, (-3, 3)),
    "cosh": (np.cosh, (-3, 3)),
    "asinh": (np.arcsinh, (-4, 4)),
    "acosh": (np.arccosh, (1.05, 4)),
    "atanh": (np.arctanh, (-0.9, 0.9)),
    "ceil": (np.ceil, (-4, 4)),
    "floor": (np.floor, (-4, 4)),
    "round": (np.rint, (-4, 4)),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_float(op: str, dtype: np.dtype) -> None:
    oracle, (lo, hi) = UNARY[op]
    x = sample(7, (3, 17), dtype, lo, hi)
    fn = getattr(ops, op)
    ref = fn(x, device="ref")
    close(ref, oracle(f64(x)), dtype)
    close(fn(x, device="cpu"), ref, dtype)


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_matches_onnx_reference(op: str) -> None:
    reference = pytest.importorskip("onnx.reference")
    helper = pytest.importorskip("onnx").helper
    _, (lo, hi) = UNARY[op]
    x = sample(3, (4, 5), np.float32, lo, hi)
    x[0, :3] = [0.5, -2.5, 1.5] if op == "round" else x[0, :3]  # ties go to even
    onnx_name = {"asin": "Asin", "acos": "Acos", "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh"}
    node = helper.make_node(onnx_name.get(op, op.capitalize()), ["x"], ["y"])
    (want,) = reference.ReferenceEvaluator(node).run(None, {"x": x})
    for device in DEVICES:
        close(getattr(ops, op)(x, device=device), want, np.float32)


def test_round_is_half_to_even_and_keeps_specials() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, np.nan, np.inf, -np.inf], np.float32)
    want = np.array([0, 2, 2, -0.0, -2, 2, np.nan, np.inf, -np.inf], np.float32)
    for device in DEVICES:
        np.testing.assert_array_equal(ops.round(x, device=device), want)
        got = ops.round(x.astype(ml_dtypes.bfloat16), device=device)
        assert got.dtype == ml_dtypes.bfloat16
        # compared as float32 (exact for bfloat16): numpy < 2's assert_array_equal matches NaNs by
        # position only for its own float dtypes, so a bfloat16 NaN would never equal a NaN
        np.testing.assert_array_equal(got.astype(np.float32), want)


def test_inverse_functions_give_nan_outside_their_domain() -> None:
    for device in DEVICES:
        assert np.isnan(ops.asin(np.array([1.5]), device=device)).all()
        assert np.isnan(ops.acosh(np.array([0.5]), device=device)).all()
        assert ops.atanh(np.array([1.0], np.float32), device=device)[0] == np.inf


# --------------------------------------------------------------------------- sign


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES, ids=str)
def test_sign(dtype: np.dtype) -> None:
    x = sample(1, (20,), dtype, -3, 3)
    want = np.sign(x.astype(np.float64))
    for device in DEVICES:
        got = ops.sign(x, device=device)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.astype(np.float64), want)


def test_sign_keeps_nan() -> None:
    for device in DEVICES:
        assert np.isnan(ops.sign(np.array([np.nan]), device=device)).all()


# --------------------------------------------------------------------------- mod


def _py_mod(a: int, b: int, fmod: bool) -> int:
    if b == 0:
        return 0
    if fmod:  # truncated division, exactly
        q = abs(a) // abs(b)
        return a - (-q if (a < 0) != (b < 0) else q) * b
    return a % b


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
@pytest.mark.parametrize("fmod", [False, True])
@SETTINGS
@given(shapes=PAIRS, seed=SEEDS)
def test_mod_int_matches_python(dtype: np.dtype, fmod: bool, shapes: Any, seed: int) -> None:
    sa, sb = shapes.input_shapes
    a, b = sample(seed, sa, dtype, -100, 100), sample(seed + 1, sb, dtype, -9, 9)
    a2, b2 = np.broadcast_arrays(a, b)
    want = np.array(
        [_py_mod(int(p), int(q), fmod) for p, q in zip(a2.ravel(), b2.ravel(), strict=True)], np.int64
    ).reshape(a2.shape)
    for device in DEVICES:
        got = ops.mod(a, b, fmod=fmod, device=device)
        assert got.dtype == dtype and got.shape == a2.shape
        np.testing.assert_array_equal(got.astype(np.int64), want)


def test_mod_int64_extremes_are_exact() -> None:
    a = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -7], np.int64)
    b = np.array([3, -3, 0], np.int64)
    for fmod in (False, True):
        want = [_py_mod(int(p), int(q), fmod) for p, q in zip(a, b, strict=True)]
        for device in DEVICES:
            assert ops.mod(a, b, fmod=fmod, device=device).tolist() == want


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16], ids=str)
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_float_matches_onnx_reference(dtype: Any, fmod: int) -> None:
    reference = pytest.importorskip("onnx.reference")
    helper = pytest.importorskip("onnx").helper
    a = np.array([-4.3, 7.2, 5.0, 4.3, -7.2, 8.0, 0.0, -0.0, np.inf, 3.0, 3.0, -3.0, np.nan, 2.0], dtype)
    b = np.array([2.1, -3.4, 8.0, -2.1, 3.4, 5.0, 3.0, -3.0, 2.0, 0.0, np.inf, np.inf, 1.0, -np.inf], dtype)
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)
    with np.errstate(all="ignore"):
        (want,) = reference.ReferenceEvaluator(node).run(None, {"a": a, "b": b})
    for device in DEVICES:
        got = ops.mod(a, b, fmod=bool(fmod), device=device)
        assert got.dtype == np.dtype(dtype)
        assert_close(f64(got), f64(want), rtol=TOLERANCES[np.dtype(dtype)][0], atol=1e-3, check_dtype=False)


def test_mod_floor_follows_the_divisor_sign_for_infinite_divisors() -> None:
    # ONNX: finite nonzero x with y = +-inf gives x when the signs agree, y otherwise
    got = ops.mod(np.array([3.0, -3.0, 3.0, -3.0]), np.array([np.inf, np.inf, -np.inf, -np.inf]))
    np.testing.assert_array_equal(got, [3.0, np.inf, -np.inf, -3.0])


# --------------------------------------------------------------------------- bitwise


def _py_shift(v: int, s: int, left: bool, dtype: np.dtype) -> int:
    bits = dtype.itemsize * 8
    if left:
        r = (v << s) & ((1 << bits) - 1) if s < bits else 0
        if dtype.kind == "i" and r >= 1 << (bits - 1):
            r -= 1 << bits
        return r
    return v >> s if s < bits else (-1 if v < 0 else 0)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift_matches_python(dtype: np.dtype, direction: str) -> None:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(0)
    x = rng.integers(info.min, info.max, size=40, endpoint=True, dtype=dtype)
    s = rng.integers(0, dtype.itemsize * 8 + 3, size=40).astype(dtype)
    want = [_py_shift(int(v), int(k), direction == "LEFT", dtype) for v, k in zip(x, s, strict=True)]
    for device in DEVICES:
        got = ops.bit_shift(x, s, direction=direction, device=device)
        assert got.dtype == dtype
        assert got.tolist() == want


def test_bit_shift_onnx_example_and_errors() -> None:
    x, y = np.array([16, 4, 1], np.uint32), np.array([1, 2, 3], np.uint32)
    assert ops.bit_shift(x, y, direction="RIGHT").tolist() == [8, 1, 0]
    assert ops.bit_shift(x, y, direction="LEFT").tolist() == [32, 16, 8]
    with pytest.raises(OpError, match=r"bit_shift: argument 'direction' expected one of \('LEFT', 'RIGHT'\)"):
        ops.bit_shift(x, y, direction="left")
    with pytest.raises(OpError, match=r"bit_shift: argument 'x' expected .*got float32"):
        ops.bit_shift(x.astype(np.float32), y.astype(np.float32), direction="LEFT")


@pytest.mark.parametrize("dtype", [*INT_DTYPES, np.dtype(bool)], ids=str)
@pytest.mark.parametrize("op", ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not"])
@SETTINGS
@given(shapes=PAIRS, seed=SEEDS)
def test_bitwise(op: str, dtype: np.dtype, shapes: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    if dtype.kind == "b":
        a, b = rng.random(sa) < 0.5, rng.random(sb) < 0.5
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, size=sa, endpoint=True, dtype=dtype)
        b = rng.integers(info.min, info.max, size=sb, endpoint=True, dtype=dtype)
    for device in DEVICES:
        if op == "bitwise_not":
            got, want = ops.bitwise_not(a, device=device), ~a
        else:
            got = getattr(ops, op)(a, b, device=device)
            want = {"bitwise_and": a & b, "bitwise_or": a | b, "bitwise_xor": a ^ b}[op]
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)


def test_bitwise_refuses_floats_naming_the_fix() -> None:
    with pytest.raises(OpError, match=r"bitwise_not: argument 'x' expected .*got float32. Fix: cast 'x'"):
        ops.bitwise_not(np.ones(2, np.float32))
    with pytest.raises(OpError, match=r"bitwise_and: argument 'a' expected .*got float64"):
        ops.bitwise_and(np.ones(2), np.ones(2))


# --------------------------------------------------------------------------- isnan / isinf


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_isnan_isinf(dtype: np.dtype) -> None:
    x = np.array([1.0, -2.0, np.nan, np.inf, -np.inf, 0.0], np.float32).astype(dtype)
    ref = x.astype(np.float32)  # float8_e4m3fn has no inf: its +-inf became NaN
    for device in DEVICES:
        np.testing.assert_array_equal(ops.isnan(x, device=device), np.isnan(ref))
        np.testing.assert_array_equal(ops.isinf(x, device=device), np.isinf(ref))
        pos = ops.isinf(x, detect_negative=False, device=device)
        neg = ops.isinf(x, detect_positive=False, device=device)
        np.testing.assert_array_equal(pos, np.isposinf(ref))
        np.testing.assert_array_equal(neg, np.isneginf(ref))
        assert not ops.isinf(x, detect_positive=False, detect_negative=False, device=device).any()


def test_isnan_refuses_ints() -> None:
    with pytest.raises(OpError, match=r"isnan: argument 'x' expected .*got int32"):
        ops.isnan(np.ones(2, np.int32))


# --------------------------------------------------------------------------- det


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, ml_dtypes.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (2, 1, 2, 2), (0, 3, 3), (1, 1)])
def test_det(dtype: Any, shape: tuple[int, ...]) -> None:
    x = sample(5, shape, dtype, -1, 1)
    want = np.linalg.det(f64(x))
    for device in DEVICES:
        got = ops.det(x, device=device)
        assert got.shape == shape[:-2]
        close(got, want, dtype, scale=10)


def test_det_errors() -> None:
    with pytest.raises(OpError, match=r"det: argument 'x' expected square matrices .*shape \(2, 3\)"):
        ops.det(np.ones((2, 3)))
    with pytest.raises(OpError, match=r"det: argument 'x' expected at least 2 dims"):
        ops.det(np.ones(3))
    with pytest.raises(OpError, match=r"det: argument 'x' expected .*got int64"):
        ops.det(np.ones((2, 2), np.int64))


# --------------------------------------------------------------------------- cumprod


def _cumprod_oracle(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    xs = np.moveaxis(x.astype(object if x.dtype.kind in "iu" else np.float64), axis, 0)
    out = np.empty(xs.shape, xs.dtype)
    run: Any = 1
    order = range(len(xs) - 1, -1, -1) if reverse else range(len(xs))
    for i in order:
        if exclusive:
            out[i], run = run, run * xs[i]
        else:
            run = run * xs[i]
            out[i] = run
    out = np.moveaxis(out, 0, axis)
    if x.dtype.kind in "iu":  # wrap like the dtype
        bits = x.dtype.itemsize * 8
        return (
            np.vectorize(lambda v: int(v) % (1 << bits), otypes=[object])(out)
            .astype(np.uint64)
            .astype(x.dtype)
        )
    return out


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int32, np.int64, np.uint8], ids=str)
@SETTINGS
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5),
    seed=SEEDS,
    exclusive=st.booleans(),
    reverse=st.booleans(),
    data=st.data(),
)
def test_cumprod(dtype: Any, shape: Any, seed: int, exclusive: bool, reverse: bool, data: Any) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = sample(seed, shape, dtype, -3, 3)
    want = _cumprod_oracle(x, axis % len(shape), exclusive, reverse)
    for device in DEVICES:
        got = ops.cumprod(x, axis=axis, exclusive=exclusive, reverse=reverse, device=device)
        assert got.dtype == np.dtype(dtype) and got.shape == x.shape
        if np.dtype(dtype).kind in "iu":
            np.testing.assert_array_equal(got, want)
        else:
            close(got, want.astype(np.float64), dtype, scale=4)


def test_cumprod_onnx_example_and_errors() -> None:
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert ops.cumprod(x, axis=0).tolist() == [1, 2, 6, 24, 120]
    assert ops.cumprod(x, axis=0, exclusive=True, reverse=True).tolist() == [120, 60, 20, 5, 1]
    with pytest.raises(OpError, match=r"cumprod: argument 'axis' expected an axis in \[-1, 1\), got 1"):
        ops.cumprod(x, axis=1)
    with pytest.raises(OpError, match=r"cumprod: argument 'x' expected at least 1 dims"):
        ops.cumprod(np.float64(2.0), axis=0)


# --------------------------------------------------------------------------- 16/32/64-bit integers


@pytest.mark.parametrize("dtype", NEW_INTS, ids=str)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "pow"])
@SETTINGS
@given(shapes=PAIRS, seed=SEEDS)
def test_new_int_dtypes_wrap(op: str, dtype: np.dtype, shapes: Any, seed: int) -> None:
    sa, sb = shapes.input_shapes
    info = np.iinfo(dtype)
    a = sample(seed, sa, dtype, info.min, info.max)
    b = sample(seed + 1, sb, dtype, 0, 5) if op == "pow" else sample(seed + 1, sb, dtype, info.min, info.max)
    py = {"add": lambda p, q: p + q, "sub": lambda p, q: p - q, "mul": lambda p, q: p * q, "pow": pow}[op]
    a2, b2 = np.broadcast_arrays(a, b)
    bits = dtype.itemsize * 8
    want = [py(int(p), int(q)) % (1 << bits) for p, q in zip(a2.ravel(), b2.ravel(), strict=True)]
    for device in DEVICES:
        got = getattr(ops, op)(a, b, device=device)
        assert got.dtype == dtype
        assert [int(v) % (1 << bits) for v in got.ravel()] == want


@pytest.mark.parametrize("dtype", NEW_INTS, ids=str)
def test_new_int_dtypes_compare_select_and_reduce(dtype: np.dtype) -> None:
    info = np.iinfo(dtype)
    a = np.array([info.min, 0, 7, info.max], dtype)
    b = np.array([info.max, 0, 3, info.min], dtype)
    for device in DEVICES:
        assert ops.equal(a, b, device=device).tolist() == [False, True, False, False]
        assert ops.less(a, b, device=device).tolist() == [True, False, False, False]
        assert ops.greater(a, b, device=device).tolist() == [False, False, True, True]
        np.testing.assert_array_equal(ops.where(ops.greater(a, b), a, b), np.maximum(a, b))
        assert ops.abs(a, device=device).dtype == dtype
        assert ops.relu(a, device=device).dtype == dtype
        np.testing.assert_array_equal(ops.clip(a, min=1, max=5, device=device), np.clip(a, 1, 5))
    assert ops.max(a).tolist() == int(info.max)
    assert ops.cast(a, dtype="float64").tolist() == [float(v) for v in a.tolist()]


def test_mixed_int_promotion_follows_numpy() -> None:
    assert ops.result_dtype("int8", "uint8") == np.int16
    assert ops.result_dtype("uint16", "int16") == np.int32
    assert ops.result_dtype("uint32", "int32") == np.int64
    assert ops.add(np.ones(2, np.int8), np.ones(2, np.uint8)).dtype == np.int16
    assert ops.add(np.ones(2, np.uint16), 3).dtype == np.uint16  # a Python int is weak


def test_integer_pow_with_negative_exponent_truncates() -> None:
    a = np.array([2, -1, -1, 1, 0, 3], np.int32)
    b = np.array([-1, -1, -2, -5, -1, 2], np.int32)
    for device in DEVICES:
        assert ops.pow(a, b, device=device).tolist() == [0, -1, 1, 1, 0, 9]
