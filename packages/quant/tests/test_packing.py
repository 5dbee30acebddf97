"""int4/uint4 packing: ONNX's byte layout (low nibble first), round trips, and bad input."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from opstrata.graph import tensor_from_array
from opstrata.quant import QuantError, pack_int4, unpack_int4


def _onnx_packed(a: np.ndarray) -> bytes:
    """onnx's packed int4 bytes of ``a``: its raw_data, or (onnx < 1.19, whose numpy_helper cannot convert
    ml_dtypes arrays: helper.make_tensor) one packed byte per int32_data entry."""
    t = tensor_from_array(a, "w")
    return t.raw_data or np.array(t.int32_data).astype(np.uint8).tobytes()  # int4: signed bytes


def test_layout_matches_onnx_int4_raw_data() -> None:
    v = np.array([[1, -2, 7], [-8, 0, 5]], np.int8).astype(ml_dtypes.int4)
    assert pack_int4(v).tobytes() == _onnx_packed(v)
    u = np.array([0, 15, 3, 9, 1], np.uint8).astype(ml_dtypes.uint4)
    assert pack_int4(u).tobytes() == _onnx_packed(u)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-8, 7), min_size=0, max_size=65), st.booleans())
def test_int4_round_trip(values: list[int], unsigned: bool) -> None:
    a = np.array(values, np.int8)
    if unsigned:
        a = (a + 8).astype(np.uint8)
    packed = pack_int4(a)
    assert packed.dtype == np.uint8 and packed.size == (a.size + 1) // 2
    back = unpack_int4(packed, a.shape, "uint4" if unsigned else "int4")
    assert back.astype(np.int16).tolist() == a.astype(np.int16).tolist()


def test_unpack_restores_shape() -> None:
    v = np.arange(-6, 6, dtype=np.int8).reshape(3, 4)
    back = unpack_int4(pack_int4(v), (3, 4))
    assert back.shape == (3, 4) and back.dtype == np.dtype(ml_dtypes.int4)
    np.testing.assert_array_equal(back.astype(np.int8), v)


def test_bad_input() -> None:
    with pytest.raises(QuantError, match=r"values in \[-9, 3\] do not fit 4 bits"):
        pack_int4(np.array([-9, 3]))
    with pytest.raises(QuantError, match="expected int4/uint4 or integer values"):
        pack_int4(np.array([0.5]))
    with pytest.raises(QuantError, match="3 values need 2 bytes, got 1"):
        unpack_int4(np.zeros(1, np.uint8), 3)
    with pytest.raises(QuantError, match="expected 'int4' or 'uint4'"):
        unpack_int4(np.zeros(1, np.uint8), 2, "int8")
