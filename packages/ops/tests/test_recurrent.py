"""Recurrent kernels — rnn, gru, lstm — against onnx's reference evaluator (every direction, initial state,
peepholes, linear_before_reset, layout), sequence_lens against a per-row run, random shapes, and error paths."""

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
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
FN = {"RNN": ops.rnn, "GRU": ops.gru, "LSTM": ops.lstm}
rng = np.random.default_rng(0)


def onnx_ref(op: str, feeds: dict[str, Any], n_out: int, **attrs: Any) -> list[np.ndarray]:
    """Outputs of one ONNX node run by onnx's reference evaluator (None values are omitted inputs)."""
    names = [k if v is not None else "" for k, v in feeds.items()]
    node = onnx.helper.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)
    return ReferenceEvaluator(node).run(None, {k: v for k, v in feeds.items() if v is not None})


def weights(kind: str, dirs: int, i: int, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g = GATES[kind]
    w = rng.standard_normal((dirs, g * h, i)).astype(np.float32) * 0.5
    r = rng.standard_normal((dirs, g * h, h)).astype(np.float32) * 0.5
    b = rng.standard_normal((dirs, 2 * g * h)).astype(np.float32) * 0.1
    return w, r, b


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrent_matches_onnx(device: str, kind: str, direction: str) -> None:
    dirs = 2 if direction == "bidirectional" else 1
    s, b, i, h = 4, 3, 5, 6
    x = rng.standard_normal((s, b, i)).astype(np.float32)
    w, r, bias = weights(kind, dirs, i, h)
    h0 = rng.standard_normal((dirs, b, h)).astype(np.float32)
    n_out = 3 if kind == "LSTM" else 2
    feeds: dict[str, Any] = {"x": x, "w": w, "r": r, "b": bias, "sl": None, "h0": h0}
    args: list[Any] = [x, w, r, bias, None, h0]
    if kind == "LSTM":
        c0, p = (
            rng.standard_normal((dirs, b, h)).astype(np.float32),
            rng.standard_normal((dirs, 3 * h)).astype(np.float32),
        )
        feeds.update(c0=c0, p=p)
        args += [c0, p]
    want = onnx_ref(kind, feeds, n_out, hidden_size=h, direction=direction)
    got = FN[kind](*args, direction=direction, device=device)
    for g, wnt in zip(got, want, strict=True):
        assert_close(g, wnt, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset_matches_onnx(lbr: int) -> None:
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    w, r, b = weights("GRU", 1, 4, 5)
    want = onnx_ref("GRU", {"x": x, "w": w, "r": r, "b": b}, 2, hidden_size=5, linear_before_reset=lbr)
    got = ops.gru(x, w, r, b, linear_before_reset=bool(lbr))
    for g, wnt in zip(got, want, strict=True):
        assert_close(g, wnt, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_layout_1_is_the_transposed_layout_0(kind: str) -> None:
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)  # (S, B, I)
    w, r, b = weights(kind, 2, 4, 5)
    y0 = FN[kind](x, w, r, b, direction="bidirectional")
    y1 = FN[kind](x.transpose(1, 0, 2), w, r, b, direction="bidirectional", layout=1)
    assert_close(y1[0], y0[0].transpose(2, 0, 1, 3))
    for a, c in zip(y1[1:], y0[1:], strict=True):
        assert_close(a, c.transpose(1, 0, 2))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["RNN", "GRU", "LSTM"]),
    direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
    lens=st.lists(st.integers(1, 5), min_size=1, max_size=3),
)
def test_sequence_lens_equals_a_run_on_each_rows_prefix(kind: str, direction: str, lens: list[int]) -> None:
    """Row b with length L gives the outputs of an unpadded run on its first L steps; later Y rows are 0."""
    s, b, i, h = 5, len(lens), 3, 4
    dirs = 2 if direction == "bidirectional" else 1
    x = rng.standard_normal((s, b, i)).astype(np.float32)
    w, r, bias = weights(kind, dirs, i, h)
    got = FN[kind](x, w, r, bias, np.array(lens, np.int32), direction=direction)
    for row, n in enumerate(lens):
        alone = FN[kind](x[:n, row : row + 1], w, r, bias, direction=direction)
        assert_close(got[0][:n, :, row : row + 1], alone[0], rtol=1e-5, atol=1e-6)
        assert not np.any(got[0][n:, :, row])
        for a, c in zip(got[1:], alone[1:], strict=True):
            assert_close(a[:, row : row + 1], c, rtol=1e-5, atol=1e-6)


def test_activation_alpha_beta_consumed_in_order() -> None:
    """Only activations that take alpha/beta consume them: LeakyRelu takes alpha 0.2, Affine (0.5, 1.0)."""
    x = rng.standard_normal((2, 1, 2)).astype(np.float32)
    w, r, _ = weights("RNN", 2, 2, 2)
    got = ops.rnn(
        x,
        w,
        r,
        direction="bidirectional",
        activations=["LeakyRelu", "Affine"],
        alphas=[0.2, 0.5],
        betas=[1.0],
    )
    fwd = ops.rnn(x, w[:1], r[:1], activations=["LeakyRelu"], alphas=[0.2])
    rev = ops.rnn(x, w[1:], r[1:], direction="reverse", activations=["Affine"], alphas=[0.5], betas=[1.0])
    assert_close(got[0][:, 0], fwd[0][:, 0])
    assert_close(got[0][:, 1], rev[0][:, 0])


def test_low_precision_computes_in_float32() -> None:
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    w, r, b = weights("LSTM", 1, 4, 3)
    want = ops.lstm(x, w, r, b)
    got = ops.lstm(x.astype(ml_dtypes.bfloat16), w, r, b)
    assert got[0].dtype == ml_dtypes.bfloat16
    assert_close(got[0].astype(np.float32), want[0], rtol=3e-2, atol=3e-2)


def test_clip_bounds_the_gate_inputs() -> None:
    x = np.full((1, 1, 1), 100.0, np.float32)
    y, _ = ops.rnn(
        x, np.ones((1, 1, 1), np.float32), np.zeros((1, 1, 1), np.float32), activations=["Relu"], clip=2.0
    )
    assert float(y.ravel()[0]) == 2.0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda x, w, r: ops.rnn(x, w, r, direction="sideways"), "direction"),
        (lambda x, w, r: ops.rnn(x, w, r, activations=["Nope"]), "activations"),
        (lambda x, w, r: ops.rnn(x, w, r, activations=["Tanh", "Tanh"]), "activations"),
        (lambda x, w, r: ops.rnn(x, w[:, :, :1], r), "w"),
        (lambda x, w, r: ops.rnn(x, w, r, clip=-1.0), "clip"),
        (lambda x, w, r: ops.rnn(x, w, r, direction="bidirectional"), "direction"),
        (lambda x, w, r: ops.rnn(x.astype(np.int32), w, r), "dtype|x"),
    ],
)
def test_errors_name_the_argument(call: Any, match: str) -> None:
    x = np.ones((2, 1, 3), np.float32)
    w, r = np.ones((1, 2, 3), np.float32), np.ones((1, 2, 2), np.float32)
    with pytest.raises(OpError, match=match):
        call(x, w, r)
