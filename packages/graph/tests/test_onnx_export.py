"""to_onnx: standard ops vs model-local functions by target opset, fused opstrata ops, register_export."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from opstrata.graph import (  # noqa: E402
    OPSTRATA_DOMAIN,
    ExportContext,
    Graph,
    GraphError,
    Node,
    export_as_function,
    from_onnx,
    infer_shapes,
    register_export,
    run_graph,
    to_onnx,
)
from opstrata.graph.testing import ort_run  # noqa: E402

rng = np.random.default_rng(1)


def _close(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _exported_matches(g: Graph, feeds: dict[str, np.ndarray], opset: int) -> onnx.ModelProto:
    infer_shapes(g)
    m = to_onnx(g, opset=opset)
    onnx.checker.check_model(m, full_check=True)
    want = run_graph(g, feeds)
    got = ort_run(m, feeds)
    for k in want:
        _close(got[k], want[k])
    return m


@pytest.mark.parametrize(("opset", "as_function"), [(13, True), (17, False), (18, False)])
def test_layer_norm_is_standard_from_17_else_a_function(opset: int, as_function: bool) -> None:
    g = Graph("ln", opset_imports={"": opset})
    g.add_input("x", np.float32, ("batch", 3, 8))
    g.add_initializer("w", rng.standard_normal(8).astype(np.float32))
    g.add_initializer("b", rng.standard_normal(8).astype(np.float32))
    g.add_node("LayerNormalization", ["x", "w", "b"], ["y"], {"axis": -1, "epsilon": 1e-5})
    g.outputs.append("y")
    m = _exported_matches(g, {"x": rng.standard_normal((2, 3, 8)).astype(np.float32)}, opset)
    assert bool(m.functions) is as_function
    assert [n.op_type for n in m.graph.node] == (
        ["LayerNormalization_0"] if as_function else ["LayerNormalization"]
    )


@pytest.mark.parametrize(("opset", "approximate"), [(17, "none"), (17, "tanh"), (20, "none"), (20, "tanh")])
def test_gelu_is_standard_from_20_else_a_function(opset: int, approximate: str) -> None:
    g = Graph("gelu", opset_imports={"": opset})
    g.add_input("x", np.float32, (4, 5))
    g.add_node("Gelu", ["x"], ["y"], {"approximate": approximate})
    g.outputs.append("y")
    m = _exported_matches(g, {"x": rng.standard_normal((4, 5)).astype(np.float32) * 3}, opset)
    assert bool(m.functions) is (opset < 20)


def _fused_graph(opset: int) -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("fused", opset_imports={"": opset})
    g.add_input("x", np.float32, ("batch", "seq", 16))
    g.add_input("mask", np.bool_, ("batch", 1, 1, "seq"))
    g.add_initializer("w_qkv", rng.standard_normal((48, 16)).astype(np.float32) * 0.3)
    g.add_initializer("b_qkv", rng.standard_normal(48).astype(np.float32) * 0.1)
    g.add_initializer("g", (1 + 0.1 * rng.standard_normal(16)).astype(np.float32))
    g.add_node("RMSNorm", ["x", "g"], ["n"], {"axis": -1, "epsilon": 1e-6}, domain=OPSTRATA_DOMAIN)
    g.add_node("Linear", ["n", "w_qkv", "b_qkv"], ["qkv"], domain=OPSTRATA_DOMAIN)
    g.add_initializer("shape", np.array([0, 0, 3, 2, 8], np.int64))
    g.add_node("Reshape", ["qkv", "shape"], ["qkv5"])
    g.add_node("Transpose", ["qkv5"], ["heads"], {"perm": [2, 0, 3, 1, 4]})  # (3, B, H, S, D)
    g.add_node("Split", ["heads"], ["q5", "k5", "v5"], {"axis": 0, "split": None})
    for t in "qkv":
        g.add_node("Squeeze", [f"{t}5"], [t], {"axes": [0]})
    g.add_node("Attention", ["q", "k", "v"], ["causal"], {"causal": 1}, domain=OPSTRATA_DOMAIN)
    g.add_node("Attention", ["q", "k", "v", "mask"], ["masked"], {"scale": 0.3}, domain=OPSTRATA_DOMAIN)
    g.add_node("Add", ["causal", "masked"], ["y"])
    g.outputs.append("y")
    mask = np.ones((2, 1, 1, 5), bool)
    mask[0, ..., -2:] = False
    return g, {"x": rng.standard_normal((2, 5, 16)).astype(np.float32), "mask": mask}


@pytest.mark.parametrize("opset", [13, 17, 18, 23, 24, 25, onnx.defs.onnx_opset_version()])
def test_fused_opstrata_ops_export_as_standard_ops_or_functions(opset: int) -> None:
    g, feeds = _fused_graph(opset)
    m = _exported_matches(g, feeds, opset)
    functions = {f.name.rsplit("_", 1)[0] for f in m.functions}
    standard = [n.op_type for n in m.graph.node if n.op_type in ("RMSNormalization", "Attention")]
    if opset < 23:  # no standard form yet: model-local functions
        assert functions == {"RMSNorm", "Linear", "Attention"} and len(m.functions) == 4 and standard == []
    elif opset < 25:  # the (B, 1, 1, S) padding mask broadcasts over queries: onnxruntime wants opset 25
        assert functions == {"Linear", "Attention"} and standard == ["RMSNormalization", "Attention"]
    else:
        assert functions == {"Linear"} and standard == ["RMSNormalization", "Attention", "Attention"]
    assert g.value("y").shape == ("batch", 2, "seq", 8)
    back = from_onnx(m)  # functions are inlined on import; standard ops come back as the fused nodes
    counts = back.op_counts()
    assert counts.get("ai.opstrata::RMSNorm", 0) == (opset >= 23)
    assert counts.get("ai.opstrata::Attention", 0) == len(standard) - (opset >= 23)
    _close(run_graph(back, feeds)["y"], run_graph(g, feeds)["y"])


def test_register_export_for_a_new_op() -> None:
    from opstrata.graph import define_op, lookup_op, undefine_op

    def swish_export(node: Node, ctx: ExportContext) -> None:
        s = ctx.fresh("sig")
        ctx.emit("Sigmoid", [node.inputs[0]], [s])
        ctx.emit("Mul", [node.inputs[0], s], node.outputs)

    register_export("Swish", export_as_function(swish_export), domain="test.custom")
    define_op(
        "Swish", "test.custom", shape=lookup_op("Sigmoid").shape, uses=("host",),
        kernel=lambda n, x: [x[0] / (1 + np.exp(-x[0]))],
    )  # fmt: skip
    try:
        g = Graph("swish")
        g.add_input("x", np.float32, (3,))
        g.add_node("Swish", ["x"], ["y"], domain="test.custom")
        g.outputs.append("y")
        m = _exported_matches(g, {"x": np.array([-1.0, 0.0, 2.0], np.float32)}, 17)
        assert m.functions[0].node[0].op_type == "Sigmoid"
    finally:
        undefine_op("Swish", "test.custom")


def test_unregistered_custom_op_is_a_clear_error() -> None:
    g = Graph("custom")
    g.add_input("x", np.float32, (3,))
    g.add_node("Mystery", ["x"], ["y"], domain="acme")
    g.outputs.append("y")
    g.value("y").dtype = np.dtype(np.float32)
    with pytest.raises(
        GraphError, match=r"node 'Mystery_0' \(acme::Mystery\): no ONNX exporter.*register_export\('Mystery'"
    ):
        to_onnx(g)


def test_output_that_is_an_initializer_and_input_passthrough() -> None:
    g = Graph("consts")
    g.add_input("x", np.float32, (2,))
    g.add_initializer("k", np.arange(3, dtype=np.int64))
    g.outputs += ["k", "x"]
    m = to_onnx(g)
    onnx.checker.check_model(m, full_check=True)
    out = ort_run(m, {"x": np.ones(2, np.float32)})
    assert out["k"].tolist() == [0, 1, 2] and out["x"].tolist() == [1.0, 1.0]


def test_export_rejects_bad_opset_and_untyped_values() -> None:
    g = Graph("t")
    g.add_input("x", np.float32, (2,))
    g.add_node("Relu", ["x"], ["y"])
    g.outputs.append("y")
    with pytest.raises(GraphError, match=r"target opset 9 is outside 13\.\."):
        to_onnx(g, opset=9)
    with pytest.raises(GraphError, match=r"value 'y': has no dtype.*run infer_shapes"):
        to_onnx(g)


def _attention_graph(opset: int, n: int | str, m: int | str, *, causal: int, mask: tuple | None) -> Graph:
    g = Graph("attn", opset_imports={"": opset})
    g.add_input("q", np.float32, (2, 4, n, 8))
    for t in "kv":
        g.add_input(t, np.float32, (2, 2, m, 8))  # GQA: 2 kv heads for 4 query heads
    ins = ["q", "k", "v"]
    if mask is not None:
        g.add_input("mask", np.bool_, mask)
        ins.append("mask")
    g.add_node("Attention", ins, ["y"], {"causal": causal}, domain=OPSTRATA_DOMAIN)
    g.outputs.append("y")
    return g


@pytest.mark.parametrize(
    ("n", "m", "causal", "mask", "opset", "standard"),
    [
        ("seq", "seq", 1, None, 23, True),  # provably equal lengths: ONNX's causal is opstrata's
        (3, 5, 1, None, 25, False),  # bottom-right (opstrata) vs top-left (ONNX): keep the function
        ("n", "m", 1, None, 28, False),  # not provably equal
        (3, 5, 0, (2, 1, 1, 5), 24, False),  # mask broadcast over queries: onnxruntime needs opset 25
        (3, 5, 0, (2, 1, 1, 5), 25, True),
        (3, 5, 0, (2, 1, 3, 5), 23, True),
        ("seq", "seq", 1, None, 22, False),  # no standard Attention before opset 23
    ],
)
def test_attention_standard_op_only_where_onnxruntime_agrees(n, m, causal, mask, opset, standard) -> None:
    g = _attention_graph(opset, n, m, causal=causal, mask=mask)
    dims = {"seq": 5, "n": 3, "m": 5}
    nn, mm = (dims.get(d, d) for d in (n, m))  # type: ignore[arg-type]
    feeds = {"q": rng.standard_normal((2, 4, nn, 8)).astype(np.float32)}
    feeds |= {t: rng.standard_normal((2, 2, mm, 8)).astype(np.float32) for t in "kv"}
    if mask is not None:
        feeds["mask"] = np.broadcast_to(np.arange(mm) != 1, mask).copy()
    exported = _exported_matches(g, feeds, opset)
    assert [x.op_type for x in exported.graph.node] == (["Attention"] if standard else ["Attention_0"])
    back = from_onnx(exported)  # the standard op comes back as the fused node, a function inlined
    assert back.op_counts().get("ai.opstrata::Attention", 0) == int(standard)
    _close(run_graph(back, feeds)["y"], run_graph(g, feeds)["y"])


def test_rms_norm_without_weight_stays_a_function() -> None:
    g = Graph("rms", opset_imports={"": 23})
    g.add_input("x", np.float32, ("batch", 8))
    g.add_node("RMSNorm", ["x"], ["y"], {"epsilon": 1e-6}, domain=OPSTRATA_DOMAIN)
    g.outputs.append("y")
    m = _exported_matches(g, {"x": rng.standard_normal((3, 8)).astype(np.float32)}, 23)
    assert [n.op_type for n in m.graph.node] == ["RMSNorm_0"]  # RMSNormalization requires a scale
