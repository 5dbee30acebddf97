"""Dtypes: the supported set, promotion (result_dtype) and accumulation rules."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

import opstrata.ops as ops
from opstrata.ops import _dtypes

NAMES = list(_dtypes.DTYPES_BY_NAME)


def test_low_precision_are_ml_dtypes():
    assert ops.bfloat16 == np.dtype(ml_dtypes.bfloat16)
    assert ops.float8_e4m3fn == np.dtype(ml_dtypes.float8_e4m3fn)
    assert ops.float8_e5m2 == np.dtype(ml_dtypes.float8_e5m2)
    assert set(ops.LOW_PRECISION_DTYPES) == {ops.float16, ops.bfloat16, ops.float8_e4m3fn, ops.float8_e5m2}


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("bfloat16", "float32", "float32"),
        ("float8_e4m3fn", "float32", "float32"),
        ("float8_e5m2", "float64", "float64"),
        ("bfloat16", "float16", "float32"),
        ("float8_e4m3fn", "bfloat16", "float32"),
        ("float8_e4m3fn", "float8_e5m2", "float32"),
        ("bfloat16", "int64", "bfloat16"),
        ("float16", "int32", "float16"),
        ("bfloat16", "bool", "bfloat16"),
        ("int32", "float32", "float64"),  # numpy's rule outside low precision
        ("int8", "uint8", "int16"),  # numpy's rule
        ("uint64", "int64", "float64"),  # numpy's rule: no integer holds both
        ("float32", "float32", "float32"),
        ("bool", "bool", "bool"),
    ],
)
def test_result_dtype_table(a, b, expected):
    assert ops.result_dtype(a, b) == np.dtype(expected)


@given(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4), st.randoms())
def test_result_dtype_is_order_independent_and_idempotent(names, rnd):
    shuffled = list(names)
    rnd.shuffle(shuffled)
    r = ops.result_dtype(*names)
    assert r == ops.result_dtype(*shuffled)
    assert ops.result_dtype(r, r) == r
    if any(_dtypes.DTYPES_BY_NAME[n] in ops.FLOAT_DTYPES for n in names):
        assert r in ops.FLOAT_DTYPES  # a float input always gives a float result


def test_result_dtype_errors():
    with pytest.raises(TypeError, match="at least one dtype"):
        ops.result_dtype()
    with pytest.raises(TypeError, match="not supported by opstrata"):
        ops.result_dtype("complex64", "float32")


@pytest.mark.parametrize(
    ("dtype", "acc"),
    [
        ("bfloat16", "float32"),
        ("float16", "float32"),
        ("float8_e5m2", "float32"),
        ("float32", "float32"),
        ("float64", "float64"),
        ("int8", "int64"),
        ("bool", "int64"),
    ],
)
def test_accumulation_dtype(dtype, acc):
    assert ops.accumulation_dtype(dtype) == np.dtype(acc)
    assert ops.compute_dtype(dtype) == (
        np.dtype("float32") if ops.is_low_precision(dtype) else np.dtype(dtype)
    )


def test_as_dtype():
    assert ops.as_dtype("bfloat16") == ops.bfloat16
    assert ops.as_dtype(np.float32) == ops.float32
    with pytest.raises(TypeError, match="unknown dtype 'bfloat61'; expected one of float64"):
        ops.as_dtype("bfloat61")
