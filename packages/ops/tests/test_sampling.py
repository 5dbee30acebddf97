"""Sampling kernels — grid_sample, affine_grid, col2im, center_crop_pad, deform_conv, tensor_scatter,
causal_conv_with_state — and the ONNX forms of attention and rotary embedding, against onnx's reference
evaluator, with random shapes and error paths."""

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

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEVICES = ("ref", "cpu")
rng = np.random.default_rng(0)


def F(*s: int) -> np.ndarray:
    return rng.standard_normal(s).astype(np.float32)


def onnx_ref(op: str, feeds: dict[str, Any], n_out: int = 1, **attrs: Any) -> list[np.ndarray]:
    """Outputs of one ONNX node run by onnx's reference evaluator (None values are omitted inputs)."""
    names = [k if v is not None else "" for k, v in feeds.items()]
    node = onnx.helper.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)
    return ReferenceEvaluator(node).run(None, {k: v for k, v in feeds.items() if v is not None})


# --------------------------------------------------------------------------- grid_sample


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_matches_onnx(device: str, mode: str, padding_mode: str, align_corners: int) -> None:
    x, grid = F(2, 2, 4, 5), rng.uniform(-1.4, 1.4, (2, 3, 3, 2)).astype(np.float32)
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    if (mode, padding_mode) == ("cubic", "border"):
        pytest.skip(
            "onnx's reference clamps the coordinate; opstrata follows PyTorch/onnxruntime (tested below)"
        )
    want = onnx_ref("GridSample", {"x": x, "g": grid}, **attrs)[0]
    got = ops.grid_sample(
        x, grid, mode=mode, padding_mode=padding_mode, align_corners=bool(align_corners), device=device
    )
    assert_close(got, want, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(
    dims=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    mode=st.sampled_from(["linear", "nearest"]),
    padding_mode=st.sampled_from(["zeros", "border", "reflection"]),
    align=st.booleans(),
)
def test_grid_sample_any_rank_matches_onnx(
    dims: list[int], mode: str, padding_mode: str, align: bool
) -> None:
    if align and 1 in dims:
        dims = [d + 1 for d in dims]  # the reference divides by (size - 1) in reflection
    x = F(1, 2, *dims)
    grid = rng.uniform(-1.3, 1.3, (1, *[2] * len(dims), len(dims))).astype(np.float32)
    want = onnx_ref(
        "GridSample", {"x": x, "g": grid}, mode=mode, padding_mode=padding_mode, align_corners=int(align)
    )[0]
    got = ops.grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=align)
    assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_cubic_border_clamps_taps_like_torch(align_corners: bool) -> None:
    torch = pytest.importorskip("torch")
    x, grid = F(1, 2, 5, 6), rng.uniform(-1.4, 1.4, (1, 4, 5, 2)).astype(np.float32)
    want = torch.nn.functional.grid_sample(
        torch.from_numpy(x),
        torch.from_numpy(grid),
        mode="bicubic",
        padding_mode="border",
        align_corners=align_corners,
    ).numpy()
    got = ops.grid_sample(x, grid, mode="cubic", padding_mode="border", align_corners=align_corners)
    assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_grid_sample_identity_grid_returns_the_input() -> None:
    x = F(1, 3, 4, 5)
    theta = np.array([[[1, 0, 0], [0, 1, 0]]], np.float32)
    grid = ops.affine_grid(theta, [1, 3, 4, 5], align_corners=True)
    assert_close(ops.grid_sample(x, grid, align_corners=True), x, rtol=1e-5, atol=1e-5)


def test_grid_sample_low_precision() -> None:
    x, grid = F(1, 1, 4, 4), rng.uniform(-1, 1, (1, 2, 2, 2)).astype(np.float32)
    got = ops.grid_sample(x.astype(ml_dtypes.bfloat16), grid)
    assert got.dtype == ml_dtypes.bfloat16
    assert_close(got.astype(np.float32), ops.grid_sample(x, grid), rtol=3e-2, atol=3e-2)


