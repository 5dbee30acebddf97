"""Layout ops — pad, tile, depth_to_space, space_to_depth, reverse_sequence, eye_like, resize — against
onnx's reference evaluator (and torch's pixel shuffle semantics), on random shapes, and their error paths."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops import OpError
from opstrata.ops.testing import assert_close

onnx = pytest.importorskip("onnx")
from onnx.reference import ReferenceEvaluator  # noqa: E402

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEVICES = ("ref", "cpu")


def onnx_ref(op: str, feeds: dict[str, Any], n_out: int = 1, **attrs: Any) -> list[np.ndarray]:
    """Outputs of one ONNX node run by onnx's reference evaluator (``""`` keys are omitted inputs)."""
    names = [k if v is not None else "" for k, v in feeds.items()]
    node = onnx.helper.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)
    return ReferenceEvaluator(node).run(None, {k: v for k, v in feeds.items() if v is not None})


# --------------------------------------------------------------------------- pad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[0, 1, 2, 1], [1, 0, 0, 2], [0, 0, 0, 0]])
def test_pad_matches_onnx(device: str, mode: str, pads: list[int]) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = ops.pad(x, pads, mode=mode, value=1.5, device=device)
    want = onnx_ref("Pad", {"x": x, "p": np.array(pads, np.int64), "v": np.float32(1.5)}, mode=mode)[0]
    assert_close(got, want)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[-1, 1, 1, -1], [1, -1, -1, 1], [-1, 1, 0, -2]])
def test_pad_negative_crops_as_onnxruntime(mode: str, pads: list[int]) -> None:
    """onnx's reference evaluator rejects negative pads; onnxruntime crops first, then pads."""
    ort = pytest.importorskip("onnxruntime")
    h, tp = onnx.helper, onnx.TensorProto
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    graph = h.make_graph(
        [h.make_node("Pad", ["x", "p"], ["y"], mode=mode)],
        "pad",
        [h.make_tensor_value_info("x", tp.FLOAT, [3, 4])],
        [h.make_tensor_value_info("y", tp.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array(pads, np.int64), "p")],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    for device in DEVICES:
        np.testing.assert_array_equal(ops.pad(x, pads, mode=mode, device=device), want)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int64, np.bool_, np.float16, ml_dtypes.bfloat16])
def test_pad_keeps_dtype(dtype: Any) -> None:
    got = ops.pad(np.ones((2,), dtype), [1, 1], value=0)
    assert got.dtype == np.dtype(dtype)
    assert got.astype(np.float64).tolist() == [0, 1, 1, 0]


@SETTINGS
@given(st.integers(0, 2**31), st.sampled_from(["constant", "reflect", "edge", "wrap"]))
def test_pad_shape_property(seed: int, mode: str) -> None:
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(1, 4))
    shape = tuple(int(s) for s in rng.integers(2, 5, size=rank))
    pads = [int(v) for v in rng.integers(-1, 3, size=2 * rank)]
    x = rng.standard_normal(shape)
    got = ops.pad(x, pads, mode=mode)
    assert got.shape == tuple(shape[d] + pads[d] + pads[d + rank] for d in range(rank))
    inner = tuple(slice(max(pads[d], 0), got.shape[d] - max(pads[d + rank], 0)) for d in range(rank))
    crop = tuple(slice(max(-pads[d], 0), shape[d] - max(-pads[d + rank], 0)) for d in range(rank))
    np.testing.assert_array_equal(got[inner], x[crop])  # the kept data sits unchanged inside the padding


def test_pad_errors() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(OpError, match=r"pad: argument 'pads' expected 4 ints"):
        ops.pad(x, [1, 1])
    with pytest.raises(OpError, match="pad: argument 'mode' expected one of"):
        ops.pad(x, [0, 0, 0, 0], mode="symmetric")
    with pytest.raises(OpError, match="pad: argument 'pads' expected crops no larger"):
        ops.pad(x, [-2, 0, -1, 0])


# --------------------------------------------------------------------------- tile


@pytest.mark.parametrize("device", DEVICES)
def test_tile_matches_onnx(device: str) -> None:
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    reps = np.array([2, 3], np.int64)
    np.testing.assert_array_equal(ops.tile(x, reps, device=device), onnx_ref("Tile", {"x": x, "r": reps})[0])
    assert ops.tile(x, [0, 1]).shape == (0, 3)


def test_tile_errors() -> None:
    with pytest.raises(OpError, match=r"tile: argument 'repeats' expected 2 ints >= 0"):
        ops.tile(np.zeros((2, 2)), [2])
    with pytest.raises(OpError, match="tile: argument 'repeats'"):
        ops.tile(np.zeros((2, 2)), [2, -1])


