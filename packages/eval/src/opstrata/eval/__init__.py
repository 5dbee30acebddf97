"""opstrata.eval — numeric comparison, conformance, benchmarks with baselines, reports and the `opstrata` CLI."""

from __future__ import annotations

from opstrata.ops.compat import check_compatible as _check_compatible

__version__: str = _check_compatible("opstrata-eval")

__all__ = ["__version__"]
