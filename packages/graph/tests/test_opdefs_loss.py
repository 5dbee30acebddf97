"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opdefs/loss.py): one node through
from_onnx/run_graph against onnxruntime, back through to_onnx, and the import/shape errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper as oh  # noqa: E402

from opstrata.graph import GraphError, UnsupportedOpError, from_onnx, run_graph, to_onnx  # noqa: E402
from opstrata.graph.testing import ort_run  # noqa: E402

rng = np.random.default_rng(0)


def _model(op: str, x: np.ndarray, t: np.ndarray, w: np.ndarray | None, n_out: int = 1, **attrs: Any) -> Any:
    names = ["x", "t"] + (["w"] if w is not None else [])
    outs = ["loss", "log_prob"][:n_out]
    ty = TensorProto.DOUBLE if x.dtype == np.float64 else TensorProto.FLOAT
    inputs = [
        oh.make_tensor_value_info("x", ty, list(x.shape)),
        oh.make_tensor_value_info("t", TensorProto.INT64, list(t.shape)),
    ]
    if w is not None:
        inputs.append(oh.make_tensor_value_info("w", ty, list(w.shape)))
    loss_shape = list(t.shape) if attrs.get("reduction") == "none" else []
    outputs = [oh.make_tensor_value_info("loss", ty, loss_shape)]
    if n_out > 1:
        outputs.append(oh.make_tensor_value_info("log_prob", ty, list(x.shape)))
    g = oh.make_graph([oh.make_node(op, names, outs, name="n", **attrs)], "g", inputs, outputs)
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 13)])


def _check(model: Any, feeds: dict[str, np.ndarray]) -> None:
    """run_graph and the exported model (run by onnxruntime) agree with onnxruntime on the original."""
    want = ort_run(model, feeds)
    graph = from_onnx(model)
    got = run_graph(graph, feeds)
    exported = to_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    back = ort_run(exported, feeds)
    for k, w in want.items():
        for name, result in (("run_graph", got[k]), ("to_onnx+ort", back[k])):
            assert result.dtype == w.dtype and result.shape == w.shape, (name, k, result.dtype, result.shape)
            np.testing.assert_allclose(result, w, rtol=1e-5, atol=1e-6, err_msg=f"{name} {k}")
        assert graph.value(k).dtype == w.dtype


def _feeds(shape: tuple[int, ...], ignore: int | None, weighted: bool, dtype: Any = np.float32):
    x = rng.standard_normal(shape).astype(dtype)
    t = rng.integers(0, shape[1], (shape[0], *shape[2:])).astype(np.int64)
    if ignore is not None:
        t.flat[1::3] = ignore
    w = rng.uniform(0.5, 2.0, shape[1]).astype(dtype) if weighted else None
    return x, t, w


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, -1, 1])
@pytest.mark.parametrize("shape", [(3, 4), (2, 4, 3, 2)])
def test_losses_match_onnxruntime(
    op: str, reduction: str, weighted: bool, ignore: int | None, shape: tuple[int, ...]
) -> None:
    x, t, w = _feeds(shape, ignore, weighted)
    attrs = {"reduction": reduction} | ({"ignore_index": ignore} if ignore is not None else {})
    feeds = {"x": x, "t": t} | ({"w": w} if w is not None else {})
    _check(_model(op, x, t, w, **attrs), feeds)


def test_softmax_cross_entropy_log_prob_output_in_float64() -> None:
    x, t, w = _feeds((3, 5, 2), 2, True, np.float64)
    _check(
        _model("SoftmaxCrossEntropyLoss", x, t, w, n_out=2, reduction="mean", ignore_index=2),
        {"x": x, "t": t, "w": w},
    )


def test_ignore_index_has_no_default_so_it_is_absent_from_the_ir() -> None:
    x, t, _ = _feeds((2, 3), None, False)
    node = from_onnx(_model("NegativeLogLikelihoodLoss", x, t, None)).nodes[0]
    assert node.attrs == {"reduction": "mean"}


def test_unknown_reduction_is_refused_naming_the_choices() -> None:
    x, t, _ = _feeds((2, 3), None, False)
    model = _model("NegativeLogLikelihoodLoss", x, t, None, reduction="avg")
    with pytest.raises(UnsupportedOpError, match=r"reduction 'avg' is not one of \('none', 'sum', 'mean'\)"):
        from_onnx(model)


def test_target_shape_mismatch_names_the_node() -> None:
    x, _, _ = _feeds((2, 3, 4), None, False)
    model = _model("SoftmaxCrossEntropyLoss", x, np.zeros((2, 5), np.int64), None)
    with pytest.raises(GraphError, match=r"node 'n' \(SoftmaxCrossEntropyLoss\).*target shape \(2, 5\)"):
        from_onnx(model)


def test_out_of_range_class_names_the_target() -> None:
    x, t, _ = _feeds((2, 3), None, False)
    graph = from_onnx(_model("NegativeLogLikelihoodLoss", x, t, None))
    with pytest.raises(Exception, match=r"nll_loss.*target.*\[0, 3\)"):
        run_graph(graph, {"x": x, "t": np.array([0, 5], np.int64)})
