"""Reduce* axes and CumSum/CumProd axis computed at run time (ONNX operator spec, opset 18+): the IR node
keeps the input, the kernel reads it, results equal onnxruntime, and export writes the input back. Also
the training-mode forms with a deterministic result: Dropout with a run-time training_mode / ratio and
BatchNormalization training_mode=1 (running statistics)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from _onnx_check import needs_ort_noop_reduce  # noqa: E402
from onnx import TensorProto, helper as oh  # noqa: E402

from opstrata.graph import GraphError, UnsupportedOpError, from_onnx, run_graph, to_onnx  # noqa: E402
from opstrata.graph.testing import ort_run  # noqa: E402

REDUCE = (
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
)  # fmt: skip


def _model(op: str, x_shape: list[int], second: str, opset: int = 18, **attrs) -> onnx.ModelProto:
    """``op(x, <second>)`` where the second input is a graph input (known only when the model runs)."""
    node = oh.make_node(op, ["x", second], ["y"], name="n", **attrs)
    graph = oh.make_graph(
        [node],
        "g",
        [
            oh.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
            oh.make_tensor_value_info(second, TensorProto.INT64, [None] if second == "axes" else []),
        ],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 1e-5) -> None:
    """run_graph and the re-exported model agree with onnxruntime; the IR node keeps the run-time input."""
    g = from_onnx(model)
    node = next(n for n in g.nodes if n.name == "n")
    assert node.inputs[1] == model.graph.input[1].name, "the run-time input stays an input of the IR node"
    want = ort_run(model, feeds)["y"]
    got = run_graph(g, feeds)["y"]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6)
    exported = to_onnx(g)
    assert model.graph.input[1].name in exported.graph.node[0].input, "exported with the run-time input"
    np.testing.assert_allclose(ort_run(exported, feeds)["y"], want, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_with_run_time_axes(op: str, keepdims: int) -> None:
    x = np.random.default_rng(0).uniform(0.5, 2.0, (2, 3, 4)).astype(np.float32)
    _check(_model(op, [2, 3, 4], "axes", keepdims=keepdims), {"x": x, "axes": np.array([0, -1], np.int64)})


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("noop", [0, 1])
def test_reduce_with_empty_run_time_axes(op: str, noop: int) -> None:
    """An empty axes tensor reduces every axis, or none with noop_with_empty_axes (elementwise part stays)."""
    if noop:
        needs_ort_noop_reduce(op, axes="feed")
    x = np.random.default_rng(1).uniform(0.5, 2.0, (2, 3)).astype(np.float32)
    model = _model(op, [2, 3], "axes", keepdims=1, noop_with_empty_axes=noop)
    _check(model, {"x": x, "axes": np.zeros(0, np.int64)})


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=4), data=st.data())
def test_reduce_sum_with_any_run_time_axes(shape: list[int], data: st.DataObject) -> None:
    r = len(shape)
    axes = data.draw(st.lists(st.integers(0, r - 1), unique=True, max_size=r))
    keep = data.draw(st.integers(0, 1))
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    _check(_model("ReduceSum", shape, "axes", 13, keepdims=keep), {"x": x, "axes": np.array(axes, np.int64)})


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scan_with_run_time_axis(op: str, axis: int) -> None:
    x = np.random.default_rng(2).uniform(0.5, 1.5, (3, 4)).astype(np.float32)
    model = _model(op, [3, 4], "axis", 26 if op == "CumProd" else 14, exclusive=1, reverse=1)
    _check(model, {"x": x, "axis": np.array(axis, np.int64)})


def test_run_time_axes_out_of_range_name_the_node() -> None:
    g = from_onnx(_model("ReduceL2", [2, 3], "axes"))
    with pytest.raises(GraphError, match=r"node 'n' \(ReduceL2\).*axes \[2\].*rank-2"):
        run_graph(g, {"x": np.ones((2, 3), np.float32), "axes": np.array([2], np.int64)})
    with pytest.raises(GraphError, match=r"node 'n' \(ReduceL2\).*distinct"):
        run_graph(g, {"x": np.ones((2, 3), np.float32), "axes": np.array([1, -1], np.int64)})


def test_scan_axis_of_two_values_names_the_node() -> None:
    model = _model("CumSum", [2, 3], "axis", 14)
    model.graph.input[1].type.tensor_type.shape.dim.add()  # declared rank 1, so the feed gets through
    g = from_onnx(model)
    with pytest.raises(GraphError, match=r"node 'n' \(CumSum\).*one value"):
        run_graph(g, {"x": np.ones((2, 3), np.float32), "axis": np.array([0, 1], np.int64)})


def test_run_time_axes_cannot_export_below_opset_18() -> None:
    g = from_onnx(_model("ReduceMean", [2, 3], "axes"))
    with pytest.raises(GraphError, match=r"node 'n' \(ReduceMean\).*computed at run time.*opset 18"):
        to_onnx(g, opset=17)


def test_constant_axes_stay_an_attribute() -> None:
    b = _model("ReduceMax", [2, 3], "axes")
    b.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1], np.int64), "axes"))
    del b.graph.input[1]
    node = from_onnx(b).nodes[0]
    assert node.attrs["axes"] == [1] and node.inputs == ["x"]


def _dropout(ratio: np.ndarray | None, training: np.ndarray | None, opset: int = 13) -> onnx.ModelProto:
    """Dropout(x, ratio, training_mode) with both as graph inputs, or as initializers when given."""
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in (("r", ratio), ("t", training)) if v is not None]
    inputs = [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
    if ratio is None:
        inputs.append(oh.make_tensor_value_info("r", TensorProto.FLOAT, []))
    if training is None:
        inputs.append(oh.make_tensor_value_info("t", TensorProto.BOOL, []))
    outputs = [
        oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
        oh.make_tensor_value_info("mask", TensorProto.BOOL, [2, 3]),
    ]
    node = oh.make_node("Dropout", ["x", "r", "t"], ["y", "mask"], name="n")
    g = oh.make_graph([node], "g", inputs, outputs, inits)
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])


@pytest.mark.parametrize(("ratio", "training"), [(0.5, False), (0.0, True), (0.0, False)])
def test_dropout_with_run_time_training_mode_is_deterministic(ratio: float, training: bool) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    feeds = {"x": x, "r": np.array(ratio, np.float32), "t": np.array(training)}
    model = _dropout(None, None)
    got, want = run_graph(from_onnx(model), feeds), ort_run(model, feeds)
    for k in ("y", "mask"):
        np.testing.assert_array_equal(got[k], want[k])
        assert got[k].dtype == want[k].dtype


def test_dropout_training_with_a_ratio_is_refused_naming_the_node() -> None:
    feeds = {"x": np.ones((2, 3), np.float32), "r": np.array(0.5, np.float32), "t": np.array(True)}
    with pytest.raises(
        GraphError, match=r"node 'n' \(Dropout\).*only ratio 0 in training mode.*got ratio 0.5"
    ):
        run_graph(from_onnx(_dropout(None, None)), feeds)
    with pytest.raises(UnsupportedOpError, match=r"training with ratio > 0 \(random\) is not supported"):
        from_onnx(_dropout(np.array(0.5, np.float32), np.array(True)))


def test_dropout_training_with_constant_ratio_zero_is_an_identity() -> None:
    g = from_onnx(_dropout(np.array(0.0, np.float32), np.array(True)))
    assert "Dropout" not in [n.op_type for n in g.nodes]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = run_graph(g, {"x": x})
    np.testing.assert_array_equal(out["y"], x)
    assert out["mask"].dtype == np.bool_ and out["mask"].all()


@pytest.mark.parametrize("shape", [(2, 3), (3, 2, 4, 5)])
def test_batch_norm_training_mode_matches_onnxruntime(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(3)
    c = shape[1]
    x = rng.standard_normal(shape).astype(np.float32)
    params = {k: rng.uniform(0.5, 1.5, c).astype(np.float32) for k in ("s", "b", "m", "v")}
    inputs = [oh.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))] + [
        oh.make_tensor_value_info(k, TensorProto.FLOAT, [c]) for k in params
    ]
    outputs = [oh.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))] + [
        oh.make_tensor_value_info(k, TensorProto.FLOAT, [c]) for k in ("rm", "rv")
    ]
    node = oh.make_node(
        "BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], name="n",
        training_mode=1, momentum=0.8, epsilon=1e-3,
    )  # fmt: skip
    model = oh.make_model(
        oh.make_graph([node], "g", inputs, outputs), opset_imports=[oh.make_opsetid("", 15)]
    )
    feeds = {"x": x, **params}
    want = ort_run(model, feeds)
    g = from_onnx(model)
    got = run_graph(g, feeds)
    back = ort_run(to_onnx(g), feeds)
    for k in ("y", "rm", "rv"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(back[k], want[k], rtol=1e-5, atol=1e-5)


def test_batch_norm_training_outputs_before_opset_14_are_refused() -> None:
    node = oh.make_node("BatchNormalization", ["x", "s", "s", "s", "s"], ["y", "m", "v"], name="bn")
    inputs = [
        oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
        oh.make_tensor_value_info("s", TensorProto.FLOAT, [3]),
    ]
    outputs = [oh.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in ("y", "m", "v")]
    model = oh.make_model(
        oh.make_graph([node], "g", inputs, outputs), opset_imports=[oh.make_opsetid("", 13)]
    )
    with pytest.raises(
        UnsupportedOpError, match=r"training mode before opset 14.*opset 14\+ with training_mode=1"
    ):
        from_onnx(model)
