"""Values whose shape depends on input values: the static part keeps its arena, the rest runs on allocated
buffers, and the answers equal onnxruntime's on every run."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper as oh  # noqa: E402

from opstrata.graph.testing import ort_run  # noqa: E402
from opstrata.runtime import InferenceSession, SessionOptions  # noqa: E402


def _model() -> onnx.ModelProto:
    """relu(x) -> static output ``r``; Squeeze(relu(x) * 2, axes) with ``axes`` fed at run time -> ``y``."""
    nodes = [
        oh.make_node("Relu", ["x"], ["r"], name="relu"),
        oh.make_node("Mul", ["r", "two"], ["m"], name="mul"),
        oh.make_node("Squeeze", ["m", "axes"], ["s"], name="squeeze"),
        oh.make_node("Neg", ["s"], ["y"], name="neg"),
    ]
    graph = oh.make_graph(
        nodes,
        "dyn",
        [
            oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n", 1]),
            oh.make_tensor_value_info("axes", TensorProto.INT64, [None]),
        ],
        [
            oh.make_tensor_value_info("r", TensorProto.FLOAT, None),
            oh.make_tensor_value_info("y", TensorProto.FLOAT, None),
        ],
        [oh.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


@pytest.mark.parametrize("profiling", [False, True])
def test_static_part_keeps_its_arena_dynamic_part_runs(profiling: bool) -> None:
    model = _model()
    sess = InferenceSession(model, SessionOptions(enable_profiling=profiling))
    x = np.linspace(-1, 1, 5, dtype=np.float32).reshape(1, 5, 1)
    for axes in ([0], [2], [0, 2], [-1], [0]):
        feeds = {"x": x, "axes": np.array(axes, np.int64)}
        got = sess.run(None, feeds)
        want = ort_run(model, feeds)
        np.testing.assert_array_equal(got[0], want["r"])
        np.testing.assert_array_equal(got[1], want["y"])
    if profiling:  # the profile says which nodes ran outside the arena, and why
        dyn = {e.name for e in sess.profiler.events if e.dynamic}
        assert dyn == {"squeeze", "neg"}, dyn
    arenas = [a for a in sess.arenas.values() if a is not None]
    assert len(arenas) == 2, "one arena per input-shape signature (axes of length 1 and 2)"
    for arena in arenas:
        mp = arena.plan
        assert {"s", "y"} <= set(mp.dynamic), mp.dynamic
        assert "m" in mp.offsets and "s" not in mp.offsets
        assert "dynamic" in mp.summary()


def test_dynamic_value_error_names_the_node() -> None:
    sess = InferenceSession(_model())
    with pytest.raises(Exception, match=r"squeeze"):
        sess.run(None, {"x": np.ones((1, 3, 1), np.float32), "axes": np.array([1], np.int64)})
    # the session is still usable after a failed run
    out = sess.run(None, {"x": np.ones((1, 3, 1), np.float32), "axes": np.array([0], np.int64)})
    assert out[1].shape == (3, 1)


def test_plan_cache_is_bounded_and_evicted_shapes_replan() -> None:
    model = _model()
    sess = InferenceSession(model, SessionOptions(plan_cache_size=2))
    for n in (2, 3, 4, 2):
        feeds = {"x": np.full((1, n, 1), -0.5 + n, np.float32), "axes": np.array([0], np.int64)}
        got = sess.run(None, feeds)
        np.testing.assert_array_equal(got[1], ort_run(model, feeds)["y"])
        assert len(sess.arenas) <= 2
    assert [k[0] for k in sess.arenas] == [(1, 4, 1), (1, 2, 1)], "least recently used first"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_plan_cache_size_is_validated(bad) -> None:
    with pytest.raises(Exception, match=r"plan_cache_size must be a positive int"):
        InferenceSession(_model(), SessionOptions(plan_cache_size=bad))


def test_dynamic_view_of_an_arena_value_survives_buffer_reuse() -> None:
    """Expand to a run-time shape returns a view of its (planned) input; the planner reuses that input's
    buffer for the next value, so the dynamic result must own its bytes (BERT's token-type ids)."""
    nodes = [
        oh.make_node("Add", ["x", "one"], ["a"], name="a"),
        oh.make_node("Expand", ["a", "shape"], ["e"], name="expand"),
        oh.make_node("Softmax", ["x"], ["b"], name="b"),  # not fusable: planned, takes a's freed buffer
        oh.make_node("Transpose", ["b"], ["c"], name="c", perm=[0, 1]),
        oh.make_node("Add", ["e", "c"], ["y"], name="y"),
    ]
    graph = oh.make_graph(
        nodes,
        "view",
        [
            oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
            oh.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [oh.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    sess = InferenceSession(model)
    for rows in (3, 1, 5):
        feeds = {"x": np.arange(4, dtype=np.float32).reshape(1, 4), "shape": np.array([rows, 4], np.int64)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], ort_run(model, feeds)["y"])


def test_affine_grid_with_a_run_time_size() -> None:
    """AffineGrid's output shape is the size input's values: planned per run, equal to onnxruntime."""
    graph = oh.make_graph(
        [oh.make_node("AffineGrid", ["theta", "size"], ["grid"], name="grid")],
        "affine",
        [
            oh.make_tensor_value_info("theta", TensorProto.FLOAT, [1, 2, 3]),
            oh.make_tensor_value_info("size", TensorProto.INT64, [4]),
        ],
        [oh.make_tensor_value_info("grid", TensorProto.FLOAT, None)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)])
    sess = InferenceSession(model)
    theta = np.array([[[1.0, 0.2, 0.1], [0.0, 0.9, -0.3]]], np.float32)
    for size in ([1, 1, 3, 4], [1, 1, 5, 2]):
        feeds = {"theta": theta, "size": np.array(size, np.int64)}
        got = sess.run(None, feeds)[0]
        np.testing.assert_allclose(got, ort_run(model, feeds)["grid"], rtol=1e-5, atol=1e-6)


def test_session_runs_an_old_opset_model() -> None:
    """An opset-11 model is converted on import; the session's pass report says so."""
    nodes = [oh.make_node("Softmax", ["x"], ["y"], name="softmax", axis=1)]  # opset 11: flattens from axis 1
    graph = oh.make_graph(
        nodes,
        "old",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 11)])
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)}
    sess = InferenceSession(model)
    np.testing.assert_allclose(sess.run(None, feeds)[0], ort_run(model, feeds)["y"], rtol=1e-5, atol=1e-6)
    assert "converted opset 11 -> 13 on import" in str(sess.plan.report)
