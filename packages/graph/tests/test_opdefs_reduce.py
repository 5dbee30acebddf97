"""Reductions through the graph (ONNX import, shape rules, executor, plan, export) against onnxruntime:
ReduceProd/L1/L2/LogSum/LogSumExp/SumSquare (axes as attribute before opset 18, as a constant input from 18),
keepdims, noop_with_empty_axes, empty sets, ReduceMax/ReduceMin on ints and bool."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper as oh  # noqa: E402

from opstrata.graph import compile, from_onnx, run_graph, to_onnx  # noqa: E402
from opstrata.graph.testing import ort_run  # noqa: E402

rng = np.random.default_rng(0)


def F(*s: int) -> np.ndarray:
    return rng.standard_normal(s).astype(np.float32)


def feed(a: Any) -> tuple[str, np.ndarray]:
    return ("feed", np.asarray(a))


def const(a: Any) -> tuple[str, np.ndarray]:
    return ("const", np.asarray(a))


def _node_model(
    op: str, inputs: list[Any], attrs: dict[str, Any], n_out: int, opset: int
) -> tuple[Any, dict[str, np.ndarray]]:
    """A one-node model: ``("feed", arr)`` inputs are graph inputs, ``("const", arr)`` initializers."""
    ins, inits, names, feeds = [], [], [], {}
    for k, item in enumerate(inputs):
        if item is None:
            names.append("")
            continue
        kind, arr = item
        names.append(f"in{k}")
        if kind == "feed":
            ins.append(oh.make_tensor_value_info(f"in{k}", oh.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
            feeds[f"in{k}"] = arr
        else:
            inits.append(onnx.numpy_helper.from_array(arr, f"in{k}"))
    outs = [f"out{i}" for i in range(n_out)]
    node = oh.make_node(op, names, outs, name="node", **attrs)
    m = oh.make_model(oh.make_graph([node], "g", ins, [], inits), opset_imports=[oh.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    types = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
    elem = oh.np_dtype_to_tensor_dtype(next(iter(feeds.values())).dtype)  # function ops infer no type
    m.graph.output.extend(types.get(o) or oh.make_tensor_value_info(o, elem, None) for o in outs)
    return m, feeds


def check_against_ort(
    op: str,
    inputs: list[Any],
    attrs: dict[str, Any] | None = None,
    *,
    n_out: int = 1,
    opset: int = 17,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    export: bool = True,
) -> None:
    """from_onnx + run_graph (and a compiled Plan, and to_onnx back through onnxruntime) == onnxruntime."""
    model, feeds = _node_model(op, inputs, attrs or {}, n_out, opset)
    want = ort_run(model, feeds)
    graph = from_onnx(model)
    results = {"run_graph": run_graph(graph, feeds), "plan": compile(from_onnx(model)).run(feeds)}
    if export:
        exported = to_onnx(graph)
        onnx.checker.check_model(exported, full_check=True)
        results["to_onnx+ort"] = ort_run(exported, feeds)
    for k, w in want.items():
        for name, got in results.items():
            r = np.asarray(got[k])
            assert r.dtype == w.dtype and r.shape == w.shape, (name, k, r.dtype, r.shape, w.dtype, w.shape)
            np.testing.assert_allclose(
                r.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol, err_msg=f"{name} {k}"
            )
        v = graph.value(k)
        assert v.dtype == w.dtype and all(
            not isinstance(d, int) or d == s for d, s in zip(v.shape, w.shape, strict=True)
        )


NEW = ["ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def _pos(*s: int) -> np.ndarray:
    return (np.abs(F(*s)) + 0.5).astype(np.float32)


@pytest.mark.parametrize("op", NEW)
@pytest.mark.parametrize(("axes", "keepdims"), [([1], 1), ([0, -1], 0), (None, 1), (None, 0)])
def test_axes_attribute_before_opset_18(op: str, axes: list[int] | None, keepdims: int) -> None:
    attrs: dict[str, Any] = {"keepdims": keepdims} | ({"axes": axes} if axes is not None else {})
    check_against_ort(op, [feed(_pos(2, 3, 4))], attrs, opset=13)


@pytest.mark.parametrize("op", NEW)
@pytest.mark.parametrize("axes", [[1], [-1, 0], None])
def test_axes_constant_input_from_opset_18(op: str, axes: list[int] | None) -> None:
    ins = [feed(_pos(2, 3, 4))] + ([const(np.array(axes, np.int64))] if axes is not None else [])
    check_against_ort(op, ins, {"keepdims": 0}, opset=18)


@pytest.mark.parametrize("op", NEW)
def test_noop_with_empty_axes_is_identity(op: str) -> None:
    check_against_ort(
        op, [feed(_pos(2, 3)), const(np.array([], np.int64))], {"noop_with_empty_axes": 1}, opset=18
    )


@pytest.mark.parametrize("op", ["ReduceProd", "ReduceL1", "ReduceSumSquare", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_int_reductions_keep_the_dtype(op: str, dtype: Any) -> None:
    x = rng.integers(-3, 4, size=(2, 3, 4)).astype(dtype)
    check_against_ort(op, [feed(x), const(np.array([1], np.int64))], {"keepdims": 1}, opset=18)


@pytest.mark.parametrize(
    "op",
    ["ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ReduceSum"],
)
def test_empty_set_gives_the_identity(op: str) -> None:
    check_against_ort(
        op, [feed(np.zeros((2, 0, 4), np.float32)), const(np.array([1], np.int64))], {}, opset=18
    )


@pytest.mark.parametrize(
    ("op", "dtype"), [("ReduceMax", np.float32), ("ReduceMin", np.float32), ("ReduceMax", np.int64)]
)
def test_max_min_of_an_empty_set_is_the_dtype_extreme(op: str, dtype: Any) -> None:
    model, feeds = _node_model(
        op, [feed(np.zeros((2, 0, 4), dtype)), const(np.array([1], np.int64))], {}, 1, 18
    )
    got = run_graph(from_onnx(model), feeds)["out0"]
    lowest = -np.inf if dtype == np.float32 else np.iinfo(dtype).min
    highest = np.inf if dtype == np.float32 else np.iinfo(dtype).max
    np.testing.assert_array_equal(got, np.full((2, 1, 4), lowest if op == "ReduceMax" else highest, dtype))


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_max_min_take_bool_from_opset_20(op: str) -> None:
    x = np.array([[True, False, True], [False, False, True]])
    check_against_ort(op, [feed(x), const(np.array([1], np.int64))], {"keepdims": 0}, opset=20)


def test_bool_input_to_a_sum_reduction_is_refused() -> None:
    model, _ = _node_model("ReduceMax", [feed(np.array([True]))], {}, 1, 20)
    model.graph.node[0].op_type = "ReduceProd"
    model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.BOOL
    with pytest.raises(Exception, match="ReduceProd"):
        run_graph(from_onnx(model), {"in0": np.array([True])})
