"""Layout ops through the graph: Pad, Tile, DepthToSpace, SpaceToDepth and Resize against onnxruntime, back
through to_onnx, with shape-computed pads/sizes (as torchvision and transformers exports write them)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from test_opdefs_indexing import c, check, f, model_of  # noqa: E402

from opstrata.graph import UnsupportedOpError, from_onnx, run_graph, to_onnx  # noqa: E402
from opstrata.graph.testing import ModelBuilder, ort_run  # noqa: E402

rng = np.random.default_rng(1)
F = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
I64 = lambda *v: np.array(v, np.int64)  # noqa: E731
F32 = lambda *v: np.array(v, np.float32)  # noqa: E731

IMG = F(1, 2, 4, 6)
CASES: dict[str, tuple[str, list[Any], dict[str, Any], int, int]] = {
    "pad_constant": ("Pad", [f(F(2, 3)), c(I64(1, 0, 0, 2)), c(np.float32(1.5))], {}, 1, 13),
    "pad_reflect": ("Pad", [f(F(2, 4)), c(I64(0, 2, 1, 3))], {"mode": "reflect"}, 1, 13),
    "pad_edge_crop": ("Pad", [f(F(3, 4)), c(I64(-1, 1, 2, -2))], {"mode": "edge"}, 1, 13),
    "pad_wrap": ("Pad", [f(F(3, 4)), c(I64(1, 2, 1, 0))], {"mode": "wrap"}, 1, 19),
    "pad_axes": ("Pad", [f(F(2, 3, 4)), c(I64(1, 2, 0, 1)), "", c(I64(-1, 0))], {}, 1, 18),
    "pad_int_value": ("Pad", [f(I64([1, 2], [3, 4])), c(I64(1, 1, 1, 1)), c(np.int64(-7))], {}, 1, 13),
    "tile": ("Tile", [f(F(2, 3)), c(I64(2, 1))], {}, 1, 13),
    "depth_to_space_dcr": ("DepthToSpace", [f(F(1, 8, 2, 3))], {"blocksize": 2}, 1, 13),
    "depth_to_space_crd": ("DepthToSpace", [f(F(2, 8, 2, 3))], {"blocksize": 2, "mode": "CRD"}, 1, 13),
    "space_to_depth": ("SpaceToDepth", [f(F(2, 3, 4, 6))], {"blocksize": 2}, 1, 13),
    "resize_nearest_scales": ("Resize", [f(IMG), "", c(F32(1, 1, 2, 2))], {}, 1, 13),
    "resize_nearest_asymmetric_floor": (
        "Resize", [f(IMG), "", c(F32(1, 1, 1.5, 0.5))],
        {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, 1, 13,
    ),
    "resize_linear_half_pixel": ("Resize", [f(IMG), "", c(F32(1, 1, 2, 1.5))], {"mode": "linear"}, 1, 13),
    "resize_linear_align_corners": (
        "Resize", [f(IMG), "", "", c(I64(1, 2, 7, 5))],
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, 1, 13,
    ),
    "resize_linear_pytorch_half_pixel_down": (
        "Resize", [f(IMG), "", "", c(I64(1, 2, 3, 1))],
        {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, 1, 13,
    ),
    "resize_cubic": ("Resize", [f(IMG), c(F32()), c(F32(1, 1, 2, 2))], {"mode": "cubic"}, 1, 13),
    "resize_cubic_exclude_outside": (
        "Resize", [f(IMG), "", c(F32(1, 1, 0.5, 0.5))],
        {"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}, 1, 13,
    ),
    "resize_sizes_axes": ("Resize", [f(IMG), "", "", c(I64(5, 3))], {"axes": [3, 2], "mode": "linear"}, 1, 19),
    "resize_antialias": ("Resize", [f(IMG), "", c(F32(1, 1, 0.5, 0.5))], {"mode": "linear", "antialias": 1}, 1, 18),
    "resize_tf_crop": (
        "Resize", [f(IMG), c(F32(0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2)), "", c(I64(1, 2, 3, 3))],
        {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 9.0},
        1, 13,
    ),
    "resize_uint8": ("Resize", [f(np.arange(24, dtype=np.uint8).reshape(1, 1, 4, 6) * 10), "", c(F32(1, 1, 2, 2))],
                     {"mode": "linear"}, 1, 13),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_op_matches_onnxruntime(case: str) -> None:
    check(*model_of(*CASES[case]))


def test_resize_to_another_feature_maps_size() -> None:
    """torchvision's FPN: ``F.interpolate(top, size=lateral.shape[-2:])`` — sizes computed from a shape."""
    b = ModelBuilder("fpn", 17)
    top, lat = b.input("top", [1, 4, "h", "w"]), b.input("lat", [1, 4, "H", "W"])
    hw = b.op("Slice", [b.op("Shape", [lat]), b.ints([2]), b.ints([4])])
    sizes = b.op("Concat", [b.ints([1, 4]), hw], axis=0)
    up = b.op("Resize", [top, "", "", sizes], mode="nearest")
    out = b.op("Add", [up, lat])
    b.output(out, np.float32)
    model = b.build()
    graph = from_onnx(model)
    assert graph.value(out).shape == (1, 4, "H", "W")
    feeds = {"top": F(1, 4, 3, 5), "lat": F(1, 4, 6, 10)}
    np.testing.assert_allclose(run_graph(graph, feeds)[out], ort_run(model, feeds)[out], rtol=1e-6)


