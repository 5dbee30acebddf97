"""Reductions through the graph (ONNX import, shape rules, executor, plan, export) against onnxruntime:
ReduceProd/L1/L2/LogSum/LogSumExp/SumSquare (axes as attribute before opset 18, as a constant input from 18),
keepdims, noop_with_empty_axes, empty sets, ReduceMax/ReduceMin on ints and bool."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from _onnx_check import F, check_against_ort, const, feed, needs_ort_noop_reduce, node_model, rng  # noqa: E402

from opstrata.graph import from_onnx, run_graph  # noqa: E402

_node_model = node_model


NEW = ["ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def _pos(*s: int) -> np.ndarray:
    return (np.abs(F(*s)) + 0.5).astype(np.float32)


@pytest.mark.parametrize("op", NEW)
@pytest.mark.parametrize(("axes", "keepdims"), [([1], 1), ([0, -1], 0), (None, 1), (None, 0)])
def test_axes_attribute_before_opset_18(op: str, axes: list[int] | None, keepdims: int) -> None:
    attrs: dict[str, Any] = {"keepdims": keepdims} | ({"axes": axes} if axes is not None else {})
    check_against_ort(op, [feed(_pos(2, 3, 4))], attrs, opset=13)


@pytest.mark.parametrize("op", NEW)
@pytest.mark.parametrize("axes", [[1], [-1, 0], None])
def test_axes_constant_input_from_opset_18(op: str, axes: list[int] | None) -> None:
    ins = [feed(_pos(2, 3, 4))] + ([const(np.array(axes, np.int64))] if axes is not None else [])
    check_against_ort(op, ins, {"keepdims": 0}, opset=18)


@pytest.mark.parametrize("op", NEW)
def test_noop_with_empty_axes_is_identity(op: str) -> None:
    needs_ort_noop_reduce(op, axes="const")
    check_against_ort(
        op, [feed(_pos(2, 3)), const(np.array([], np.int64))], {"noop_with_empty_axes": 1}, opset=18
    )


@pytest.mark.parametrize("op", ["ReduceProd", "ReduceL1", "ReduceSumSquare", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_int_reductions_keep_the_dtype(op: str, dtype: Any) -> None:
    x = rng.integers(-3, 4, size=(2, 3, 4)).astype(dtype)
    check_against_ort(op, [feed(x), const(np.array([1], np.int64))], {"keepdims": 1}, opset=18)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("axes", [[1], [0, 2], None])
def test_int_reduce_mean_truncates_toward_zero_like_ort(dtype: Any, axes: list[int] | None) -> None:
    x = rng.integers(-50, 50, size=(2, 3, 4)).astype(dtype)
    attrs = {"keepdims": 0} if axes is None else {"keepdims": 0, "axes": axes}
    check_against_ort("ReduceMean", [feed(x)], attrs, opset=17)


def test_reduce_mean_of_int8_is_refused_with_the_fix() -> None:
    from opstrata.graph import GraphError

    m, _ = node_model("ReduceMean", [feed(np.zeros((2, 3), np.int8))], {}, 1, 17, infer_types=False)
    with pytest.raises(GraphError, match=r"ReduceMean.*floating dtype, got int8.*Cast"):
        from_onnx(m)


@pytest.mark.parametrize(
    "op",
    ["ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ReduceSum"],
)
def test_empty_set_gives_the_identity(op: str) -> None:
    check_against_ort(
        op, [feed(np.zeros((2, 0, 4), np.float32)), const(np.array([1], np.int64))], {}, opset=18
    )


@pytest.mark.parametrize(
    ("op", "dtype"), [("ReduceMax", np.float32), ("ReduceMin", np.float32), ("ReduceMax", np.int64)]
)
def test_max_min_of_an_empty_set_is_the_dtype_extreme(op: str, dtype: Any) -> None:
    model, feeds = _node_model(
        op, [feed(np.zeros((2, 0, 4), dtype)), const(np.array([1], np.int64))], {}, 1, 18
    )
    got = run_graph(from_onnx(model), feeds)["out0"]
    lowest = -np.inf if dtype == np.float32 else np.iinfo(dtype).min
    highest = np.inf if dtype == np.float32 else np.iinfo(dtype).max
    np.testing.assert_array_equal(got, np.full((2, 1, 4), lowest if op == "ReduceMax" else highest, dtype))


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_max_min_take_bool_from_opset_20(op: str) -> None:
    x = np.array([[True, False, True], [False, False, True]])
    check_against_ort(op, [feed(x), const(np.array([1], np.int64))], {"keepdims": 0}, opset=20)


def test_bool_input_to_a_sum_reduction_is_refused() -> None:
    model, _ = _node_model("ReduceMax", [feed(np.array([True]))], {}, 1, 20)
    model.graph.node[0].op_type = "ReduceProd"
    model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.BOOL
    with pytest.raises(Exception, match="ReduceProd"):
        run_graph(from_onnx(model), {"in0": np.array([True])})
