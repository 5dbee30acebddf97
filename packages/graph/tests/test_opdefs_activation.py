"""The ONNX activations of opdefs/activation.py: one node at a time through from_onnx/run_graph against
onnxruntime, back through to_onnx, and the shape rules' errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from opstrata.graph import GraphError, from_onnx, run_graph, to_onnx  # noqa: E402
from opstrata.graph.opdefs import registry  # noqa: E402
from opstrata.graph.testing import ModelBuilder, ort_run  # noqa: E402

rng = np.random.default_rng(0)
F = lambda *s: (rng.standard_normal(s) * 3).astype(np.float32)  # noqa: E731


def single_node(
    op: str, inputs: list[tuple[str, np.ndarray]], attrs: dict[str, Any], opset: int
) -> tuple[Any, dict[str, np.ndarray]]:
    """A model of one ``op`` node; inputs are ("feed" | "const", array); the output type is inferred."""
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

# name: (op, inputs, attrs, opset)
CASES: dict[str, tuple[str, list[Any], dict[str, Any], int]] = {
    "hardsigmoid": ("HardSigmoid", [f(F(3, 4))], {}, 22),
    "hardsigmoid_attrs": ("HardSigmoid", [f(F(3, 4))], {"alpha": 0.3, "beta": 0.4}, 22),
    "hardswish": ("HardSwish", [f(F(3, 4))], {}, 22),
    "elu": ("Elu", [f(F(3, 4))], {}, 22),
    "elu_alpha": ("Elu", [f(F(3, 4))], {"alpha": 0.5}, 22),
    "selu": ("Selu", [f(F(3, 4))], {}, 22),
    "selu_attrs": ("Selu", [f(F(3, 4))], {"alpha": 2.0, "gamma": 3.0}, 22),
    "celu": ("Celu", [f(F(3, 4))], {"alpha": 2.0}, 22),
    "leakyrelu": ("LeakyRelu", [f(F(3, 4))], {}, 16),
    "leakyrelu_alpha": ("LeakyRelu", [f(F(3, 4))], {"alpha": 0.2}, 16),
    "thresholdedrelu": ("ThresholdedRelu", [f(F(3, 4))], {"alpha": 0.5}, 22),
    "softplus": ("Softplus", [f(F(3, 4))], {}, 22),
    "softsign": ("Softsign", [f(F(3, 4))], {}, 22),
    "mish": ("Mish", [f(F(3, 4))], {}, 22),
    "swish": ("Swish", [f(F(3, 4))], {"alpha": 1.5}, 24),
    "shrink": ("Shrink", [f(F(3, 4))], {"bias": 0.5, "lambd": 1.0}, 13),
    "shrink_int": ("Shrink", [f(np.arange(-6, 6, dtype=np.int32))], {"bias": 1.0, "lambd": 2.0}, 13),
    "prelu": ("PRelu", [f(F(2, 3, 4)), c(F(3, 1) / 3)], {}, 16),
    "prelu_scalar_slope": ("PRelu", [f(F(2, 3)), c(np.float32(0.25))], {}, 16),
    "prelu_int": ("PRelu", [f(np.arange(-4, 4, dtype=np.int64)), c(np.array([2], np.int64))], {}, 16),
    "hardmax": ("Hardmax", [f(np.round(F(3, 4, 5)))], {}, 13),
    "hardmax_axis0": ("Hardmax", [f(np.round(F(3, 4)))], {"axis": 0}, 13),
    "float16_leakyrelu": ("LeakyRelu", [f(F(3, 4).astype(np.float16))], {"alpha": 0.3}, 16),
    "float16_mish": ("Mish", [f(F(3, 4).astype(np.float16))], {}, 22),
    "float16_softplus": ("Softplus", [f(F(3, 4).astype(np.float16))], {}, 22),
}


@pytest.mark.parametrize("case", list(CASES))
def test_op_matches_onnxruntime(case: str) -> None:
    op, inputs, attrs, opset = CASES[case]
    if op == "Swish" and not onnx.defs.has("Swish"):
        pytest.skip("the installed onnx has no Swish (opset 24)")
    model, feeds = single_node(op, inputs, attrs, opset)
    tol = {"rtol": 2e-3, "atol": 2e-3} if case.startswith("float16") else {}
    check_against_ort(model, feeds, **tol)


def test_every_activation_has_a_case_and_an_elementwise_class() -> None:
    ops = {case[0] for case in CASES.values()}
    for name in ops:
        d = registry.lookup(name)
        assert d is not None and d.kernel is not None and d.shape is not None, name
        assert d.codegen is None, name  # attributes the generator cannot take: never fused
        assert d.elementwise == (None if name == "Hardmax" else "binary" if name == "PRelu" else "unary"), (
            name
        )


def test_attribute_defaults_are_filled_on_import() -> None:
    model, _ = single_node("Elu", [f(F(2))], {}, 22)
    (node,) = from_onnx(model).nodes
    assert node.attrs == {"alpha": 1.0}


def test_int_input_to_a_float_activation_names_the_node_and_fix() -> None:
    b = ModelBuilder("bad", 22)
    x = b.input("x", [3], np.int32)
    b.nodes.append(onnx.helper.make_node("Elu", [x], ["y"], name="act"))
    b.output("y", np.int32)
    model = onnx.helper.make_model(
        onnx.helper.make_graph(b.nodes, "g", b.inputs, b.outputs),
        opset_imports=[onnx.helper.make_opsetid("", 22)],
    )
    with pytest.raises(GraphError, match=r"node 'act'.*must be a floating dtype, got int32.*Cast"):
        from_onnx(model)


def test_prelu_slope_that_does_not_broadcast_is_refused() -> None:
    b = ModelBuilder("prelu", 16)
    x = b.input("x", [2, 3], np.float32)
    s = b.const(np.ones(4, np.float32))
    b.nodes.append(onnx.helper.make_node("PRelu", [x, s], ["y"], name="p"))
    b.output("y")
    model = onnx.helper.make_model(
        onnx.helper.make_graph(b.nodes, "g", b.inputs, b.outputs, b.inits),
        opset_imports=[onnx.helper.make_opsetid("", 16)],
    )
    with pytest.raises(GraphError, match=r"node 'p'.*slope \(4,\) does not broadcast to x \(2, 3\)"):
        from_onnx(model)
