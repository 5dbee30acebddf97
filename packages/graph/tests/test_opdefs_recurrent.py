"""RNN, GRU and LSTM through the graph (ONNX import, shape rules, executor, plan, export) against onnxruntime:
every direction, sequence_lens, initial state, peepholes, clip, linear_before_reset, layout=1 and all outputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import functools  # noqa: E402

import _onnx_check  # noqa: E402
from _onnx_check import F, const, feed  # noqa: E402

from opstrata.graph import from_onnx, run_graph  # noqa: E402
from opstrata.graph.testing import ort_run  # noqa: E402

node_model = functools.partial(_onnx_check.node_model, infer_types=False)
check_against_ort = functools.partial(_onnx_check.check_against_ort, opset=22, infer_types=False)


def _weights(kind: str, dirs: int, i: int, h: int, bias: bool = True) -> list[Any]:
    g = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    out = [const(F(dirs, g * h, i) * 0.5), const(F(dirs, g * h, h) * 0.5)]
    return [*out, const(F(dirs, 2 * g * h) * 0.1) if bias else None]


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrent_directions_and_all_outputs(kind: str, direction: str) -> None:
    dirs = 2 if direction == "bidirectional" else 1
    s, b, i, h = 4, 3, 5, 6
    n_out = 3 if kind == "LSTM" else 2
    check_against_ort(
        kind, [feed(F(s, b, i)), *_weights(kind, dirs, i, h)], {"hidden_size": h, "direction": direction},
        n_out=n_out,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_recurrent_sequence_lens_and_initial_state(kind: str) -> None:
    s, b, i, h, dirs = 5, 3, 4, 3, 2
    extra: list[Any] = [const(np.array([5, 2, 3], np.int32)), feed(F(dirs, b, h))]
    if kind == "LSTM":
        extra += [feed(F(dirs, b, h)), const(F(dirs, 3 * h) * 0.3)]  # initial_c, peepholes
    check_against_ort(
        kind, [feed(F(s, b, i)), *_weights(kind, dirs, i, h), *extra],
        {"hidden_size": h, "direction": "bidirectional"}, n_out=3 if kind == "LSTM" else 2,
    )  # fmt: skip


def test_gru_linear_before_reset_and_clip() -> None:
    check_against_ort(
        "GRU", [feed(F(3, 2, 4) * 3), *_weights("GRU", 1, 4, 5)],
        {"hidden_size": 5, "linear_before_reset": 1, "clip": 0.7}, n_out=2,
    )  # fmt: skip


def test_rnn_activation_with_alpha_beta() -> None:
    check_against_ort(
        "RNN", [feed(F(3, 2, 4)), *_weights("RNN", 2, 4, 3)],
        {"hidden_size": 3, "direction": "bidirectional", "activations": ["LeakyRelu", "HardSigmoid"],
         "activation_alpha": [0.2, 0.3], "activation_beta": [0.4]}, n_out=2,
    )  # fmt: skip


def test_lstm_layout_1_matches_layout_0_on_onnxruntime() -> None:
    """onnxruntime refuses layout=1, so compare with its layout-0 run on transposed inputs."""
    b, s, i, h = 2, 3, 4, 5
    x, h0, c0 = F(b, s, i), F(b, 1, h), F(b, 1, h)
    w = _weights("LSTM", 1, i, h)
    m1, f1 = node_model(
        "LSTM", [feed(x), *w, None, feed(h0), feed(c0)], {"hidden_size": h, "layout": 1}, 3, 22
    )
    got = run_graph(from_onnx(m1), f1)
    tr = (1, 0, 2)
    m0, f0 = node_model(
        "LSTM", [feed(x.transpose(tr)), *w, None, feed(h0.transpose(tr)), feed(c0.transpose(tr))],
        {"hidden_size": h, "input_forget": 0}, 3, 22,
    )  # fmt: skip
    want = ort_run(m0, f0)
    np.testing.assert_allclose(got["out0"], want["out0"].transpose(2, 0, 1, 3), rtol=1e-4, atol=1e-5)
    for k in ("out1", "out2"):
        np.testing.assert_allclose(got[k], want[k].transpose(tr), rtol=1e-4, atol=1e-5)


def test_lstm_input_forget() -> None:
    check_against_ort(
        "LSTM", [feed(F(3, 2, 4)), *_weights("LSTM", 1, 4, 5)], {"hidden_size": 5, "input_forget": 1}, n_out=3
    )


def test_recurrent_bad_activation_names_the_op() -> None:
    model, feeds = node_model(
        "RNN",
        [feed(F(2, 1, 2)), *_weights("RNN", 1, 2, 2)],
        {"hidden_size": 2, "activations": ["Nope"]},
        2,
        22,
    )
    with pytest.raises(ValueError, match=r"rnn.*activations"):
        run_graph(from_onnx(model), feeds)