# --------------------------------------------------------------------------- depth_to_space / space_to_depth


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_matches_onnx_and_inverts(device: str, mode: str) -> None:
    x = np.arange(2 * 8 * 2 * 3, dtype=np.float32).reshape(2, 8, 2, 3)
    got = ops.depth_to_space(x, blocksize=2, mode=mode, device=device)
    assert_close(got, onnx_ref("DepthToSpace", {"x": x}, blocksize=2, mode=mode)[0])
    back = ops.space_to_depth(got, blocksize=2, mode=mode, device=device)
    np.testing.assert_array_equal(back, x)


def test_space_to_depth_dcr_matches_onnx() -> None:
    x = np.arange(2 * 3 * 4 * 6, dtype=np.float32).reshape(2, 3, 4, 6)
    assert_close(ops.space_to_depth(x, blocksize=2), onnx_ref("SpaceToDepth", {"x": x}, blocksize=2)[0])


def test_crd_is_pixel_shuffle() -> None:
    """CRD is torch's pixel_shuffle: out[n, c, h*r + i, w*r + j] = x[n, c*r*r + i*r + j, h, w]."""
    r = 3
    x = np.random.default_rng(0).standard_normal((1, 2 * r * r, 2, 2))
    got = ops.depth_to_space(x, blocksize=r, mode="CRD")
    for c, i, j, h, w in np.ndindex(2, r, r, 2, 2):
        assert got[0, c, h * r + i, w * r + j] == x[0, c * r * r + i * r + j, h, w]


def test_block_errors() -> None:
    with pytest.raises(OpError, match="depth_to_space: argument 'x' expected channels divisible"):
        ops.depth_to_space(np.zeros((1, 3, 2, 2)), blocksize=2)
    with pytest.raises(OpError, match="space_to_depth: argument 'x' expected height and width divisible"):
        ops.space_to_depth(np.zeros((1, 1, 3, 2)), blocksize=2)
    with pytest.raises(OpError, match="depth_to_space: argument 'mode'"):
        ops.depth_to_space(np.zeros((1, 4, 2, 2)), blocksize=2, mode="XYZ")
    with pytest.raises(OpError, match="depth_to_space: argument 'x' expected 4 dims"):
        ops.depth_to_space(np.zeros((4, 2, 2)), blocksize=2)


# --------------------------------------------------------------------------- reverse_sequence, eye_like


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("time_axis", "batch_axis"), [(0, 1), (1, 0)])
def test_reverse_sequence_matches_onnx(device: str, time_axis: int, batch_axis: int) -> None:
    x = np.arange(4 * 4 * 2, dtype=np.float32).reshape(4, 4, 2)
    lens = np.array([4, 3, 1, 0], np.int64)
    got = ops.reverse_sequence(x, lens, time_axis=time_axis, batch_axis=batch_axis, device=device)
    want = onnx_ref("ReverseSequence", {"x": x, "l": lens}, time_axis=time_axis, batch_axis=batch_axis)[0]
    np.testing.assert_array_equal(got, want)


def test_reverse_sequence_errors() -> None:
    with pytest.raises(
        OpError, match=r"reverse_sequence: argument 'sequence_lens' expected values in \[0, 2\]"
    ):
        ops.reverse_sequence(np.zeros((2, 2)), np.array([3, 1]))
    with pytest.raises(OpError, match="reverse_sequence: argument 'sequence_lens' expected 2 ints"):
        ops.reverse_sequence(np.zeros((2, 2)), np.array([1]))


@pytest.mark.parametrize("k", [-1, 0, 2])
def test_eye_like_matches_onnx(k: int) -> None:
    x = np.zeros((3, 4), np.int32)
    got = ops.eye_like(x, k=k, dtype=np.float32)
    want = onnx_ref("EyeLike", {"x": x}, k=k, dtype=onnx.TensorProto.FLOAT)[0]
    assert_close(got, want)
    assert ops.eye_like(x, k=k).dtype == np.int32


# --------------------------------------------------------------------------- resize

