"""Is there a usable NVIDIA GPU here? Import CuPy and ask the CUDA runtime, once, and say why not.

The answer is plain data (:class:`CudaStatus`) so ``opstrata info`` and the device listing can print
it; nothing here raises for a missing GPU.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

__all__ = ["DISABLE_ENV", "CudaStatus", "probe"]

#: Set to 1 to leave the cuda device unregistered even where a GPU is visible (CPU-only runs).
DISABLE_ENV = "OPSTRATA_DISABLE_CUDA"
INSTALL_HINT = "pip install 'opstrata-ops[cuda]' (CuPy for CUDA 13; cupy-cuda12x for a CUDA 12 driver)"


@dataclass(frozen=True)
class CudaStatus:
    """What the probe found: the device (when available) or the reason it is not."""

    available: bool
    reason: str = ""
    device_name: str = ""
    compute_capability: str = ""  # "9.0"
    memory_gib: float = 0.0
    cupy_version: str = ""
    cuda_runtime: str = ""  # "13.0"

    def summary(self) -> str:
        """One line: ``cuda: NVIDIA H100 (sm_90, 79.1 GiB), CuPy 14.2.0, CUDA 13.0`` or the reason."""
        if not self.available:
            return f"cuda: not available: {self.reason}"
        sm = self.compute_capability.replace(".", "")
        return (
            f"cuda: {self.device_name} (sm_{sm}, {self.memory_gib:.1f} GiB), CuPy {self.cupy_version}, "
            f"CUDA runtime {self.cuda_runtime}"
        )


def _runtime_version(cp: ModuleType) -> str:
    v = int(cp.cuda.runtime.runtimeGetVersion())  # 13000 -> "13.0"
    return f"{v // 1000}.{v % 1000 // 10}"


def probe(import_module: Callable[[str], ModuleType] = importlib.import_module) -> CudaStatus:
    """Import CuPy and look for GPU 0; never raises (a failure is the returned reason)."""
    if os.environ.get(DISABLE_ENV, "").strip() not in ("", "0"):
        return CudaStatus(False, f"disabled by {DISABLE_ENV}={os.environ[DISABLE_ENV]}")
    try:
        cp = import_module("cupy")
    except ImportError as exc:
        return CudaStatus(False, f"CuPy is not installed ({exc}). Fix: {INSTALL_HINT}")
    except Exception as exc:  # a broken CuPy install: say what it raised
        return CudaStatus(
            False, f"CuPy failed to import: {type(exc).__name__}: {exc}. Fix: reinstall it ({INSTALL_HINT})"
        )
    version = str(getattr(cp, "__version__", "?"))
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as exc:  # no driver, no device node, driver older than the runtime
        return CudaStatus(
            False,
            f"CuPy {version} found no usable GPU: {type(exc).__name__}: {exc}. Fix: run where "
            "`nvidia-smi` lists a GPU, with a driver at least as new as CuPy's CUDA",
            cupy_version=version,
        )
    if count < 1:
        return CudaStatus(False, f"CuPy {version}: the CUDA runtime sees 0 GPUs", cupy_version=version)
    try:
        props = cp.cuda.runtime.getDeviceProperties(0)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        return CudaStatus(
            True,
            device_name=name,
            compute_capability=f"{props['major']}.{props['minor']}",
            memory_gib=float(props["totalGlobalMem"]) / 2**30,
            cupy_version=version,
            cuda_runtime=_runtime_version(cp),
        )
    except Exception as exc:
        return CudaStatus(False, f"GPU 0 did not answer: {type(exc).__name__}: {exc}", cupy_version=version)
