"""Must-show: the test models compiled at each level, exported, and run in onnxruntime against the original."""

from __future__ import annotations

import numpy as np
import pytest

import opstrata.graph as og
from opstrata.graph.testing import (
    bert_block_model,
    cnn_model,
    fused_llama,
    gpt_block_model,
    gpt_gqa_model,
    mlp_model,
    mobile_cnn_model,
    ort_run,
    random_feeds,
)

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

MODELS = {
    "mlp": lambda: mlp_model(),
    "cnn": lambda: cnn_model(),
    "mobile_cnn": lambda: (
        mobile_cnn_model()
    ),  # Conv epilogues: HardSwish, Clip, SE, residual, SiLU, LeakyRelu
    "bert": lambda: bert_block_model(),  # decomposed LayerNorm, Erf GELU, additive padding mask
    "bert_opset13": lambda: bert_block_model(opset=13),
    "gpt": lambda: gpt_block_model(opset=14),  # decomposed LayerNorm, tanh GELU, Trilu/Where causal mask
    "gpt_opset17": lambda: gpt_block_model(),  # LayerNormalization ops
    "gpt_opset21": lambda: gpt_block_model(opset=21),
}
DIMS = {"batch": 2, "seq": 5}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    return request.param, MODELS[request.param]()


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_compiled_export_matches_original_in_onnxruntime(model, level):
    name, proto = model
    plan = og.compile(og.from_onnx(proto), level=level)
    feeds = random_feeds(proto, DIMS)
    ref = ort_run(proto, feeds)
    exported = og.to_onnx(plan.graph)
    import onnx

    onnx.checker.check_model(exported, full_check=True)
    got = ort_run(exported, feeds)
    ours = plan.run(feeds)
    for k in ref:
        np.testing.assert_allclose(
            got[k], ref[k], rtol=1e-4, atol=1e-5, err_msg=f"{name} level {level} (onnxruntime)"
        )
        np.testing.assert_allclose(
            ours[k], ref[k], rtol=1e-4, atol=1e-5, err_msg=f"{name} level {level} (run_graph)"
        )
    assert plan.fallbacks == []
    if level >= 2:  # the compiled export re-imports and runs in our executor too
        again = og.run_graph(og.from_onnx(exported), feeds)
        np.testing.assert_allclose(again[next(iter(ref))], ref[next(iter(ref))], rtol=1e-4, atol=1e-5)


def _fused(plan):
    counts = plan.graph.op_counts()
    norm = counts.get("LayerNormalization", 0) + counts.get("ai.opstrata::SkipLayerNorm", 0)
    gelu = counts.get("Gelu", 0) + sum(
        1
        for n in plan.graph.nodes
        if n.op_type == "Linear" and str(n.attrs.get("activation", "")).startswith("gelu")
    )
    return counts.get("ai.opstrata::Attention", 0), norm, gelu


@pytest.mark.parametrize("name", ["bert", "bert_opset13"])
def test_bert_fusions_found(name):
    g = og.from_onnx(MODELS[name]())
    plan = og.compile(g, level=2)
    assert _fused(plan) == (1, 2, 1)
    rep = plan.report
    assert rep.matched("fuse_attention") == 1 and rep.matched("fuse_layer_norm") == 2
    assert rep.matched("fuse_gelu") == 1 and rep.matched("fuse_skip_norm") == 2
    assert plan.graph.op_counts()["ai.opstrata::Linear"] == 6
    assert len(g) == 65 and len(plan.graph) <= 21  # 65 -> 21 nodes
    attn = next(n for n in plan.graph.nodes if n.op_type == "Attention")
    assert attn.attrs["causal"] == 0 and len(attn.inputs) == 4  # the additive padding mask


@pytest.mark.parametrize("name", ["gpt", "gpt_opset17", "gpt_opset21"])
def test_gpt_fusions_found(name):
    g = og.from_onnx(MODELS[name]())
    plan = og.compile(g, level=2)
    assert _fused(plan) == (1, 3, 1)
    attn = next(n for n in plan.graph.nodes if n.op_type == "Attention")
    assert attn.attrs["causal"] == 1 and len(attn.inputs) == 3  # the Trilu/Where mask became causal=1
    assert attn.attrs["scale"] == pytest.approx(1 / np.sqrt(8))
    counts = plan.graph.op_counts()
    assert "Trilu" not in counts and "Where" not in counts and "Softmax" not in counts
    assert counts["ai.opstrata::SkipLayerNorm"] == 2 and len(plan.graph) <= 24


