"""nll_loss and softmax_cross_entropy_loss (ONNX NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss) on
``ref`` and ``cpu`` against onnx's reference evaluator, with shape/weight/ignore_index properties and the
error paths."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops import OpError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper as oh, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

DEVICES = ("ref", "cpu")
TOL = {np.float16: (2e-3, 2e-3), np.float32: (1e-5, 1e-6), np.float64: (1e-12, 1e-12)}
_ONNX_TYPE = {np.float16: TensorProto.FLOAT16, np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def reference(op: str, x: np.ndarray, t: np.ndarray, w: np.ndarray | None, **attrs: Any) -> list[np.ndarray]:
    """The ONNX reference evaluator's outputs of one ``op`` node."""
    names = ["x", "t"] + (["w"] if w is not None else [])
    outs = ["loss", "log_prob"] if op == "SoftmaxCrossEntropyLoss" else ["loss"]
    ty = _ONNX_TYPE[x.dtype.type]
    g = oh.make_graph(
        [oh.make_node(op, names, outs, **attrs)],
        "g",
        [oh.make_tensor_value_info(n, TensorProto.INT64 if n == "t" else ty, None) for n in names],
        [oh.make_tensor_value_info(o, ty, None) for o in outs],
    )
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 13)])
    feeds = {"x": x, "t": t.astype(np.int64)} | ({"w": w} if w is not None else {})
    return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]


def _data(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any, ignore: int | None):
    x = rng.standard_normal(shape).astype(dtype)
    t = rng.integers(0, shape[1], (shape[0], *shape[2:]))
    if ignore is not None:
        t[rng.random(t.shape) < 0.3] = ignore
        t.flat[0] = 0  # at least one counted position, so "mean" is finite
    w = rng.uniform(0.5, 2.0, shape[1]).astype(dtype)
    return x, t, w


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, -3, 2])  # not -1: the evaluator then averages over ignored ones too
def test_nll_loss_matches_the_onnx_reference(
    device: str, dtype: Any, reduction: str, weighted: bool, ignore: int | None
) -> None:
    x, t, w = _data(np.random.default_rng(0), (3, 4, 2, 2), dtype, ignore)
    w = w if weighted else None
    attrs = {"reduction": reduction} | ({"ignore_index": ignore} if ignore is not None else {})
    want = reference("NegativeLogLikelihoodLoss", x, t, w, **attrs)[0]
    got = ops.nll_loss(x, t, w, reduction=reduction, ignore_index=ignore, device=device)
    rtol, atol = TOL[dtype]
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol * 4, atol=atol * 4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_softmax_cross_entropy_loss_matches_the_onnx_reference(
    device: str, dtype: Any, reduction: str
) -> None:
    x, t, w = _data(np.random.default_rng(1), (2, 5, 3), dtype, 1)
    want_loss, want_logp = reference("SoftmaxCrossEntropyLoss", x, t, w, reduction=reduction, ignore_index=1)
    loss, logp = ops.softmax_cross_entropy_loss(x, t, w, reduction=reduction, ignore_index=1, device=device)
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(loss, want_loss, rtol=rtol, atol=atol)
    np.testing.assert_allclose(logp, want_logp, rtol=rtol, atol=atol)


@settings(max_examples=30, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=2, max_size=4),
    reduction=st.sampled_from(["none", "sum", "mean"]),
    seed=st.integers(0, 2**16),
)
def test_ref_and_cpu_agree_with_the_reference_on_any_shape(
    shape: list[int], reduction: str, seed: int
) -> None:
    x, t, w = _data(np.random.default_rng(seed), tuple(shape), np.float64, -5)
    want = reference("NegativeLogLikelihoodLoss", x, t, w, reduction=reduction, ignore_index=-5)[0]
    for device in DEVICES:
        got = ops.nll_loss(x, t, w, reduction=reduction, ignore_index=-5, device=device)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=2, max_size=4), seed=st.integers(0, 2**16))
def test_unweighted_mean_is_the_mean_of_none(shape: list[int], seed: int) -> None:
    x, t, _ = _data(np.random.default_rng(seed), tuple(shape), np.float64, None)
    per = ops.nll_loss(x, t, reduction="none")
    np.testing.assert_allclose(ops.nll_loss(x, t), per.mean(), rtol=1e-12)


def test_mean_counts_only_positions_not_ignored() -> None:
    """As the spec and onnxruntime (ignore_index=-1 too): mean = sum / number of non-ignored positions."""
    x, t = np.log(np.full((4, 3), 0.5, np.float32)), np.array([0, -1, -1, 1])
    for device in DEVICES:
        np.testing.assert_allclose(ops.nll_loss(x, t, ignore_index=-1, device=device), np.log(2), rtol=1e-6)


def test_all_ignored_mean_is_nan_and_sum_is_zero() -> None:
    x, t = np.zeros((2, 3), np.float32), np.full(2, 7)
    for device in DEVICES:
        assert np.isnan(ops.nll_loss(x, t, reduction="mean", ignore_index=7, device=device))
        assert ops.nll_loss(x, t, reduction="sum", ignore_index=7, device=device) == 0


def test_out_of_range_target_names_the_argument_and_the_range() -> None:
    with pytest.raises(OpError, match=r"nll_loss.*target.*\[0, 3\) or ignore_index=None"):
        ops.nll_loss(np.zeros((2, 3), np.float32), np.array([0, 3]))


def test_integer_scores_are_refused() -> None:
    with pytest.raises(OpError, match=r"nll_loss.*log_prob"):
        ops.nll_loss(np.zeros((2, 3), np.int32), np.array([0, 1]))
    with pytest.raises(OpError, match=r"softmax_cross_entropy_loss.*scores"):
        ops.softmax_cross_entropy_loss(np.zeros((2, 3), np.int64), np.array([0, 1]))


def test_bad_target_dtype_shape_weight_and_reduction_name_the_fix() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(OpError, match=r"nll_loss.*target"):
        ops.nll_loss(x, np.array([0.0, 1.0]))
    with pytest.raises(OpError, match=r"nll_loss.*target.*shape \(2,\)"):
        ops.nll_loss(x, np.array([[0, 1]]))
    with pytest.raises(OpError, match=r"nll_loss.*weight.*float32 of shape \(3,\)"):
        ops.nll_loss(x, np.array([0, 1]), np.ones(2, np.float32))
    with pytest.raises(OpError, match=r"nll_loss.*reduction"):
        ops.nll_loss(x, np.array([0, 1]), reduction="avg")
    with pytest.raises(OpError, match=r"log_prob"):
        ops.nll_loss(np.zeros(3, np.float32), np.array(0))


def test_weights_from_numpy_helper_roundtrip() -> None:
    """Weights stored as an ONNX tensor come back as the same (C,) float array the kernel takes."""
    w = numpy_helper.to_array(numpy_helper.from_array(np.array([1.0, 0.0, 2.0], np.float32)))
    x = np.log(np.full((1, 3), 1 / 3, np.float32))
    np.testing.assert_allclose(ops.nll_loss(x, np.array([2]), w, reduction="sum"), 2 * np.log(3), rtol=1e-6)
