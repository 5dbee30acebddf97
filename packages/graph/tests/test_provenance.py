"""Provenance kept by the passes: where each value of the imported graph went (aliases, fusions, folds)."""

from __future__ import annotations

import numpy as np
import pytest

import opstrata.graph as og
from opstrata.graph import Graph, Node
from opstrata.graph.testing import bert_block_model, cnn_model, gpt_block_model, mlp_model, random_feeds

pytest.importorskip("onnx")

MODELS = {
    "mlp": mlp_model,
    "cnn": cnn_model,
    "bert": bert_block_model,
    "gpt": lambda: gpt_block_model(opset=14),  # decomposed LayerNorm, tanh GELU, causal mask
}
DIMS = {"batch": 2, "seq": 5}


def _all_values(g: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every node output of ``g`` (run on the ref executor with all of them requested)."""
    names = [o for n in g.nodes for o in n.outputs if o]
    return dict(zip(names, og.run_graph(g, feeds, "ref", outputs=names).values(), strict=True))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_vanished_value_is_accounted_for_and_aliases_hold_the_same_tensor(name: str) -> None:
    proto = MODELS[name]()
    g0 = og.from_onnx(proto)
    g3, _ = og.optimize(g0, level=3)
    feeds = random_feeds(proto, DIMS)
    before = _all_values(g0, feeds)
    live = {o for n in g3.nodes for o in n.outputs if o}
    after = _all_values(g3, feeds)
    fused = 0
    for value, want in before.items():
        if value in live:
            continue
        target = g3.resolve_alias(value)
        if target in live:  # merged with an identical value: the very same numbers
            np.testing.assert_allclose(after[target], want, rtol=1e-5, atol=1e-6, err_msg=value)
        elif value in g3.initializers:
            assert value in g3.folded
            np.testing.assert_allclose(g3.initializers[value], want, rtol=1e-6, err_msg=value)
        else:
            into = g3.resolve_fused(value)
            if into is not None:
                assert into in live, (value, into)
                fused += 1
    if name in ("bert", "gpt", "mlp"):
        assert fused > 0  # these models have fusions (attention, norms, GELU, Linear)


def test_identity_removal_and_cse_record_aliases() -> None:
    g = Graph("g")
    g.add_input("x", np.float32, (2, 3))
    g.add_node("Relu", ["x"], ["a"])
    g.add_node("Relu", ["x"], ["b"])  # a duplicate of a
    g.add_node("Identity", ["b"], ["c"])
    g.add_node("Add", ["a", "c"], ["y"])
    g.outputs.append("y")
    opt, _ = og.optimize(g, level=1)
    assert {n.op_type for n in opt.nodes} == {"Relu", "Add"}
    assert opt.resolve_alias("c") == opt.resolve_alias("b") == "a"
    assert opt.resolve_fused("c") is None and opt.resolve_alias("y") == "y"


def test_record_fusion_points_inner_values_at_the_fused_output_and_chains() -> None:
    g = Graph("g")
    g.add_input("x", np.float32, (4,))
    n1 = g.add_node("Neg", ["x"], ["t"])
    n2 = g.add_node("Abs", ["t"], ["u"])
    fused = Node("Fused", ["x"], ["u"], name="F1")
    g.replace_node(n2, [fused])
    g.nodes.remove(n1)
    g.record_fusion([n1], [fused])
    assert g.fused_into == {"t": "u"} and g.resolve_fused("t") == "u"
    later = Node("Fused2", ["x"], ["v"], name="F2")
    g.replace_node(fused, [later])  # the fused node is itself fused later
    assert g.resolve_fused("t") == "v" and g.resolve_fused("u") == "v"
    assert g.resolve_fused("x") is None


def test_provenance_survives_copy_and_plan_serialisation(tmp_path) -> None:
    proto = bert_block_model()
    plan = og.compile(og.from_onnx(proto), level=3)
    g = plan.graph
    assert g.fused_into and g.copy().fused_into == g.fused_into
    plan.save(tmp_path / "p.opstrata")
    loaded = og.Plan.load(tmp_path / "p.opstrata")
    assert loaded.graph.fused_into == g.fused_into
    assert loaded.graph.aliases == g.aliases and loaded.graph.folded == g.folded
