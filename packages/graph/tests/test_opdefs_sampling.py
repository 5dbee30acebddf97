"""GridSample, AffineGrid, Col2Im, CenterCropPad, DeformConv, TensorScatter and CausalConvWithState through the
graph (ONNX import, shape rules, executor, plan, export) against onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


import functools  # noqa: E402

import _onnx_check  # noqa: E402
from _onnx_check import F, const, feed, rng  # noqa: E402

from opstrata.graph import from_onnx, run_graph  # noqa: E402

node_model = functools.partial(_onnx_check.node_model, infer_types=False)
check_against_ort = functools.partial(_onnx_check.check_against_ort, opset=22, infer_types=False)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_2d(mode: str, padding_mode: str, align_corners: int) -> None:
    grid = rng.uniform(-1.3, 1.3, (2, 4, 5, 2)).astype(np.float32)
    check_against_ort(
        "GridSample", [feed(F(2, 3, 5, 6)), feed(grid)],
        {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners},
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_3d(mode: str) -> None:
    grid = rng.uniform(-1.2, 1.2, (1, 2, 3, 4, 3)).astype(np.float32)
    check_against_ort(
        "GridSample", [feed(F(1, 2, 3, 4, 5)), feed(grid)], {"mode": mode, "padding_mode": "border"}
    )


def test_grid_sample_opset_16_bilinear_name() -> None:
    grid = rng.uniform(-1, 1, (1, 3, 3, 2)).astype(np.float32)
    check_against_ort(
        "GridSample", [feed(F(1, 1, 4, 4)), feed(grid)], {"mode": "bilinear"}, opset=16, export=False
    )


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("size", [[2, 3, 4, 5], [2, 3, 2, 4, 5]])
def test_affine_grid(align_corners: int, size: list[int]) -> None:
    nd = len(size) - 2
    check_against_ort(
        "AffineGrid",
        [feed(F(2, nd, nd + 1)), const(np.array(size, np.int64))],
        {"align_corners": align_corners},
    )


def test_affine_grid_size_computed_at_run_time() -> None:
    """The output shape depends on the size input's values (the runtime's session: runtime's tests)."""
    want = check_against_ort(
        "AffineGrid", [feed(F(1, 2, 3)), feed(np.array([1, 1, 3, 4], np.int64))], plan=False
    )
    assert want["out0"].shape == (1, 3, 4, 2)


@pytest.mark.parametrize(
    ("image", "block", "attrs"),
    [([5, 5], [2, 2], {}), ([6, 5], [2, 3], {"strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [1, 2]}),
     ([4, 3, 5], [2, 2, 2], {})],
)  # fmt: skip
def test_col2im(image: list[int], block: list[int], attrs: dict[str, Any]) -> None:
    nd = len(image)
    st, dl = attrs.get("strides", [1] * nd), attrs.get("dilations", [1] * nd)
    pd = attrs.get("pads", [0] * 2 * nd)
    out = [(image[i] + pd[i] + pd[i + nd] - dl[i] * (block[i] - 1) - 1) // st[i] + 1 for i in range(nd)]
    x = F(2, 3 * int(np.prod(block)), int(np.prod(out)))
    check_against_ort(
        "Col2Im", [feed(x), const(np.array(image, np.int64)), const(np.array(block, np.int64))], attrs
    )


@pytest.mark.parametrize(("shape", "axes"), [([3, 8, 2], None), ([7, 2], [0, 2]), ([5], [-1])])
def test_center_crop_pad(shape: list[int], axes: list[int] | None) -> None:
    attrs = {} if axes is None else {"axes": axes}
    check_against_ort("CenterCropPad", [feed(F(5, 4, 3)), const(np.array(shape, np.int64))], attrs)


@pytest.mark.parametrize("with_mask_bias", [False, True])
def test_deform_conv(with_mask_bias: bool) -> None:
    x, w = F(1, 4, 5, 6), F(6, 2, 2, 3)
    offset = F(1, 2 * 2 * 3 * 2, 6, 4) * 0.7  # offset_group 2, kernel 2x3, out 6x4 with pads
    extra = (
        [feed(F(6)), feed(rng.uniform(0, 1, (1, 2 * 6, 6, 4)).astype(np.float32))] if with_mask_bias else []
    )
    check_against_ort(
        "DeformConv", [feed(x), feed(w), feed(offset), *extra],
        {"group": 2, "offset_group": 2, "pads": [1, 0, 1, 0], "strides": [1, 1]},
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(mode: str) -> None:
    idx = np.array([1, 3], np.int64) if mode == "linear" else np.array([3, 4], np.int64)
    check_against_ort(
        "TensorScatter", [feed(F(2, 3, 5, 4)), feed(F(2, 3, 2, 4)), feed(idx)], {"mode": mode}, opset=24
    )


@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize("with_state", [False, True])
def test_causal_conv_with_state(activation: str, with_state: bool) -> None:
    extra = [feed(F(3)), feed(F(2, 3, 2))] if with_state else []
    check_against_ort(
        "CausalConvWithState", [feed(F(2, 3, 6)), feed(F(3, 1, 3)), *extra], {"activation": activation},
        n_out=2, opset=27, export=False,
    )  # fmt: skip


def test_grid_sample_bad_grid_shape_names_the_node() -> None:
    model, feeds = node_model("GridSample", [feed(F(1, 1, 4, 4)), feed(F(1, 3, 3, 3))], {}, 1, 22)
    with pytest.raises(Exception, match="GridSample"):
        run_graph(from_onnx(model), feeds)
