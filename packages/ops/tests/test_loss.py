"""cross_entropy: ref against torch's definition re-implemented per position in float64, cpu against ref."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops import OpError
from opstrata.ops._dtypes import FLOAT_DTYPES
from opstrata.ops.testing import TOLERANCES, assert_close

SETTINGS = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
DEVICES = ("ref", "cpu")
SEEDS = st.integers(0, 2**32 - 1)


def f64(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def torch_cross_entropy(
    logits: np.ndarray, target: np.ndarray, reduction: str, ignore_index: int, smoothing: float
) -> np.ndarray:
    """torch.nn.functional.cross_entropy (no class weights), one position at a time in float64."""
    c = logits.shape[1]
    rows = np.moveaxis(f64(logits), 1, -1).reshape(-1, c)  # (positions, C)
    losses = []
    for row, t in zip(rows, target.reshape(-1).tolist(), strict=True):
        if t == ignore_index:
            losses.append(0.0)
            continue
        lse = math.log(math.fsum(math.exp(v) for v in row))
        nll = lse - row[t]
        smooth = lse - math.fsum(row) / c
        losses.append((1 - smoothing) * nll + smoothing * smooth if smoothing else nll)
    if reduction == "none":
        return np.array(losses).reshape(target.shape)
    total = math.fsum(losses)
    if reduction == "sum":
        return np.array(total)
    n_valid = int(np.sum(target != ignore_index))
    return np.array(total / n_valid if n_valid else math.nan)


@st.composite
def problems(draw: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """Logits (N, C, d...) in [-4, 4], targets with ~25% ignored, and the ignore_index used."""
    n, c = draw(st.integers(0, 4)), draw(st.integers(1, 5))
    extra = draw(st.lists(st.integers(0, 3), max_size=2))
    seed = draw(SEEDS)
    ignore_index = draw(st.sampled_from([-100, 0, 255]))
    tdtype = draw(st.sampled_from([np.int64, np.int32] + ([np.uint8] if ignore_index >= 0 else [])))
    rng = np.random.default_rng(seed)
    logits = rng.uniform(-4, 4, size=(n, c, *extra))
    target = rng.integers(0, c, size=(n, *extra))
    target[rng.random(target.shape) < 0.25] = ignore_index
    return logits, target.astype(tdtype), ignore_index


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@SETTINGS
@given(problem=problems(), smoothing=st.sampled_from([0.0, 0.1, 1.0]))
def test_cross_entropy(dtype: np.dtype, reduction: str, problem: Any, smoothing: float) -> None:
    logits, target, ignore_index = problem
    logits = logits.astype(dtype)
    kw = {"reduction": reduction, "ignore_index": ignore_index, "label_smoothing": smoothing}
    expected = torch_cross_entropy(logits, target, reduction, ignore_index, smoothing)
    ref = ops.cross_entropy(logits, target, device="ref", **kw)
    cpu = ops.cross_entropy(logits, target, device="cpu", **kw)
    rtol, atol = TOLERANCES[dtype]
    for actual, want in ((ref, expected), (cpu, ref)):
        assert actual.dtype == dtype and actual.shape == want.shape
        assert_close(f64(actual), f64(want), rtol=rtol, atol=atol, check_dtype=False)


@pytest.mark.parametrize("device", DEVICES)
def test_large_logits_do_not_overflow(device: str) -> None:
    x = np.array([[1e4, 1e4 - 2.0, -1e4], [3.0e4, 0.0, 3.0e4]], np.float32)
    loss = ops.cross_entropy(x, np.array([1, 2]), reduction="none", device=device)
    np.testing.assert_allclose(loss, [2.0 + math.log1p(math.exp(-2.0)), math.log(2.0)], rtol=1e-6)
    bf = ops.cross_entropy(x.astype(ml_dtypes.bfloat16), np.array([0, 0]), device=device)
    assert np.isfinite(f64(bf))


@pytest.mark.parametrize("device", DEVICES)
def test_masked_classes_and_ignore_index(device: str) -> None:
    x = np.array([[0.0, -np.inf, 0.0], [0.0, 0.0, 0.0], [5.0, 1.0, 2.0]])
    none = ops.cross_entropy(x, np.array([0, -100, 1]), reduction="none", device=device)
    np.testing.assert_allclose(none[:2], [math.log(2.0), 0.0])
    assert ops.cross_entropy(x[:1], np.array([1]), device=device) == np.inf  # target class masked out
    mean = ops.cross_entropy(x, np.array([0, -100, 1]), device=device)
    np.testing.assert_allclose(mean, none.sum() / 2)  # ignored position not counted
    all_ignored = np.array([-100, -100, -100])
    assert np.isnan(ops.cross_entropy(x, all_ignored, device=device))  # 0/0, as torch
    assert ops.cross_entropy(x, all_ignored, reduction="sum", device=device) == 0.0


@pytest.mark.parametrize("device", DEVICES)
def test_unbatched_logits(device: str) -> None:
    x = np.array([1.0, 2.0, 0.5])
    r = ops.cross_entropy(x, np.array(1), reduction="none", device=device)
    assert r.shape == ()
    np.testing.assert_allclose(r, torch_cross_entropy(x[None], np.array([1]), "none", -100, 0.0)[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("args", "kw", "pattern"),
    [
        (
            (np.ones((2, 3)), np.ones(2)),
            {},
            r"cross_entropy: argument 'target' expected an integer dtype, got float64",
        ),
        (
            (np.ones((2, 3)), np.ones(3, int)),
            {},
            r"cross_entropy: argument 'target' expected shape \(2,\).*got \(3,\)",
        ),
        ((np.ones((2, 3, 4)), np.ones((2, 3), int)), {}, r"argument 'target' expected shape \(2, 4\)"),
        (
            (np.ones((2, 3)), np.array([0, 3])),
            {},
            r"argument 'target' expected class indices in \[0, 3\).*got \[3\]",
        ),
        ((np.ones((2, 3)), np.array([0, 1])), {"reduction": "avg"}, r"argument 'reduction' expected one of"),
        (
            (np.ones((2, 3)), np.array([0, 1])),
            {"label_smoothing": 1.5},
            r"argument 'label_smoothing' expected",
        ),
        (
            (np.ones((2, 3), int), np.array([0, 1])),
            {},
            r"cross_entropy: argument 'logits' expected one of .*int64",
        ),
        ((np.ones(()), np.array(0)), {}, r"cross_entropy: argument 'logits' expected at least 1 dims"),
    ],
)
def test_errors_name_op_argument_expected_actual(device: str, args: Any, kw: Any, pattern: str) -> None:
    with pytest.raises(OpError, match=pattern):
        ops.cross_entropy(*args, device=device, **kw)
