"""tensor_from_array / array_from_tensor / dtype_to_onnx / dtype_from_onnx: ONNX tensors and ml_dtypes
arrays round-trip on every supported onnx (onnx < 1.19 maps bfloat16/float8/int4 to float32/int8)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

onnx = pytest.importorskip("onnx")

import opstrata.graph as og  # noqa: E402

T = onnx.TensorProto
CASES = [
    (np.float32, T.FLOAT),
    (ml_dtypes.bfloat16, T.BFLOAT16),
    (ml_dtypes.float8_e4m3fn, T.FLOAT8E4M3FN),
    (ml_dtypes.float8_e5m2, T.FLOAT8E5M2),
    (ml_dtypes.int4, T.INT4),
    (ml_dtypes.uint4, T.UINT4),
    (np.int8, T.INT8),
]


@pytest.mark.parametrize(("dtype", "elem"), CASES)
@settings(max_examples=15, deadline=None)
@given(shape=st.lists(st.integers(0, 4), min_size=0, max_size=3), seed=st.integers(0, 2**16))
def test_round_trip_keeps_dtype_shape_and_values(dtype, elem, shape, seed) -> None:
    """Negative values included: onnx 1.16's to_array rejects raw float8 bytes >= 0x80."""
    rng = np.random.default_rng(seed)
    lo, hi = (0, 15) if dtype is ml_dtypes.uint4 else (-8, 7)
    values = (
        rng.integers(lo, hi + 1, size=shape)
        if np.dtype(dtype).kind in "iu" or "int4" in np.dtype(dtype).name
        else rng.uniform(-4, 4, size=shape)
    )
    a = np.asarray(values).astype(dtype)
    t = og.tensor_from_array(a, "t")
    assert t.data_type == elem == og.dtype_to_onnx(np.dtype(dtype))
    assert og.dtype_from_onnx(elem, "test") == np.dtype(dtype)
    b = og.array_from_tensor(t)
    assert b.dtype == np.dtype(dtype) and b.shape == a.shape
    np.testing.assert_array_equal(b.astype(np.float32), a.astype(np.float32))


def test_raw_negative_float8_bytes_decode() -> None:
    raw = bytes([0x80 | 0x38, 0x38, 0xC0])  # -1.0, 1.0, -2.0 in e4m3fn
    t = onnx.helper.make_tensor("f8", T.FLOAT8E4M3FN, [3], raw, raw=True)
    got = og.array_from_tensor(t)
    assert got.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and got.astype(np.float32).tolist() == [
        -1.0,
        1.0,
        -2.0,
    ]