COORDS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("scales", [[1.0, 1.0, 2.0, 1.5], [1.0, 1.0, 0.6, 0.5]])
def test_resize_scales_matches_onnx(mode: str, coord: str, scales: list[float]) -> None:
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 5)).astype(np.float32)
    s = np.array(scales, np.float32)
    got = ops.resize(x, scales=s, mode=mode, coordinate_transformation_mode=coord)
    want = onnx_ref("Resize", {"x": x, "roi": None, "s": s}, mode=mode, coordinate_transformation_mode=coord)[
        0
    ]
    assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_resize_sizes_nearest_matches_onnx(nearest_mode: str, policy: str) -> None:
    x = np.arange(20, dtype=np.float32).reshape(1, 1, 4, 5)
    sizes = np.array([7, 3], np.int64)
    got = ops.resize(x, sizes=sizes, axes=[2, 3], nearest_mode=nearest_mode, keep_aspect_ratio_policy=policy)
    want = onnx_ref(
        "Resize",
        {"x": x, "roi": None, "scales": None, "sizes": sizes},
        axes=[2, 3],
        nearest_mode=nearest_mode,
        keep_aspect_ratio_policy=policy,
    )[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias_and_exclude_outside_match_onnx(mode: str) -> None:
    x = np.random.default_rng(1).standard_normal((1, 1, 9, 7)).astype(np.float32)
    sizes = np.array([1, 1, 4, 3], np.int64)
    for attrs in ({"antialias": 1}, {"exclude_outside": 1, "cubic_coeff_a": -0.5}):
        got = ops.resize(x, sizes=sizes, mode=mode, **{k: v for k, v in attrs.items()})
        want = onnx_ref("Resize", {"x": x, "roi": None, "scales": None, "sizes": sizes}, mode=mode, **attrs)[
            0
        ]
        assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_resize_tf_crop_and_resize_matches_onnx() -> None:
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    roi = np.array([0, 0, 0.4, 0.6, 1, 1, 1.2, 1.7], np.float32)
    sizes = np.array([1, 1, 3, 3], np.int64)
    attrs = {
        "mode": "linear",
        "coordinate_transformation_mode": "tf_crop_and_resize",
        "extrapolation_value": 10.0,
    }
    got = ops.resize(x, sizes=sizes, roi=roi, **attrs)
    want = onnx_ref("Resize", {"x": x, "roi": roi, "scales": None, "sizes": sizes}, **attrs)[0]
    assert_close(got, want)


def test_resize_cubic_overshoot_saturates() -> None:
    x = np.array([[0, 0, 127, 127, 127, 0, 0]], np.uint8)  # ringing below 0
    wide = ops.resize(x.astype(np.float64), scales=[1, 2], mode="cubic")
    assert wide.max() > 127 and wide.min() < 0
    got = ops.resize(x, scales=[1, 2], mode="cubic")
    np.testing.assert_array_equal(got, np.clip(np.trunc(wide), 0, 255).astype(np.uint8))


@pytest.mark.parametrize("dtype", [np.uint8, np.int32])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_integers_truncate_and_saturate(dtype: Any, mode: str) -> None:
    """As onnxruntime casts (toward zero); onnx's reference evaluator rounds instead."""
    x = np.array([[0, 255, 3, 0]], dtype)
    got = ops.resize(x, scales=[1, 2], mode=mode)
    want = ops.resize(x.astype(np.float64), scales=[1, 2], mode=mode)
    info = np.iinfo(dtype)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, np.clip(np.trunc(want), info.min, info.max).astype(dtype))


@SETTINGS
@given(st.integers(0, 2**31), st.sampled_from(["nearest", "linear", "cubic"]), st.sampled_from(COORDS))
def test_resize_random_sizes_match_onnx(seed: int, mode: str, coord: str) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, *rng.integers(1, 6, size=2))).astype(np.float32)
    sizes = np.array([1, *rng.integers(1, 9, size=2)], np.int64)
    got = ops.resize(x, sizes=sizes, mode=mode, coordinate_transformation_mode=coord)
    want = onnx_ref(
        "Resize",
        {"x": x, "roi": None, "scales": None, "sizes": sizes},
        mode=mode,
        coordinate_transformation_mode=coord,
    )[0]
    assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_resize_errors() -> None:
    x = np.zeros((1, 1, 2, 2), np.float32)
    with pytest.raises(OpError, match="resize: argument 'scales' expected exactly one of scales and sizes"):
        ops.resize(x)
    with pytest.raises(OpError, match="resize: argument 'scales' expected 4 positive floats"):
        ops.resize(x, scales=[2, 2])
    with pytest.raises(OpError, match="resize: argument 'mode' expected one of"):
        ops.resize(x, scales=[1, 1, 2, 2], mode="area")
    with pytest.raises(OpError, match="resize: argument 'antialias' expected 0 with mode='nearest'"):
        ops.resize(x, scales=[1, 1, 2, 2], antialias=True)
    with pytest.raises(ops.NoKernelError, match="resize: no kernel for device 'cpu' and dtype bool"):
        ops.resize(x.astype(bool), scales=[1, 1, 2, 2])


@pytest.mark.parametrize("dtype", [np.int64, ml_dtypes.bfloat16, np.bool_])
def test_resize_nearest_copies_exactly(dtype: Any) -> None:
    """Nearest only copies entries: int64 beyond 2**53 and low-precision floats stay exact."""
    x = (np.array([[2**60 + 1, 3]], np.int64) if dtype == np.int64 else np.array([[1.5, -2.0]])).astype(dtype)
    if dtype == np.bool_:
        with pytest.raises(ops.NoKernelError):
            ops.resize(x, scales=[1, 2])
        return
    got = ops.resize(x, scales=[1, 2])
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, np.repeat(x, 2, axis=1))
