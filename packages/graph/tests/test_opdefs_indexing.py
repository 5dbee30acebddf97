"""Index ops through the graph: GatherElements, GatherND, ScatterElements, ScatterND, OneHot, EyeLike, TopK,
ReverseSequence, NonZero, ArgMin and ArgMax (select_last_index) against onnxruntime, and back through to_onnx."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from opstrata.graph import from_onnx, run_graph, to_onnx  # noqa: E402
from opstrata.graph.testing import ModelBuilder, ort_run  # noqa: E402

rng = np.random.default_rng(0)
F = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
I64 = lambda *v: np.array(v, np.int64)  # noqa: E731


def f(a: Any) -> tuple[str, np.ndarray]:
    """A fed input."""
    return ("feed", np.asarray(a))


def c(a: Any) -> tuple[str, np.ndarray]:
    """A constant input (initializer)."""
    return ("const", np.asarray(a))


def model_of(op: str, inputs: list[Any], attrs: dict[str, Any], n_out: int, opset: int) -> tuple[Any, dict]:
    """A one-node model (declared output types from onnx shape inference) and its feeds."""
    b = ModelBuilder(op.lower(), opset)
    names, feeds = [], {}
    for k, item in enumerate(inputs):
        if item == "":
            names.append("")
            continue
        kind, arr = item
        if kind == "feed":
            names.append(b.input(f"in{k}", list(arr.shape), arr.dtype))
            feeds[f"in{k}"] = arr
        else:
            names.append(b.const(arr))
    outs = [f"out{i}" for i in range(n_out)]
    b.nodes.append(onnx.helper.make_node(op, names, outs, name="node", **attrs))
    m = onnx.helper.make_model(
        onnx.helper.make_graph(b.nodes, "g", b.inputs, [], b.inits),
        opset_imports=[onnx.helper.make_opsetid("", opset)],
    )
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    types = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
    b.outputs.extend(types[o] for o in outs)
    ranked = all(types[o].type.tensor_type.HasField("shape") for o in outs)
    return b.build(check=ranked), feeds  # the checker wants a rank; an output size set at run time has none


X34 = F(3, 4)
CASES: dict[str, tuple[str, list[Any], dict[str, Any], int, int]] = {
    "gather_elements": ("GatherElements", [f(X34), f(I64([0, -1, 2, 3], [2, 1, 0, -4]))], {"axis": 1}, 1, 18),
    "gather_elements_axis0_int32": (
        "GatherElements", [f(X34), c(np.array([[0, 2, 1, -1]], np.int32))], {}, 1, 18,
    ),
    "gather_nd": ("GatherND", [f(F(2, 3, 4)), c(I64([[0, 1], [1, 2], [1, -1]]))], {}, 1, 18),
    "gather_nd_batch": ("GatherND", [f(F(2, 3, 4)), f(I64([[2], [0]], [[1], [1]]))], {"batch_dims": 1}, 1, 18),
    "scatter_elements": (
        "ScatterElements", [f(X34), c(I64([1, 0], [2, 2])), f(F(2, 2))], {"axis": 0}, 1, 18,
    ),
    "scatter_elements_add": (
        "ScatterElements", [f(X34), c(I64([1, 1], [-1, 1])), f(F(2, 2))], {"axis": 1, "reduction": "add"}, 1, 18,
    ),
    "scatter_elements_max": (
        "ScatterElements", [f(X34), c(I64([1, 1], [3, 1])), f(F(2, 2))], {"axis": 1, "reduction": "max"}, 1, 18,
    ),
    "scatter_nd": ("ScatterND", [f(F(4, 3)), c(I64([1], [3])), f(F(2, 3))], {}, 1, 18),
    "scatter_nd_mul": ("ScatterND", [f(F(4, 3)), c(I64([1, 0], [1, 0])), f(F(2))], {"reduction": "mul"}, 1, 18),
    "one_hot": ("OneHot", [f(I64([0, 3], [-1, 7])), c(np.float32(4)), c(np.array([0, 5], np.float32))], {}, 1, 13),
    "one_hot_axis": ("OneHot", [f(I64(1, 2)), c(I64(3)), c(I64(-1, 1))], {"axis": 0}, 1, 13),
    "eye_like": ("EyeLike", [f(F(3, 4))], {"k": 1}, 1, 13),
    "eye_like_dtype": ("EyeLike", [f(np.zeros((4, 2), np.int64))], {"dtype": onnx.TensorProto.FLOAT, "k": -1}, 1, 13),
    "top_k": ("TopK", [f(F(3, 6)), c(I64(3))], {}, 2, 13),
    "top_k_smallest_axis0": ("TopK", [f(F(5, 2)), c(I64(2))], {"axis": 0, "largest": 0}, 2, 13),
    "reverse_sequence": (
        "ReverseSequence", [f(F(4, 3, 2)), f(I64(4, 1, 2))], {"time_axis": 0, "batch_axis": 1}, 1, 13,
    ),
    "argmin": ("ArgMin", [f(F(3, 4))], {"axis": 1, "keepdims": 0}, 1, 13),
    "argmin_last": ("ArgMin", [f(np.array([[1, 0, 0], [2, 2, 3]], np.float32))], {"axis": -1, "select_last_index": 1}, 1, 13),
    "argmax_last": ("ArgMax", [f(np.array([[1, 3, 3], [2, 2, 0]], np.int64))], {"axis": 1, "select_last_index": 1}, 1, 13),
}  # fmt: skip


def check(model: Any, feeds: dict[str, np.ndarray]) -> None:
    """run_graph and the exported model in onnxruntime agree with onnxruntime on the original."""
    want = ort_run(model, feeds)
    graph = from_onnx(model)
    got = run_graph(graph, feeds)
    exported = to_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    back = ort_run(exported, feeds)
    for k, w in want.items():
        for name, result in (("run_graph", got[k]), ("to_onnx+ort", back[k])):
            assert result.dtype == w.dtype, (name, result.dtype, w.dtype)
            assert result.shape == w.shape, (name, result.shape, w.shape)
            np.testing.assert_allclose(result, w, rtol=1e-5, atol=1e-6, err_msg=name)
        v = graph.value(k)
        assert v.dtype == w.dtype
        assert v.shape is not None and len(v.shape) == w.ndim
        assert all(not isinstance(d, int) or d == s for d, s in zip(v.shape, w.shape, strict=True)), (
            v.shape,
            w.shape,
        )


@pytest.mark.parametrize("case", list(CASES))
def test_op_matches_onnxruntime(case: str) -> None:
    check(*model_of(*CASES[case]))


def test_top_k_k_from_a_shape_infers_and_runs() -> None:
    """K computed from another tensor's shape (as exporters write ``x.topk(y.shape[0])``) still infers."""
    b = ModelBuilder("topk_shape", 17)
    x, y = b.input("x", [2, 8]), b.input("y", [3, 5])
    k = b.op("Slice", [b.op("Shape", [y]), b.ints([0]), b.ints([1])])
    vals, idx = b.op("TopK", [x, k], n_out=2, axis=1)
    b.output(vals, np.float32)
    b.output(idx, np.int64)
    model = b.build()
    graph = from_onnx(model)
    assert graph.value(vals).shape == (2, 3)
    feeds = {"x": F(2, 8), "y": F(3, 5)}
    got, want = run_graph(graph, feeds), ort_run(model, feeds)
    np.testing.assert_array_equal(got[idx], want[idx])


