"""fold_attention_layout: head Transposes around ai.opstrata::Attention fold into its bshd / bshd_out
layout (a RotaryHalf in between moves to the (B, S, H, D) side first); results, shapes, the ONNX export
and the tensor-parallel head check all read the new layout."""

from __future__ import annotations

import math

import numpy as np
import pytest

import opstrata.graph as og
from opstrata.graph import OPSTRATA_DOMAIN, Graph, GraphError
from opstrata.graph.passes.attention_layout import fold_attention_layout
from opstrata.graph.testing import fused_llama, gpt_block_model, ort_run, random_feeds

DIMS = {"batch": 2, "seq": 5}


def _transposes(g: Graph) -> list:
    return [n for n in g.nodes if n.op_type == "Transpose" and n.attrs.get("perm") == [0, 2, 1, 3]]


def test_llama_head_transposes_fold_into_attention() -> None:
    g = fused_llama(layers=2, heads=4, kv_heads=2)
    assert len(_transposes(g)) == 8
    h = fold_attention_layout(g)
    assert _transposes(h) == []
    attn = [n for n in h.nodes if n.op_type == "Attention"]
    assert [(n.attrs.get("bshd"), n.attrs.get("bshd_out")) for n in attn] == [([0, 1, 2], 1)] * 2
    og.infer_shapes(h)
    h.validate()
    for n in attn:
        assert h.values[n.outputs[0]].shape == ("batch", "seq", 4, 8)  # (B, S, H, D) out
    feeds = random_feeds(g, DIMS)
    want, got = og.run_graph(g, feeds), og.run_graph(h, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)


def _rope_attention_graph() -> Graph:
    """x -> q/k/v heads (Reshape, Transpose) -> RotaryHalf on q and k -> causal GQA attention -> merge."""
    rng = np.random.default_rng(0)
    g = Graph("rope_attn", opset_imports={"": 17, OPSTRATA_DOMAIN: 1})
    g.add_input("x", np.float32, ("batch", "seq", 16))
    g.add_input("cos", np.float32, (1, 1, "seq", 4))
    g.add_input("sin", np.float32, (1, 1, "seq", 4))
    heads = {"q": 4, "k": 2, "v": 2}
    qkv = []
    for nm, nh in heads.items():
        g.add_initializer(f"{nm}.w", (rng.standard_normal((16, nh * 4)) / 4).astype(np.float32))
        g.add_initializer(f"{nm}.shape", np.array([0, 0, nh, 4], np.int64))
        g.add_node("MatMul", ["x", f"{nm}.w"], [f"{nm}.lin"], name=f"{nm}.lin")
        g.add_node("Reshape", [f"{nm}.lin", f"{nm}.shape"], [f"{nm}.heads"], name=f"{nm}.reshape")
        g.add_node("Transpose", [f"{nm}.heads"], [f"{nm}.bhsd"], {"perm": [0, 2, 1, 3]}, name=f"{nm}.t")
        t = f"{nm}.bhsd"
        if nm != "v":
            g.add_node(
                "RotaryHalf", [t, "cos", "sin"], [f"{nm}.rope"], name=f"{nm}.rope", domain=OPSTRATA_DOMAIN
            )
            t = f"{nm}.rope"
        qkv.append(t)
    g.add_node("Attention", qkv, ["attn"], {"causal": 1, "scale": 1 / math.sqrt(4)}, name="attn",
               domain=OPSTRATA_DOMAIN)  # fmt: skip
    g.add_node("Transpose", ["attn"], ["attn_bshd"], {"perm": [0, 2, 1, 3]}, name="merge.t")
    g.add_initializer("merge.shape", np.array([0, 0, 16], np.int64))
    g.add_node("Reshape", ["attn_bshd", "merge.shape"], ["y"], name="merge")
    g.outputs.append("y")
    return og.infer_shapes(g)


