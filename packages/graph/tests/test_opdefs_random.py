"""Random generators (RandomNormal/Uniform and *Like, Bernoulli, Multinomial): shapes, dtypes, seeds and
distributions (moments within 6 standard errors), never constant-folded nor merged, export, errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

onnx = pytest.importorskip("onnx")

import onnx.helper as oh  # noqa: E402

import opstrata.graph as og  # noqa: E402
from opstrata.graph import GraphError, from_onnx, run_graph, to_onnx  # noqa: E402

T = onnx.TensorProto


def _model(nodes: list[Any], inputs: list[Any], outputs: list[str], opset: int = 17) -> Any:
    outs = [oh.make_tensor_value_info(o, T.UNDEFINED, None) for o in outputs]
    return oh.make_model(oh.make_graph(nodes, "g", inputs, outs), opset_imports=[oh.make_opsetid("", opset)])


def _f(name: str, shape: list[int], elem: int = T.FLOAT) -> Any:
    return oh.make_tensor_value_info(name, elem, shape)


def _within(sample: np.ndarray, mean: float, std: float) -> None:
    """The sample mean is within 6 standard errors of ``mean`` and the sample std within 5% of ``std``."""
    n = sample.size
    assert abs(float(sample.mean()) - mean) < 6 * std / np.sqrt(n), (sample.mean(), mean)
    assert abs(float(sample.std()) - std) < 0.05 * std, (sample.std(), std)


def test_random_normal_and_uniform_have_their_moments_shape_and_dtype() -> None:
    nodes = [
        oh.make_node("RandomNormal", [], ["n"], shape=[200, 100], mean=2.0, scale=3.0),
        oh.make_node("RandomUniform", [], ["u"], shape=[20000], low=-1.0, high=3.0, dtype=T.DOUBLE),
    ]
    out = run_graph(from_onnx(_model(nodes, [], ["n", "u"])), {})
    assert out["n"].shape == (200, 100) and out["n"].dtype == np.float32
    _within(out["n"], 2.0, 3.0)
    u = out["u"]
    assert u.dtype == np.float64 and u.min() >= -1.0 and u.max() < 3.0
    _within(u, 1.0, 4 / np.sqrt(12))


def test_seed_repeats_per_session_and_runs_draw_anew() -> None:
    m = _model([oh.make_node("RandomNormal", [], ["n"], shape=[8], seed=5.0)], [], ["n"])
    g1, g2 = from_onnx(m), from_onnx(m)
    first, second = run_graph(g1, {})["n"], run_graph(g1, {})["n"]
    assert not np.array_equal(first, second)  # successive runs advance the generator
    assert np.array_equal(run_graph(g2, {})["n"], first)  # a new graph with the same seed repeats
    unseeded = _model([oh.make_node("RandomNormal", [], ["n"], shape=[8])], [], ["n"])
    assert not np.array_equal(
        run_graph(from_onnx(unseeded), {})["n"], run_graph(from_onnx(unseeded), {})["n"]
    )


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(0, 5), min_size=0, max_size=4), like_double=st.booleans())
def test_like_ops_follow_the_input_shape_and_dtype(shape: list[int], like_double: bool) -> None:
    elem = T.DOUBLE if like_double else T.FLOAT
    nodes = [
        oh.make_node("RandomNormalLike", ["x"], ["n"]),
        oh.make_node("RandomUniformLike", ["x"], ["u"], dtype=T.FLOAT16, low=5.0, high=6.0),
    ]
    x = np.zeros(shape, np.float64 if like_double else np.float32)
    out = run_graph(from_onnx(_model(nodes, [_f("x", shape, elem)], ["n", "u"])), {"x": x})
    assert out["n"].shape == tuple(shape) and out["n"].dtype == x.dtype
    assert out["u"].shape == tuple(shape) and out["u"].dtype == np.float16
    assert ((out["u"] >= 5) & (out["u"] <= 6)).all()


def test_bernoulli_draws_one_with_probability_p() -> None:
    """The spec (and torch.bernoulli): 1 with probability p. onnxruntime 1.32's CPU kernel draws 1 with
    probability 1 - p, so this is checked against the definition, not against onnxruntime."""
    p = np.repeat(np.array([0.0, 0.25, 0.9, 1.0], np.float32), 20000).reshape(4, 20000)
    m = _model(
        [oh.make_node("Bernoulli", ["p"], ["b"], dtype=T.INT64)], [_f("p", [4, 20000])], ["b"], opset=15
    )
    b = run_graph(from_onnx(m), {"p": p})["b"]
    assert b.dtype == np.int64 and set(np.unique(b).tolist()) <= {0, 1}
    assert b[0].sum() == 0 and b[3].sum() == 20000
    for row, q in ((1, 0.25), (2, 0.9)):
        _within(b[row].astype(np.float64), q, np.sqrt(q * (1 - q)))


def test_multinomial_frequencies_follow_the_softmax() -> None:
    probs = np.array([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0]], np.float64)
    logits = np.log(np.maximum(probs, 1e-30)).astype(np.float32)
    m = _model(
        [oh.make_node("Multinomial", ["x"], ["y"], sample_size=30000, dtype=T.INT64, seed=2.0)],
        [_f("x", [2, 3])],
        ["y"],
    )
    y = run_graph(from_onnx(m), {"x": logits})["y"]
    assert y.shape == (2, 30000) and y.dtype == np.int64
    for row in range(2):
        freq = np.bincount(y[row], minlength=3) / y.shape[1]
        np.testing.assert_allclose(freq, probs[row], atol=6 * np.sqrt(0.25 / y.shape[1]))


def test_random_ops_are_never_folded_nor_merged() -> None:
    nodes = [
        oh.make_node("RandomNormal", [], ["a"], shape=[4], seed=1.0),
        oh.make_node("RandomNormal", [], ["b"], shape=[4], seed=1.0),  # same node twice: two samples
        oh.make_node("RandomUniformLike", ["c"], ["u"]),  # constant input: still drawn every run
        oh.make_node("Add", ["a", "u"], ["s"]),
        oh.make_node("Add", ["b", "u"], ["t"]),
    ]
    g = oh.make_graph(
        nodes, "g", [], [oh.make_tensor_value_info(o, T.FLOAT, [4]) for o in ("s", "t")],
        [oh.make_tensor("c", T.FLOAT, [4], [0.0] * 4)],
    )  # fmt: skip
    graph = from_onnx(oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]))
    opt, _report = og.optimize(graph)
    kinds = [n.op_type for n in opt.nodes]
    assert kinds.count("RandomNormal") == 2 and "RandomUniformLike" in kinds
    assert og.lookup_op("RandomNormal").nondeterministic and not og.lookup_op("Add").nondeterministic
    r1, r2 = run_graph(opt, {}), run_graph(opt, {})
    assert not np.array_equal(r1["s"], r2["s"])


def test_export_keeps_seed_and_dtype() -> None:
    m = _model([oh.make_node("RandomUniform", [], ["u"], shape=[3], dtype=T.DOUBLE, seed=7.0)], [], ["u"])
    back = to_onnx(from_onnx(m))
    (node,) = back.graph.node
    attrs = {a.name: oh.get_attribute_value(a) for a in node.attribute}
    assert node.op_type == "RandomUniform" and attrs["dtype"] == T.DOUBLE and attrs["seed"] == 7.0
    assert np.array_equal(run_graph(from_onnx(back), {})["u"], run_graph(from_onnx(m), {})["u"])


@pytest.mark.parametrize(
    ("node", "inputs", "match"),
    [
        (
            oh.make_node("RandomNormal", [], ["y"], shape=[2], dtype=T.INT32),
            [],
            r"RandomNormal produces floats",
        ),
        (oh.make_node("RandomUniform", [], ["y"]), [], r"RandomUniform without its required 'shape'"),
        (oh.make_node("RandomNormal", [], ["y"], shape=[2, -1]), [], r"negative dim"),
        (oh.make_node("Multinomial", ["x"], ["y"]), [_f("x", [2, 3, 4])], r"\(batch_size, class_size\)"),
        (oh.make_node("Multinomial", ["x"], ["y"], dtype=T.FLOAT), [_f("x", [2, 3])], r"produces indices"),
        (oh.make_node("Bernoulli", ["x"], ["y"]), [_f("x", [2], T.INT32)], r"float tensor of probabilities"),
    ],
)
def test_bad_random_nodes_are_refused_naming_the_node(node: Any, inputs: list[Any], match: str) -> None:
    with pytest.raises(GraphError, match=match):
        from_onnx(_model([node], inputs, ["y"]))
