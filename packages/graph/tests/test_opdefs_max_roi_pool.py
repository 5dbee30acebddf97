"""MaxRoiPool (Fast R-CNN ROI max pooling): a hand-computed case, random ROIs against onnxruntime, errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

onnx = pytest.importorskip("onnx")

import onnx.helper as oh  # noqa: E402

from opstrata.graph import GraphError, from_onnx, run_graph  # noqa: E402

T = onnx.TensorProto


def _model(pooled: list[int], scale: float = 1.0, rois_cols: int = 5, rank: int = 4) -> Any:
    g = oh.make_graph(
        [oh.make_node("MaxRoiPool", ["x", "r"], ["y"], pooled_shape=pooled, spatial_scale=scale)],
        "g",
        [
            oh.make_tensor_value_info("x", T.FLOAT, [None] * rank),
            oh.make_tensor_value_info("r", T.FLOAT, [None, rois_cols]),
        ],
        [oh.make_tensor_value_info("y", T.FLOAT, None)],
    )
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


def test_hand_computed_bins() -> None:
    """A 4x4 map, ROI (1, 0)-(3, 3) (rounded corners, inclusive): 3 columns x 4 rows pooled to 2x2 bins
    of rows [0, 2) / [2, 4) and columns [1, 3) / [2, 4) (floor/ceil of the 1.5-wide split)."""
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    rois = np.array([[0, 1, 0, 3, 3]], np.float32)
    y = run_graph(from_onnx(_model([2, 2])), {"x": x, "r": rois})["y"]
    want = np.array([[[[x[0, 0, 0:2, 1:3].max(), x[0, 0, 0:2, 2:4].max()],
                       [x[0, 0, 2:4, 1:3].max(), x[0, 0, 2:4, 2:4].max()]]]], np.float32)  # fmt: skip
    np.testing.assert_array_equal(y, want)


def test_roi_outside_the_map_pools_to_zero() -> None:
    x = np.full((1, 2, 4, 4), -5.0, np.float32)
    y = run_graph(from_onnx(_model([2, 2])), {"x": x, "r": np.array([[0, 10, 10, 12, 12]], np.float32)})["y"]
    assert y.shape == (1, 2, 2, 2) and (y == 0).all()


@settings(max_examples=25, deadline=None)
@given(
    pooled=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    scale=st.sampled_from([1.0, 0.5, 0.25, 1 / 16]),
    boxes=st.lists(
        st.tuples(st.integers(0, 1), *[st.floats(-4, 40, allow_nan=False, width=32)] * 4),
        min_size=1,
        max_size=4,
    ),
    seed=st.integers(0, 2**16),
)
def test_matches_onnxruntime(pooled: tuple[int, int], scale: float, boxes: list[tuple], seed: int) -> None:
    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(seed).standard_normal((2, 3, 9, 11)).astype(np.float32)
    rois = np.array(boxes, np.float32)
    m = _model(list(pooled), scale)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "r": rois}
    )[0]
    got = run_graph(from_onnx(m), {"x": x, "r": rois})["y"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"pooled": [2]}, r"pooled_shape must be two positive ints"),
        ({"pooled": [2, 0]}, r"pooled_shape must be two positive ints"),
        ({"pooled": [2, 2], "rois_cols": 4}, r"rois must be \(num_rois, 5\)"),
        ({"pooled": [2, 2], "rank": 3}, r"4-D \(N, C, H, W\) input"),
    ],
)
def test_bad_max_roi_pool_is_refused(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(GraphError, match=match):
        from_onnx(_model(**kw))
