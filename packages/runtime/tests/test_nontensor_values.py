"""InferenceSession with STRING tensors, sequences and optionals: fed and returned as onnxruntime does
(object/str arrays, lists of arrays, None), in every run mode (arena, allocator, streams, profiling)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import onnx.helper as oh  # noqa: E402

from opstrata.runtime import InferenceSession, InvalidArgument, SessionOptions  # noqa: E402

T = onnx.TensorProto
F = np.float32

MODES = {
    "arena": SessionOptions(),
    "allocator": SessionOptions(enable_mem_arena=False),
    "streams": SessionOptions(num_streams=2),
    "profiling": SessionOptions(enable_profiling=True),
}


def seq_t(elem: int = T.FLOAT) -> Any:
    return oh.make_sequence_type_proto(oh.make_tensor_type_proto(elem, None))


def opt_t(inner: Any) -> Any:
    return oh.make_optional_type_proto(inner)


def mixed_model() -> bytes:
    """Strings in and out, a sequence built, passed through and returned, and an optional input."""
    nodes = [
        oh.make_node("StringConcat", ["x", "y"], ["z"]),
        oh.make_node("SplitToSequence", ["a"], ["s"], axis=0),
        oh.make_node("SequenceInsert", ["s", "b"], ["s2"]),
        oh.make_node("SequenceLength", ["s2"], ["n"]),
        oh.make_node("ConcatFromSequence", ["s2"], ["c"], axis=0),
        oh.make_node("OptionalHasElement", ["o"], ["h"]),
        oh.make_node("Identity", ["o"], ["o2"]),
    ]
    ot = opt_t(oh.make_tensor_type_proto(T.FLOAT, [2]))
    g = oh.make_graph(
        nodes,
        "mixed",
        [
            oh.make_tensor_value_info("x", T.STRING, ["k"]),
            oh.make_tensor_value_info("y", T.STRING, ["k"]),
            oh.make_tensor_value_info("a", T.FLOAT, [3, 2]),
            oh.make_tensor_value_info("b", T.FLOAT, [1, 2]),
            oh.make_value_info("o", ot),
        ],
        [
            oh.make_tensor_value_info("z", T.STRING, ["k"]),
            oh.make_value_info("s2", seq_t()),
            oh.make_tensor_value_info("n", T.INT64, []),
            oh.make_tensor_value_info("c", T.FLOAT, None),
            oh.make_tensor_value_info("h", T.BOOL, []),
            oh.make_value_info("o2", ot),
        ],
    )
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 20)]).SerializeToString()


def feeds(opt: Any) -> dict[str, Any]:
    return {
        "x": np.array(["a", "bé"], dtype=object),
        "y": np.array(["c", "d"]),  # a numpy str array is accepted, as onnxruntime does
        "a": np.arange(6, dtype=F).reshape(3, 2),
        "b": np.full((1, 2), 9, F),
        "o": opt,
    }


def same(a: Any, b: Any) -> None:
    if isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    elif b is None:
        assert a is None
    else:
        assert isinstance(a, np.ndarray) and a.dtype == np.asarray(b).dtype and a.shape == np.shape(b)
        assert a.tolist() == np.asarray(b).tolist()


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("opt", [None, np.array([1, 2], F)], ids=["absent", "present"])
def test_matches_onnxruntime_in_every_mode(mode: str, opt: Any) -> None:
    m = mixed_model()
    sess = InferenceSession(m, MODES[mode])
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds(opt))
    for _ in range(2):  # the second run takes the cached program / bound path
        got = sess.run(None, feeds(opt))
        for g, w in zip(got, want, strict=True):
            same(g, w)
    sess.close()


def test_outputs_by_name_and_types() -> None:
    sess = InferenceSession(mixed_model())
    types = {a.name: a.type for a in (*sess.get_inputs(), *sess.get_outputs())}
    assert types["x"] == "tensor(string)"
    assert types["s2"] == "seq(tensor(float))"
    assert types["o"] == "optional(tensor(float))"
    s2, o2 = sess.run(["s2", "o2"], feeds(None))
    assert isinstance(s2, list) and len(s2) == 4 and o2 is None


def test_results_do_not_alias_feeds() -> None:
    sess = InferenceSession(mixed_model())
    f = feeds(np.array([1, 2], F))
    o2 = sess.run(["o2"], f)[0]
    o2[0] = 100
    assert f["o"][0] == 1


def test_sequence_feed_validation() -> None:
    g = oh.make_graph(
        [oh.make_node("SequenceLength", ["s"], ["n"])],
        "g",
        [oh.make_value_info("s", seq_t())],
        [oh.make_tensor_value_info("n", T.INT64, [])],
    )
    sess = InferenceSession(oh.make_model(g, opset_imports=[oh.make_opsetid("", 18)]))
    assert int(sess.run(None, {"s": [np.ones(2, F), np.ones((3, 3), F)]})[0]) == 2
    assert int(sess.run(None, {"s": []})[0]) == 0
    with pytest.raises(InvalidArgument, match=r"seq\(tensor\(float\)\): expected a list of arrays"):
        sess.run(None, {"s": np.ones(2, F)})
    with pytest.raises(InvalidArgument, match=r"element 1.*expected elements of dtype float32, got float64"):
        sess.run(None, {"s": [np.ones(2, F), np.ones(2)]})


def test_string_feed_validation() -> None:
    g = oh.make_graph(
        [oh.make_node("RegexFullMatch", ["x"], ["y"], pattern="a+")],
        "g",
        [oh.make_tensor_value_info("x", T.STRING, [2])],
        [oh.make_tensor_value_info("y", T.BOOL, [2])],
    )
    sess = InferenceSession(oh.make_model(g, opset_imports=[oh.make_opsetid("", 20)]))
    assert sess.run(None, {"x": np.array(["aa", "ab"])})[0].tolist() == [True, False]
    with pytest.raises(InvalidArgument, match="expected dtype tensor\\(string\\)"):
        sess.run(None, {"x": np.array([1.0, 2.0])})
    with pytest.raises(InvalidArgument, match="dim 0 must be 2"):
        sess.run(None, {"x": np.array(["a"], dtype=object)})


def test_saved_plan_keeps_strings_and_kinds(tmp_path: Any) -> None:
    import opstrata.graph as og

    g = oh.make_graph(
        [
            oh.make_node("Constant", [], ["c"], value_strings=["a", "b"]),
            oh.make_node("StringConcat", ["x", "c"], ["y"]),
            oh.make_node("SequenceConstruct", ["y", "y"], ["s"]),
        ],
        "g",
        [oh.make_tensor_value_info("x", T.STRING, [2])],
        [oh.make_value_info("s", seq_t(T.STRING))],
    )
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 20)])
    path = og.compile(og.from_onnx(m)).save(tmp_path / "m.plan")
    sess = InferenceSession(path)
    assert sess.get_outputs()[0].type == "seq(tensor(string))"
    (s,) = sess.run(None, {"x": np.array(["1", "2"], dtype=object)})
    assert [t.tolist() for t in s] == [["1a", "2b"], ["1a", "2b"]]


def _string_movement_model() -> bytes:
    """Strings through the data-movement ops a tokenizer front end uses, then Where and Equal."""
    i64 = lambda name, v: oh.make_tensor(name, T.INT64, [len(v)], v)  # noqa: E731
    nodes = [
        oh.make_node("Reshape", ["x", "shape"], ["r"]),  # (2, 3)
        oh.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),  # (3, 2)
        oh.make_node("Concat", ["t", "t"], ["c"], axis=1),  # (3, 4)
        oh.make_node("Gather", ["c", "idx"], ["g"], axis=0),  # (2, 4)
        oh.make_node("Slice", ["g", "st", "en", "ax"], ["s"]),  # (2, 2)
        oh.make_node("Equal", ["s", "probe"], ["eq"]),
        oh.make_node("Where", ["eq", "s", "fill"], ["w"]),
    ]
    g = oh.make_graph(
        nodes,
        "strings",
        [oh.make_tensor_value_info("x", T.STRING, [6]), oh.make_tensor_value_info("idx", T.INT64, [2])],
        [oh.make_tensor_value_info("w", T.STRING, [2, 2]), oh.make_tensor_value_info("eq", T.BOOL, [2, 2])],
        [
            i64("shape", [2, 3]),
            i64("st", [1]),
            i64("en", [3]),
            i64("ax", [1]),
            oh.make_tensor("probe", T.STRING, [], [b"b"]),
            oh.make_tensor("fill", T.STRING, [], [b"-"]),
        ],
    )
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 20)]).SerializeToString()


@pytest.mark.parametrize("mode", sorted(MODES))
def test_string_data_movement_matches_onnxruntime(mode: str) -> None:
    m = _string_movement_model()
    feeds = {"x": np.array(["a", "b", "c", "d", "b", "f"], dtype=object), "idx": np.array([2, 0])}
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = InferenceSession(m, MODES[mode])
    for _ in range(2):  # the steady state (arena reuse) keeps the strings
        got = sess.run(None, feeds)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.tolist() == w.tolist()
    assert got[0].dtype == object
