"""Test helpers shared by opstrata packages: per-dtype tolerances and an upcasting ``assert_close``.

Tolerances follow torch.testing's defaults where it has them, and reflect the mantissa width for
bfloat16 (8 bits) and the float8 formats (4 and 3 bits).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from . import _dtypes as dt

#: (rtol, atol) per dtype.
TOLERANCES: dict[np.dtype, tuple[float, float]] = {
    dt.float64: (1e-7, 1e-7),
    dt.float32: (1.3e-6, 1e-5),
    dt.float16: (1e-3, 1e-5),
    dt.bfloat16: (1.6e-2, 1e-5),
    dt.float8_e4m3fn: (1.25e-1, 1e-3),
    dt.float8_e5m2: (2.5e-1, 1e-3),
}


def tolerances(dtype: Any) -> tuple[float, float]:
    """Default (rtol, atol) for comparing results of ``dtype``; exact (0, 0) for ints and bool."""
    return TOLERANCES.get(np.dtype(dtype), (0.0, 0.0))


def assert_close(
    actual: Any,
    expected: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    check_dtype: bool = True,
) -> None:
    """Assert elementwise closeness after upcasting to float64; NaNs must match; shapes must match."""
    a, e = np.asarray(actual), np.asarray(expected)
    if check_dtype and a.dtype != e.dtype:
        raise AssertionError(f"dtype mismatch: actual {a.dtype}, expected {e.dtype}")
    if a.shape != e.shape:
        raise AssertionError(f"shape mismatch: actual {a.shape}, expected {e.shape}")
    d_rtol, d_atol = tolerances(e.dtype)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    a64 = a.astype(np.float64) if a.dtype.kind not in "iub" else a
    e64 = e.astype(np.float64) if e.dtype.kind not in "iub" else e
    np.testing.assert_allclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)


def write_fake_distribution(
    site_dir: Any, name: str, version: str, *, entry_points: dict[str, dict[str, str]] | None = None
) -> None:
    """Write a minimal ``<name>-<version>.dist-info`` into ``site_dir`` (a real metadata directory).

    Put ``site_dir`` first on ``sys.path``/``PYTHONPATH`` and importlib.metadata finds it, so tests can
    install a distribution of any version, or one declaring entry points, without pip.
    """
    from pathlib import Path

    info = Path(site_dir) / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if entry_points:
        lines = []
        for group, items in entry_points.items():
            lines.append(f"[{group}]")
            lines.extend(f"{key} = {value}" for key, value in items.items())
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def import_with_fake_lower(module: str, lower: str, version: str, site_dir: Any) -> Any:
    """Import ``module`` in a fresh interpreter that sees ``lower`` at ``version``; return the result."""
    import os
    import subprocess
    import sys

    write_fake_distribution(site_dir, lower, version)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site_dir), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-c", f"import {module}"], env=env, capture_output=True, text=True, timeout=120
    )


@contextmanager
def isolated_registry() -> Iterator[None]:
    """Restore kernels, decompositions, device defaults/chains, fallback policy and audit on exit.

    Register ``_test_``-prefixed ops inside it; nothing leaks into the next test.
    """
    from . import _fallback, _registry

    snap = _registry.snapshot()
    policy = _fallback._global_policy
    try:
        yield
    finally:
        _registry.restore(snap)
        _fallback.set_fallback_policy(policy)
        _fallback.reset_fallback_report()


class StandInArray(np.ndarray):
    """An array in the stand-in device's memory: a numpy subclass, so the host can still compute on it."""


def _standin_from_host(a: np.ndarray, out: Any = None) -> Any:
    if out is None:
        return np.array(a, copy=True).view(StandInArray)
    out[...] = a
    return out


def _device_only(fn: Any) -> Any:
    """``fn`` refusing host arrays (the executor must have copied them up) and returning stand-in arrays."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        nested = [v for a in args if isinstance(a, (list, tuple)) for v in a]
        for v in (*args, *kwargs.values(), *nested):
            if isinstance(v, np.ndarray) and not isinstance(v, StandInArray):
                raise AssertionError(f"a host array {v.dtype}{v.shape} reached a device kernel")
        r = fn(*args, **kwargs)
        if isinstance(r, tuple):
            return tuple(np.asarray(t).view(StandInArray) for t in r)
        return np.asarray(r).view(StandInArray)

    kernel.__name__ = getattr(fn, "__name__", "kernel")
    return kernel


def register_standin_device(name: str = "_standin") -> str:
    """Register a device with its own memory that runs the cuda device's kernels over numpy, on the CPU.

    Its arrays are :class:`StandInArray`; its kernels refuse plain numpy arrays, so a caller that forgets
    to copy a value to the device fails loudly. Sessions, conformance runs and the demo are tested on it
    where there is no GPU. Use inside :func:`isolated_registry` (the ops tests' fixture does).
    """
    from ._cuda import CudaOps, op_table
    from ._devices import DeviceMemory, register_memory
    from ._registry import register
    from .kernels.erf import erf_cpu

    register_memory(
        name,
        DeviceMemory(
            f"{name}:0",
            lambda x: isinstance(x, StandInArray),
            lambda x: np.array(x, copy=True),
            _standin_from_host,
        ),
    )
    for op, (fn, dtypes, dtype_arg) in op_table(CudaOps(np, erf=erf_cpu)).items():
        register(op, device=name, dtypes=dtypes, dtype_arg=dtype_arg)(_device_only(fn))
    return name
