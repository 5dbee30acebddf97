"""The detection and text ops (opdefs/detection.py NonMaxSuppression, opdefs/text.py TfIdfVectorizer):
one node at a time through from_onnx/run_graph against onnxruntime, with thresholds given as constants
and fed at run time (the output size depends on the data), and back through to_onnx."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from opstrata.graph import from_onnx, run_graph, to_onnx  # noqa: E402
from opstrata.graph.opdefs.detection import non_max_suppression  # noqa: E402
from opstrata.graph.testing import ort_run  # noqa: E402

h = onnx.helper
rng = np.random.default_rng(0)


def model(
    op: str, inputs: list[tuple[str, np.ndarray | None]], out_type: int, **attrs: Any
) -> tuple[Any, dict]:
    """One ``op`` node; inputs are ("feed" | "const", array) or ("", None) for an omitted one."""
    names, feeds, vis, inits = [], {}, [], []
    for k, (kind, arr) in enumerate(inputs):
        if arr is None:
            names.append("")
            continue
        names.append(f"in{k}")
        arr = np.asarray(arr)
        if kind == "feed":
            feeds[f"in{k}"] = arr
            vis.append(h.make_tensor_value_info(f"in{k}", h.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
        else:
            inits.append(onnx.numpy_helper.from_array(arr, f"in{k}"))
    g = h.make_graph(
        [h.make_node(op, names, ["out"], **attrs)],
        "g",
        vis,
        [h.make_tensor_value_info("out", out_type, None)],
        inits,
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), feeds


def check(m: Any, feeds: dict) -> None:
    want = ort_run(m, feeds)["out"]
    graph = from_onnx(m)
    got = run_graph(graph, feeds)["out"]
    back = ort_run(to_onnx(graph), feeds)["out"]
    for r in (got, back):
        assert r.dtype == want.dtype and r.shape == want.shape
        np.testing.assert_allclose(r, want, rtol=1e-6)


def _boxes(n: int, batch: int = 2) -> np.ndarray:
    xy = rng.uniform(0, 10, (batch, n, 2))
    wh = rng.uniform(0.5, 4, (batch, n, 2))
    return np.concatenate([xy, xy + wh], -1).astype(np.float32)


@pytest.mark.parametrize("kind", ["const", "feed"])
@pytest.mark.parametrize("center", [0, 1])
def test_nms_against_onnxruntime(kind: str, center: int) -> None:
    boxes, scores = _boxes(20), rng.uniform(0, 1, (2, 3, 20)).astype(np.float32)
    for limit, iou, score in ((5, 0.3, 0.4), (100, 0.5, None), (3, 0.0, 0.9)):
        ins = [("feed", boxes), ("feed", scores), (kind, np.array([limit], np.int64)), (kind, np.array([iou], np.float32)),
               (kind, None if score is None else np.array([score], np.float32))]  # fmt: skip
        check(*model("NonMaxSuppression", ins, onnx.TensorProto.INT64, center_point_box=center))
    check(*model("NonMaxSuppression", [("feed", boxes), ("feed", scores)], onnx.TensorProto.INT64))


def test_nms_ties_flipped_corners_and_degenerate_boxes() -> None:
    boxes = np.array([[[0, 0, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0], [0.5, 0.5, 1.5, 1.5]]], np.float32)
    scores = np.array([[[0.9, 0.9, 0.95, 0.8]]], np.float32)
    got = non_max_suppression(boxes, scores, 10, 0.2)  # box 3: IoU 1/7 with box 0, kept
    np.testing.assert_array_equal(got, [[0, 0, 2], [0, 0, 0], [0, 0, 3]])


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("weighted", [False, True])
def test_tfidf_against_onnxruntime(mode: str, weighted: bool) -> None:
    x = rng.integers(0, 8, (3, 12)).astype(np.int32)
    attrs: dict[str, Any] = dict(
        mode=mode, min_gram_length=1, max_gram_length=3, max_skip_count=2, ngram_counts=[0, 4, 8],
        ngram_indexes=list(range(7)), pool_int64s=[2, 3, 5, 4, 5, 6, 7, 1, 2, 3, 4],
    )  # fmt: skip
    if weighted:
        attrs["weights"] = [float(w) for w in rng.uniform(0.5, 2, 7)]
    check(*model("TfIdfVectorizer", [("feed", x)], onnx.TensorProto.FLOAT, **attrs))
    check(*model("TfIdfVectorizer", [("feed", x[0].astype(np.int64))], onnx.TensorProto.FLOAT, **attrs))


@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(1, 3), st.sampled_from([0, 1]))
@settings(max_examples=25, deadline=None)
def test_nms_matches_onnx_reference(seed: int, n: int, classes: int, center: int) -> None:
    from onnx.reference import ReferenceEvaluator

    r = np.random.default_rng(seed)
    boxes = r.uniform(0, 4, (1, n, 4)).astype(np.float32)
    scores = r.choice([0.1, 0.5, 0.7, 0.9], (1, classes, n)).astype(np.float32)  # ties included
    m, _ = model("NonMaxSuppression", [("feed", boxes), ("feed", scores), ("const", np.array([4], np.int64)),
                 ("const", np.array([0.3], np.float32)), ("const", np.array([0.2], np.float32))],
                 onnx.TensorProto.INT64, center_point_box=center)  # fmt: skip
    (want,) = ReferenceEvaluator(m).run(None, {"in0": boxes, "in1": scores})
    np.testing.assert_array_equal(non_max_suppression(boxes, scores, 4, 0.3, 0.2, center), want)


def test_tfidf_string_tokens() -> None:
    x = np.array([["a", "b", "a", "c"], ["b", "b", "a", "b"]], dtype=object)
    attrs = dict(mode="TF", min_gram_length=1, max_gram_length=2, max_skip_count=0, ngram_counts=[0, 2], ngram_indexes=[0, 1, 2],
                 pool_strings=["a", "b", "a", "b"])  # fmt: skip
    m = h.make_model(
        h.make_graph([h.make_node("TfIdfVectorizer", ["x"], ["out"], **attrs)], "g",
                     [h.make_tensor_value_info("x", onnx.TensorProto.STRING, [2, 4])],
                     [h.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)]),
        opset_imports=[h.make_opsetid("", 13)],
    )  # fmt: skip
    got = run_graph(from_onnx(m), {"x": x})["out"]
    np.testing.assert_array_equal(got, ort_run(m, {"x": x})["out"])
    np.testing.assert_array_equal(got, [[2, 1, 1], [1, 3, 1]])
