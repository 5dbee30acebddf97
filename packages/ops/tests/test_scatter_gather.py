"""Index ops — gather_elements, gather_nd, scatter_elements, scatter_nd, argmin, one_hot — against onnx's
reference evaluator, ``cpu`` against ``ref`` on random shapes, and their error paths."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops import OpError
from opstrata.ops.testing import assert_close

onnx = pytest.importorskip("onnx")
from onnx.reference import ReferenceEvaluator  # noqa: E402

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEVICES = ("ref", "cpu")
DTYPES = (np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32, np.int64, np.int8, np.uint8)


def onnx_ref(op: str, feeds: dict[str, Any], **attrs: Any) -> list[np.ndarray]:
    """Outputs of one ONNX node run by onnx's reference evaluator."""
    node = onnx.helper.make_node(op, list(feeds), ["y"], **attrs)
    return ReferenceEvaluator(node).run(None, feeds)


def data(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return (rng.standard_normal(shape) * 4).astype(dtype)


# --------------------------------------------------------------------------- gather_elements


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_matches_onnx(device: str, axis: int) -> None:
    rng = np.random.default_rng(0)
    x = data(rng, (3, 4, 2), np.float32)
    n = x.shape[axis]
    ishape = list(x.shape)
    ishape[axis] = 5
    idx = rng.integers(-n, n, size=ishape).astype(np.int64)
    got = ops.gather_elements(x, idx, axis=axis, device=device)
    want = onnx_ref("GatherElements", {"x": x, "i": idx}, axis=axis % x.ndim)[0]  # its axis=-1 is broken
    assert_close(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_elements_keeps_dtype(dtype: Any) -> None:
    x = np.arange(6).reshape(2, 3).astype(dtype)
    got = ops.gather_elements(x, np.array([[2, 0]], np.int32), axis=1)
    assert got.dtype == np.dtype(dtype)
    assert got.astype(np.float64).tolist() == [[2.0, 0.0]]


@SETTINGS
@given(st.integers(0, 2**31), st.integers(1, 4))
def test_gather_elements_cpu_equals_ref(seed: int, rank: int) -> None:
    rng = np.random.default_rng(seed)
    shape = tuple(int(s) for s in rng.integers(1, 4, size=rank))
    axis = int(rng.integers(-rank, rank))
    x = data(rng, shape, np.float32)
    ishape = tuple(
        int(rng.integers(1, s + 1)) if d != axis % rank else int(rng.integers(0, 4))
        for d, s in enumerate(shape)
    )
    idx = rng.integers(-shape[axis], shape[axis], size=ishape)
    np.testing.assert_array_equal(
        ops.gather_elements(x, idx, axis=axis, device="cpu"),
        ops.gather_elements(x, idx, axis=axis, device="ref"),
    )


def test_gather_elements_errors_name_the_argument() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(OpError, match=r"gather_elements: argument 'indices' expected values in \[-3, 2\]"):
        ops.gather_elements(x, np.array([[3]]), axis=1)
    with pytest.raises(OpError, match="gather_elements: argument 'indices' expected rank 2"):
        ops.gather_elements(x, np.array([0]), axis=1)
    with pytest.raises(OpError, match="gather_elements: argument 'axis'"):
        ops.gather_elements(x, np.array([[0]]), axis=2)
    with pytest.raises(OpError, match="argument 'indices' expected"):
        ops.gather_elements(x, np.array([[0.0]]), axis=1)


# --------------------------------------------------------------------------- gather_nd


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("xshape", "ishape", "batch_dims"),
    [
        ((2, 3, 4), (5, 2), 0),
        ((2, 3, 4), (5, 3), 0),
        ((2, 3, 4), (2, 1), 1),
        ((2, 3, 4), (2, 5, 2), 1),
        ((3, 4), (1,), 0),
    ],
)
def test_gather_nd_matches_onnx(
    device: str, xshape: tuple[int, ...], ishape: tuple[int, ...], batch_dims: int
) -> None:
    rng = np.random.default_rng(1)
    x = data(rng, xshape, np.float32)
    k = ishape[-1]
    dims = np.array(xshape[batch_dims : batch_dims + k])
    idx = (rng.integers(0, 1 << 20, size=ishape) % dims).astype(np.int64)
    got = ops.gather_nd(x, idx, batch_dims=batch_dims, device=device)
    assert_close(got, onnx_ref("GatherND", {"x": x, "i": idx}, batch_dims=batch_dims)[0])


@pytest.mark.parametrize("device", DEVICES)
def test_gather_nd_negative_indices_count_from_the_end(device: str) -> None:
    x = np.arange(6).reshape(2, 3)
    assert ops.gather_nd(x, np.array([[-1, -1], [0, -3]]), device=device).tolist() == [5, 0]


def test_gather_nd_errors() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(OpError, match="gather_nd: argument 'indices' expected entries in"):
        ops.gather_nd(x, np.array([[2, 0]]))
    with pytest.raises(OpError, match="gather_nd: argument 'indices' expected a last dim <= 2"):
        ops.gather_nd(x, np.array([[0, 0, 0]]))
    with pytest.raises(OpError, match="gather_nd: argument 'batch_dims'"):
        ops.gather_nd(x, np.array([[0]]), batch_dims=2)
    with pytest.raises(OpError, match="gather_nd: argument 'indices' expected"):
        ops.gather_nd(x, np.array([[0.0]]))


# --------------------------------------------------------------------------- scatter_elements / scatter_nd

REDUCTIONS = ("none", "add", "mul", "max", "min")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("axis", [0, -1])
def test_scatter_elements_matches_onnx(device: str, reduction: str, axis: int) -> None:
    rng = np.random.default_rng(2)
    x = data(rng, (3, 4), np.float32)
    n = x.shape[axis]
    ishape = (2, 4) if axis == 0 else (3, 2)
    idx = rng.integers(-n, n, size=ishape).astype(np.int64)
    if reduction == "none":  # distinct targets: the spec leaves duplicates open
        idx = np.broadcast_to(
            np.arange(ishape[axis]).reshape((-1, 1) if axis == 0 else (1, -1)), ishape
        ).copy()
    upd = data(rng, ishape, np.float32)
    got = ops.scatter_elements(x, idx, upd, axis=axis, reduction=reduction, device=device)
    want = onnx_ref("ScatterElements", {"x": x, "i": idx, "u": upd}, axis=axis, reduction=reduction)[0]
    assert_close(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_scatter_duplicates_reduce_every_update(device: str) -> None:
    x = np.ones(3, np.int64)
    got = ops.scatter_elements(x, np.array([1, 1, -1]), np.array([2, 3, 4]), reduction="mul", device=device)
    assert got.tolist() == [1, 6, 4]
    got = ops.scatter_nd(x, np.array([[1], [1]]), np.array([5, 7]), reduction="add", device=device)
    assert got.tolist() == [1, 13, 1]
    got = ops.scatter_nd(x, np.array([[0], [0]]), np.array([5, 7]), device=device)
    assert got.tolist() == [7, 1, 1]  # last wins
    assert x.tolist() == [1, 1, 1]  # x is not written


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_nd_matches_onnx(device: str, reduction: str) -> None:
    rng = np.random.default_rng(3)
    x = data(rng, (4, 3, 2), np.float32)
    idx = np.array([[0, 1], [2, 2], [0, 1]] if reduction != "none" else [[0, 1], [2, 2], [3, 0]], np.int64)
    upd = data(rng, (3, 2), np.float32)
    got = ops.scatter_nd(x, idx, upd, reduction=reduction, device=device)
    assert_close(got, onnx_ref("ScatterND", {"x": x, "i": idx, "u": upd}, reduction=reduction)[0])


@SETTINGS
@given(
    st.integers(0, 2**31), st.sampled_from(REDUCTIONS), st.sampled_from([np.float32, np.int64, np.float16])
)
def test_scatter_cpu_equals_ref(seed: int, reduction: str, dtype: Any) -> None:
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(1, 4))
    shape = tuple(int(s) for s in rng.integers(1, 4, size=rank))
    x = data(rng, shape, dtype)
    axis = int(rng.integers(0, rank))
    ishape = tuple(int(rng.integers(1, s + 1)) for s in shape)
    idx = rng.integers(-shape[axis], shape[axis], size=ishape)
    upd = data(rng, ishape, dtype)
    a = ops.scatter_elements(x, idx, upd, axis=axis, reduction=reduction, device="cpu")
    b = ops.scatter_elements(x, idx, upd, axis=axis, reduction=reduction, device="ref")
    assert_close(a, b)
    k = int(rng.integers(1, rank + 1))
    nidx = np.stack([rng.integers(-shape[j], shape[j], size=(3,)) for j in range(k)], axis=-1)
    nupd = data(rng, (3, *shape[k:]), dtype)
    a = ops.scatter_nd(x, nidx, nupd, reduction=reduction, device="cpu")
    b = ops.scatter_nd(x, nidx, nupd, reduction=reduction, device="ref")
    assert_close(a, b)


def test_scatter_errors() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(OpError, match="scatter_elements: argument 'reduction' expected one of"):
        ops.scatter_elements(x, np.zeros((1, 1), np.int64), np.zeros((1, 1), np.float32), reduction="sum")
    with pytest.raises(OpError, match="scatter_elements: argument 'updates' expected shape"):
        ops.scatter_elements(x, np.zeros((1, 1), np.int64), np.zeros((1, 2), np.float32))
    with pytest.raises(OpError, match="scatter_elements: argument 'updates' expected dtype float32"):
        ops.scatter_elements(x, np.zeros((1, 1), np.int64), np.zeros((1, 1), np.float64))
    with pytest.raises(OpError, match="scatter_nd: argument 'updates' expected shape"):
        ops.scatter_nd(x, np.zeros((1, 1), np.int64), np.zeros((2,), np.float32))
    with pytest.raises(OpError, match="scatter_nd: argument 'indices' expected entries"):
        ops.scatter_nd(x, np.array([[5]]), np.zeros((1, 3), np.float32))


# --------------------------------------------------------------------------- argmin, one_hot


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_argmin_matches_onnx(device: str, last: int, keepdims: int) -> None:
    x = np.random.default_rng(4).integers(0, 3, size=(3, 5)).astype(np.float32)  # many ties
    got = ops.argmin(x, axis=1, keepdims=bool(keepdims), select_last_index=bool(last), device=device)
    want = onnx_ref("ArgMin", {"x": x}, axis=1, keepdims=keepdims, select_last_index=last)[0]
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.int64


@SETTINGS
@given(st.integers(0, 2**31), st.booleans())
def test_argmin_cpu_equals_ref_with_nan(seed: int, last: bool) -> None:
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 2, size=(3, 4)).astype(np.float32)
    x[rng.random(x.shape) < 0.2] = np.nan
    a = ops.argmin(x, axis=-1, select_last_index=last, device="cpu")
    np.testing.assert_array_equal(a, ops.argmin(x, axis=-1, select_last_index=last, device="ref"))


