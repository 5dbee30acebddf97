"""Test helpers shared by opstrata packages: per-dtype tolerances and an upcasting ``assert_close``.

Tolerances follow torch.testing's defaults where it has them, and reflect the mantissa width for
bfloat16 (8 bits) and the float8 formats (4 and 3 bits).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np

from . import _dtypes as dt
from ._capture import capture_checks, capturing
from ._devices import DeviceAllocations

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


class StandInGraph:
    """The stand-in's ``capture``: records each kernel call (function, arguments, result) while ``fn`` runs;
    a replay re-runs those calls in order and writes into the recorded results, as a CUDA graph replays
    kernels into the addresses it captured. Work outside the device's kernels (host code) is not replayed,
    and crossing memories while recording raises, as a CUDA stream capture would."""

    def __init__(self, fn: Any) -> None:
        #: (kernel, args, kwargs, result, the flags of the deferred checks it made or None outside capturing())
        self.calls: list[tuple[Any, tuple[Any, ...], dict[str, Any], Any, list[Any] | None]] = []
        _RECORDING.append(self.calls)
        try:
            self.result = fn()
        finally:
            _RECORDING.pop()

    def replay(self) -> None:
        """Re-run every recorded kernel call into its recorded result arrays."""
        for fn, args, kwargs, result, flags in self.calls:
            # the kernel as recorded: under ops.capturing() it clamps and writes its checks into device flags
            with capturing() if flags is not None else nullcontext() as checks:
                fresh = fn(*args, **kwargs)
            for old, new in zip(result if isinstance(result, tuple) else (result,),
                                fresh if isinstance(fresh, tuple) else (fresh,), strict=True):  # fmt: skip
                np.copyto(old, np.asarray(new), casting="no")
            for flag, check in zip(flags or [], checks or [], strict=True):
                np.copyto(flag, check.flag)


#: the kernel-call lists of the stand-in captures in progress (innermost last)
_RECORDING: list[list[Any]] = []


def _refuse_while_recording(what: str) -> None:
    if _RECORDING:
        raise RuntimeError(f"{what} while a device graph is recorded (a CUDA stream capture forbids it)")


def _standin_to_host(x: Any) -> np.ndarray:
    _refuse_while_recording("a device-to-host copy")
    return np.array(x, copy=True)


def _standin_from_host(a: np.ndarray, out: Any = None) -> Any:
    _refuse_while_recording("a host-to-device copy")
    if out is None:
        return np.array(a, copy=True).view(StandInArray)
    out[...] = a
    return out


def _standin_sync() -> None:
    _refuse_while_recording("a device synchronisation")


def _standin_elapsed_ms(a: int, b: int) -> float:
    return (b - a) / 1e6


class _StandInMemory:
    """Bytes a stand-in kernel writes one result into (a block's slice or its own), and the owner they keep
    alive: the stand-in's half of :class:`~opstrata.ops.DeviceAllocations`."""

    __slots__ = ("buf", "owner")

    def __init__(self, buf: np.ndarray, owner: Any) -> None:
        self.buf, self.owner = buf, owner


#: per thread: the allocation functions routed by ``DeviceAllocations.route`` (innermost last)
_ROUTES = threading.local()


@contextmanager
def _standin_route(fn: Any) -> Iterator[None]:
    stack = _ROUTES.__dict__.setdefault("stack", [])
    stack.append(fn)
    try:
        yield
    finally:
        stack.pop()


def _standin_carve(block: np.ndarray, offset: int, nbytes: int, owner: Any) -> _StandInMemory:
    if offset < 0 or offset + nbytes > block.size:
        raise ValueError(
            f"carve: bytes [{offset}, {offset + nbytes}) lie outside the {block.size}-byte block"
        )
    return _StandInMemory(block[offset : offset + nbytes], owner)


#: the stand-in's allocations: a kernel's fresh result is copied into memory the routed function gives
STANDIN_ALLOCATIONS = DeviceAllocations(
    _standin_route,
    lambda n: np.full(n, 0xFF, np.uint8),  # NaN-filled floats: a read of unwritten bytes shows
    _standin_carve,
    lambda n, owner: _StandInMemory(np.full(n, 0xFF, np.uint8), owner),
)


def _placed(t: Any, arrays: list[np.ndarray]) -> StandInArray:
    """A kernel's result ``t`` as a stand-in array: a view of an argument keeps that argument's memory; a
    fresh result goes into the routed allocation's bytes (as a CuPy kernel allocates through CuPy's
    allocator), else stays where numpy put it."""
    t = np.asarray(t)
    for a in arrays:
        if np.may_share_memory(t, a):
            out = t.view(StandInArray)
            out._mem = getattr(a, "_mem", None)  # type: ignore[attr-defined]
            return out
    stack = getattr(_ROUTES, "stack", None)
    if not stack:
        return t.view(StandInArray)
    mem = stack[-1](t.nbytes)
    dst = mem.buf[: t.nbytes].view(t.dtype).reshape(t.shape)
    np.copyto(dst, t)
    out = dst.view(StandInArray)
    out._mem = mem  # type: ignore[attr-defined]
    return out


def _device_only(fn: Any) -> Any:
    """``fn`` refusing host arrays (the executor must have copied them up) and returning stand-in arrays."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        nested = [v for a in args if isinstance(a, (list, tuple)) for v in a]
        arrays = []
        for v in (*args, *kwargs.values(), *nested):
            if isinstance(v, np.ndarray):
                if not isinstance(v, StandInArray):
                    raise AssertionError(f"a host array {v.dtype}{v.shape} reached a device kernel")
                arrays.append(v)
        checks = capture_checks()
        before = len(checks) if checks is not None else 0
        r = fn(*args, **kwargs)
        out = tuple(_placed(t, arrays) for t in r) if isinstance(r, tuple) else _placed(r, arrays)
        if _RECORDING:
            flags = [c.flag for c in checks[before:]] if checks is not None else None  # None: eager checks
            _RECORDING[-1].append((fn, args, dict(kwargs), out, flags))
        return out

    kernel.__name__ = getattr(fn, "__name__", "kernel")
    return kernel


def register_standin_device(name: str = "_standin") -> str:
    """Register a device with its own memory that runs the cuda device's kernels over numpy, on the CPU.

    Its arrays are :class:`StandInArray`; its kernels refuse plain numpy arrays, so a caller that forgets
    to copy a value to the device fails loudly. It records work for replay (:class:`StandInGraph`,
    refusing copies and syncs while recording), timestamps its queue with the host clock, and lets an
    executor place its kernels' results (``DeviceAllocations``: each fresh result is copied into the
    bytes the routed function gives; views keep their base's memory alive). Sessions,
    conformance runs and the demo are tested on it where there is no GPU. Use inside
    :func:`isolated_registry` (the ops tests' fixture does).
    """
    import time

    from ._cuda import CudaOps, op_table
    from ._devices import DeviceMemory, register_memory
    from ._registry import register
    from .kernels.erf import erf_cpu

    register_memory(
        name,
        DeviceMemory(
            f"{name}:0",
            lambda x: isinstance(x, StandInArray),
            _standin_to_host,
            _standin_from_host,
            _standin_sync,
            capture=StandInGraph,
            mark=time.perf_counter_ns,
            elapsed_ms=_standin_elapsed_ms,
            allocations=STANDIN_ALLOCATIONS,
        ),
    )
    for op, (fn, dtypes, dtype_arg) in op_table(CudaOps(np, erf=erf_cpu)).items():
        register(op, device=name, dtypes=dtypes, dtype_arg=dtype_arg)(_device_only(fn))
    return name
