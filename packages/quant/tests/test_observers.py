"""Observers against hand computations: minmax, moving average, percentile, entropy, MSE; granularity;
accumulation over batches; error paths."""

from __future__ import annotations

import numpy as np
import pytest

from opstrata.quant import (
    OBSERVERS,
    EntropyObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MSEObserver,
    Observer,
    PercentileObserver,
    QuantError,
    dequantize,
    make_observer,
    quantize_array,
)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_minmax_accumulates_over_batches() -> None:
    o = MinMaxObserver("uint8", symmetric=False)
    o.observe(np.array([-1.0, 2.0], np.float32))
    o.observe(np.array([0.5, 3.0], np.float32))
    p = o.compute()
    assert np.isclose(float(p.scale), 4.0 / 255) and int(p.zero_point) == 64 and o.batches == 2


def test_minmax_per_channel_by_hand() -> None:
    x = np.array([[1.0, -4.0], [-2.0, 0.5], [0.25, 3.0]], np.float32)
    o = MinMaxObserver("int8", axis=1)
    o.observe(x)
    p = o.compute()
    np.testing.assert_allclose(p.scale, np.array([2.0, 4.0]) / 127, rtol=1e-6)
    assert p.axis == 1 and p.zero_point.dtype == np.int8


def test_moving_average_by_hand() -> None:
    o = MovingAverageMinMaxObserver("uint8", symmetric=False, averaging_constant=0.5)
    o.observe(np.array([-2.0, 2.0], np.float32))
    o.observe(np.array([0.0, 6.0], np.float32))  # lo -2 + .5 (0 - -2) = -1, hi 2 + .5 (6 - 2) = 4
    np.testing.assert_allclose([o.lo[0], o.hi[0]], [-1.0, 4.0])
    assert np.isclose(float(o.compute().scale), 5.0 / 255)


def test_percentile_matches_numpy_percentile() -> None:
    x = _rng().standard_normal(200_000).astype(np.float32)
    o = PercentileObserver("int8", percentile=99.0, bins=4096)
    o.observe(x[:100_000])
    o.observe(x[100_000:] * 1.01)  # a wider second batch exercises re-binning
    want = np.percentile(np.abs(np.concatenate([x[:100_000], x[100_000:] * 1.01])), 99.0)
    assert abs(float(o.compute().scale) * 127 - want) / want < 0.01


def test_percentile_asymmetric_uses_both_tails() -> None:
    x = _rng(1).exponential(size=100_000).astype(np.float32) - 0.5
    o = PercentileObserver("uint8", symmetric=False, percentile=99.9)
    o.observe(x)
    hi = np.percentile(x, 99.9)
    p = o.compute()
    lo = -0.5  # 0.1 % quantile of a shifted exponential is ~-0.499: the zero point sits near 0.5 / scale
    assert abs(float(p.scale) * 255 - (hi - lo)) / (hi - lo) < 0.02


def test_entropy_clips_outliers_but_keeps_the_bulk() -> None:
    x = _rng(2).standard_normal(100_000).astype(np.float32)
    x[:5] = 60.0  # rare outliers: minmax would waste almost all levels on them
    e, m = EntropyObserver("int8"), MinMaxObserver("int8")
    e.observe(x)
    m.observe(x)
    t = float(e.compute().scale) * 127
    assert 2.5 < t < 30.0 and float(m.compute().scale) * 127 == pytest.approx(60.0)
    bulk = x[5:]
    pe, pm = e.compute(), m.compute()
    err_e = np.mean((dequantize(quantize_array(bulk, pe), pe) - bulk) ** 2)
    err_m = np.mean((dequantize(quantize_array(bulk, pm), pm) - bulk) ** 2)
    assert err_e < err_m / 5


def test_entropy_kl_threshold_on_uniform_data_keeps_the_range() -> None:
    x = _rng(3).uniform(-1, 1, 200_000).astype(np.float32)
    e = EntropyObserver("int8")
    e.observe(x)
    assert float(e.compute().scale) * 127 > 0.9  # nothing to clip in a uniform distribution


def test_mse_beats_minmax_error_with_outliers() -> None:
    x = _rng(4).standard_normal(50_000).astype(np.float32)
    x[0] = 40.0
    errs = {}
    for name in ("minmax", "mse"):
        o = make_observer(name, "int4")
        o.observe(x)
        p = o.compute()
        errs[name] = float(np.mean((dequantize(quantize_array(x, p), p) - x) ** 2))
    assert errs["mse"] < errs["minmax"] / 4


def test_mse_on_float8_simulates_the_cast() -> None:
    x = _rng(5).standard_normal(10_000).astype(np.float32)
    o = MSEObserver("float8_e4m3fn")
    o.observe(x)
    p = o.compute()
    assert np.isfinite(float(p.scale)) and p.zero_point.dtype.name == "float8_e4m3fn"


def test_per_group_accumulates_and_checks_shapes() -> None:
    x = _rng(6).standard_normal((64, 8)).astype(np.float32)
    o = MinMaxObserver("int4", axis=0, group_size=32)
    o.observe(x)
    o.observe(x * 2)
    p = o.compute()
    assert p.scale.shape == (2, 8) and p.block_size == 32
    np.testing.assert_allclose(p.scale[1], 2 * np.abs(x[32:]).max(axis=0) / 7, rtol=1e-6)
    with pytest.raises(QuantError, match=r"parameters of shape \(4, 8\), earlier batches \(2, 8\)"):
        o.observe(np.zeros((128, 8), np.float32))


def test_non_finite_values_are_ignored() -> None:
    o = MinMaxObserver("int8")
    o.observe(np.array([1.0, np.inf, -np.inf, np.nan, -2.0], np.float32))
    assert np.isclose(float(o.compute().scale), 2.0 / 127)


def test_registry_and_factories() -> None:
    assert set(OBSERVERS) == {"minmax", "moving_average", "percentile", "entropy", "mse"}
    assert isinstance(make_observer(MinMaxObserver, "uint8"), MinMaxObserver)
    assert make_observer("moving-average", "int8").name == "moving_average"


def test_errors_name_the_fix() -> None:
    with pytest.raises(
        QuantError, match=r"unknown observer 'entropie' \(did you mean 'entropy'\?\).*Fix: use one of"
    ):
        make_observer("entropie")
    with pytest.raises(QuantError, match="returned int, not an Observer"):
        make_observer(lambda *a, **k: 3)
    with pytest.raises(QuantError, match=r"group_size 48 does not divide dimension 0 of size 64.*Fix"):
        MinMaxObserver("int4", axis=0, group_size=48).observe(np.zeros((64, 4), np.float32))
    with pytest.raises(QuantError, match="needs an axis"):
        MinMaxObserver("int4", group_size=32)
    with pytest.raises(QuantError, match="no batch has been observed"):
        MinMaxObserver().compute()
    with pytest.raises(QuantError, match="float8 type"):
        EntropyObserver("fp8")
    with pytest.raises(QuantError, match=r"axis 2 is out of range.*\(4, 4\)"):
        MinMaxObserver(axis=2).observe(np.zeros((4, 4), np.float32))
    with pytest.raises(QuantError, match="percentile"):
        PercentileObserver(percentile=20)
    assert issubclass(EntropyObserver, Observer)
