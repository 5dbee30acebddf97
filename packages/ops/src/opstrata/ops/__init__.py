"""opstrata.ops — kernels, dtypes, registry and dispatch with an audited fallback."""

from __future__ import annotations

from .compat import check_compatible as _check_compatible

__version__: str = _check_compatible("opstrata-ops")

# --- dtypes, registry, dispatch, fallback (owner: dispatch) ---
from ._dtypes import (  # noqa: E402
    bfloat16 as bfloat16,
    float8_e4m3fn as float8_e4m3fn,
    float8_e5m2 as float8_e5m2,
)
from ._registry import call as call, register as register  # noqa: E402
# --- end dispatch ---

# --- elementwise, reductions, normalization, softmax, loss (owner: kernels-a) ---
# --- end kernels-a ---

# --- linear algebra, conv, pooling, shape ops, attention (owner: kernels-b) ---
# --- end kernels-b ---

__all__ = sorted(n for n in dir() if not n.startswith("_") and n not in {"annotations", "compat", "testing"})
