"""fold_repeat_kv: grouped-query attention's Unsqueeze -> Expand -> Reshape of K and V folds into the
Attention node (which pairs query head h with kv head h // rep itself); numerics and the export hold."""

from __future__ import annotations

import numpy as np
import pytest

import opstrata.graph as og
from opstrata.graph.testing import gpt_gqa_model, ort_run, random_feeds

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("heads, kv_heads", [(8, 4), (8, 2), (4, 4)])
def test_repeat_kv_folds_into_attention(heads: int, kv_heads: int) -> None:
    model = gpt_gqa_model(layers=2, heads=heads, kv_heads=kv_heads)
    g, report = og.optimize(og.from_onnx(model), 2)
    counts = g.op_counts()
    assert counts.get("ai.opstrata::Attention") == 2
    assert "Expand" not in counts, counts
    for n in g.nodes:
        if n.op_type == "Attention":
            assert g.values[n.inputs[1]].shape[1] == kv_heads == g.values[n.inputs[2]].shape[1]
    assert report.matched("fold_repeat_kv") == 2 * 3 * 2  # K and V: Unsqueeze, Expand, Reshape, 2 layers
    feeds = random_feeds(model, {"batch": 2, "seq": 5})
    want = ort_run(model, feeds)["y"]
    np.testing.assert_allclose(og.run_graph(g, feeds)["y"], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ort_run(og.to_onnx(g), feeds)["y"], want, rtol=1e-4, atol=1e-5)


def test_a_repeat_read_elsewhere_keeps_its_chain() -> None:
    """The folded Attention reads K itself; a repeated K also read by another node stays computed."""
    import onnx

    model = gpt_gqa_model(layers=1, heads=8, kv_heads=4)
    graph = model.graph
    reshapes = [n for n in graph.node if n.op_type == "Reshape" and any(
        p.op_type == "Expand" and p.output[0] == n.input[0] for p in graph.node)]  # fmt: skip
    graph.node.append(onnx.helper.make_node("Identity", [reshapes[0].output[0]], ["k_rep"]))
    graph.output.append(onnx.helper.make_tensor_value_info("k_rep", onnx.TensorProto.FLOAT, None))
    g = og.optimize(og.from_onnx(model), 2)[0]
    assert g.op_counts().get("Expand") == 1  # the read repeat survives; the other folds
    feeds = random_feeds(model, {"batch": 2, "seq": 5})
    want = ort_run(model, feeds)
    got = og.run_graph(g, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)
