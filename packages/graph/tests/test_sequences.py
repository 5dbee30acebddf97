"""Sequence and optional values (Value.kind) and the ops of opdefs/sequence.py: import, kinds, run_graph
against onnxruntime, export, hypothesis properties of SplitToSequence/ConcatFromSequence, and errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import onnx.helper as oh  # noqa: E402
from hypothesis import (  # noqa: E402
    given,
    settings,
    strategies as st,
)
from onnx.reference import ReferenceEvaluator  # noqa: E402

from opstrata.graph import GraphError, from_onnx, plan_memory, run_graph, to_onnx  # noqa: E402
from opstrata.graph.opdefs.sequence import absent, is_absent, sequence_items, to_sequence  # noqa: E402

T = onnx.TensorProto
F = np.float32


def seq_t(elem: int = T.FLOAT) -> Any:
    return oh.make_sequence_type_proto(oh.make_tensor_type_proto(elem, None))


def opt_t(inner: Any) -> Any:
    return oh.make_optional_type_proto(inner)


def vi(name: str, tp: Any) -> Any:
    return oh.make_value_info(name, tp)


def tin(name: str, shape: Any, elem: int = T.FLOAT) -> Any:
    return oh.make_tensor_value_info(name, elem, shape)


def model(nodes: list[Any], inputs: list[Any], outputs: list[Any], opset: int = 18) -> Any:
    return oh.make_model(
        oh.make_graph(nodes, "g", inputs, outputs), opset_imports=[oh.make_opsetid("", opset)]
    )


def ort_run(m: Any, feeds: dict[str, Any]) -> list[Any]:
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def as_ort(x: Any, kind: str) -> Any:
    """A run_graph result in onnxruntime's form (lists for sequences, None for absent optionals)."""
    if kind != "tensor" and is_absent(x):
        return None
    return sequence_items(x) if kind.endswith("sequence") else x


def same(a: Any, b: Any) -> None:
    if isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    elif b is None:
        assert a is None
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def check(m: Any, feeds: dict[str, Any], *, export: bool = True) -> list[Any]:
    g = from_onnx(m)
    got = run_graph(g, feeds)
    res = [as_ort(got[o], g.value(o).kind) for o in g.outputs]
    for r, w in zip(res, ort_run(m, feeds), strict=True):
        same(r, w)
    if export:
        back = ort_run(to_onnx(g), feeds)
        for r, w in zip(res, back, strict=True):
            same(r, w)
    return res


def test_sequence_input_imports_with_kind_and_stays_out_of_the_arena() -> None:
    m = model(
        [oh.make_node("SequenceLength", ["s"], ["n"]), oh.make_node("SequenceAt", ["s", "i"], ["t"])],
        [vi("s", seq_t()), tin("i", [], T.INT64)],
        [tin("n", [], T.INT64), tin("t", None)],
    )
    g = from_onnx(m)
    assert g.value("s").kind == "sequence" and g.value("s").dtype == F and g.value("s").shape is None
    assert g.value("s").type_str() == "sequence(float32)"
    plan = plan_memory(g, input_shapes={"s": (3,), "i": ()}, dynamic=True)
    assert "t" in plan.dynamic and "n" in plan.offsets
    xs = [np.ones((2,), F), np.zeros((3,), F), np.full((1,), 2, F)]
    n, t = check(m, {"s": xs, "i": np.array(-1, np.int64)})
    assert int(n) == 3 and t.tolist() == [2.0]


def test_construct_insert_erase_at() -> None:
    nodes = [
        oh.make_node("SequenceConstruct", ["a", "b"], ["s0"]),
        oh.make_node("SequenceInsert", ["s0", "c", "p"], ["s1"]),
        oh.make_node("SequenceErase", ["s1"], ["s2"]),
        oh.make_node("SequenceAt", ["s1", "p"], ["t"]),
    ]
    m = model(
        nodes,
        [tin("a", [2]), tin("b", [2]), tin("c", [2]), tin("p", [], T.INT64)],
        [vi("s1", seq_t()), vi("s2", seq_t()), tin("t", None)],
    )
    a, b, c = np.array([1, 2], F), np.array([3, 4], F), np.array([5, 6], F)
    s1, s2, t = check(m, {"a": a, "b": b, "c": c, "p": np.array(1, np.int64)})
    assert [x.tolist() for x in s1] == [[1, 2], [5, 6], [3, 4]] and len(s2) == 2 and t.tolist() == [5, 6]


