"""The cuda device: NVIDIA GPUs through CuPy (cuBLAS GEMMs, NVRTC-compiled kernels), beside cpu and ref.

ops' own ``opstrata.devices`` entry point calls :func:`register_kernels` on the first dispatch: where
CuPy imports and a GPU is visible the kernels register on ``cuda`` with its memory (CuPy arrays), and
ops they lack fall back to ``cpu`` with the copies counted; elsewhere ``cuda`` is marked unavailable
with the reason (``opstrata info``, :func:`opstrata.ops.device_status`). CuPy is imported only here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .._devices import DeviceMemory, mark_unavailable, register_memory
from .._registry import register
from ._alloc import cupy_allocations
from ._graphs import cupy_capture, cupy_elapsed_ms, cupy_mark
from ._kernels import CudaOps, op_table
from ._probe import CudaStatus, probe

__all__ = [
    "DEVICE",
    "CudaOps",
    "CudaStatus",
    "cuda_memory",
    "cuda_status",
    "register_cuda",
    "register_kernels",
]

DEVICE = "cuda"


@functools.lru_cache(maxsize=1)
def cuda_status() -> CudaStatus:
    """The probe's answer for this process (CuPy imported and GPU 0 asked once)."""
    return probe()


def cuda_memory(cp: ModuleType) -> DeviceMemory:
    """CuPy arrays on the current GPU: host copies with ``cupy.asnumpy``, device copies with ``cupy.asarray``,
    CUDA graphs for replay, CUDA events for timing, and allocations an executor may lay out itself."""

    def from_host(a: Any, out: Any = None) -> Any:
        if out is None:
            return cp.asarray(a)
        if out.flags.c_contiguous and a.flags.c_contiguous:
            out.set(a)  # one host-to-device copy into the existing buffer
        else:
            out[...] = cp.asarray(a)
        return out

    return DeviceMemory(
        f"cuda:{cp.cuda.runtime.getDevice()}",
        lambda x: isinstance(x, cp.ndarray),
        cp.asnumpy,
        from_host,
        lambda: cp.cuda.get_current_stream().synchronize(),
        capture=cupy_capture(cp),
        mark=cupy_mark(cp),
        elapsed_ms=cupy_elapsed_ms(cp),
        allocations=cupy_allocations(cp),
    )


def register_cuda(
    device: str,
    xp: ModuleType,
    *,
    raw: Any = None,
    erf: Callable[[Any], Any] | None = None,
    memory: DeviceMemory | None = None,
) -> CudaOps:
    """Register the cuda kernels over array module ``xp`` on ``device`` (tests use numpy on a stand-in)."""
    k = CudaOps(xp, raw, erf)
    if memory is not None:
        register_memory(device, memory)
    for op, (fn, dtypes, dtype_arg) in op_table(k).items():
        register(op, device=device, dtypes=dtypes, dtype_arg=dtype_arg)(fn)
    return k


def register_kernels() -> None:
    """The entry point: register ``cuda`` where a GPU is usable, else mark it unavailable with the reason."""
    status = cuda_status()
    if not status.available:
        mark_unavailable(DEVICE, status.reason)
        return
    import cupy as cp
    import cupyx.scipy.special as cps

    from ._raw import RawKernels

    register_cuda(DEVICE, cp, raw=RawKernels(cp), erf=cps.erf, memory=cuda_memory(cp))