def test_rotary_moves_to_the_bshd_side() -> None:
    g = _rope_attention_graph()
    h = fold_attention_layout(g)
    og.infer_shapes(h)
    h.validate()
    left = [n.inputs[0] for n in h.nodes if n.op_type == "Transpose"]
    assert sorted(left) == ["cos", "sin"]  # one Transpose per distinct cos / sin, shared by q and k
    (attn,) = (n for n in h.nodes if n.op_type == "Attention")
    assert attn.attrs["bshd"] == [0, 1, 2] and attn.attrs["bshd_out"] == 1
    rng = np.random.default_rng(1)
    ang = rng.standard_normal((1, 1, 5, 4)).astype(np.float32)
    feeds = {"x": rng.standard_normal((2, 5, 16)).astype(np.float32), "cos": np.cos(ang), "sin": np.sin(ang)}
    np.testing.assert_allclose(og.run_graph(h, feeds)["y"], og.run_graph(g, feeds)["y"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("opset", [17, 23])
def test_exported_model_runs_in_onnxruntime(opset: int) -> None:
    pytest.importorskip("onnxruntime")
    import onnx

    if opset > onnx.defs.onnx_opset_version():
        pytest.skip(f"onnx knows opsets up to {onnx.defs.onnx_opset_version()}")
    proto = gpt_block_model()
    h, report = og.optimize(og.from_onnx(proto), 2)
    (attn,) = (n for n in h.nodes if n.op_type == "Attention")
    assert attn.attrs.get("bshd") == [0, 1, 2] and attn.attrs.get("bshd_out") == 1
    assert report.matched("fold_attention_layout") == 4  # three head splits and the merge
    feeds = random_feeds(proto, DIMS, int_high=50)
    want = ort_run(proto, feeds)
    exported = og.to_onnx(h, opset=opset)
    onnx.checker.check_model(exported, full_check=True)
    for k, v in ort_run(exported, feeds).items():
        np.testing.assert_allclose(v, want[k], rtol=1e-4, atol=1e-5)
    assert set(h.values) >= set(h.inputs)  # exporting leaves the graph's values as they were
    assert not [v for v in h.values if "_bhsd" in v]


def test_partition_reads_heads_on_the_bshd_axis() -> None:
    h = fold_attention_layout(fused_llama(layers=1, heads=4, kv_heads=2))
    with pytest.raises(GraphError, match=r"query heads H=4.*tp=3"):
        og.partition(h, 3)


@pytest.mark.parametrize("tp", [2])
def test_bshd_attention_and_rotary_partition_across_heads(tp: int) -> None:
    """Tensor parallel splits the bshd attention's heads on axis 2 (and a RotaryHalf elementwise): the
    simulated ranks reproduce the single-process result without replicating the attention."""
    h = fold_attention_layout(fused_llama(layers=2, heads=4, kv_heads=2))
    ranks = og.partition(h, tp)
    feeds = random_feeds(h, DIMS)
    want = og.run_graph(h, feeds)
    for out in og.simulate_tensor_parallel(ranks, feeds):
        for k, v in want.items():
            np.testing.assert_allclose(out[k], v, rtol=1e-4, atol=1e-5)
    attn = [n for n in ranks[0].nodes if n.op_type == "Attention"]
    assert [ranks[0].values[n.inputs[0]].shape[2] for n in attn] == [4 // tp] * 2  # local heads
    g2 = fold_attention_layout(_rope_attention_graph())
    rng = np.random.default_rng(2)
    ang = rng.standard_normal((1, 1, 5, 4)).astype(np.float32)
    f2 = {"x": rng.standard_normal((2, 5, 16)).astype(np.float32), "cos": np.cos(ang), "sin": np.sin(ang)}
    want2 = og.run_graph(g2, f2)["y"]
    for out in og.simulate_tensor_parallel(og.partition(g2, tp, on_unmatched="replicate"), f2):
        np.testing.assert_allclose(out["y"], want2, rtol=1e-4, atol=1e-5)