def test_sequence_empty_then_insert() -> None:
    m = model(
        [
            oh.make_node("SequenceEmpty", [], ["e"], dtype=T.INT64),
            oh.make_node("SequenceInsert", ["e", "x"], ["s"]),
        ],
        [tin("x", [2], T.INT64)],
        [vi("s", seq_t(T.INT64))],
    )
    g = from_onnx(m)
    assert g.value("e").kind == "sequence" and g.value("e").dtype == np.int64
    (s,) = check(m, {"x": np.array([7, 8], np.int64)})
    assert s[0].tolist() == [7, 8]


def test_position_out_of_range_names_the_node() -> None:
    m = model(
        [oh.make_node("SequenceAt", ["s", "i"], ["t"])],
        [vi("s", seq_t()), tin("i", [], T.INT64)],
        [tin("t", None)],
    )
    with pytest.raises(IndexError, match="out of range"):
        run_graph(from_onnx(m), {"s": [np.ones(1, F)], "i": np.array(3, np.int64)})


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 7),
    st.integers(1, 4),
    st.integers(0, 1),
    st.sampled_from(["none", "scalar", "sizes"]),
    st.integers(0, 1),
)
def test_split_to_sequence_then_concat_round_trips(n: int, m_: int, axis: int, mode: str, keep: int) -> None:
    x = np.arange(n * m_, dtype=F).reshape(n, m_)
    length = x.shape[axis]
    ins, feeds = ["x"], {"x": x}
    inputs = [tin("x", [n, m_])]
    if mode == "scalar":
        ins.append("k")
        feeds["k"] = np.array(2, np.int64)
        inputs.append(tin("k", [], T.INT64))
    elif mode == "sizes":
        sizes = [length // 2, length - length // 2]
        ins.append("k")
        feeds["k"] = np.array(sizes, np.int64)
        inputs.append(tin("k", [2], T.INT64))
    new_axis = int(mode == "none" and not keep)
    nodes = [
        oh.make_node("SplitToSequence", ins, ["s"], axis=axis, keepdims=keep),
        oh.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis, new_axis=new_axis),
    ]
    m = model(nodes, inputs, [vi("s", seq_t()), tin("y", None)])
    g = from_onnx(m)
    got = run_graph(g, feeds)
    # the ONNX reference evaluator (onnxruntime squeezes scalar-split chunks of 1 under keepdims=0, which
    # the spec says is ignored when split is given)
    want_s, want_y = ReferenceEvaluator(m).run(None, feeds)
    same(sequence_items(got["s"]), list(want_s))
    if not new_axis or _reference_stacks_on_axis():  # else the round trip below is the oracle for y
        same(got["y"], want_y)
    np.testing.assert_array_equal(got["y"], x)


def _reference_stacks_on_axis() -> bool:
    """Whether the installed onnx's reference ConcatFromSequence with new_axis=1 stacks on ``axis`` as
    the spec says (onnx 1.16 stacks on the last axis: [[0, 2], [1, 3]] for items [0, 1], [2, 3], axis 0)."""
    nodes = [oh.make_node("ConcatFromSequence", ["s"], ["y"], axis=0, new_axis=1)]
    m = model(nodes, [vi("s", seq_t())], [tin("y", None)])
    (y,) = ReferenceEvaluator(m).run(
        None, {"s": [np.array([0, 1], np.float32), np.array([2, 3], np.float32)]}
    )
    return np.array_equal(y, [[0, 1], [2, 3]])


