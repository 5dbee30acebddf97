"""Session options: the knobs of an InferenceSession (ONNX Runtime's SessionOptions, the real ones only)."""

from __future__ import annotations

import math
from dataclasses import InitVar, dataclass
from typing import Any

from ._errors import InvalidArgument

__all__ = ["SessionOptions"]

_POLICIES = ("allow", "warn", "error")
MAX_STREAMS = 64
MAX_THREADS = 1024  # a sanity bound: BLAS libraries cap their pools far below it anyway
_UNSET: Any = object()  # num_streams not passed (None is a value, and an invalid one)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass
class SessionOptions:
    """Options of an InferenceSession; checked when the session is created.

    Threads as in onnxruntime: ``intra_op_num_threads`` (0, the default: ``OPSTRATA_NUM_THREADS`` if
    set, else the physical cores) limits BLAS per run; ``inter_op_num_threads`` is the stream
    scheduler's width (0, the default, and 1: sequential). ``num_streams`` is the older name of
    ``inter_op_num_threads`` and stays an alias (reads 1 for 0). Spread over ``inter`` streams, a run
    gives each stream ``max(1, intra // inter)`` BLAS threads (see ``opstrata.runtime._threads``).

    >>> opts = SessionOptions(graph_optimization_level=2, enable_profiling=True)
    >>> opts.fallback_policy is None
    True
    >>> SessionOptions(num_streams=2).inter_op_num_threads
    2
    """

    graph_optimization_level: int = 3  # 0 none, 1 basic, 2 extended, 3 all (ORT's ORT_ENABLE_ALL)
    enable_profiling: bool = False  # record per-node events; write them with sess.end_profiling()
    profile_file_prefix: str = "opstrata_profile"  # end_profiling writes <prefix>_<timestamp>.json
    fallback_policy: str | None = None  # "allow" | "warn" | "error"; None = the ops layer's current policy
    enable_mem_arena: bool = True  # intermediates in one planned arena; False = caching-allocator blocks
    memory_limit_bytes: int | None = None  # caching allocator capacity (simulated device memory)
    num_streams: InitVar[Any] = _UNSET  # alias of inter_op_num_threads (a property once constructed)
    stream_timeout_s: float = (
        60.0  # a run with no node finishing for this long fails (hung or too-slow kernel)
    )
    plan_cache_size: int = 16  # input-shape signatures whose arena and bound program are kept (LRU)
    intra_op_num_threads: int = 0  # BLAS threads per run; 0 = OPSTRATA_NUM_THREADS, else physical cores
    inter_op_num_threads: int = 0  # worker streams running independent nodes concurrently (0/1 = sequential)
    #: a device session (cuda) records each input shape's plan as one device graph (a CUDA graph) after
    #: one eager run, then replays it: onnxruntime's CUDA provider option ``enable_cuda_graph``
    enable_device_graph: bool = False

    def __post_init__(self, num_streams: Any) -> None:
        if num_streams is _UNSET:
            return
        inter = self.inter_op_num_threads
        if not (_is_int(inter) and inter in (0, num_streams)):
            raise InvalidArgument(
                "SessionOptions", f"num_streams={num_streams!r} and inter_op_num_threads={inter!r} disagree "
                "(num_streams is the older name of inter_op_num_threads)", "pass only inter_op_num_threads",
            )  # fmt: skip
        self.num_streams = num_streams

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "inter_op_num_threads":  # error messages name the option the caller used
            object.__setattr__(self, "_inter_op_name", name)
        object.__setattr__(self, name, value)

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
        n = self.inter_op_num_threads
        if getattr(self, "_inter_op_name", "") == "num_streams":
            if not _is_int(n) or not 1 <= n <= MAX_STREAMS:
                raise InvalidArgument(
                    where, f"num_streams must be an int in 1..{MAX_STREAMS}, got {n!r}",
                    "use 1 for sequential execution, or about the number of independent branches (2 on 2 "
                    "cores); num_streams is the older name of inter_op_num_threads",
                )  # fmt: skip
        elif not _is_int(n) or not 0 <= n <= MAX_STREAMS:
            raise InvalidArgument(
                where, f"inter_op_num_threads must be an int in 0..{MAX_STREAMS} (0 or 1: sequential), got {n!r}",
                "use 0 for sequential execution, or about the number of independent branches (2 on 2 cores)",
            )  # fmt: skip
        if not isinstance(self.enable_device_graph, bool):
            raise InvalidArgument(
                where, f"enable_device_graph must be True or False, got {self.enable_device_graph!r}"
            )
        t = self.intra_op_num_threads
        if not _is_int(t) or not 0 <= t <= MAX_THREADS:
            raise InvalidArgument(
                where, f"intra_op_num_threads must be an int in 0..{MAX_THREADS}, got {t!r}",
                "use 0 for the default (OPSTRATA_NUM_THREADS, else the physical cores) or a thread count "
                "such as 1 or 2",
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


def _get_num_streams(self: SessionOptions) -> Any:
    n = self.inter_op_num_threads
    return 1 if _is_int(n) and n == 0 else n


def _set_num_streams(self: SessionOptions, value: Any) -> None:
    object.__setattr__(self, "inter_op_num_threads", value)
    object.__setattr__(self, "_inter_op_name", "num_streams")


#: ``num_streams``: the older name of ``inter_op_num_threads``, read and written through it.
SessionOptions.num_streams = property(  # type: ignore[assignment,misc]
    _get_num_streams, _set_num_streams, doc="Alias of inter_op_num_threads (worker streams; 0 reads as 1)."
)
