"""Session options: the knobs of an InferenceSession (ONNX Runtime's SessionOptions, the real ones only)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._errors import InvalidArgument

__all__ = ["SessionOptions"]

_POLICIES = ("allow", "warn", "error")
MAX_STREAMS = 64


@dataclass
class SessionOptions:
    """Options of an InferenceSession; checked when the session is created.

    >>> opts = SessionOptions(graph_optimization_level=2, enable_profiling=True)
    >>> opts.fallback_policy is None
    True
    """

    graph_optimization_level: int = 3  # 0 none, 1 basic, 2 extended, 3 all (ORT's ORT_ENABLE_ALL)
    enable_profiling: bool = False  # record per-node events; write them with sess.end_profiling()
    profile_file_prefix: str = "opstrata_profile"  # end_profiling writes <prefix>_<timestamp>.json
    fallback_policy: str | None = None  # "allow" | "warn" | "error"; None = the ops layer's current policy
    enable_mem_arena: bool = True  # intermediates in one planned arena; False = caching-allocator blocks
    memory_limit_bytes: int | None = None  # caching allocator capacity (simulated device memory)
    num_streams: int = (
        1  # worker streams running independent nodes concurrently (1 = sequential, in the caller)
    )
    stream_timeout_s: float = (
        60.0  # a run with no node finishing for this long fails (hung or too-slow kernel)
    )
    plan_cache_size: int = 16  # input-shape signatures whose arena and bound program are kept (LRU)

    def validate(self) -> SessionOptions:
        """Raise InvalidArgument naming the first bad option; return self."""
        where = "SessionOptions"
        lvl = self.graph_optimization_level
        if isinstance(lvl, bool) or not isinstance(lvl, int) or not 0 <= lvl <= 3:
            raise InvalidArgument(
                where, f"graph_optimization_level must be an int 0-3, got {lvl!r}", "use 0, 1, 2 or 3"
            )
        if self.fallback_policy is not None and self.fallback_policy not in _POLICIES:
            raise InvalidArgument(
                where, f"fallback_policy must be one of {_POLICIES} or None, got {self.fallback_policy!r}"
            )
        lim = self.memory_limit_bytes
        if lim is not None and (isinstance(lim, bool) or not isinstance(lim, int) or lim <= 0):
            raise InvalidArgument(where, f"memory_limit_bytes must be a positive int or None, got {lim!r}")
        n = self.num_streams
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_STREAMS:
            raise InvalidArgument(
                where, f"num_streams must be an int in 1..{MAX_STREAMS}, got {n!r}",
                "use 1 for sequential execution, or about the number of independent branches (2 on 2 cores)",
            )  # fmt: skip
        t = self.stream_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (t > 0 and math.isfinite(t)):
            raise InvalidArgument(
                where, f"stream_timeout_s must be a positive finite number of seconds, got {t!r}",
                "use e.g. 60.0; it must exceed the slowest single kernel",
            )  # fmt: skip
        c = self.plan_cache_size
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise InvalidArgument(
                where, f"plan_cache_size must be a positive int, got {c!r}",
                "use e.g. 16: one arena and bound program is kept per distinct set of input shapes",
            )  # fmt: skip
        if not isinstance(self.profile_file_prefix, str) or not self.profile_file_prefix:
            raise InvalidArgument(where, "profile_file_prefix must be a non-empty string")
        return self
