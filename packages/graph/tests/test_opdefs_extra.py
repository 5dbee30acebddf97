"""LinearAttention, SwiGLU (opdefs/extra_attention.py), RoiAlign (opdefs/roi.py) and Einsum with an ellipsis
or a repeated letter (onnx/einsum.py): ONNX models through from_onnx/run_graph against onnxruntime (or
onnx's reference evaluator where onnxruntime lacks the op), the inferred shapes, and the refusals."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from opstrata.graph import from_onnx, run_graph  # noqa: E402

rng = np.random.default_rng(0)


def _model(op: str, feeds: dict[str, np.ndarray | None], outs: list[str], opset: int, **attrs: Any) -> Any:
    names = [k if v is not None else "" for k, v in feeds.items()]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op, names, outs, name="node", **attrs)
    ins = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        for k, v in feeds.items()
        if v is not None
    ]
    g = helper.make_graph(
        [node],
        "g",
        ins,
        [helper.make_tensor_value_info(o, ins[0].type.tensor_type.elem_type, None) for o in outs],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _check(
    model: Any, feeds: dict[str, np.ndarray | None], want: list[np.ndarray], rtol: float, atol: float
) -> None:
    feeds = {k: v for k, v in feeds.items() if v is not None}
    graph = from_onnx(model)
    got = run_graph(graph, feeds)
    for o, w in zip([v.name for v in model.graph.output], want, strict=True):
        assert got[o].dtype == w.dtype and got[o].shape == w.shape, (o, got[o].dtype, got[o].shape)
        np.testing.assert_allclose(got[o], w, rtol=rtol, atol=atol, err_msg=o)
        shape = graph.value(o).shape
        assert shape is None or all(d is None or d == s for d, s in zip(shape, w.shape, strict=True))


def _ort(model: Any, feeds: dict[str, np.ndarray | None]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {k: v for k, v in feeds.items() if v is not None})


def _ref(model: Any, feeds: dict[str, np.ndarray | None]) -> list[np.ndarray]:
    return ReferenceEvaluator(model).run(None, {k: v for k, v in feeds.items() if v is not None})


@pytest.mark.parametrize(
    ("rule", "hq", "hkv", "past"),
    [("linear", 2, 2, False), ("gated", 2, 1, True), ("delta", 4, 2, False), ("gated_delta", 4, 2, True)],
)
def test_linear_attention_matches_onnxruntime(rule, hq, hkv, past):
    b, t, dk, dv = 2, 5, 4, 3
    feeds = {
        "q": rng.standard_normal((b, t, hq * dk)).astype(np.float32),
        "k": (rng.standard_normal((b, t, hkv * dk)) / 2).astype(np.float32),
        "v": rng.standard_normal((b, t, hkv * dv)).astype(np.float32),
        "past": rng.standard_normal((b, hkv, dk, dv)).astype(np.float32) if past else None,
        "decay": -rng.random((b, t, hkv * dk)).astype(np.float32) if "gated" in rule else None,
        "beta": rng.random((b, t, hkv)).astype(np.float32) if "delta" in rule else None,
    }
    m = _model(
        "LinearAttention", feeds, ["y", "state"], 27, q_num_heads=hq, kv_num_heads=hkv, update_rule=rule
    )
    _check(m, feeds, _ort(m, feeds), rtol=1e-4, atol=1e-5)


def test_linear_attention_bad_heads_names_node():
    x = np.ones((1, 2, 6), np.float32)
    feeds = {"q": x, "k": x, "v": x}
    m = _model(
        "LinearAttention", feeds, ["y", "state"], 27, q_num_heads=3, kv_num_heads=2, update_rule="linear"
    )
    with pytest.raises(Exception, match="q_num_heads"):
        run_graph(from_onnx(m), feeds)


@pytest.mark.parametrize(("alpha", "dtype"), [(1.0, np.float32), (0.5, np.float32), (1.0, np.float16)])
def test_swiglu_matches_reference(alpha, dtype):
    feeds = {"a": rng.standard_normal((3, 8)).astype(dtype), "b": rng.standard_normal((3, 8)).astype(dtype)}
    m = _model("SwiGLU", feeds, ["y"], 28, alpha=alpha)
    tol = 1e-3 if dtype == np.float16 else 1e-6
    _check(m, feeds, _ref(m, feeds), rtol=tol, atol=tol)


def test_swiglu_shape_mismatch_is_an_error():
    feeds = {"a": np.ones((2, 4), np.float32), "b": np.ones((2, 3), np.float32)}
    with pytest.raises(Exception, match="one shape"):
        run_graph(from_onnx(_model("SwiGLU", feeds, ["y"], 28)), feeds)


@pytest.mark.parametrize(
    ("opset", "attrs"),
    [
        (16, {"mode": "avg", "sampling_ratio": 2}),
        (16, {"mode": "max", "coordinate_transformation_mode": "output_half_pixel"}),
        (10, {"mode": "avg", "spatial_scale": 0.5}),  # opset 10: output_half_pixel, no attribute
        (16, {"mode": "avg", "sampling_ratio": 0, "spatial_scale": 0.25}),
    ],
)
def test_roi_align_matches_reference_or_onnxruntime(opset, attrs):
    feeds = {
        "x": rng.standard_normal((2, 3, 10, 12)).astype(np.float32),
        "rois": np.array([[0, 0, 9, 9], [2.5, 1.5, 7.2, 8.8], [-2, -1, 14, 3], [4, 4, 4.5, 4.2]], np.float32),
        "idx": np.array([0, 1, 1, 0], np.int64),
    }
    m = _model("RoiAlign", feeds, ["y"], opset, output_height=3, output_width=4, **attrs)
    # opset 10 has no coordinate_transformation_mode and behaves as output_half_pixel: onnxruntime does,
    # onnx's reference evaluator applies opset 16's half_pixel default there, so opset 10 checks against ort
    _check(m, feeds, _ort(m, feeds) if opset == 10 else _ref(m, feeds), rtol=1e-5, atol=1e-6)


def test_roi_align_bad_mode_is_refused():
    feeds = {
        "x": np.ones((1, 1, 4, 4), np.float32),
        "rois": np.ones((1, 4), np.float32),
        "idx": np.zeros(1, np.int64),
    }
    m = _model("RoiAlign", feeds, ["y"], 16, coordinate_transformation_mode="corners")
    with pytest.raises(Exception, match="coordinate_transformation_mode"):
        from_onnx(m)


@pytest.mark.parametrize(
    ("eq", "shapes"),
    [
        ("...ii->...i", [(2, 3, 4, 4)]),
        ("ii->", [(5, 5)]),
        ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
        ("...i,...i->...", [(2, 3, 4), (2, 3, 4)]),
        ("bii,bj->bij", [(2, 3, 3), (2, 4)]),
        ("i...->...", [(3, 2, 2)]),
        ("...ij,jk", [(2, 3, 4), (4, 5)]),
        ("bsh,hd->bsd", [(2, 3, 4), (4, 5)]),
        ("xay,ybz->zbxa", [(2, 3, 4), (4, 5, 6)]),
    ],
)
def test_einsum_ellipsis_and_diagonal_match_onnxruntime(eq, shapes):
    feeds = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    m = _model("Einsum", feeds, ["y"], 13, equation=eq)
    want = _ort(m, feeds)
    np.testing.assert_allclose(want[0], np.einsum(eq, *feeds.values()), rtol=1e-5, atol=1e-5)
    _check(m, feeds, want, rtol=1e-5, atol=1e-5)


def test_einsum_diagonal_keeps_nan_off_the_diagonal_out():
    x = np.eye(3, dtype=np.float32)
    x[0, 1] = np.nan
    feeds = {"x0": x}
    got = run_graph(from_onnx(_model("Einsum", feeds, ["y"], 13, equation="ii->i")), feeds)["y"]
    np.testing.assert_array_equal(got, np.ones(3, np.float32))


def test_einsum_two_contracted_letters_is_refused():
    feeds = {"x0": np.ones((2, 3, 4), np.float32), "x1": np.ones((3, 4, 5), np.float32)}
    with pytest.raises(Exception, match="contracts more than one letter"):
        from_onnx(_model("Einsum", feeds, ["y"], 13, equation="abc,bcd->ad"))


def test_einsum_ellipsis_of_unknown_rank_is_refused():
    node = helper.make_node("Einsum", ["x"], ["y"], name="node", equation="...ii->...i")
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    with pytest.raises(Exception, match="rank is unknown"):
        from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
