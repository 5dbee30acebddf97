"""Axes and split sizes that a model computes at run time: imported as node inputs, run, equal to onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper as oh  # noqa: E402

from opstrata.graph import from_onnx, optimize, run_graph, to_onnx  # noqa: E402
from opstrata.graph.testing import ort_run  # noqa: E402


def _model(op: str, x_shape: tuple[int, ...], n_out: int = 1, **attrs) -> onnx.ModelProto:
    """``op(x, axes)`` where ``axes`` is a graph input (known only when the model runs)."""
    outs = [f"y{i}" for i in range(n_out)]
    node = oh.make_node(op, ["x", "axes"], outs, name="n", **attrs)
    graph = oh.make_graph(
        [node],
        "g",
        [
            oh.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape)),
            oh.make_tensor_value_info("axes", TensorProto.INT64, [None]),
        ],
        [oh.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    g = from_onnx(model)
    node = next(n for n in g.nodes if n.name == "n")
    assert node.inputs[1] == "axes", "a run-time axes input stays an input of the IR node"
    got, want = run_graph(g, feeds), ort_run(model, feeds)
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w)
    exported = to_onnx(optimize(g, level=1)[0])
    for name, w in ort_run(exported, feeds).items():
        np.testing.assert_array_equal(w, want[name])


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=4), data=st.data())
def test_unsqueeze_with_run_time_axes(shape: list[int], data: st.DataObject) -> None:
    r = len(shape) + 1
    axis = data.draw(st.integers(-r, r - 1))
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    _check(_model("Unsqueeze", tuple(shape)), {"x": x, "axes": np.array([axis], np.int64)})


def test_squeeze_with_run_time_axes() -> None:
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 1, 3)
    _check(_model("Squeeze", (1, 2, 1, 3)), {"x": x, "axes": np.array([0, -2], np.int64)})
    g = from_onnx(_model("Squeeze", (1, 2, 1, 3)))
    with pytest.raises(Exception, match=r"node 'n' \(Squeeze\).*axis 1 of shape \(1, 2, 1, 3\) is not 1"):
        run_graph(g, {"x": x, "axes": np.array([1], np.int64)})


def test_split_with_run_time_sizes() -> None:
    x = np.arange(14, dtype=np.float32).reshape(2, 7)
    _check(_model("Split", (2, 7), n_out=3, axis=1), {"x": x, "axes": np.array([2, 4, 1], np.int64)})


def test_unsqueeze_repeated_run_time_axes_name_the_node() -> None:
    g = from_onnx(_model("Unsqueeze", (2, 3)))
    with pytest.raises(Exception, match=r"node 'n' \(Unsqueeze\).*repeat an axis"):
        run_graph(g, {"x": np.ones((2, 3), np.float32), "axes": np.array([0, 0], np.int64)})


def test_pass_report_names_where_dynamic_shapes_start() -> None:
    nodes = [
        oh.make_node("Relu", ["x"], ["r"], name="relu"),
        oh.make_node("NonZero", ["r"], ["nz"], name="nz"),
        oh.make_node("Transpose", ["nz"], ["y"], name="t"),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
        [oh.make_tensor_value_info("y", TensorProto.INT64, None)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    g, report = optimize(from_onnx(model), level=2)
    (note,) = [n for n in report.notes if "depends on input values" in n]
    assert "1 node(s)" in note and "'nz' (NonZero)" in note, note
    again = optimize(g, level=2)[1]
    assert sum("depends on input values" in n for n in again.notes) == 1, "re-optimizing does not repeat it"
    fed = optimize(from_onnx(_model("Unsqueeze", (2, 3))), level=1)[1]  # axes fed at run time
    assert any("'n' (Unsqueeze)" in n for n in fed.notes), fed.notes
    relu = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"])], "s",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    static = optimize(from_onnx(oh.make_model(relu, opset_imports=[oh.make_opsetid("", 17)])), level=1)[1]
    assert not any("depends on input values" in n for n in static.notes)
