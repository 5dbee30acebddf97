"""Signal-processing kernels — dft, stft, hann_window, hamming_window, blackman_window,
mel_weight_matrix — registered on ``ref`` and ``cpu`` (one numpy implementation each).

Semantics follow the ONNX operator specification (DFT, STFT, HannWindow, HammingWindow,
BlackmanWindow, MelWeightMatrix). Complex tensors use ONNX's layout: a trailing dim of 2 holds
(real, imaginary); a trailing dim of 1 is a real signal. Transforms run numpy's FFT in complex64
(complex128 for float64 inputs) and round once to the input dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtypes import FLOAT_DTYPES, float32, float64
from .._errors import OpError, check_dtype
from .._registry import call, register

__all__ = [
    "blackman_window",
    "dft",
    "hamming_window",
    "hann_window",
    "mel_weight_matrix",
    "stft",
]


def _check_signal(op: str, x: Any) -> np.ndarray:
    x = np.asarray(x)
    check_dtype(op, "x", x, FLOAT_DTYPES)
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise OpError(
            op, "x", "a tensor (..., n, 1) (real) or (..., n, 2) (complex)", f"shape {x.shape}",
            fix="append a trailing dim of 1 for a real signal",
        )  # fmt: skip
    return x


def _complex(x: np.ndarray) -> np.ndarray:
    """ONNX (..., 1|2) layout -> complex array without the trailing dim: complex128 for float64,
    complex64 otherwise (numpy's FFT then runs in single precision, as ONNX's reference does)."""
    ct = np.complex128 if x.dtype == float64 else np.complex64
    v = x.astype(float64 if x.dtype == float64 else float32)
    return (v[..., 0] + 1j * v[..., 1]).astype(ct) if x.shape[-1] == 2 else v[..., 0].astype(ct)


def _pack(c: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.stack([c.real, c.imag], axis=-1).astype(dtype)


def _int(op: str, name: str, v: Any, minimum: int) -> int:
    a = np.asarray(v)
    if a.size != 1 or a.dtype.kind not in "iu" or int(a.ravel()[0]) < minimum:
        raise OpError(op, name, f"an int >= {minimum}", repr(v))
    return int(a.ravel()[0])


# --------------------------------------------------------------------------- DFT


def _dft(
    x: Any, dft_length: Any = None, *, axis: int = -2, inverse: bool = False, onesided: bool = False
) -> np.ndarray:
    x = np.asarray(x)
    ax = axis % x.ndim
    n_in = x.shape[ax]
    if dft_length is None:
        n = 2 * (n_in - 1) if inverse and onesided else n_in
    else:
        n = _int("dft", "dft_length", dft_length, 1)
    c = _complex(x)
    if inverse and onesided:
        return np.fft.irfft(c, n=n, axis=ax)[..., None].astype(x.dtype)
    if inverse:
        return _pack(np.fft.ifft(c, n=n, axis=ax), x.dtype)
    y = np.fft.fft(c, n=n, axis=ax)
    if onesided:
        y = y.take(np.arange(n // 2 + 1), axis=ax)
    return _pack(y, x.dtype)


register("dft", device="ref", dtypes=FLOAT_DTYPES)(_dft)
register("dft", device="cpu", dtypes=FLOAT_DTYPES)(_dft)


def dft(
    x: Any,
    dft_length: Any = None,
    *,
    axis: int = -2,
    inverse: bool = False,
    onesided: bool = False,
    device: str | None = None,
) -> np.ndarray:
    """Discrete Fourier transform along ``axis`` (ONNX DFT) of x (..., 1|2); zero-pads or truncates to
    ``dft_length``; ``onesided`` keeps the n//2+1 non-redundant bins (with ``inverse``: a real output).

    >>> dft(np.array([[1.0], [0.0]], np.float32), axis=0).tolist()
    [[1.0, 0.0], [1.0, 0.0]]
    """
    x = _check_signal("dft", x)
    if isinstance(axis, bool) or not -x.ndim <= int(axis) < x.ndim or int(axis) % x.ndim == x.ndim - 1:
        raise OpError(
            "dft", "axis", f"a signal axis in [{-x.ndim}, {x.ndim - 2}] (not the trailing real/imag dim)",
            repr(axis),
        )  # fmt: skip
    if onesided and not inverse and x.shape[-1] != 1:
        raise OpError("dft", "onesided", "a real input (trailing dim 1)", "a complex input")
    return call(
        "dft", x, dft_length, axis=int(axis), inverse=bool(inverse), onesided=bool(onesided), device=device
    )


# --------------------------------------------------------------------------- STFT


def _stft(
    x: Any, frame_step: Any, window: Any = None, frame_length: Any = None, *, onesided: bool = True
) -> np.ndarray:
    x = np.asarray(x)
    step = _int("stft", "frame_step", frame_step, 1)
    w = None if window is None else np.asarray(window)
    if frame_length is not None:
        length = _int("stft", "frame_length", frame_length, 1)
    elif w is not None:
        length = w.shape[0]
    else:
        raise OpError("stft", "frame_length", "frame_length or a window", "neither")
    if w is not None and (w.ndim != 1 or w.shape[0] != length):
        raise OpError("stft", "window", f"a 1-D window of frame_length={length} values", f"shape {w.shape}")
    sig = x.shape[1]
    if length > sig:
        raise OpError("stft", "frame_length", f"at most the signal length {sig}", str(length))
    frames = 1 + (sig - length) // step
    c = _complex(x)  # (batch, sig)
    idx = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
    f = c[:, idx]  # (batch, frames, length)
    if w is not None:
        f = f * w.astype(float64)
    y = np.fft.fft(f, axis=-1)
    if onesided:
        y = y[..., : length // 2 + 1]
    return _pack(y, x.dtype)


register("stft", device="ref", dtypes=FLOAT_DTYPES)(_stft)
register("stft", device="cpu", dtypes=FLOAT_DTYPES)(_stft)


def stft(
    x: Any,
    frame_step: Any,
    window: Any = None,
    frame_length: Any = None,
    *,
    onesided: bool = True,
    device: str | None = None,
) -> np.ndarray:
    """Short-time Fourier transform (ONNX STFT) of x (batch, n, 1|2): frames every ``frame_step``
    samples, weighted by ``window``; returns (batch, frames, bins, 2)."""
    x = _check_signal("stft", x)
    if x.ndim != 3:
        raise OpError("stft", "x", "a tensor (batch, signal_length, 1|2)", f"shape {x.shape}")
    if onesided and x.shape[-1] != 1:
        raise OpError("stft", "onesided", "a real signal (trailing dim 1)", "a complex signal")
    return call("stft", x, frame_step, window, frame_length, onesided=bool(onesided), device=device)


# --------------------------------------------------------------------------- windows


def _window(name: str, coeffs: tuple[float, ...]) -> Any:
    """Register the cosine-sum window ``sum_k (-1)^k a_k cos(2 pi k n / N)`` as op ``name``."""

    def kernel(size: int, *, periodic: bool = True, dtype: Any = float32) -> np.ndarray:
        n = np.arange(size, dtype=float64)
        denom = max(size if periodic else size - 1, 1)
        y = np.zeros(size, float64)
        for k, a in enumerate(coeffs):
            y += (-1) ** k * a * np.cos(2 * np.pi * k * n / denom)
        return y.astype(dtype)

    register(name, device="ref")(kernel)
    register(name, device="cpu")(kernel)

    def public(
        size: Any, *, periodic: bool = True, dtype: Any = float32, device: str | None = None
    ) -> np.ndarray:
        return call(
            name, _int(name, "size", size, 0), periodic=bool(periodic), dtype=np.dtype(dtype), device=device
        )

    public.__name__ = public.__qualname__ = name
    return public


hann_window = _window("hann_window", (0.5, 0.5))
hann_window.__doc__ = (
    "Hann window of ``size`` samples (ONNX HannWindow); ``periodic`` divides by N, else N-1."
)
hamming_window = _window("hamming_window", (25.0 / 46.0, 21.0 / 46.0))
hamming_window.__doc__ = (
    "Hamming window (alpha = 25/46, ONNX HammingWindow); ``periodic`` divides by N, else N-1."
)
blackman_window = _window("blackman_window", (0.42, 0.5, 0.08))
blackman_window.__doc__ = "Blackman window (ONNX BlackmanWindow); ``periodic`` divides by N, else N-1."


# --------------------------------------------------------------------------- MelWeightMatrix


def _mel_weight_matrix(
    num_mel_bins: int,
    dft_length: int,
    sample_rate: int,
    lower_hz: float,
    upper_hz: float,
    *,
    dtype: Any = float32,
) -> np.ndarray:
    bins = dft_length // 2 + 1
    pts = np.arange(num_mel_bins + 2)
    lo = 2595 * np.log1p(lower_hz / 700) / np.log(10)
    hi = 2595 * np.log1p(upper_hz / 700) / np.log(10)
    hz = 700 * np.expm1((pts * ((hi - lo) / pts.shape[0]) + lo) / 2595 * np.log(10))
    f = (((dft_length + 1) * hz) // sample_rate).astype(np.int64)
    out = np.zeros((bins, num_mel_bins), float64)
    for i in range(num_mel_bins):
        left, center, right = int(f[i]), int(f[i + 1]), int(f[i + 2])
        if center == left:
            out[center, i] = 1
        else:
            j = np.arange(left, center + 1)
            out[j, i] = (j - left) / (center - left)
        if right > center:
            j = np.arange(center, right)
            out[j, i] = (right - j) / (right - center)
    return out.astype(dtype)


register("mel_weight_matrix", device="ref")(_mel_weight_matrix)
register("mel_weight_matrix", device="cpu")(_mel_weight_matrix)


def mel_weight_matrix(
    num_mel_bins: Any,
    dft_length: Any,
    sample_rate: Any,
    lower_edge_hertz: Any,
    upper_edge_hertz: Any,
    *,
    dtype: Any = float32,
    device: str | None = None,
) -> np.ndarray:
    """Triangular mel filter bank (ONNX MelWeightMatrix) of shape (dft_length // 2 + 1, num_mel_bins),
    band edges spaced evenly on the mel scale as ONNX's reference implementation does."""
    m = _int("mel_weight_matrix", "num_mel_bins", num_mel_bins, 1)
    n = _int("mel_weight_matrix", "dft_length", dft_length, 1)
    sr = _int("mel_weight_matrix", "sample_rate", sample_rate, 1)
    lo, hi = float(np.asarray(lower_edge_hertz).ravel()[0]), float(np.asarray(upper_edge_hertz).ravel()[0])
    if not 0 <= lo < hi <= sr / 2:
        raise OpError(
            "mel_weight_matrix", "upper_edge_hertz", f"0 <= lower_edge_hertz < upper <= sample_rate/2 = {sr / 2}",
            f"lower={lo}, upper={hi}",
        )  # fmt: skip
    return call("mel_weight_matrix", m, n, sr, lo, hi, dtype=np.dtype(dtype), device=device)
