"""Thread settings of a session: intra-op and inter-op counts resolved as onnxruntime does.

``intra_op_num_threads`` is the number of BLAS threads one run may use; 0 (the default) means
``OPSTRATA_NUM_THREADS`` when that is set, else the machine's physical cores. An explicit option
always wins over the environment variable, as in onnxruntime, where the variable only replaces the
default. Physical cores are counted among the CPUs this process may run on
(``os.sched_getaffinity``): one per distinct (package, core) pair in sysfs, so SMT siblings count
once; where sysfs or affinity is unavailable, the usable CPU count (``os.cpu_count()``) is used.

``inter_op_num_threads`` is the stream scheduler's width (alias ``num_streams``); 0 means one stream,
the sequential executor, as onnxruntime's default sequential execution mode runs no inter-op pool.

Streams x intra-op never oversubscribe: a run the scheduler spreads over ``inter`` streams limits BLAS
to ``max(1, intra // inter)`` threads per stream (the BLAS limit is process-wide, so it is that count
for the whole run; fewer when all its GEMMs are small, see ``_gemm_threads``); a run the scheduler keeps
on one stream uses up to ``intra``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import InvalidArgument

__all__ = [
    "ENV_NUM_THREADS",
    "GEMM_MIN_FLOPS_PER_THREAD",
    "ThreadSettings",
    "env_num_threads",
    "physical_cores",
    "resolve_intra_op",
    "thread_info",
]

#: Environment variable replacing the default (0) intra-op count; ops' parallel kernels read it too.
ENV_NUM_THREADS = "OPSTRATA_NUM_THREADS"
#: FLOPs of one GEMM call per BLAS thread it gets: below twice this a GEMM runs single-threaded
#: (measured; see ``_gemm_threads``). Read when a session is created.
GEMM_MIN_FLOPS_PER_THREAD = 2_500_000
_SYSFS_CPU = Path("/sys/devices/system/cpu")  # per-CPU topology (package and core ids)


def _usable_cpus() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: no affinity mask to read
        return None


@functools.lru_cache(maxsize=1)
def physical_cores() -> int:
    """Physical cores this process may run on (SMT siblings once); at least 1. Cached per process."""
    cpus = _usable_cpus()
    cores: set[tuple[str, str]] = set()
    for cpu in sorted(cpus or ()):
        topo = _SYSFS_CPU / f"cpu{cpu}" / "topology"
        try:
            cores.add(
                ((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip())
            )
        except OSError:  # no sysfs topology (containers may hide it): count logical CPUs instead
            cores.clear()
            break
    if cores:
        return len(cores)
    return max(1, len(cpus) if cpus else (os.cpu_count() or 1))


def env_num_threads() -> int | None:
    """``OPSTRATA_NUM_THREADS`` as an int >= 1, None when unset or empty; InvalidArgument otherwise."""
    raw = os.environ.get(ENV_NUM_THREADS, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise InvalidArgument(
            f"environment variable {ENV_NUM_THREADS}",
            f"expected an int >= 1 (the default intra-op thread count), got {raw!r}",
            f"set e.g. {ENV_NUM_THREADS}=2, or unset it to use the physical cores ({physical_cores()})",
        )
    return int(raw)


def resolve_intra_op(option: int) -> tuple[int, str]:
    """The intra-op thread count for an (already validated) option value and where it came from."""
    if option > 0:
        return option, "intra_op_num_threads"
    env = env_num_threads()
    if env is not None:
        return env, ENV_NUM_THREADS
    return physical_cores(), "physical cores"


@dataclass(frozen=True)
class ThreadSettings:
    """A session's resolved thread counts and the rules derived from them (see the module docstring)."""

    intra_op: int  #: BLAS threads one sequential run may use
    inter_op: int  #: streams (1 = the sequential executor)
    source: str  #: where ``intra_op`` came from: the option, OPSTRATA_NUM_THREADS or physical cores
    gemm_min_flops_per_thread: int  #: a GEMM gets one BLAS thread per this many FLOPs (at least 1)

    @classmethod
    def resolve(
        cls, intra_op_option: int = 0, inter_op: int = 0, gemm_min_flops_per_thread: int | None = None
    ) -> ThreadSettings:
        """Settings for validated options; reads ``OPSTRATA_NUM_THREADS``, the core count and
        :data:`GEMM_MIN_FLOPS_PER_THREAD` now."""
        intra, source = resolve_intra_op(intra_op_option)
        per = GEMM_MIN_FLOPS_PER_THREAD if gemm_min_flops_per_thread is None else gemm_min_flops_per_thread
        return cls(intra, max(1, inter_op), source, per)

    @property
    def per_stream(self) -> int:
        """BLAS threads per stream when a run is spread over the streams: ``max(1, intra // inter)``."""
        return max(1, self.intra_op // self.inter_op)

    def gemm_threads(self, flops: int, cap: int) -> int:
        """BLAS threads for one GEMM call of ``flops`` FLOPs: ``clamp(flops // per-thread minimum, 1, cap)``.

        Below ``2 * gemm_min_flops_per_thread`` a GEMM runs single-threaded.
        """
        return max(1, min(cap, flops // max(1, self.gemm_min_flops_per_thread)))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready description (profiler trace metadata, ``opstrata info``)."""
        return {
            "intra_op_num_threads": self.intra_op,
            "intra_op_source": self.source,
            "inter_op_num_threads": self.inter_op,
            "blas_threads_per_stream": self.per_stream if self.inter_op > 1 else self.intra_op,
            "gemm_single_thread_below_flops": 2 * self.gemm_min_flops_per_thread,
            "gemm_min_flops_per_thread": self.gemm_min_flops_per_thread,
            "physical_cores": physical_cores(),
        }


def thread_info() -> dict[str, Any]:
    """What a session created now with default options would use, and the BLAS it limits (``opstrata info``)."""
    from ._blas import BLAS

    BLAS.refresh()
    return {**ThreadSettings.resolve().as_dict(), "blas": BLAS.describe()}