@pytest.mark.parametrize("name", sorted(MODELS))
def test_node_count_falls_with_level(name):
    g = og.from_onnx(MODELS[name]())
    sizes = [len(og.optimize(g, lvl)[0]) for lvl in range(4)]
    assert sizes == sorted(sizes, reverse=True), sizes
    if name == "mobile_cnn":  # nothing for levels 1-2 but the Gemm; level 3 fuses the epilogues
        assert sizes[3] < sizes[2]
    else:
        assert sizes[2] < sizes[0]


def test_level3_fuses_elementwise_chain_in_bert():
    plan = og.compile(og.from_onnx(bert_block_model()), level=3)
    fused = [n for n in plan.graph.nodes if n.op_type == "FusedElementwise"]
    assert len(fused) == 1 and [s[0] for s in fused[0].attrs["expr"]] == ["Sub", "Mul"]  # (1 - m) * -1e4


# --------------------------------------------------------------------------- standard Attention / RMSNormalization

NEWEST = 28


@pytest.mark.parametrize("opset", [23, 25, NEWEST])
@pytest.mark.parametrize(
    ("name", "build", "standard"),
    [
        ("gpt", lambda: gpt_block_model(), {"Attention": 1}),  # causal, equal lengths
        ("bert", lambda: bert_block_model(), {"Attention": 1}),  # (B, 1, 1, S) padding mask: opset >= 25
        ("gpt_gqa", lambda: gpt_gqa_model(layers=2), {"Attention": 2}),  # repeat_kv + causal
    ],
)
def test_compiled_export_uses_standard_attention(name, build, standard, opset):
    import onnx

    if opset > onnx.defs.onnx_opset_version():
        pytest.skip(f"onnx knows opsets up to {onnx.defs.onnx_opset_version()}")
    proto = build()
    feeds = random_feeds(proto, DIMS, int_high=50)
    ref = ort_run(proto, feeds)
    plan = og.compile(og.from_onnx(proto), level=3)
    exported = og.to_onnx(plan.graph, opset=opset)
    onnx.checker.check_model(exported, full_check=True)
    ops = [n.op_type for n in exported.graph.node]
    want = 0 if name == "bert" and opset < 25 else standard["Attention"]
    assert ops.count("Attention") == want, ops
    for k, v in ort_run(exported, feeds).items():
        np.testing.assert_allclose(v, ref[k], rtol=1e-4, atol=1e-5, err_msg=f"{name} opset {opset}")
    back = og.from_onnx(exported)  # ONNX Attention reads back as the fused node
    assert back.op_counts().get("ai.opstrata::Attention", 0) == want
    for k, v in og.run_graph(back, feeds).items():
        np.testing.assert_allclose(v, ref[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [17, 23, 25])
def test_llama_gqa_rms_norm_round_trip(opset):
    """The fused GQA + RMSNorm form: standard Attention (K/V with 2 of 4 heads) and RMSNormalization from 23."""
    import onnx

    g = fused_llama(layers=2, heads=4, kv_heads=2)
    feeds = random_feeds(g, DIMS)
    want = og.run_graph(g, feeds)
    plan = og.compile(g, level=3)
    exported = og.to_onnx(plan.graph, opset=opset)
    onnx.checker.check_model(exported, full_check=True)
    ops = [n.op_type for n in exported.graph.node]
    assert ops.count("Attention") == (2 if opset >= 23 else 0)
    assert ops.count("RMSNormalization") == (4 if opset >= 23 else 0)  # SkipRMSNorm writes one too
    for k, v in ort_run(exported, feeds).items():
        np.testing.assert_allclose(v, want[k], rtol=1e-4, atol=1e-5, err_msg=f"opset {opset}")
    back = og.from_onnx(exported)
    if opset >= 23:
        attn = [n for n in back.nodes if n.op_type == "Attention"]
        assert len(attn) == 2 and [back.value(x).shape[1] for x in attn[0].inputs[:3]] == [4, 2, 2]
        assert back.op_counts()["ai.opstrata::RMSNorm"] == 4
    for k, v in og.run_graph(back, feeds).items():
        np.testing.assert_allclose(v, want[k], rtol=1e-4, atol=1e-5)
