"""The signal ops of opdefs/signal.py (DFT, STFT, Hann/Hamming/BlackmanWindow, MelWeightMatrix): one node
at a time through from_onnx/run_graph against onnx's reference evaluator (DFT) or onnxruntime, back
through to_onnx, with scalar inputs given as constants and computed at run time."""

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
    op: str, inputs: list[tuple[str, np.ndarray | None]], attrs: dict[str, Any], opset: int
) -> tuple[Any, dict[str, np.ndarray]]:
    """A model of one ``op`` node; inputs are ("feed" | "const", array) or ("", None) for an omitted one."""
    b = ModelBuilder(op.lower(), opset)
    names, feeds = [], {}
    for k, (kind, arr) in enumerate(inputs):
        if arr is None:
            names.append("")
        elif kind == "feed":
            names.append(b.input(f"in{k}", list(arr.shape), arr.dtype))
            feeds[f"in{k}"] = np.asarray(arr)
        else:
            names.append(b.const(arr))
    b.nodes.append(onnx.helper.make_node(op, names, ["out"], name="node", **attrs))
    m = onnx.helper.make_model(
        onnx.helper.make_graph(b.nodes, "g", b.inputs, [], b.inits),
        opset_imports=[onnx.helper.make_opsetid("", opset)],
    )
    try:
        inferred = onnx.shape_inference.infer_shapes(m)
        out = next(v for v in inferred.graph.value_info if v.name == "out")
        elem = out.type.tensor_type.elem_type
    except (onnx.shape_inference.InferenceError, StopIteration):
        elem = onnx.TensorProto.FLOAT
    b.outputs.append(onnx.helper.make_tensor_value_info("out", elem, None))  # shape: left to the op
    # not b.build(): onnx's shape inference mis-sizes STFT's onesided output (onnxruntime agrees with opstrata)
    model = onnx.helper.make_model(
        onnx.helper.make_graph(b.nodes, "g", b.inputs, b.outputs, b.inits),
        opset_imports=[onnx.helper.make_opsetid("", opset)],
    )
    return model, feeds


def _ref(m: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(zip([o.name for o in m.graph.output], ReferenceEvaluator(m).run(None, feeds), strict=True))


def check(model: Any, feeds: dict[str, np.ndarray], *, oracle: str = "ort", atol: float = 1e-5) -> None:
    """run_graph and the re-exported model agree with the oracle."""
    run = ort_run if oracle == "ort" else _ref
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
                result.dtype,
                result.shape,
                w.shape,
            )
            np.testing.assert_allclose(result, w, rtol=1e-4, atol=atol, err_msg=name)


@pytest.mark.parametrize("inverse,onesided", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_dft_opset17_and_20(inverse: int, onesided: int) -> None:
    x = rng.standard_normal((2, 8, 3, 1 if onesided and not inverse else 2)).astype(np.float32)
    if inverse and onesided:
        x = x[:, :5]
    attrs = {"inverse": inverse, "onesided": onesided}
    check(*single_node("DFT", [("feed", x), ("", None)], {**attrs, "axis": 1}, 17), oracle="ref")
    check(*single_node("DFT", [("feed", x), ("", None), ("const", np.int64(1))], attrs, 20), oracle="ref")
    n = np.int64(8)
    check(*single_node("DFT", [("feed", x), ("feed", n), ("feed", np.int64(-3))], attrs, 20), oracle="ref")


def test_dft_axis_error_names_the_node() -> None:
    x = rng.standard_normal((4, 2)).astype(np.float32)
    m, _ = single_node("DFT", [("feed", x), ("", None), ("const", np.int64(-1))], {}, 20)
    with pytest.raises(GraphError, match="trailing"):
        from_onnx(m)


@pytest.mark.parametrize("kind", ["const", "feed"])
def test_stft(kind: str) -> None:
    x = rng.standard_normal((2, 64, 1)).astype(np.float32)
    w = np.hanning(16).astype(np.float32)
    check(
        *single_node("STFT", [("feed", x), (kind, np.int64(8)), ("const", w), (kind, np.int64(16))], {}, 17)
    )
    check(*single_node("STFT", [("feed", x), (kind, np.int64(4)), ("", None), (kind, np.int64(10))],
                       {"onesided": 1}, 17), oracle="ref")  # fmt: skip


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("kind", ["const", "feed"])
def test_windows(op: str, kind: str) -> None:
    check(*single_node(op, [(kind, np.int64(10))], {}, 17))
    check(
        *single_node(
            op, [(kind, np.int32(7))], {"periodic": 0, "output_datatype": onnx.TensorProto.DOUBLE}, 17
        )
    )


def test_mel_weight_matrix() -> None:
    args = [np.int64(8), np.int64(16), np.int64(8192), np.float32(0), np.float32(4096)]
    check(*single_node("MelWeightMatrix", [("const", a) for a in args], {}, 17))
    check(*single_node("MelWeightMatrix", [("feed", a) for a in args], {}, 17))