def test_non_zero_runs_with_a_data_dependent_size() -> None:
    x = np.array([[0, 1, 0], [2, 0, 3]], np.float32)
    model, feeds = model_of("NonZero", [f(x)], {}, 1, 13)
    graph = from_onnx(model)
    assert graph.value("out0").shape[0] == 2  # the count of non-zeros is only known at run time
    np.testing.assert_array_equal(run_graph(graph, feeds)["out0"], ort_run(model, feeds)["out0"])


@pytest.mark.parametrize(
    ("op", "inputs", "attrs"),
    [
        ("TopK", [f(F(3, 6)), f(I64(4))], {"axis": 1}),
        ("OneHot", [f(I64(0, 2, -1)), f(np.float32(3.0)), c(np.array([0, 5], np.float32))], {}),
    ],
)
def test_sizes_fed_at_run_time_run(op: str, inputs: list[Any], attrs: dict[str, Any]) -> None:
    """TopK's K and OneHot's (float) depth fed at run time stay inputs; the answers equal onnxruntime's."""
    model, feeds = model_of(op, inputs, attrs, 2 if op == "TopK" else 1, 13)
    graph = from_onnx(model)
    got, want = run_graph(graph, feeds), ort_run(model, feeds)
    for k, w in want.items():
        np.testing.assert_allclose(got[k], w, rtol=1e-6)


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "n_out"),
    [
        ("Compress", [f(F(3, 4)), f(np.array([True, False, True]))], {"axis": 0}, 1),
        ("Compress", [f(F(3, 4)), f(np.array([False, True, True, False, True]))], {}, 1),
        ("Unique", [f(np.array([[2, 1, 1], [3, 0, 0], [2, 1, 1]], np.float32))], {"axis": 0}, 4),
        ("Unique", [f(np.array([4, 1, 4, 0, 1], np.int64))], {"sorted": 0}, 4),
        ("Unique", [f(np.array([4, 1, 4, 0, 1], np.int64))], {}, 1),
    ],
)
def test_data_dependent_sizes_match_onnxruntime(
    op: str, inputs: list[Any], attrs: dict[str, Any], n_out: int
) -> None:
    model, feeds = model_of(op, inputs, attrs, n_out, 13)
    graph = from_onnx(model)
    got, want = run_graph(graph, feeds), ort_run(model, feeds)
    back = ort_run(to_onnx(graph), feeds)
    for k, w in want.items():
        np.testing.assert_array_equal(got[k], w)
        np.testing.assert_array_equal(back[k], w)
        assert graph.value(k).dtype == w.dtype
