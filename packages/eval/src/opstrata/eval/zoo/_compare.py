"""The zoo's error measure: max |actual - expected| / max |expected|, one number per output pair."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["TOLERANCE_ORT", "TOLERANCE_TORCH", "max_rel_error"]

#: Above this error against onnxruntime a zoo row is a wrong answer (float32 models, same ONNX file).
TOLERANCE_ORT = 1e-4
#: Against torch (the exporter sits in between), used to judge a row only when onnxruntime could not run.
TOLERANCE_TORCH = 1e-3


def max_rel_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """max|actual - expected| / max|expected|: the worst error scaled by the output's magnitude.

    Unlike an elementwise |a-b|/|b| it does not blow up where an output is near zero (logits cross
    zero), and unlike an absolute error it is comparable across models. A shape mismatch or a
    non-finite value where the reference is finite is infinite error; an all-zero reference falls
    back to the absolute error.
    """
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    same_nonfinite = ~np.isfinite(b) & ((a == b) | (np.isnan(a) & np.isnan(b)))
    diff = np.where(same_nonfinite, 0.0, np.abs(a - b))
    if not np.all(np.isfinite(diff)):
        return math.inf
    finite_b = np.abs(b[np.isfinite(b)])
    scale = float(finite_b.max()) if finite_b.size else 0.0
    worst = float(diff.max())
    return worst / scale if scale > 0.0 else worst
