"""opstrata.graph — IR, ONNX import/export, shape inference, optimisation passes, memory planning, execution plans."""

from __future__ import annotations

from opstrata.ops.compat import check_compatible as _check_compatible

__version__: str = _check_compatible("opstrata-graph")

__all__ = ["__version__"]
