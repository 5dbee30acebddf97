"""Observers: accumulate statistics of a tensor over batches (``observe``) and yield its QuantParams.

minmax, moving-average minmax, percentile, histogram entropy (TensorRT's KL calibration) and MSE-optimal
clipping; per-tensor, per-channel (``axis``) or per-group (``axis`` + ``group_size``); symmetric or not;
int8/uint8/int4/uint4 and float8 (scale only) targets.
"""

from __future__ import annotations

import difflib
from typing import Any, ClassVar

import numpy as np

from ._dtypes import qdtype
from ._errors import QuantError
from ._granularity import to_rows, validate_granularity
from ._histogram import RowHistogram
from ._qparams import QuantParams, params_from_range

__all__ = [
    "OBSERVERS",
    "EntropyObserver",
    "MSEObserver",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "Observer",
    "PercentileObserver",
    "make_observer",
]


class Observer:
    """Base observer: validates and reshapes each batch into one row per scale, then ``_update(rows)``."""

    name: ClassVar[str] = "observer"

    def __init__(
        self,
        dtype: Any = "int8",
        *,
        symmetric: bool | None = None,
        axis: int | None = None,
        group_size: int = 0,
    ) -> None:
        self.qtype = qdtype(dtype, f"{type(self).__name__}(dtype)")
        validate_granularity(axis, group_size, f"{type(self).__name__}(axis, group_size)")
        self.symmetric = self.qtype.signed if symmetric is None else bool(symmetric)
        self.axis, self.group_size = axis, int(group_size)
        self.batches = 0
        self._pshape: tuple[int, ...] | None = None
        self._axis_norm: int | None = None

    def observe(self, x: Any) -> None:
        """Add one batch of the tensor's values (non-finite values are ignored)."""
        a = np.asarray(x)
        where = f"{type(self).__name__}.observe(x)"
        if a.dtype.kind not in "fiu" and a.dtype.name != "bfloat16":
            raise QuantError(
                where, f"expected a numeric tensor, got dtype {a.dtype}", "pass float activations"
            )
        a = a.astype(np.float32)
        if a.ndim == 0:
            a = a.reshape(1)
        a = np.where(np.isfinite(a), a, np.nan) if not np.isfinite(a).all() else a
        rows, pshape = to_rows(a, self.axis, self.group_size, where)
        if self._pshape is not None and pshape != self._pshape:
            raise QuantError(
                where, f"this batch needs parameters of shape {pshape}, earlier batches {self._pshape} "
                f"(axis={self.axis}, group_size={self.group_size}, batch shape {a.shape})",
                "keep the quantized axis the same size in every batch, or observe per-tensor",
            )  # fmt: skip
        self._pshape = pshape
        self._axis_norm = None if self.axis is None else self.axis % a.ndim
        self._update(rows)
        self.batches += 1

    def _update(self, rows: np.ndarray) -> None:
        raise NotImplementedError

    def _range(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-row (lo, hi) clipping range chosen by this observer."""
        raise NotImplementedError

    def compute(self) -> QuantParams:
        """The QuantParams for everything observed so far."""
        if self._pshape is None:
            raise QuantError(
                f"{type(self).__name__}.compute()",
                "no batch has been observed",
                "call observe(x) at least once",
            )
        lo, hi = self._range()
        lo = np.nan_to_num(np.where(np.isfinite(lo), lo, 0.0)).reshape(self._pshape)
        hi = np.nan_to_num(np.where(np.isfinite(hi), hi, 0.0)).reshape(self._pshape)
        return params_from_range(
            lo, hi, self.qtype, symmetric=self.symmetric, axis=self._axis_norm, block_size=self.group_size
        )


class MinMaxObserver(Observer):
    """The running minimum and maximum: no clipping, every observed value is representable."""

    name = "minmax"

    def __init__(self, dtype: Any = "int8", **kw: Any) -> None:
        super().__init__(dtype, **kw)
        self.lo = self.hi = np.zeros(0)

    def _update(self, rows: np.ndarray) -> None:
        lo, hi = np.nanmin(rows, axis=1), np.nanmax(rows, axis=1)
        if self.batches == 0:
            self.lo, self.hi = lo, hi
        else:
            self.lo, self.hi = np.fmin(self.lo, lo), np.fmax(self.hi, hi)

    def _range(self) -> tuple[np.ndarray, np.ndarray]:
        return self.lo, self.hi


class MovingAverageMinMaxObserver(MinMaxObserver):
    """Exponential moving average of each batch's min and max (``averaging_constant`` = weight of the new batch)."""

    name = "moving_average"

    def __init__(self, dtype: Any = "int8", *, averaging_constant: float = 0.01, **kw: Any) -> None:
        super().__init__(dtype, **kw)
        if not 0.0 < float(averaging_constant) <= 1.0:
            raise QuantError("MovingAverageMinMaxObserver(averaging_constant)",
                             f"expected a value in (0, 1], got {averaging_constant!r}", "use e.g. 0.01")  # fmt: skip
        self.c = float(averaging_constant)

    def _update(self, rows: np.ndarray) -> None:
        lo, hi = np.nanmin(rows, axis=1), np.nanmax(rows, axis=1)
        if self.batches == 0:
            self.lo, self.hi = lo, hi
        else:
            self.lo = self.lo + self.c * (np.nan_to_num(lo, nan=0.0) - self.lo) * ~np.isnan(lo)
            self.hi = self.hi + self.c * (np.nan_to_num(hi, nan=0.0) - self.hi) * ~np.isnan(hi)


class _HistogramObserver(Observer):
    """Shared state of the histogram observers: one :class:`RowHistogram` per scale."""

    def __init__(self, dtype: Any = "int8", *, bins: int = 2048, **kw: Any) -> None:
        super().__init__(dtype, **kw)
        if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 16:
            raise QuantError(
                f"{type(self).__name__}(bins)", f"expected an int >= 16, got {bins!r}", "use 2048"
            )
        self.hist = RowHistogram(int(bins), absolute=self._absolute())

    def _absolute(self) -> bool:
        return self.symmetric or self.qtype.is_float

    def _update(self, rows: np.ndarray) -> None:
        self.hist.add(rows)

    def _clip(self, t_lo: np.ndarray, t_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A threshold range intersected with the values actually seen."""
        return np.maximum(t_lo, self.hist.min), np.minimum(t_hi, self.hist.max)


class PercentileObserver(_HistogramObserver):
    """Clip at a percentile of the values (of |x| when symmetric; both tails otherwise)."""

    name = "percentile"

    def __init__(self, dtype: Any = "int8", *, percentile: float = 99.99, **kw: Any) -> None:
        super().__init__(dtype, **kw)
        if not 50.0 < float(percentile) <= 100.0:
            raise QuantError("PercentileObserver(percentile)", f"expected a value in (50, 100], got {percentile!r}",
                             "use e.g. 99.99")  # fmt: skip
        self.percentile = float(percentile)

    def _range(self) -> tuple[np.ndarray, np.ndarray]:
        h, p = self.hist, self.percentile / 100.0
        assert h.counts is not None
        lo, hi = np.empty(h.counts.shape[0]), np.empty(h.counts.shape[0])
        for k in range(h.counts.shape[0]):
            cdf = np.concatenate([[0.0], np.cumsum(h.counts[k])])
            edges = h.edges(k)
            if h.absolute:
                t = float(np.interp(p * cdf[-1], cdf, edges))
                lo[k], hi[k] = -t, t
            else:
                lo[k] = float(np.interp((1.0 - p) * cdf[-1], cdf, edges))
                hi[k] = float(np.interp(p * cdf[-1], cdf, edges))
        return self._clip(lo, hi)


class EntropyObserver(_HistogramObserver):
    """TensorRT's entropy calibration: the |x| threshold minimising KL(P || Q) between the clipped histogram
    and its quantized version (integer targets only). Meant for activations: it searches row by row, so
    thousands of per-group weight rows take seconds."""

    name = "entropy"

    def __init__(self, dtype: Any = "int8", *, bins: int = 2048, candidates: int = 128, **kw: Any) -> None:
        super().__init__(dtype, bins=bins, **kw)
        if self.qtype.is_float:
            raise QuantError(
                "EntropyObserver(dtype)", f"entropy calibration models a uniform integer grid; {self.qtype.name} "
                "is a float8 type", "use observer='minmax', 'percentile' or 'mse' for float8",
            )  # fmt: skip
        self.levels = int(self.qtype.qmax - self.qtype.qmin + 1) // 2
        if self.hist.bins < self.levels:
            raise QuantError("EntropyObserver(bins)", f"{self.hist.bins} bins < {self.levels} quantization levels",
                             f"use bins >= {self.levels} (2048 is TensorRT's choice)")  # fmt: skip
        self.candidates = max(1, int(candidates))

    def _absolute(self) -> bool:
        return True

    def _threshold(self, hist: np.ndarray) -> int:
        """The number of bins ``i`` whose upper edge is the KL-optimal threshold."""
        bins, levels = hist.size, self.levels
        if hist.sum() == 0:
            return bins
        stride = max(1, (bins - levels) // self.candidates)
        best_i, best_kl = bins, np.inf
        for i in (*range(levels, bins, stride), bins):
            ref = hist[:i].copy()
            ref[-1] += hist[i:].sum()
            chunk = np.minimum(np.arange(i) * levels // i, levels - 1)
            nonzero = hist[:i] != 0
            sums = np.bincount(chunk, weights=hist[:i], minlength=levels)
            norm = np.bincount(chunk, weights=nonzero, minlength=levels)
            q = np.where(nonzero, sums[chunk] / np.maximum(norm[chunk], 1), 0.0)
            p = ref / ref.sum()
            qs = q.sum()
            if qs == 0:
                continue
            q = q / qs
            m = p > 0
            if np.any(q[m] == 0):
                continue
            kl = float(np.sum(p[m] * np.log(p[m] / q[m])))
            if kl < best_kl:
                best_i, best_kl = i, kl
        return best_i

    def _range(self) -> tuple[np.ndarray, np.ndarray]:
        h = self.hist
        assert h.counts is not None
        t = np.array([self._threshold(h.counts[k]) for k in range(h.counts.shape[0])]) * h.width
        return self._clip(-t, t)


class MSEObserver(_HistogramObserver):
    """The clipping range (a fraction of the observed one) that minimises the histogram's expected
    quantize-dequantize squared error."""

    name = "mse"

    def __init__(self, dtype: Any = "int8", *, bins: int = 2048, steps: int = 100, **kw: Any) -> None:
        super().__init__(dtype, bins=bins, **kw)
        self.fractions = np.linspace(0.1, 1.0, max(2, int(steps)))

    def _range(self) -> tuple[np.ndarray, np.ndarray]:
        h = self.hist
        assert h.counts is not None
        rows, bins = h.counts.shape
        lo, hi = np.empty(rows), np.empty(rows)
        f = self.fractions[:, None]  # (F, 1): candidates x rows broadcast
        chunk = max(1, 4_000_000 // (f.size * bins * 2))
        for a in range(0, rows, chunk):
            sl = slice(a, min(rows, a + chunk))
            centers = h.lo[sl, None] + h.width[sl, None] * (np.arange(bins) + 0.5)  # (k, bins)
            counts = h.counts[sl]
            if h.absolute:
                amax = np.maximum(np.abs(h.min[sl]), np.abs(h.max[sl]))
                amax = np.where(np.isfinite(amax), amax, 0.0)
                c_lo, c_hi = -f * amax, f * amax  # (F, k)
                vals = np.concatenate([centers, -centers], axis=1)  # |x| histogram: both signs, half each
                cnt = np.concatenate([counts, counts], axis=1) / 2
            else:
                c_lo = f * np.minimum(np.where(np.isfinite(h.min[sl]), h.min[sl], 0.0), 0.0)
                c_hi = f * np.maximum(np.where(np.isfinite(h.max[sl]), h.max[sl], 0.0), 0.0)
                vals, cnt = centers, counts
            p = params_from_range(c_lo, c_hi, self.qtype, symmetric=self.symmetric)
            fq = _fake_quant(vals[None], p.scale[..., None], p.zero_point[..., None], self.qtype)
            err = ((fq - vals[None]) ** 2 * cnt[None]).sum(axis=2)  # (F, k)
            best = np.argmin(err, axis=0)
            idx = np.arange(best.size)
            lo[sl], hi[sl] = c_lo[best, idx], c_hi[best, idx]
        return lo, hi


def _fake_quant(v: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, qt: Any) -> np.ndarray:
    """quantize-dequantize of ``v`` with broadcastable per-candidate parameters, in float64."""
    s = scale.astype(np.float64)
    if qt.is_float:
        q = np.clip(v / s, qt.qmin, qt.qmax).astype(np.float32).astype(qt.dtype).astype(np.float64)
        return q * s
    zp = zero_point.astype(np.float64)
    return (np.clip(np.rint(v / s) + zp, qt.qmin, qt.qmax) - zp) * s


OBSERVERS: dict[str, type[Observer]] = {
    c.name: c
    for c in (MinMaxObserver, MovingAverageMinMaxObserver, PercentileObserver, EntropyObserver, MSEObserver)
}


def make_observer(observer: Any, dtype: Any = "int8", **kw: Any) -> Observer:
    """An observer from a name in :data:`OBSERVERS`, an Observer subclass or a factory callable."""
    if isinstance(observer, str):
        cls = OBSERVERS.get(observer.lower().replace("-", "_"))
        if cls is None:
            close = difflib.get_close_matches(observer, list(OBSERVERS), n=1)
            raise QuantError(
                "observer", f"unknown observer {observer!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
                f"use one of {', '.join(OBSERVERS)}, an Observer subclass or a callable returning an Observer",
            )  # fmt: skip
        return cls(dtype, **kw)
    if callable(observer):
        obs = observer(dtype, **kw)
        if not isinstance(obs, Observer):
            raise QuantError("observer", f"the factory returned {type(obs).__name__}, not an Observer",
                             "return an opstrata.quant.Observer instance")  # fmt: skip
        return obs
    raise QuantError("observer", f"expected a name, an Observer subclass or a callable, got {observer!r}",
                     f"use one of {', '.join(OBSERVERS)}")  # fmt: skip
