"""Models with opsets older than 13 are converted on import by onnx.version_converter (ONNX operator spec).

The converter's adapters carry the old semantics over (Softmax-11 flattens from ``axis`` on; opset 13
normalizes along ``axis`` only), so results must equal onnxruntime running the original model; the
Graph and the pass report record the conversion; a model the converter refuses is a GraphError naming
the node, the op, the opset and the fix.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto as T

import opstrata.graph as og
from opstrata.graph import GraphError, from_onnx
from opstrata.graph.onnx import importer

ort = pytest.importorskip("onnxruntime")


def _block(opset: int) -> Any:
    """Relu -> Add -> Reshape -> Softmax(axis=1) at ``opset``: ops that exist in opsets 9, 11 and 13."""
    shape = onnx.numpy_helper.from_array(np.array([2, 3, 4], np.int64), "shape")
    bias = onnx.numpy_helper.from_array(np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 12), "bias")
    nodes = [
        oh.make_node("Relu", ["x"], ["r"], name="relu"),
        oh.make_node("Add", ["r", "bias"], ["a"], name="add"),
        oh.make_node("Reshape", ["a", "shape"], ["h"], name="reshape"),
        oh.make_node("Softmax", ["h"], ["y"], name="softmax", axis=1),
    ]
    g = oh.make_graph(
        nodes, "block", [oh.make_tensor_value_info("x", T.FLOAT, [2, 12])],
        [oh.make_tensor_value_info("y", T.FLOAT, [2, 3, 4])], [shape, bias],
    )  # fmt: skip
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])


def _ort(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


FEEDS = {"x": np.random.default_rng(0).standard_normal((2, 12)).astype(np.float32)}


@pytest.mark.parametrize("opset", [9, 11])
def test_old_opset_is_converted_and_matches_onnxruntime(opset: int) -> None:
    model = _block(opset)
    g = from_onnx(model)
    assert g.opset_imports[""] == 13
    assert g.import_notes == [f"converted opset {opset} -> 13 on import"]
    got = og.run_graph(g, FEEDS)["y"]
    np.testing.assert_allclose(got, _ort(model, FEEDS)[0], rtol=1e-5, atol=1e-6)
    # Softmax-11 normalizes over the flattened dims 1..: each batch row sums to 1, not each (b, :, k)
    np.testing.assert_allclose(got.reshape(2, -1).sum(axis=1), [1, 1], rtol=1e-5)
    assert not np.allclose(got.sum(axis=1), 1)


def test_opset_13_softmax_keeps_its_own_semantics() -> None:
    g = from_onnx(_block(13))
    assert g.import_notes == []
    got = og.run_graph(g, FEEDS)["y"]
    np.testing.assert_allclose(got.sum(axis=1), np.ones((2, 4)), rtol=1e-5)
    np.testing.assert_allclose(got, _ort(_block(13), FEEDS)[0], rtol=1e-5, atol=1e-6)


def test_pass_report_says_the_model_was_converted() -> None:
    plan = og.compile(from_onnx(_block(9)), level=2)
    assert plan.report.notes == ["converted opset 9 -> 13 on import"]
    assert str(plan.report).splitlines()[0] == "converted opset 9 -> 13 on import"
    assert og.PassReport.from_dict(plan.report.to_dict()).notes == plan.report.notes
    _, report = og.optimize(plan.graph, level=1)  # optimizing the optimized graph keeps the note
    assert report.notes == plan.report.notes
    assert "converted opset" not in str(og.compile(from_onnx(_block(13)), level=2).report)


def _scan8_with_sequence_lens() -> Any:
    """A Scan-8 that uses its sequence_lens input: the 8 -> 9 adapter refuses it."""
    body = oh.make_graph(
        [oh.make_node("Add", ["s", "x"], ["s2"]), oh.make_node("Identity", ["s2"], ["o"])], "body",
        [oh.make_tensor_value_info("s", T.FLOAT, [2]), oh.make_tensor_value_info("x", T.FLOAT, [2])],
        [oh.make_tensor_value_info("s2", T.FLOAT, [2]), oh.make_tensor_value_info("o", T.FLOAT, [2])],
    )  # fmt: skip
    node = oh.make_node(
        "Scan", ["lens", "init", "xs"], ["final", "outs"], name="scan", num_scan_inputs=1, body=body
    )
    g = oh.make_graph(
        [node], "g",
        [oh.make_tensor_value_info("lens", T.INT32, [1]), oh.make_tensor_value_info("init", T.FLOAT, [1, 2]),
         oh.make_tensor_value_info("xs", T.FLOAT, [1, 3, 2])],
        [oh.make_tensor_value_info("final", T.FLOAT, [1, 2]), oh.make_tensor_value_info("outs", T.FLOAT, [1, 3, 2])],
    )  # fmt: skip
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 8)])


def test_a_model_the_converter_refuses_names_node_op_opset_and_fix() -> None:
    with pytest.raises(GraphError) as info:
        from_onnx(_scan8_with_sequence_lens())
    msg = str(info.value)
    assert "cannot convert opset 8 to 13 at node 'scan' (Scan)" in msg
    assert "Unsupported conversion to opset 9" in msg  # the converter's own words
    assert "Fix: re-export the model with opset 13 or newer, or rewrite Scan" in msg


def test_a_converter_message_without_an_op_names_the_nodes_that_changed(monkeypatch) -> None:
    from onnx import version_converter

    def refuse(model: Any, target: int) -> Any:
        raise RuntimeError("/project/onnx/x.h:1: f: Assertion `x` failed: something went wrong")

    monkeypatch.setattr(version_converter, "convert_version", refuse)
    g = oh.make_graph(
        [oh.make_node("Sin", ["x"], ["s"], name="sin"), oh.make_node("Softmax", ["s"], ["y"], name="sm")], "g",
        [oh.make_tensor_value_info("x", T.FLOAT, [2, 3])], [oh.make_tensor_value_info("y", T.FLOAT, [2, 3])],
    )  # fmt: skip
    # Sin is unchanged since opset 7; Softmax changed in 11 and 13: the likely culprit
    with pytest.raises(GraphError, match=r"opset 9 to 13 at node 'sm' \(Softmax\): something went wrong"):
        from_onnx(oh.make_model(g, opset_imports=[oh.make_opsetid("", 9)]))
    assert importer.MIN_OPSET == 13