def test_optional_present_and_absent() -> None:
    m = model(
        [oh.make_node("OptionalHasElement", ["o"], ["h"]), oh.make_node("Identity", ["o"], ["p"])],
        [vi("o", opt_t(oh.make_tensor_type_proto(T.FLOAT, [2])))],
        [tin("h", [], T.BOOL), vi("p", opt_t(oh.make_tensor_type_proto(T.FLOAT, [2])))],
    )
    g = from_onnx(m)
    assert g.value("o").kind == "optional_tensor"
    h, p = check(m, {"o": np.array([1, 2], F)})
    assert bool(h) and p.tolist() == [1, 2]
    h, p = check(m, {"o": None})
    assert not bool(h) and p is None


def test_optional_op_and_get_element() -> None:
    m = model(
        [
            oh.make_node("Optional", ["x"], ["o"]),
            oh.make_node("OptionalGetElement", ["o"], ["y"]),
            oh.make_node("Optional", [], ["e"], type=oh.make_tensor_type_proto(T.FLOAT, None)),
            oh.make_node("OptionalHasElement", ["e"], ["h"]),
        ],
        [tin("x", [2])],
        [tin("y", [2]), tin("h", [], T.BOOL)],
    )
    y, h = check(m, {"x": np.array([3, 4], F)})
    assert y.tolist() == [3, 4] and not bool(h)


def test_optional_get_element_of_empty_fails_clearly() -> None:
    m = model(
        [oh.make_node("OptionalGetElement", ["o"], ["y"])],
        [vi("o", opt_t(oh.make_tensor_type_proto(T.FLOAT, [2])))],
        [tin("y", [2])],
    )
    with pytest.raises(ValueError, match="empty optional"):
        run_graph(from_onnx(m), {"o": None})


def test_sequence_map_runs_the_body_per_element() -> None:
    body = oh.make_graph(
        [oh.make_node("Add", ["xi", "b"], ["yi"])],
        "body",
        [tin("xi", None), tin("b", [1])],
        [tin("yi", None)],
    )
    m = model(
        [oh.make_node("SequenceMap", ["s", "b"], ["out"], body=body)],
        [vi("s", seq_t()), tin("b", [1])],
        [vi("out", seq_t())],
        opset=17,
    )
    g = from_onnx(m)
    assert g.value("out").kind == "sequence"
    (out,) = check(m, {"s": [np.ones(2, F), np.zeros(3, F)], "b": np.array([2], F)})
    assert [o.tolist() for o in out] == [[3, 3], [2, 2, 2]]


def test_runtime_forms() -> None:
    s = to_sequence([np.ones((2, 2)), np.zeros((2, 2))])
    assert s.dtype == object and s.shape == (2,) and len(sequence_items(s)) == 2
    assert is_absent(absent()) and is_absent(None) and not is_absent(np.array("x", dtype=object))


def test_sequence_of_maps_is_refused() -> None:
    tp = oh.make_sequence_type_proto(
        oh.make_map_type_proto(T.INT64, oh.make_tensor_type_proto(T.FLOAT, None))
    )
    m = model([oh.make_node("SequenceLength", ["s"], ["n"])], [vi("s", tp)], [tin("n", [], T.INT64)])
    with pytest.raises(GraphError, match="only sequences of tensors"):
        from_onnx(m)


def test_constant_sequences_are_not_folded_into_initializers() -> None:
    from opstrata.graph import compile as og_compile

    m = model(
        [
            oh.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0]),
            oh.make_node("SequenceConstruct", ["c", "c"], ["s1"]),
            oh.make_node("SequenceInsert", ["s1", "x"], ["s2"]),
        ],
        [tin("x", [2])],
        [vi("s2", seq_t())],
    )
    plan = og_compile(from_onnx(m), 3)
    assert [n.op_type for n in plan.graph.nodes] == ["SequenceConstruct", "SequenceInsert"]
    assert plan.graph.value("s1").kind == "sequence" and plan.graph.value("s1").dtype == F
    out = plan.run({"x": np.array([5, 6], F)})["s2"]
    assert [t.tolist() for t in sequence_items(out)] == [[1, 2], [1, 2], [5, 6]]
