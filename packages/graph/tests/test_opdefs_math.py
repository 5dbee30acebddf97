"""The math ops of opdefs/math.py (and CastLike, integer Pow, 16/32/64-bit ints on the elementwise ops): one node at a
time through from_onnx/run_graph against onnxruntime, back through to_onnx, and the import/shape errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from _onnx_check import needs_onnx_opset  # noqa: E402

from opstrata.graph import GraphError, from_onnx, run_graph, to_onnx  # noqa: E402
from opstrata.graph.opdefs import registry  # noqa: E402
from opstrata.graph.testing import ModelBuilder, ort_run  # noqa: E402

rng = np.random.default_rng(0)
F = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
U = lambda lo, hi, *s: rng.uniform(lo, hi, s).astype(np.float32)  # noqa: E731


def single_node(
    op: str, inputs: list[tuple[str, np.ndarray]], attrs: dict[str, Any], opset: int
) -> tuple[Any, dict[str, np.ndarray]]:
    """A model of one ``op`` node; inputs are ("feed" | "const", array); the output type is inferred."""
    needs_onnx_opset(opset)
    b = ModelBuilder(op.lower(), opset)
    names, feeds = [], {}
    for k, (kind, arr) in enumerate(inputs):
        if kind == "feed":
            names.append(b.input(f"in{k}", list(arr.shape), arr.dtype))
            feeds[f"in{k}"] = arr
        else:
            names.append(b.const(arr))
    b.nodes.append(onnx.helper.make_node(op, names, ["out"], name="node", **attrs))
    m = onnx.helper.make_model(
        onnx.helper.make_graph(b.nodes, "g", b.inputs, [], b.inits),
        opset_imports=[onnx.helper.make_opsetid("", opset)],
    )
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    b.outputs.append(next(v for v in inferred.graph.value_info if v.name == "out"))
    return b.build(), feeds


def check_against_ort(
    model: Any, feeds: dict[str, np.ndarray], rtol: float = 1e-5, atol: float = 1e-6
) -> None:
    """run_graph and the re-exported model (run by onnxruntime) agree with onnxruntime on the original."""
    want = ort_run(model, feeds)
    graph = from_onnx(model)
    got = run_graph(graph, feeds)
    exported = to_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    back = ort_run(exported, feeds)
    for k, w in want.items():
        for name, result in (("run_graph", got[k]), ("to_onnx+ort", back[k])):
            assert result.dtype == w.dtype and result.shape == w.shape, (name, result.dtype, result.shape)
            np.testing.assert_allclose(result, w, rtol=rtol, atol=atol, err_msg=name)
        assert graph.value(k).dtype == w.dtype


f = lambda a: ("feed", np.asarray(a))  # noqa: E731
c = lambda a: ("const", np.asarray(a))  # noqa: E731
I = lambda dt, *v: np.array(v, dt)  # noqa: E731, E741

# name: (op, inputs, attrs, opset)
CASES: dict[str, tuple[str, list[Any], dict[str, Any], int]] = {
    **{u.lower(): (u, [f(F(3, 4))], {}, 22) for u in "Sin Cos Tan Atan Sinh Cosh Asinh".split()},
    "asin": ("Asin", [f(U(-0.9, 0.9, 3, 4))], {}, 22),
    "acos": ("Acos", [f(U(-0.9, 0.9, 3, 4))], {}, 22),
    "atanh": ("Atanh", [f(U(-0.9, 0.9, 3, 4))], {}, 22),
    "acosh": ("Acosh", [f(U(1.1, 5, 3, 4))], {}, 22),
    "ceil": ("Ceil", [f(F(3, 4) * 3)], {}, 13),
    "floor": ("Floor", [f(F(3, 4) * 3)], {}, 13),
    "round": ("Round", [f(np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, 2.6], np.float32))], {}, 22),
    "sign": ("Sign", [f(np.array([-2.0, 0.0, 3.0], np.float32))], {}, 13),
    "sign_int": ("Sign", [f(I(np.int64, -3, 0, 5))], {}, 13),
    "mod_int": ("Mod", [f(I(np.int32, -7, 7, -7, 7)), c(I(np.int32, 3, 3, -3, -3))], {}, 13),
    "mod_int_fmod": ("Mod", [f(I(np.int64, -7, 7, -7, 7)), c(I(np.int64, 3, 3, -3, -3))], {"fmod": 1}, 13),
    "mod_float_fmod": ("Mod", [f(F(3, 4) * 5), f(U(0.5, 3, 4))], {"fmod": 1}, 13),
    "mod_uint16": ("Mod", [f(I(np.uint16, 7, 100, 65535)), c(I(np.uint16, 3, 7, 10))], {}, 13),
    "bitshift_left": ("BitShift", [f(I(np.uint32, 16, 4, 1)), c(I(np.uint32, 1, 2, 3))], {"direction": "LEFT"}, 18),
    "bitshift_right": ("BitShift", [f(I(np.uint8, 16, 4, 1)), c(I(np.uint8, 1, 2, 3))], {"direction": "RIGHT"}, 18),
    "bitshift_uint64": ("BitShift", [f(I(np.uint64, 2**63, 5)), f(I(np.uint64, 3, 60))], {"direction": "LEFT"}, 18),
    "bitwise_and": ("BitwiseAnd", [f(I(np.int32, 12, -1, 7)), f(I(np.int32, 10, 5, 0))], {}, 18),
    "bitwise_or": ("BitwiseOr", [f(I(np.uint16, 12, 65535)), c(I(np.uint16, 3))], {}, 18),
    "bitwise_xor": ("BitwiseXor", [f(I(np.int8, 12, -128)), f(I(np.int8, 10, 127))], {}, 18),
    "bitwise_not": ("BitwiseNot", [f(I(np.uint8, 0, 5, 255))], {}, 18),
    "isnan": ("IsNaN", [f(np.array([1.0, np.nan, np.inf], np.float32))], {}, 20),
    "isinf": ("IsInf", [f(np.array([1.0, np.nan, np.inf, -np.inf], np.float32))], {}, 20),
    "isinf_pos": ("IsInf", [f(np.array([np.inf, -np.inf], np.float32))], {"detect_negative": 0}, 20),
    "isinf_neg": ("IsInf", [f(np.array([np.inf, -np.inf], np.float32))], {"detect_positive": 0}, 20),
    "det": ("Det", [f(F(3, 3))], {}, 22),
    "det_batched": ("Det", [f(F(2, 4, 4))], {}, 22),
    "mean3": ("Mean", [f(F(2, 3)), f(F(3)), c(F(1, 1))], {}, 13),
    "mean1": ("Mean", [f(F(2, 3))], {}, 13),
    "cumprod": ("CumProd", [f(F(3, 4)), c(np.array(1, np.int64))], {}, 26),
    "cumprod_excl_rev": ("CumProd", [f(F(3, 4)), c(np.array(-2, np.int32))], {"exclusive": 1, "reverse": 1}, 26),
    "cumprod_int": ("CumProd", [f(I(np.int64, 1, 2, 3, 4, 5)), c(np.array(0, np.int64))], {}, 26),
    "pow_int": ("Pow", [f(I(np.int64, 1, 2, 3, -2)), c(I(np.int64, 4, 5, 6, 3))], {}, 15),
    "pow_int_float_exponent": ("Pow", [f(I(np.int32, 1, 2, 3)), c(np.array([4, 5, 6], np.float32))], {}, 15),
    "castlike": ("CastLike", [f(F(3, 4) * 100), c(np.zeros(1, np.int32))], {}, 15),
    "castlike_to_float16": ("CastLike", [f(F(3, 4)), f(np.zeros(2, np.float16))], {}, 19),
    "add_int16": ("Add", [f(I(np.int16, 1, 32767)), f(I(np.int16, 3, 1))], {}, 14),
    "sub_uint32": ("Sub", [f(I(np.uint32, 1, 10)), f(I(np.uint32, 3, 1))], {}, 14),
    "mul_uint64": ("Mul", [f(I(np.uint64, 2**40, 3)), c(I(np.uint64, 2**30))], {}, 14),
    "div_uint16": ("Div", [f(I(np.uint16, 7, 100)), c(I(np.uint16, 2, 9))], {}, 14),
    "equal_uint16": ("Equal", [f(I(np.uint16, 7, 100)), c(I(np.uint16, 7, 9))], {}, 13),
    "less_int16": ("Less", [f(I(np.int16, -7, 100)), c(I(np.int16, 7, 9))], {}, 13),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_op_matches_onnxruntime(case: str) -> None:
    model, feeds = single_node(*CASES[case])
    check_against_ort(model, feeds)


def test_every_math_op_has_a_case() -> None:
    tested = {case[0] for case in CASES.values()}
    mine = """Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Ceil Floor Round Sign Mod BitShift BitwiseAnd
    BitwiseOr BitwiseXor BitwiseNot IsNaN IsInf Det Mean CumProd""".split()
    assert set(mine) <= tested
    for name in mine:
        d = registry.lookup(name)
        assert d is not None and d.kernel is not None and d.shape is not None and d.codegen is None, name


def test_mean_of_one_input_is_an_identity() -> None:
    model, _ = single_node("Mean", [f(F(2, 3))], {}, 13)
    assert [n.op_type for n in from_onnx(model).nodes] == ["Identity"]


def test_cumprod_axis_out_of_range_names_the_node() -> None:
    b = ModelBuilder("cp", 26)
    x = b.input("x", [3, 4], np.float32)
    b.nodes.append(onnx.helper.make_node("CumProd", [x, b.const(np.array(2, np.int64))], ["y"], name="cp"))
    b.output("y")
    model = onnx.helper.make_model(
        onnx.helper.make_graph(b.nodes, "g", b.inputs, b.outputs, b.inits),
        opset_imports=[onnx.helper.make_opsetid("", 26)],
    )
    with pytest.raises(GraphError, match=r"node 'cp'.*axis=2 is out of range for rank 2"):
        from_onnx(model)


@pytest.mark.parametrize(
    "op, dtype, shape, pattern",
    [
        ("BitwiseNot", np.float32, [3], r"must be an integer tensor, got float32"),
        ("Det", np.float32, [2, 3], r"Det needs square matrices, got \(2, 3\)"),
        ("Det", np.float32, [3], r"Det needs an input of shape \(\.\.\., M, M\)"),
        ("IsNaN", np.int32, [3], r"must be a floating dtype, got int32"),
        ("Sin", np.int64, [3], r"must be a floating dtype, got int64"),
    ],
)
def test_shape_rule_errors_name_the_node(op: str, dtype: Any, shape: list[int], pattern: str) -> None:
    b = ModelBuilder("bad", 22)
    x = b.input("x", shape, dtype)
    b.nodes.append(onnx.helper.make_node(op, [x], ["y"], name="bad_node"))
    model = onnx.helper.make_model(
        onnx.helper.make_graph(b.nodes, "g", b.inputs, [onnx.helper.make_tensor_value_info("y", 0, None)]),
        opset_imports=[onnx.helper.make_opsetid("", 22)],
    )
    with pytest.raises(GraphError, match=r"node 'bad_node'.*" + pattern):
        from_onnx(model)
