"""opstrata.runtime — InferenceSession, arena execution, caching allocator, stream scheduler, profiler, KV cache."""

from __future__ import annotations

from opstrata.ops.compat import check_compatible as _check_compatible

__version__: str = _check_compatible("opstrata-runtime")

__all__ = ["__version__"]
