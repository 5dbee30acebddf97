"""The quantization ops of opdefs/quantize.py (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv, BitCast): one node at a time through
from_onnx/run_graph against onnxruntime (or onnx's reference evaluator where onnxruntime lacks the
form), back through to_onnx, and the shape/type errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx.reference import ReferenceEvaluator  # noqa: E402

from opstrata.graph import GraphError, from_onnx, run_graph, to_onnx  # noqa: E402
from opstrata.graph.testing import ModelBuilder, ort_run  # noqa: E402

rng = np.random.default_rng(0)


def single_node(
    op: str, inputs: list[tuple[str, np.ndarray | None]], attrs: dict[str, Any], opset: int, n_out: int = 1
) -> tuple[Any, dict[str, np.ndarray]]:
    """A model of one ``op`` node; inputs are ("feed" | "const", array) or ("", None) for an omitted one."""
    b = ModelBuilder(op.lower(), opset)
    names, feeds = [], {}
    for k, (kind, arr) in enumerate(inputs):
        if arr is None:
            names.append("")
        elif kind == "feed":
            names.append(b.input(f"in{k}", list(arr.shape), arr.dtype))
            feeds[f"in{k}"] = arr
        else:
            names.append(b.const(arr))
    outs = [f"out{j}" for j in range(n_out)]
    b.nodes.append(onnx.helper.make_node(op, names, outs, name="node", **attrs))
    m = onnx.helper.make_model(
        onnx.helper.make_graph(b.nodes, "g", b.inputs, [], b.inits),
        opset_imports=[onnx.helper.make_opsetid("", opset)],
    )
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    for o in outs:
        b.outputs.append(next(v for v in inferred.graph.value_info if v.name == o))
    return b.build(), feeds


def check(model: Any, feeds: dict[str, np.ndarray], *, oracle: str = "ort", atol: float = 0.0) -> None:
    """run_graph and the re-exported model agree with onnxruntime (or the reference evaluator)."""
    run = ort_run if oracle == "ort" else lambda m, f: dict(zip([o.name for o in m.graph.output],
                                                                 ReferenceEvaluator(m).run(None, f), strict=True))  # fmt: skip
    want = run(model, feeds)
    graph = from_onnx(model)
    got = run_graph(graph, feeds)
    exported = to_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    back = run(exported, feeds)
    for k, w in want.items():
        for name, result in (("run_graph", got[k]), ("to_onnx", back[k])):
            assert result.dtype == w.dtype and result.shape == w.shape, (
                name,
                k,
                result.dtype,
                result.shape,
                w.shape,
            )
            np.testing.assert_allclose(
                result.astype(np.float64), w.astype(np.float64), atol=atol, err_msg=name
            )
        assert graph.value(k).dtype == w.dtype


F = lambda *s: (rng.standard_normal(s) * 10).astype(np.float32)  # noqa: E731


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("kind", ["feed", "const"])
def test_quantize_dequantize_per_tensor_and_axis(opset: int, kind: str) -> None:
    x = F(2, 3, 4)
    s, zp = np.array([0.1, 0.2, 0.3], np.float32), np.array([0, 100, 255], np.uint8)
    check(*single_node("QuantizeLinear", [(kind, x), ("const", s), ("const", zp)], {"axis": 1}, opset))
    check(*single_node("QuantizeLinear", [(kind, x), ("const", np.float32(0.5)), ("", None)], {}, opset))
    q = rng.integers(-128, 128, (2, 3, 4)).astype(np.int8)
    zq = np.array([1, -2, 3], np.int8)
    check(*single_node("DequantizeLinear", [(kind, q), ("const", s), ("const", zq)], {"axis": -2}, opset))


def test_quantize_blocked_int16_and_output_dtype() -> None:
    x = F(4, 6)
    s = rng.uniform(0.05, 1, (4, 3)).astype(np.float32)
    z = rng.integers(-50, 50, (4, 3)).astype(np.int16)
    check(
        *single_node(
            "QuantizeLinear", [("feed", x), ("const", s), ("const", z)], {"axis": 1, "block_size": 2}, 21
        )
    )
    m, feeds = single_node(
        "QuantizeLinear",
        [("feed", x), ("const", np.float32(0.1))],
        {"output_dtype": onnx.TensorProto.INT8},
        21,
    )
    check(m, feeds, oracle="ref")
    q = rng.integers(0, 65536, (4, 6)).astype(np.uint16)
    check(*single_node("DequantizeLinear", [("feed", q), ("const", s), ("const", z.astype(np.uint16))],
                       {"axis": 1, "block_size": 2}, 21), oracle="ref", atol=1e-3)  # fmt: skip


def test_dynamic_quantize_linear() -> None:
    check(*single_node("DynamicQuantizeLinear", [("feed", F(3, 5))], {}, 13, n_out=3))


def test_matmul_integer_and_qlinear_matmul() -> None:
    a = rng.integers(0, 256, (2, 3, 4)).astype(np.uint8)
    b = rng.integers(0, 256, (4, 5)).astype(np.uint8)
    check(
        *single_node(
            "MatMulInteger",
            [("feed", a), ("feed", b), ("const", np.uint8(12)), ("const", np.uint8(7))],
            {},
            13,
        )
    )
    args = [("feed", a), ("const", np.float32(0.02)), ("const", np.uint8(113)), ("feed", b),
            ("const", np.float32(0.003)), ("const", np.uint8(114)), ("const", np.float32(0.05)), ("const", np.uint8(118))]  # fmt: skip
    check(*single_node("QLinearMatMul", args, {}, 13))


def test_conv_integer_and_qlinear_conv() -> None:
    x = rng.integers(0, 256, (1, 2, 6, 6)).astype(np.uint8)
    w = rng.integers(0, 256, (4, 2, 3, 3)).astype(np.uint8)
    attrs = {"pads": [1, 1, 0, 0], "strides": [1, 2]}
    check(
        *single_node(
            "ConvInteger",
            [("feed", x), ("const", w), ("const", np.uint8(3)), ("const", np.uint8(5))],
            attrs,
            13,
        )
    )
    check(*single_node("ConvInteger", [("feed", x), ("const", w)], {"auto_pad": "SAME_UPPER"}, 13))
    wi = rng.integers(-127, 128, (4, 2, 3, 3)).astype(np.int8)
    args = [("feed", x), ("const", np.float32(0.05)), ("const", np.uint8(10)), ("const", wi),
            ("const", np.array([0.01, 0.02, 0.03, 0.04], np.float32)), ("const", np.zeros(4, np.int8)),
            ("const", np.float32(0.2)), ("const", np.uint8(128)), ("const", np.array([5, -5, 50, -50], np.int32))]  # fmt: skip
    check(*single_node("QLinearConv", args, attrs, 13), atol=1)  # onnxruntime may round ties differently


def test_bitcast() -> None:
    if onnx.defs.onnx_opset_version() < 26:
        pytest.skip("BitCast needs opset 26")
    x = F(3, 4)
    m, feeds = single_node("BitCast", [("feed", x)], {"to": onnx.TensorProto.INT32}, 26)
    graph = from_onnx(m)
    np.testing.assert_array_equal(run_graph(graph, feeds)["out0"], x.view(np.int32))
    h = onnx.helper
    bad = h.make_model(
        h.make_graph(
            [h.make_node("BitCast", ["x"], ["y"], to=onnx.TensorProto.INT64)], "g",
            [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 4])],
            [h.make_tensor_value_info("y", onnx.TensorProto.INT64, [3, 4])],
        ),
        opset_imports=[h.make_opsetid("", 26)],
    )  # fmt: skip
    with pytest.raises(GraphError, match="widths differ"):
        from_onnx(bad)


def test_quantize_int32_input_and_float8_forms() -> None:
    xi = rng.integers(-1000, 1000, (3, 4)).astype(np.int32)
    check(*single_node("QuantizeLinear", [("feed", xi), ("const", np.float32(4)), ("const", np.int8(3))], {}, 10),
          oracle="ref")  # fmt: skip
    import ml_dtypes

    f8 = np.dtype(ml_dtypes.float8_e4m3fn)
    try:  # the oracle (onnx's reference evaluator) and the test's initializers need numpy float8 in onnx
        onnx.helper.np_dtype_to_tensor_dtype(f8)
    except (KeyError, ValueError, TypeError):
        pytest.skip(
            f"installed onnx {onnx.__version__} has no numpy float8 dtype (the ml_dtypes types, onnx >= 1.19): "
            "its reference evaluator cannot check the float8 forms"
        )
    x = F(3, 4) * 100
    check(*single_node("QuantizeLinear", [("feed", x), ("const", np.float32(2)), ("const", np.zeros((), f8))], {}, 21),
          oracle="ref")  # fmt: skip
    q = rng.standard_normal((3, 4)).astype(f8)
    check(*single_node("DequantizeLinear", [("feed", q), ("const", np.float32(3))], {}, 21), oracle="ref")
