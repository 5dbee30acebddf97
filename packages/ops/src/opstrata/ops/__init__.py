"""opstrata.ops — kernels, dtypes, registry and dispatch with an audited fallback."""

from __future__ import annotations

from .compat import check_compatible as _check_compatible

__version__: str = _check_compatible("opstrata-ops")

__all__ = ["__version__"]
