"""Two chart kinds as inline SVG (no plotting dependency): horizontal bars and a line over an index.

Each chart is one ``<svg class="chart">`` carrying ``data-kind`` and ``data-points`` so a reader (or
a test) can check what it plots; values are drawn on a linear or a log10 axis with labelled ticks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

__all__ = ["bar_chart", "line_chart"]

_W, _ROW, _LEFT, _PAD = 720, 18, 220, 40


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        return [10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    step = 10 ** math.floor(math.log10(hi - lo or 1.0))
    while (hi - lo) / step > 8:
        step *= 2
    start = math.floor(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step) + 2)]


def _scale(values: Sequence[float], log: bool) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        return (1e-12, 1.0) if log else (0.0, 1.0)
    lo, hi = min(finite), max(finite)
    if log:
        return 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi) + 1e-12)
    return min(0.0, lo), (hi if hi > min(0.0, lo) else 1.0)


def _pos(v: float, lo: float, hi: float, log: bool, length: float) -> float:
    if log:
        v = max(v, lo)
        return length * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo) or 1.0)
    return length * (v - lo) / ((hi - lo) or 1.0)


def bar_chart(
    labels: Sequence[str], values: Sequence[float], *, title: str, unit: str, log: bool = False
) -> str:
    """Horizontal bars, one per label, with the value printed at the end of each bar."""
    lo, hi = _scale(values, log)
    length = _W - _LEFT - 90
    height = _PAD + _ROW * len(labels) + 30
    parts = [f'<svg class="chart" data-kind="bar" data-points="{len(values)}" role="img" '
             f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}">',
             f'<text x="{_W / 2}" y="18" text-anchor="middle" font-weight="bold">{escape(title)}</text>']  # fmt: skip
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        y = _PAD + i * _ROW
        w = _pos(v, lo, hi, log, length) if math.isfinite(v) else length
        parts.append(
            f'<text x="{_LEFT - 6}" y="{y + 12}" text-anchor="end" font-size="11">{escape(label[:34])}</text>'
        )
        parts.append(f'<rect class="bar" x="{_LEFT}" y="{y + 2}" width="{max(w, 1):.1f}" height="{_ROW - 4}" '
                     f'fill="#4c78a8"><title>{escape(label)}: {v:.4g} {escape(unit)}</title></rect>')  # fmt: skip
        parts.append(f'<text x="{_LEFT + max(w, 1) + 4:.1f}" y="{y + 12}" font-size="10">{v:.3g}</text>')
    axis_y = _PAD + _ROW * len(labels) + 4
    parts.append(f'<text x="{_LEFT + length / 2}" y="{axis_y + 20}" text-anchor="middle" font-size="11">'
                 f'{escape(unit)}{" (log scale)" if log else ""}</text>')  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


def line_chart(values: Sequence[float], *, title: str, xlabel: str, ylabel: str, log: bool = True) -> str:
    """A line with a marker per point (x = position), y on a log or linear axis with ticks."""
    lo, hi = _scale(values, log)
    width, height, left, top, bottom = _W, 300, 70, 30, 40
    plot_w, plot_h = width - left - 20, height - top - bottom
    pts = []
    for i, v in enumerate(values):
        x = left + (plot_w * i / max(len(values) - 1, 1))
        y = top + plot_h - _pos(v if math.isfinite(v) else hi, lo, hi, log, plot_h)
        pts.append((x, y, v))
    parts = [f'<svg class="chart" data-kind="line" data-points="{len(values)}" role="img" '
             f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
             f'<text x="{width / 2}" y="18" text-anchor="middle" font-weight="bold">{escape(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>']  # fmt: skip
    for t in _ticks(lo, hi, log):
        if lo <= t <= hi:
            y = top + plot_h - _pos(t, lo, hi, log, plot_h)
            parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                         f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10">{t:.0e}</text>')  # fmt: skip
    if pts:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in pts)
        parts.append(
            f'<polyline class="series" points="{path}" fill="none" stroke="#e45756" stroke-width="1.5"/>'
        )
        parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="#e45756"><title>{i}: {v:.4g}</title></circle>'
                  for i, (x, y, v) in enumerate(pts)]  # fmt: skip
    parts.append(
        f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle" font-size="11">{escape(xlabel)}</text>'
    )
    parts.append(f'<text x="14" y="{top + plot_h / 2}" font-size="11" transform="rotate(-90 14 {top + plot_h / 2})" '
                 f'text-anchor="middle">{escape(ylabel)}{" (log)" if log else ""}</text>')  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)
