"""One ONNX node at a time: every imported op type against onnxruntime, and back through to_onnx."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from _onnx_check import needs_onnx_opset, needs_ort_noop_reduce  # noqa: E402

from opstrata.graph import from_onnx, run_graph, supported_onnx_ops, to_onnx  # noqa: E402
from opstrata.graph.testing import ModelBuilder, ort_run  # noqa: E402

rng = np.random.default_rng(0)
F = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
I64 = lambda *v: np.array(v, np.int64)  # noqa: E731
B = np.array


def f(a: Any) -> tuple[str, np.ndarray]:
    """A fed input."""
    return ("feed", np.asarray(a))


def c(a: Any) -> tuple[str, np.ndarray]:
    """A constant input (initializer)."""
    return ("const", np.asarray(a))


# (op, inputs, attrs, number of outputs, opset)
CASES: dict[str, tuple[str, list[Any], dict[str, Any], int, int]] = {
    "sub_bcast": ("Sub", [f(F(2, 3)), f(F(3))], {}, 1, 17),
    "mul": ("Mul", [f(F(2, 3)), c(F(2, 1))], {}, 1, 17),
    "div": ("Div", [f(F(2, 3)), f(np.abs(F(2, 3)) + 0.5)], {}, 1, 17),
    "div_int_truncates": ("Div", [f(I64(7, -7, 6, -1)), c(I64(2, 2, -4, 3))], {}, 1, 17),
    "pow": ("Pow", [f(np.abs(F(2, 3)) + 0.1), c(np.array(1.5, np.float32))], {}, 1, 17),
    "pow_int_exponent": ("Pow", [f(F(4)), c(np.array(2, np.int64))], {}, 1, 17),
    "max3": ("Max", [f(F(2, 3)), f(F(3)), c(F(1, 1))], {}, 1, 17),
    "min2": ("Min", [f(F(2, 3)), f(F(2, 3))], {}, 1, 17),
    "sum3": ("Sum", [f(F(2, 3)), f(F(2, 3)), f(F(3))], {}, 1, 17),
    "max1": ("Max", [f(F(2))], {}, 1, 17),
    "equal": ("Equal", [f(I64(1, 2, 3)), c(I64(1, 0, 3))], {}, 1, 17),
    "less": ("Less", [f(F(2, 3)), f(F(2, 3))], {}, 1, 17),
    "greater": ("Greater", [f(F(2, 3)), c(np.float32(0))], {}, 1, 17),
    "less_or_equal": ("LessOrEqual", [f(I64(1, 2, 3)), c(I64(2))], {}, 1, 17),
    "greater_or_equal": ("GreaterOrEqual", [f(I64(1, 2, 3)), c(I64(2))], {}, 1, 17),
    "and": ("And", [f(B([True, False, True])), f(B([True, True, False]))], {}, 1, 17),
    "or": ("Or", [f(B([True, False, False])), f(B([False, False, True]))], {}, 1, 17),
    "xor": ("Xor", [f(B([True, False])), f(B([True, True]))], {}, 1, 17),
    "not": ("Not", [f(B([True, False]))], {}, 1, 17),
    **{u.lower(): (u, [f(F(3, 4))], {}, 1, 17) for u in "Exp Tanh Erf Sigmoid Relu Neg Abs".split()},
    "log": ("Log", [f(np.abs(F(3, 4)) + 0.1)], {}, 1, 17),
    "sqrt": ("Sqrt", [f(np.abs(F(3, 4)))], {}, 1, 17),
    "reciprocal": ("Reciprocal", [f(np.abs(F(3, 4)) + 0.5)], {}, 1, 17),
    "gelu": ("Gelu", [f(F(3, 4))], {}, 1, 20),
    "gelu_tanh": ("Gelu", [f(F(3, 4))], {"approximate": "tanh"}, 1, 20),
    "where": ("Where", [f(B([[True, False, True]])), f(F(2, 3)), c(np.float32(-1))], {}, 1, 17),
    "clip": ("Clip", [f(F(3, 4)), c(np.float32(-0.5)), c(np.float32(0.5))], {}, 1, 17),
    "clip_max_only": ("Clip", [f(F(3, 4)), "", c(np.float32(0.1))], {}, 1, 17),
    "clip_none": ("Clip", [f(F(3, 4))], {}, 1, 17),
    "cast_to_int": ("Cast", [f(F(3, 4) * 3)], {"to": onnx.TensorProto.INT32}, 1, 17),
    "cast_to_float": ("Cast", [f(I64(1, -2, 3))], {"to": onnx.TensorProto.FLOAT}, 1, 17),
    "identity": ("Identity", [f(F(2))], {}, 1, 17),
    "dropout": ("Dropout", [f(F(2, 3)), c(np.float32(0.3))], {}, 1, 13),
    "dropout_mask": ("Dropout", [f(F(2, 3))], {}, 2, 17),
    "softmax": ("Softmax", [f(F(2, 3, 4))], {"axis": 1}, 1, 13),
    "log_softmax": ("LogSoftmax", [f(F(2, 3, 4))], {}, 1, 17),
    "reduce_sum_int": ("ReduceSum", [f(I64(1, 2, 3, 4).reshape(2, 2)), c(I64(0))], {"keepdims": 0}, 1, 17),
    "reduce_sum_all": ("ReduceSum", [f(F(2, 3))], {}, 1, 17),
    "reduce_sum_noop": ("ReduceSum", [f(F(2, 3))], {"noop_with_empty_axes": 1}, 1, 17),
    "reduce_mean_attr": ("ReduceMean", [f(F(2, 3, 4))], {"axes": [0, 2]}, 1, 13),
    "reduce_max_input": ("ReduceMax", [f(F(2, 3, 4)), c(I64(-1))], {"keepdims": 0}, 1, 18),
    "reduce_min_all": ("ReduceMin", [f(F(2, 3, 4))], {"keepdims": 0}, 1, 18),
    "argmax": ("ArgMax", [f(F(3, 4))], {"axis": 1, "keepdims": 0}, 1, 17),
    "shape_slice": ("Shape", [f(F(2, 3, 4))], {"start": 1, "end": -1}, 1, 15),
    "size": ("Size", [f(F(2, 3))], {}, 1, 17),
    "reshape": ("Reshape", [f(F(2, 3, 4)), c(I64(0, -1))], {}, 1, 17),
    "transpose_default": ("Transpose", [f(F(2, 3, 4))], {}, 1, 17),
    "flatten0": ("Flatten", [f(F(2, 3, 4))], {"axis": 0}, 1, 17),
    "flatten2": ("Flatten", [f(F(2, 3, 4))], {"axis": -1}, 1, 17),
    "squeeze_all": ("Squeeze", [f(F(1, 3, 1))], {}, 1, 17),
    "unsqueeze": ("Unsqueeze", [f(F(3, 4)), c(I64(0, -1))], {}, 1, 17),
    "concat": ("Concat", [f(F(2, 1)), f(F(2, 3)), c(F(2, 2))], {"axis": -1}, 1, 17),
    "split_uneven_18": ("Split", [f(F(7, 2))], {"axis": 0, "num_outputs": 3}, 3, 18),
    "split_equal_13": ("Split", [f(F(2, 6))], {"axis": 1}, 3, 13),
    "slice": ("Slice", [f(F(5, 6)), c(I64(-1, 1)), c(I64(-6, 100)), c(I64(0, 1)), c(I64(-2, 2))], {}, 1, 17),
    "gather_neg": ("Gather", [f(F(3, 4)), c(I64(-1, 0))], {"axis": 1}, 1, 17),
    "gather_scalar": ("Gather", [f(F(3, 4)), c(np.array(2, np.int64))], {}, 1, 17),
    "expand": ("Expand", [f(F(3, 1)), c(I64(2, 3, 4))], {}, 1, 17),
    "range": ("Range", [c(np.float32(0.5)), f(np.float32(3)), c(np.float32(0.5))], {}, 1, 17),
    "constant_of_shape": (
        "ConstantOfShape",
        [c(I64(2, 3))],
        {"value": onnx.helper.make_tensor("v", onnx.TensorProto.INT64, [1], [7])},
        1,
        17,
    ),
    "trilu_upper_k": ("Trilu", [f(F(2, 4, 5)), c(np.array(1, np.int64))], {}, 1, 17),
    "trilu_lower": ("Trilu", [f(F(4, 4))], {"upper": 0}, 1, 17),
    "cumsum": ("CumSum", [f(F(3, 4)), c(np.array(1, np.int64))], {"exclusive": 1, "reverse": 1}, 1, 17),
    "gemm": ("Gemm", [f(F(3, 2)), c(F(3, 4)), c(F(4))], {"transA": 1, "alpha": 0.5, "beta": 2.0}, 1, 17),
    "gemm_no_c": ("Gemm", [f(F(2, 3)), c(F(4, 3))], {"transB": 1}, 1, 17),
    "conv_group_dilation": (
        "Conv",
        [f(F(1, 4, 9, 9)), c(F(6, 2, 3, 3)), c(F(6))],
        {"group": 2, "dilations": [2, 1], "pads": [1, 0, 2, 1]},
        1,
        17,
    ),
    "conv_same_stride2": (
        "Conv",
        [f(F(2, 3, 8, 7)), c(F(4, 3, 3, 3))],
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
        1,
        17,
    ),
    "maxpool_pads": (
        "MaxPool",
        [f(F(1, 2, 7, 7))],
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        1,
        17,
    ),
    "avgpool_include_pad": (
        "AveragePool",
        [f(F(1, 2, 6, 6))],
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
        1,
        17,
    ),
    "global_max_pool": ("GlobalMaxPool", [f(F(2, 3, 4, 5))], {}, 1, 17),
    "batch_norm": (
        "BatchNormalization",
        [f(F(2, 3, 4, 4)), c(F(3)), c(F(3)), c(F(3)), c(np.abs(F(3)) + 0.5)],
        {"epsilon": 1e-3},
        1,
        17,
    ),
    "layer_norm_axis1": ("LayerNormalization", [f(F(2, 3, 4)), c(F(3, 4)), c(F(3, 4))], {"axis": 1}, 1, 17),
    "layer_norm_no_bias": ("LayerNormalization", [f(F(2, 3, 4)), c(F(4))], {}, 1, 17),
    "rms_norm": ("RMSNormalization", [f(F(2, 3, 8)), c(F(8))], {"epsilon": 1e-5}, 1, 23),
    "rms_norm_axis1": ("RMSNormalization", [f(F(2, 3, 8)), c(F(3, 8))], {"axis": 1}, 1, 23),
    "attention_gqa_causal": (
        "Attention",
        [f(F(2, 4, 5, 8)), f(F(2, 2, 5, 8)), f(F(2, 2, 5, 8))],
        {"is_causal": 1},
        1,
        23,
    ),
    "attention_bool_mask": (
        "Attention",
        [f(F(2, 2, 5, 8)), f(F(2, 2, 5, 8)), f(F(2, 2, 5, 8)), f(np.arange(5) < [[[[3]]], [[[5]]]])],
        {"scale": 0.3},
        1,
        25,
    ),
    "attention_float_mask_causal": (
        "Attention",
        [f(F(1, 2, 5, 8)), f(F(1, 2, 5, 8)), f(F(1, 2, 5, 4)), f(F(1, 1, 5, 5))],
        {"is_causal": 1},
        1,
        23,
    ),
    "attention_3d_gqa_causal": (
        "Attention",
        [f(F(2, 5, 16)), f(F(2, 5, 8)), f(F(2, 5, 8))],
        {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1},
        1,
        23,
    ),
    "attention_3d_mask": (
        "Attention",
        [f(F(2, 3, 16)), f(F(2, 5, 16)), f(F(2, 5, 8)), f(F(2, 1, 3, 5))],
        {"q_num_heads": 2, "kv_num_heads": 2},
        1,
        23,
    ),
    # ONNX's causal without a cache is top-left aligned: 3 queries see keys j <= i of 5 (an explicit mask on import)
    "attention_causal_short_query": (
        "Attention",
        [f(F(2, 2, 3, 8)), f(F(2, 2, 5, 8)), f(F(2, 2, 5, 8))],
        {"is_causal": 1},
        1,
        25,
    ),
    "attention_causal_short_query_float_mask": (
        "Attention",
        [f(F(2, 2, 3, 8)), f(F(2, 2, 5, 8)), f(F(2, 2, 5, 8)), f(F(2, 1, 3, 5))],
        {"is_causal": 1},
        1,
        25,
    ),
    "attention_causal_short_query_bool_mask": (
        "Attention",
        [f(F(2, 2, 3, 8)), f(F(2, 2, 5, 8)), f(F(2, 2, 5, 8)), f(np.arange(5) != 2)],
        {"is_causal": 1},
        1,
        25,
    ),
    "einsum_attention": (
        "Einsum",
        [f(F(2, 3, 4, 5)), f(F(2, 3, 6, 5))],
        {"equation": "bhqd,bhkd->bhqk"},
        1,
        17,
    ),
    "einsum_heads_last": (
        "Einsum",
        [f(F(2, 4, 3, 5)), f(F(2, 6, 3, 5))],
        {"equation": "bqhd,bkhd->bhqk"},
        1,
        17,
    ),
    "einsum_matmul": ("Einsum", [f(F(3, 4)), c(F(4, 5))], {"equation": "ij,jk->ik"}, 1, 17),
    "einsum_matvec": ("Einsum", [f(F(3, 4)), f(F(4))], {"equation": "ij,j->i"}, 1, 17),
    "einsum_outer": ("Einsum", [f(F(3)), f(F(4))], {"equation": "i,j->ij"}, 1, 17),
    "einsum_dot_batched": ("Einsum", [f(F(2, 5)), f(F(2, 5))], {"equation": "bi,bi->b"}, 1, 17),
    "einsum_transpose": ("Einsum", [f(F(2, 3, 4))], {"equation": "bij->bji"}, 1, 17),
    "einsum_sum_implicit": ("Einsum", [f(F(3, 4))], {"equation": "ij"}, 1, 17),
    "einsum_reduce": ("Einsum", [f(F(3, 4))], {"equation": "ij->i"}, 1, 17),
    "einsum_sum_out_operand": ("Einsum", [f(F(3, 4)), f(F(4, 5))], {"equation": "ij,jk->i"}, 1, 17),
}


def _model(
    op: str, inputs: list[Any], attrs: dict[str, Any], n_out: int, opset: int
) -> tuple[Any, dict[str, np.ndarray]]:
    needs_onnx_opset(opset)
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
    for o in outs:
        b.outputs.append(types[o])
    return b.build(), feeds


@pytest.mark.parametrize("case", list(CASES))
def test_op_matches_onnxruntime(case: str) -> None:
    if case == "reduce_sum_noop":
        needs_ort_noop_reduce("ReduceSum", axes="absent")
    model, feeds = _model(*CASES[case])
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
            np.testing.assert_allclose(result, w, rtol=1e-4, atol=1e-5, err_msg=name)
        assert graph.value(k).dtype == w.dtype
        assert all(
            not isinstance(d, int) or d == s for d, s in zip(graph.value(k).shape, w.shape, strict=True)
        ), k


def test_coverage_lists_the_issue_ops() -> None:
    wanted = """Add Sub Mul Div Pow Equal Less Greater Gemm MatMul Conv MaxPool AveragePool GlobalAveragePool
    BatchNormalization LayerNormalization Softmax LogSoftmax ReduceSum ReduceMean ReduceMax ReduceMin ArgMax
    Shape Reshape Transpose Flatten Squeeze Unsqueeze Concat Split Slice Gather Expand Range ConstantOfShape
    Where Trilu CumSum Cast Constant Identity Dropout Einsum Erf Gelu Tanh Sigmoid Relu Clip Sqrt Exp Log Neg
    Abs""".split()
    assert set(wanted) <= set(supported_onnx_ops())
    # every imported op is exercised by some graph test (this file's CASES or an opdefs family's tests)
    texts = " ".join(p.read_text(encoding="utf-8") for p in Path(__file__).parent.glob("test_*.py"))
    tested = {op for op in supported_onnx_ops() if re.search(rf"\b{op}\b", texts)}
    assert set(supported_onnx_ops()) <= tested, set(supported_onnx_ops()) - tested


@pytest.mark.parametrize(
    "attr",
    [
        onnx.helper.make_attribute("value_float", 2.5),
        onnx.helper.make_attribute("value_ints", [1, 2, 3]),
        onnx.helper.make_attribute(
            "value", onnx.numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))
        ),
    ],
)
def test_constant_becomes_an_initializer(attr: Any) -> None:
    node = onnx.helper.make_node("Constant", [], ["k"], name="k")
    node.attribute.append(attr)
    vals = (
        onnx.numpy_helper.to_array(attr.t)
        if attr.name == "value"
        else np.array(onnx.helper.get_attribute_value(attr))
    )
    out_type = onnx.helper.make_tensor_value_info(
        "k",
        onnx.helper.np_dtype_to_tensor_dtype(
            vals.dtype if vals.dtype != np.float64 else np.dtype(np.float32)
        ),
        list(vals.shape),
    )
    m = onnx.helper.make_model(
        onnx.helper.make_graph([node], "g", [], [out_type]), opset_imports=[onnx.helper.make_opsetid("", 17)]
    )
    g = from_onnx(m)
    assert "k" in g.initializers and not g.nodes
    exported = to_onnx(g)
    onnx.checker.check_model(exported, full_check=True)
    np.testing.assert_array_equal(ort_run(exported, {})["k"], ort_run(m, {})["k"])


@pytest.mark.parametrize(
    ("to", "saturate", "want"),
    [
        ("FLOAT8E4M3FN", None, [448, -448, 448, -448, np.nan, 1]),  # ONNX default saturate=1: ±max
        ("FLOAT8E4M3FN", 0, [np.nan, np.nan, np.nan, np.nan, np.nan, 1]),  # no inf in e4m3fn: NaN
        ("FLOAT8E5M2", 1, [57344, -57344, 57344, -57344, np.nan, 1]),
        ("FLOAT8E5M2", 0, [np.inf, -np.inf, np.inf, -np.inf, np.nan, 1]),
    ],
)
def test_cast_to_float8_honours_saturate(to: str, saturate: int | None, want: list[float]) -> None:
    x = np.array([1e5, -1e5, np.inf, -np.inf, np.nan, 1.0], np.float32)
    attrs = {"to": getattr(onnx.TensorProto, to)} | ({} if saturate is None else {"saturate": saturate})
    b = ModelBuilder("cast8", 19)
    b.nodes.append(
        onnx.helper.make_node("Cast", [b.input("x", [6], np.float32)], ["y"], name="cast", **attrs)
    )
    b.outputs.append(onnx.helper.make_tensor_value_info("y", getattr(onnx.TensorProto, to), [6]))
    got = run_graph(from_onnx(b.build()), {"x": x})["y"]
    assert got.dtype.name == to.lower().replace("float8", "float8_")
    np.testing.assert_array_equal(got.astype(np.float32), np.array(want, np.float32))