def test_argmin_errors() -> None:
    with pytest.raises(OpError, match="argmin: argument 'x' expected a non-empty axis"):
        ops.argmin(np.zeros((2, 0)), axis=1)
    with pytest.raises(OpError, match="argmin: argument 'axis'"):
        ops.argmin(np.zeros((2, 2)), axis=3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_matches_onnx(device: str, axis: int) -> None:
    idx = np.array([[0, -1, 7], [2, -4, 1]], np.int64)  # -4 and 7 are out of range for depth 4
    values = np.array([-2.0, 3.0], np.float32)
    got = ops.one_hot(idx, 4, values, axis=axis, device=device)
    want = onnx_ref("OneHot", {"i": idx, "d": np.array(4, np.int64), "v": values}, axis=axis)[0]
    assert_close(got, want)


def test_one_hot_errors() -> None:
    with pytest.raises(OpError, match="one_hot: argument 'values' expected 2 entries"):
        ops.one_hot(np.array([0]), 3, np.array([0, 1, 2]))
    with pytest.raises(OpError, match="one_hot: argument 'depth' expected a positive scalar"):
        ops.one_hot(np.array([0]), 0, np.array([0, 1]))


# --------------------------------------------------------------------------- compress, unique


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress_matches_onnx(device: str, axis: int | None) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    cond = np.array([True, False, True])  # shorter than the axis: the rest is dropped
    got = ops.compress(x, cond, axis=axis, device=device)
    want = onnx_ref("Compress", {"x": x, "c": cond}, **({} if axis is None else {"axis": axis}))[0]
    np.testing.assert_array_equal(got, want)


def test_compress_errors() -> None:
    with pytest.raises(OpError, match="compress: argument 'condition' expected a 1-D bool array"):
        ops.compress(np.zeros(3), np.array([1, 0]))
    with pytest.raises(OpError, match="compress: argument 'condition' expected at most 3 entries"):
        ops.compress(np.zeros(3), np.ones(4, bool), axis=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("axis", "is_sorted"), [(None, 1), (None, 0), (0, 1), (1, 1), (-1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, ml_dtypes.bfloat16])
def test_unique_matches_onnx(device: str, axis: int | None, is_sorted: int, dtype: Any) -> None:
    x = np.array([[2, 1, 1], [3, 0, 0], [2, 1, 1]], np.float32).astype(dtype)
    got = ops.unique(x, axis=axis, sorted=bool(is_sorted), device=device)
    attrs = {"sorted": is_sorted, **({} if axis is None else {"axis": axis})}
    node = onnx.helper.make_node("Unique", ["x"], ["y", "i", "v", "c"], **attrs)
    ref_x = (
        x.astype(np.float32) if axis is not None else x.astype(np.float32).reshape(-1)
    )  # its 2-D sorted=0 is broken
    want = ReferenceEvaluator(node).run(None, {"x": ref_x})
    assert got[0].dtype == np.dtype(dtype)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.astype(w.dtype), w)