# --------------------------------------------------------------------------- affine_grid, col2im, center_crop_pad


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("size", [[2, 1, 3, 4], [2, 1, 2, 3, 4]])
def test_affine_grid_matches_onnx(align_corners: int, size: list[int]) -> None:
    nd = len(size) - 2
    theta = F(2, nd, nd + 1)
    want = onnx_ref("AffineGrid", {"t": theta, "s": np.array(size, np.int64)}, align_corners=align_corners)[0]
    assert_close(ops.affine_grid(theta, size, align_corners=bool(align_corners)), want, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(
    img=st.lists(st.integers(3, 6), min_size=1, max_size=3),
    data=st.data(),
)
def test_col2im_matches_onnx(img: list[int], data: Any) -> None:
    nd = len(img)
    blk = [data.draw(st.integers(1, 2)) for _ in img]
    st_ = [data.draw(st.integers(1, 2)) for _ in img]
    dil = [data.draw(st.integers(1, 2)) for _ in img]
    pads = [data.draw(st.integers(0, 1)) for _ in range(2 * nd)]
    out = [(img[i] + pads[i] + pads[i + nd] - dil[i] * (blk[i] - 1) - 1) // st_[i] + 1 for i in range(nd)]
    x = F(1, 2 * int(np.prod(blk)), int(np.prod(out)))
    feeds = {"x": x, "i": np.array(img, np.int64), "b": np.array(blk, np.int64)}
    want = onnx_ref("Col2Im", feeds, strides=st_, dilations=dil, pads=pads)[0]
    assert_close(ops.col2im(x, img, blk, strides=st_, dilations=dil, pads=pads), want, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(shape=st.lists(st.integers(1, 7), min_size=3, max_size=3), use_axes=st.booleans())
def test_center_crop_pad_matches_onnx(shape: list[int], use_axes: bool) -> None:
    x = F(4, 5, 3)
    axes = [0, -1] if use_axes else None
    target = shape[:2] if use_axes else shape
    attrs = {"axes": axes} if use_axes else {}
    want = onnx_ref("CenterCropPad", {"x": x, "s": np.array(target, np.int64)}, **attrs)[0]
    assert_close(ops.center_crop_pad(x, target, axes=axes), want)


# --------------------------------------------------------------------------- deform_conv, tensor_scatter, causal conv


@pytest.mark.parametrize("with_mask", [False, True])
def test_deform_conv_matches_onnx(with_mask: bool) -> None:
    x, w = F(1, 4, 5, 6), F(6, 2, 2, 3)
    offset = F(1, 2 * 2 * 3 * 2, 6, 4) * 0.7
    b = F(6) if with_mask else None
    mask = rng.uniform(0, 1, (1, 12, 6, 4)).astype(np.float32) if with_mask else None
    attrs = {"group": 2, "offset_group": 2, "pads": [1, 0, 1, 0]}
    want = onnx_ref("DeformConv", {"x": x, "w": w, "o": offset, "b": b, "m": mask}, **attrs)[0]
    assert_close(ops.deform_conv(x, w, offset, b, mask, **attrs), want, rtol=1e-4, atol=1e-4)


def test_deform_conv_with_zero_offsets_is_a_convolution() -> None:
    x, w = F(1, 2, 5, 5), F(3, 2, 3, 3)
    got = ops.deform_conv(x, w, np.zeros((1, 18, 3, 3), np.float32))
    want = onnx_ref("Conv", {"x": x, "w": w})[0]
    assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("axis", [-2, 1])
def test_tensor_scatter_matches_onnx(mode: str, axis: int) -> None:
    cache, upd = F(2, 6, 3), F(2, 2, 3)
    idx = np.array([0, 4], np.int64) if mode == "linear" else np.array([5, 3], np.int64)
    want = onnx_ref("TensorScatter", {"c": cache, "u": upd, "i": idx}, mode=mode, axis=axis)[0]
    assert_close(ops.tensor_scatter(cache, upd, idx, mode=mode, axis=axis), want)


@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize("with_state", [False, True])
def test_causal_conv_with_state_matches_onnx(activation: str, with_state: bool) -> None:
    x, w = F(2, 3, 6), F(3, 1, 4)
    b, past = (F(3), F(2, 3, 3)) if with_state else (None, None)
    want = onnx_ref("CausalConvWithState", {"x": x, "w": w, "b": b, "p": past}, 2, activation=activation)
    got = ops.causal_conv_with_state(x, w, b, past, activation=activation)
    for g, wn in zip(got, want, strict=True):
        assert_close(g, wn, rtol=1e-5, atol=1e-5)


def test_causal_conv_state_carries_across_chunks() -> None:
    """Running two chunks with the carried state equals one run over the whole sequence."""
    x, w = F(1, 2, 8), F(2, 1, 3)
    whole, _ = ops.causal_conv_with_state(x, w)
    a, s = ops.causal_conv_with_state(x[:, :, :5], w)
    b, _ = ops.causal_conv_with_state(x[:, :, 5:], w, None, s)
    assert_close(np.concatenate([a, b], axis=2), whole, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- ONNX attention, rotary embedding


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_onnx_kv_cache_matches_onnx(mode: int, causal: int) -> None:
    q, k, v = F(2, 4, 3, 8), F(2, 2, 3, 8), F(2, 2, 3, 8)
    pk, pv = F(2, 2, 2, 8), F(2, 2, 2, 8)
    feeds = {"q": q, "k": k, "v": v, "m": None, "pk": pk, "pv": pv}
    want = onnx_ref("Attention", feeds, 4, is_causal=causal, qk_matmul_output_mode=mode, softcap=2.0)
    got = ops.attention_onnx(q, k, v, None, pk, pv, causal=bool(causal), qk_output_mode=mode, softcap=2.0)
    for g, wn in zip(got, want, strict=True):
        assert_close(g, wn, rtol=1e-5, atol=1e-5)


def test_attention_onnx_3d_nonpad_kv_seqlen_matches_onnx() -> None:
    q, k, v = F(2, 3, 16), F(2, 5, 8), F(2, 5, 8)
    lens = np.array([5, 2], np.int64)
    feeds = {"q": q, "k": k, "v": v, "m": None, "pk": None, "pv": None, "n": lens}
    want = onnx_ref("Attention", feeds, 1, q_num_heads=4, kv_num_heads=2, is_causal=1)[0]
    got = ops.attention_onnx(q, k, v, nonpad_kv_seqlen=lens, q_num_heads=4, kv_num_heads=2, causal=True)[0]
    assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_attention_onnx_errors() -> None:
    q = F(1, 2, 3, 4)
    with pytest.raises(OpError, match="qk_output_mode"):
        ops.attention_onnx(q, q, q, qk_output_mode=5)
    with pytest.raises(OpError, match="past_key"):
        ops.attention_onnx(q, q, q, past_key=q)
    with pytest.raises(OpError, match="3-D"):
        ops.attention_onnx(F(1, 3, 8), F(1, 3, 8), F(1, 3, 8), q_num_heads=3, kv_num_heads=3)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("rotary_dim", [0, 4])
def test_rotary_embedding_onnx_matches_onnx(interleaved: int, rank: int, rotary_dim: int) -> None:
    b, h, s, d = 2, 3, 5, 8
    x = F(b, h, s, d) if rank == 4 else F(b, s, h * d)
    half = (rotary_dim or d) // 2
    cos, sin = F(10, half), F(10, half)
    pos = rng.integers(0, 10, (b, s)).astype(np.int64)
    attrs: dict[str, Any] = {"interleaved": interleaved, "rotary_embedding_dim": rotary_dim}
    if rank == 3:
        attrs["num_heads"] = h
    want = onnx_ref("RotaryEmbedding", {"x": x, "c": cos, "s": sin, "p": pos}, **attrs)[0]
    got = ops.rotary_embedding_onnx(
        x,
        cos,
        sin,
        pos,
        interleaved=bool(interleaved),
        rotary_dim=rotary_dim,
        num_heads=attrs.get("num_heads", 0),
    )
    assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_rotary_embedding_onnx_agrees_with_rotary_embedding() -> None:
    """Without position_ids and with one cos/sin table for every batch row it is the (N, D/2) kernel."""
    x, cos, sin = F(2, 3, 4, 6), F(4, 3), F(4, 3)
    want = ops.rotary_embedding(x, cos, sin)
    got = ops.rotary_embedding_onnx(x, np.broadcast_to(cos, (2, 4, 3)), np.broadcast_to(sin, (2, 4, 3)))
    assert_close(got, want, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: ops.grid_sample(F(1, 1, 2, 2), F(1, 2, 2, 2), mode="area"), "mode"),
        (lambda: ops.grid_sample(F(1, 1, 2, 2), F(1, 2, 2, 2), padding_mode="wrap"), "padding_mode"),
        (lambda: ops.grid_sample(F(1, 1, 2, 2), F(1, 2, 2, 3)), "grid"),
        (lambda: ops.grid_sample(np.ones((1, 1, 2, 2), np.int32), F(1, 2, 2, 2)), "x"),
        (lambda: ops.affine_grid(F(1, 2, 3), [2, 1, 3, 3]), "theta"),
        (lambda: ops.col2im(F(1, 4, 3), [3, 3], [2, 2]), "L ="),
        (lambda: ops.center_crop_pad(F(2, 2), [1, 1, 1]), "shape"),
        (lambda: ops.tensor_scatter(F(1, 2, 3), F(1, 3, 3), [0]), "update"),
        (lambda: ops.tensor_scatter(F(1, 2, 3), F(1, 1, 3), [0], mode="ring"), "mode"),
        (lambda: ops.tensor_scatter(F(1, 2, 3), F(1, 1, 3), [2]), "write_indices"),
        (lambda: ops.causal_conv_with_state(F(1, 2, 3), F(2, 1, 2), activation="gelu"), "activation"),
        (lambda: ops.causal_conv_with_state(F(1, 2, 3), F(2, 1, 2), None, F(1, 2, 3)), "past_state"),
        (lambda: ops.deform_conv(F(1, 2, 4, 4), F(1, 2, 2, 2), F(1, 3, 3, 3)), "offset"),
        (lambda: ops.rotary_embedding_onnx(F(1, 5, 6), F(1, 5, 3), F(1, 5, 3)), "num_heads"),
    ],
)
def test_errors_name_the_argument(call: Any, match: str) -> None:
    with pytest.raises(OpError, match=match):
        call()
