"""Errors: OpError wording and fields, the check_* helpers, unknown op and missing kernel messages."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis.extra import numpy as hnp

import opstrata.ops as ops
from opstrata.ops._errors import check_broadcastable, check_dtype, check_ndim, check_shape_match


def test_op_error_fields_and_message():
    with pytest.raises(ops.OpError) as info:
        check_dtype("softmax", "x", np.zeros(3, np.int32), "floating")
    e = info.value
    assert isinstance(e, ValueError)
    assert (e.op, e.argument, e.expected, e.actual) == ("softmax", "x", "a floating dtype", "int32")
    assert str(e).startswith(
        "softmax: argument 'x' expected a floating dtype, got int32. Fix: cast 'x' first, e.g. x.astype('float32')"
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ops.bfloat16, ops.float8_e4m3fn, ops.float8_e5m2])
def test_check_dtype_floating_accepts_ml_dtypes(dtype):
    assert check_dtype("relu", "x", np.zeros(1, dtype), "floating") == np.dtype(dtype)


def test_check_dtype_variants():
    assert check_dtype("gather", "indices", np.zeros(2, np.int64), "index") == np.int64
    assert check_dtype("where", "cond", np.zeros(2, bool), "bool") == np.bool_
    with pytest.raises(ops.OpError, match=r"argument 'w' expected one of \(float32\), got float64"):
        check_dtype("linear", "w", np.zeros(2), [np.float32])
    with pytest.raises(ops.OpError, match="expected an integer dtype, got float32"):
        check_dtype("embedding", "ids", np.zeros(2, np.float32), "integer")
    with pytest.raises(ValueError, match="unknown category 'float'"):
        check_dtype("x", "x", np.zeros(1), "float")
    assert check_dtype("add", "a", 1.5, "floating") == np.float64  # array-likes are fine


def test_check_ndim_variants():
    x = np.zeros((2, 3, 4))
    assert check_ndim("conv2d", "x", np.zeros((1, 1, 2, 2)), 4, layout="NCHW") == 4
    with pytest.raises(
        ops.OpError, match=r"conv2d: argument 'x' expected 4 dims \(NCHW\), got 3 dims with shape \(2, 3, 4\)"
    ):
        check_ndim("conv2d", "x", x, 4, layout="NCHW")
    assert check_ndim("matmul", "a", x, (1, None)) == 3
    with pytest.raises(ops.OpError, match="expected 1 to 2 dims, got 3 dims"):
        check_ndim("linear", "w", x, (1, 2))
    with pytest.raises(ops.OpError, match=r"expected one of \[2, 4\] dims"):
        check_ndim("pool", "x", x, {2, 4})
    assert check_ndim("attention", "q", np.zeros((1, 1, 1, 1)), range(3, 5)) == 4


def test_check_shape_match():
    a, b = np.zeros((2, 3)), np.zeros((4, 5))
    with pytest.raises(ops.OpError) as info:
        check_shape_match("matmul", "a", a, "b", b, axis_a=-1, axis_b=-2)
    assert str(info.value) == (
        "matmul: argument 'b' expected dim -2 to equal dim -1 of 'a' (3), got 4; shapes (2, 3) and (4, 5)"
    )
    check_shape_match("add", "a", a, "b", np.ones((2, 3)))
    with pytest.raises(ops.OpError, match=r"expected the shape of 'a' \(2, 3\), got \(4, 5\)"):
        check_shape_match("add", "a", a, "b", b)
    with pytest.raises(ops.OpError, match="expected a dim at axis 2"):
        check_shape_match("cat", "a", a, "b", b, axis_a=2)


@given(
    hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3),
    hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3),
)
def test_check_broadcastable_agrees_with_numpy(sa, sb):
    try:
        expected = np.broadcast_shapes(sa, sb)
    except ValueError:
        with pytest.raises(ops.OpError, match="broadcastable"):
            check_broadcastable("add", "a", np.empty(sa), "b", np.empty(sb))
    else:
        assert check_broadcastable("add", "a", np.empty(sa), "b", np.empty(sb)) == expected


def test_unknown_op_suggests_closest_names():
    ops.register("_test_softmax", device="ref")(lambda x: x)
    ops.register("_test_log_softmax", device="ref")(lambda x: x)
    with pytest.raises(ops.UnknownOpError) as info:
        ops.call("_test_sofmax", np.ones(2))
    e = info.value
    assert isinstance(e, LookupError)
    assert e.suggestions[0] == "_test_softmax"
    msg = str(e)
    assert msg.startswith("unknown op '_test_sofmax'; did you mean '_test_softmax'")
    assert "opstrata.ops.list_ops()" in msg and "docs/op-coverage.md" in msg
    with pytest.raises(ops.UnknownOpError, match="no_such_op"):
        ops.kernels("no_such_op")


def test_no_kernel_error_lists_what_is_registered():
    ops.register("_test_f32", device="ref", dtypes=[np.float32, np.float64])(lambda x: x)
    with pytest.raises(ops.NoKernelError) as info:
        ops.call("_test_f32", np.ones(2, np.int32))
    e = info.value
    assert (e.op, e.device, e.dtype) == ("_test_f32", "cpu", np.int32)
    assert e.registered == {"ref": "float32, float64"}
    msg = str(e)
    assert "_test_f32: no kernel for device 'cpu' and dtype int32. Tried: cpu -> ref." in msg
    assert "Registered: ref: float32, float64" in msg and "@opstrata.ops.register('_test_f32'" in msg
    assert isinstance(e, NotImplementedError)


def test_check_dtype_and_ndim_fast_paths_agree_with_the_full_checks():
    allowed = (np.dtype(np.float32), np.dtype(np.float64))
    x = np.zeros((2, 3), np.float32)
    for spec in (allowed, list(allowed), frozenset(allowed)):  # tuple/frozenset: cached set; list: full path
        assert check_dtype("op", "x", x, spec) == np.dtype(np.float32)
        with pytest.raises(ops.OpError, match=r"op: argument 'x' expected one of \(.*float32.*\), got int64"):
            check_dtype("op", "x", x.astype(np.int64), spec)
    assert check_ndim("op", "x", x, 2) == 2 and check_ndim("op", "x", x, (1, None)) == 2
    assert check_ndim("op", "x", x, (2, 3)) == 2 and check_ndim("op", "x", x, {2, 4}) == 2
    with pytest.raises(ops.OpError, match=r"expected 3 dims \(NCHW\), got 2 dims with shape \(2, 3\)"):
        check_ndim("op", "x", x, 3, layout="NCHW")
    with pytest.raises(ops.OpError, match="expected at least 3 dims"):
        check_ndim("op", "x", x, (3, None))
    with pytest.raises(ops.OpError, match="expected 3 to 4 dims"):
        check_ndim("op", "x", x, (3, 4))
