"""opstrata.eval — numeric comparison, conformance, benchmarks with baselines, reports and the `opstrata` CLI."""

from __future__ import annotations

from opstrata.ops.compat import check_compatible as _check_compatible

__version__: str = _check_compatible("opstrata-eval")

from ._assert_close import assert_close
from ._bench_gate import Verdict, gate
from ._bench_run import interleave
from ._compare import Metrics, compare
from ._conformance import (
    ConformanceCell,
    ConformanceReport,
    Reproducer,
    conformance_ops,
    load_reproducer,
    replay_reproducer,
)
from ._diff import DiffReport, TensorDiff, diff_model
from ._diff_inputs import DiffError
from ._drift import DriftReport, DriftRow, drift_model
from ._memory_timeline import memory_timeline
from ._report import ReportError, build_report
from ._tolerances import DEFAULT_TOLERANCES, default_tolerances

__all__ = [
    "DEFAULT_TOLERANCES",
    "ConformanceCell",
    "ConformanceReport",
    "DiffError",
    "DiffReport",
    "DriftReport",
    "DriftRow",
    "Metrics",
    "ReportError",
    "Reproducer",
    "TensorDiff",
    "Verdict",
    "__version__",
    "assert_close",
    "build_report",
    "compare",
    "conformance_ops",
    "default_tolerances",
    "diff_model",
    "drift_model",
    "gate",
    "interleave",
    "load_reproducer",
    "memory_timeline",
    "replay_reproducer",
]
