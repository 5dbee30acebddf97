"""``drift_model``: a model computed in bfloat16/float16 against the same model in float64, node by node.

The error of each float node output is ``max |low - f64| / max |f64|`` (scaled, so it is comparable
along the graph and stable where values cross zero); ``growth`` is that error over the worst error
of the node's inputs: above 1 the node amplifies the rounding it was fed (reductions, softmax,
normalisations), below 1 it damps it. This is the BF16/FP16 drift a porting team has to locate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._diff import DiffReport, diff_sides
from ._diff_inputs import DiffError, load_model, make_feeds, model_label
from ._diff_sides import build_sides
from ._tolerances import dtype_class

__all__ = ["DRIFT_DTYPES", "DriftReport", "DriftRow", "drift_model", "plot_drift"]

DRIFT_DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True)
class DriftRow:
    """One float node output: its scaled error against float64 and the growth over its inputs' error."""

    index: int
    node: str
    op: str
    output: str
    shape: tuple[int, ...]
    error: float  # max |low - f64| / max |f64|
    input_error: float  # the worst error among the node's inputs (0.0 when they are exact)
    growth: float  # error / input_error (inf when the inputs are exact and the output is not)
    sqnr_db: float


@dataclass(frozen=True)
class DriftReport:
    """Error growth along the graph of ``model`` computed in ``dtype`` against float64."""

    model: str
    dtype: str
    rows: tuple[DriftRow, ...]
    feeds: tuple[str, ...] = ()

    @property
    def worst(self) -> DriftRow | None:
        """The row with the largest error (None for a model without float outputs)."""
        return max(self.rows, key=lambda r: r.error, default=None)

    @property
    def top_growth(self) -> DriftRow | None:
        """The row whose node amplified its inputs' error the most (finite growth only)."""
        finite = [r for r in self.rows if math.isfinite(r.growth)]
        return max(finite, key=lambda r: r.growth, default=None)

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | str:
            return x if math.isfinite(x) else repr(x)

        return {
            "model": self.model, "dtype": self.dtype, "reference": "float64", "feeds": list(self.feeds),
            "rows": [
                {"index": r.index, "node": r.node, "op": r.op, "output": r.output, "shape": list(r.shape),
                 "error": num(r.error), "input_error": num(r.input_error), "growth": num(r.growth),
                 "sqnr_db": num(r.sqnr_db)}
                for r in self.rows
            ],
        }  # fmt: skip


def _rows(report: DiffReport) -> list[DriftRow]:
    rows = []
    for r in report.rows:
        m = r.metrics
        if m is None or dtype_class(m.dtype) not in ("float", "complex"):
            continue
        errs = []
        for x in r.inputs:
            src = report.lookup(x) if x else None
            if src is not None and src.metrics is not None and dtype_class(src.metrics.dtype) == "float":
                errs.append(src.metrics.max_abs_scaled)
        ein = max(errs, default=0.0)
        growth = m.max_abs_scaled / ein if ein > 0 else (math.inf if m.max_abs_scaled > 0 else 1.0)
        rows.append(
            DriftRow(r.index, r.node, r.op, r.name, m.shape, m.max_abs_scaled, ein, growth, m.sqnr_db)
        )
    return rows


def drift_model(
    model: Any, dtype: str = "bfloat16", feeds: Mapping[str, Any] | None = None, *,
    dims: Mapping[str, int] | None = None, seed: int = 0, device: str = "cpu", level: int = 3,
    feeds_source: str = "feeds",
) -> DriftReport:  # fmt: skip
    """Run ``model`` cast to ``dtype`` ("bfloat16" or "float16") and cast to float64; error per node."""
    if dtype not in DRIFT_DTYPES:
        raise DiffError(
            f"drift: dtype must be one of {', '.join(DRIFT_DTYPES)}, got {dtype!r}; "
            "drift measures a low-precision copy against float64"
        )
    proto = load_model(model)
    label = model_label(model, proto)
    full_feeds, notes = make_feeds(proto, feeds, dims=dims, seed=seed, source=feeds_source)
    low = build_sides(proto, label, dtype, full_feeds, device=device, level=level)[0]  # the cast copy
    high = build_sides(proto, label, "float64", full_feeds, device=device, level=level)[1]
    report = diff_sides(proto, label, low, high, notes, level=level)
    return DriftReport(label, dtype, tuple(_rows(report)), tuple(notes))


def plot_drift(report: DriftReport, path: Path) -> Path:
    """The error per node (log scale) as ``.svg`` (built in) or ``.png`` (needs matplotlib); returns ``path``."""
    path = Path(path)
    title = f"{report.dtype} drift: {report.model}"
    ylabel = f"max |{report.dtype} - float64| / max |float64|"
    errors = [max(r.error, 1e-12) for r in report.rows]
    if path.suffix.lower() == ".svg":
        from ._svg import line_chart

        path.write_text(line_chart(errors, title=title, xlabel="node output (graph order)", ylabel=ylabel))
        return path
    if path.suffix.lower() != ".png":
        raise DiffError(f"--plot {path}: expected a .svg or .png file name")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DiffError(
            f"--plot {path}: a .png needs matplotlib (pip install matplotlib); or name a .svg file"
        ) from None
    fig, ax = plt.subplots(figsize=(max(6.0, len(errors) * 0.12), 4.0))
    ax.semilogy(range(len(errors)), errors, marker="o", markersize=3)
    ax.set_xlabel("node output (graph order)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