def test_pad_to_a_window_multiple() -> None:
    """Swin-style padding: pads computed from the input's shape (``(-h) % 4``) infer and run."""
    b = ModelBuilder("pad_dyn", 17)
    x = b.input("x", [1, "h", 3])
    h = b.op("Slice", [b.op("Shape", [x]), b.ints([1]), b.ints([2])])
    extra = b.op("Mod", [b.op("Sub", [b.ints([4]), b.op("Mod", [h, b.ints([4])])]), b.ints([4])])
    pads = b.op("Concat", [b.ints([0, 0, 0, 0]), extra, b.ints([0])], axis=0)
    y = b.op("Pad", [x, pads])
    b.output(y, np.float32)
    model = b.build()
    graph = from_onnx(model)
    feeds = {"x": F(1, 5, 3)}
    got = run_graph(graph, feeds)[y]
    assert got.shape == (1, 8, 3)
    np.testing.assert_array_equal(got, ort_run(model, feeds)[y])


RUNTIME_CASES: dict[str, tuple[str, list[Any], dict[str, Any], int, int]] = {
    "resize_scales_fed": ("Resize", [f(IMG), "", f(F32(1, 1, 2, 0.5))], {"mode": "linear"}, 1, 13),
    "resize_roi_fed": (
        "Resize", [f(IMG), f(F32(0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2)), "", c(I64(1, 2, 3, 3))],
        {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}, 1, 13,
    ),
    "resize_sizes_fed": ("Resize", [f(IMG), "", "", f(I64(1, 2, 3, 9))], {"mode": "cubic"}, 1, 13),
    "pad_axes_fed": ("Pad", [f(F(2, 3, 4)), c(I64(1, 2, 0, 1)), "", f(I64(-1, 0))], {}, 1, 18),
    "pad_pads_fed": ("Pad", [f(F(2, 3)), f(I64(1, 0, 0, 2)), f(np.float32(-3))], {}, 1, 13),
    "tile_repeats_fed": ("Tile", [f(F(2, 3)), f(I64(1, 3))], {}, 1, 13),
}  # fmt: skip


@pytest.mark.parametrize("case", list(RUNTIME_CASES))
def test_shape_inputs_computed_at_run_time_run(case: str) -> None:
    """Scales, roi, sizes, pads, axes and repeats fed at run time stay inputs: the output size is unknown
    to shape inference (the runtime allocates it per run) and the answers equal onnxruntime's."""
    model, feeds = model_of(*RUNTIME_CASES[case])
    graph = from_onnx(model)
    got, want = run_graph(graph, feeds)["out0"], ort_run(model, feeds)["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    back = ort_run(to_onnx(graph), feeds)["out0"]
    np.testing.assert_allclose(back, want, rtol=1e-5, atol=1e-6)


def test_resize_with_both_scales_and_sizes_is_refused() -> None:
    h = onnx.helper
    graph = h.make_graph(
        [h.make_node("Resize", ["x", "", "s", "z"], ["y"], name="both")],
        "both",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 4, 6])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [
            onnx.numpy_helper.from_array(F32(1, 1, 2, 2), "s"),
            onnx.numpy_helper.from_array(I64(1, 2, 8, 12), "z"),
        ],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    with pytest.raises(UnsupportedOpError, match="Resize with both scales and sizes is invalid"):
        from_onnx(model)


def test_exported_resize_keeps_its_attributes() -> None:
    model, _ = model_of(*CASES["resize_cubic_exclude_outside"])
    node = to_onnx(from_onnx(model)).graph.node[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["mode"] == b"cubic" and attrs["exclude_outside"] == 1 and attrs["cubic_coeff_a"] == -0.5
