"""Signal kernels (kernels/signal.py) against numpy's FFT and window formulas and onnx's reference
evaluator on ref and cpu; hypothesis round trips; error paths name the op, the argument and the fix."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops import OpError

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEVICES = ("ref", "cpu")
TOL = {np.float32: (1e-4, 1e-4), np.float64: (1e-10, 1e-10)}
rng = np.random.default_rng(0)


def packed(c: np.ndarray, dtype: Any) -> np.ndarray:
    return np.stack([c.real, c.imag], -1).astype(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dft_matches_numpy(device: str, dtype: Any) -> None:
    rtol, atol = TOL[dtype]
    x = rng.standard_normal((2, 8, 3, 1)).astype(dtype)
    got = ops.dft(x, axis=1, device=device)
    np.testing.assert_allclose(got, packed(np.fft.fft(x[..., 0], axis=1), dtype), rtol=rtol, atol=atol)
    got = ops.dft(x, np.int64(10), axis=1, onesided=True, device=device)
    np.testing.assert_allclose(got, packed(np.fft.rfft(x[..., 0], n=10, axis=1), dtype), rtol=rtol, atol=atol)
    z = rng.standard_normal((4, 6, 2)).astype(dtype)
    c = z[..., 0] + 1j * z[..., 1]
    got = ops.dft(z, np.int64(5), axis=-2, inverse=True, device=device)
    np.testing.assert_allclose(got, packed(np.fft.ifft(c, n=5, axis=1), dtype), rtol=rtol, atol=atol)


@given(st.integers(1, 12), st.integers(1, 3))
@SETTINGS
def test_dft_round_trips(n: int, batch: int) -> None:
    x = np.random.default_rng(n).standard_normal((batch, n, 1))
    back = ops.dft(ops.dft(x, axis=1), axis=1, inverse=True)
    np.testing.assert_allclose(back[..., 0], x[..., 0], atol=1e-10)
    np.testing.assert_allclose(back[..., 1], 0, atol=1e-10)
    half = ops.dft(x, axis=1, onesided=True)
    np.testing.assert_allclose(ops.dft(half, np.int64(n), axis=1, inverse=True, onesided=True), x, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_stft_matches_framed_fft(device: str) -> None:
    x = rng.standard_normal((2, 40, 1)).astype(np.float32)
    w = ops.hann_window(np.int64(16))
    got = ops.stft(x, np.int64(8), w, device=device)
    raw = np.stack([x[:, i * 8 : i * 8 + 16, 0] for i in range(4)], 1)
    want = packed(np.fft.rfft(raw * w, axis=-1), np.float32)
    assert got.shape == (2, 4, 9, 2)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    full = ops.stft(x, np.int64(8), None, np.int64(16), onesided=False, device=device)
    np.testing.assert_allclose(full, packed(np.fft.fft(raw, axis=-1), np.float32), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("size", [1, 2, 7, 10])
def test_windows_match_numpy(device: str, size: int) -> None:
    n = np.int64(size)
    if size > 1:
        np.testing.assert_allclose(
            ops.hann_window(n, periodic=False, device=device), np.hanning(size), atol=1e-6
        )
        np.testing.assert_allclose(
            ops.blackman_window(n, periodic=False, device=device), np.blackman(size), atol=1e-6
        )
        ham = 25 / 46 - 21 / 46 * np.cos(2 * np.pi * np.arange(size) / (size - 1))
        np.testing.assert_allclose(ops.hamming_window(n, periodic=False, device=device), ham, atol=1e-6)
    periodic = ops.hann_window(n, device=device)
    np.testing.assert_allclose(periodic, np.hanning(size + 1)[:-1], atol=1e-6)
    assert periodic.dtype == np.float32
    assert ops.hann_window(n, dtype=np.float64, device=device).dtype == np.float64


def test_mel_weight_matrix_matches_onnx() -> None:
    onnx = pytest.importorskip("onnx")
    from onnx.reference import ReferenceEvaluator

    args = [np.int64(8), np.int64(16), np.int64(8192), np.float32(0), np.float32(4096)]
    names = [f"i{k}" for k in range(5)]
    node = onnx.helper.make_node("MelWeightMatrix", names, ["y"])
    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            [node], "g",
            [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), []) for n, a in
             zip(names, args, strict=True)],
            [onnx.helper.make_tensor_value_info("y", 0, None)],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 17)],
    )  # fmt: skip
    (want,) = ReferenceEvaluator(model).run(None, dict(zip(names, args, strict=True)))
    for device in DEVICES:
        got = ops.mel_weight_matrix(*args, device=device)
        assert got.shape == (9, 8) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_errors_name_op_argument_and_fix() -> None:
    with pytest.raises(OpError, match=r"dft: argument 'x' expected a tensor \(\.\.\., n, 1\).*Fix"):
        ops.dft(np.ones((4, 3), np.float32))
    with pytest.raises(OpError, match=r"dft: argument 'axis' expected a signal axis"):
        ops.dft(np.ones((4, 1), np.float32), axis=-1)
    with pytest.raises(OpError, match=r"dft: argument 'x' expected one of \(float64.*Fix: cast"):
        ops.dft(np.ones((4, 1), np.int32), axis=0)
    with pytest.raises(OpError, match=r"dft: argument 'onesided' expected a real input"):
        ops.dft(np.ones((4, 2), np.float32), axis=0, onesided=True)
    with pytest.raises(OpError, match=r"stft: argument 'window' expected a 1-D window of frame_length=8"):
        ops.stft(np.ones((1, 20, 1), np.float32), np.int64(2), np.ones(4, np.float32), np.int64(8))
    with pytest.raises(OpError, match=r"stft: argument 'frame_length' expected at most the signal length"):
        ops.stft(np.ones((1, 4, 1), np.float32), np.int64(2), None, np.int64(8))
    with pytest.raises(OpError, match=r"hann_window: argument 'size' expected an int >= 0"):
        ops.hann_window(np.float32(3))
    with pytest.raises(OpError, match=r"mel_weight_matrix: argument 'upper_edge_hertz'"):
        ops.mel_weight_matrix(np.int64(8), np.int64(16), np.int64(8000), 0.0, 5000.0)
