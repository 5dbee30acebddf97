"""Kernel resolution: which function runs an (op, device, dtype) call, and by which path.

The chain, first match wins (the order PyTorch's dispatcher and ONNX Runtime's execution-provider
fallback follow, made explicit):

1. ``native``: the requested device's own kernel accepting the dtype (highest priority first);
2. ``decomposition``: the op's registered decomposition, run on the requested device;
3. ``device:<name>``: a kernel on the next device of the requested device's fallback chain.

Pure functions over the registry tables; no state here, so coverage tools can ask "what would run"
without running anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

NATIVE = "native"
DECOMPOSITION = "decomposition"


@dataclass(frozen=True)
class KernelEntry:
    """A kernel registered for one op on one device."""

    op: str
    device: str
    fn: Callable[..., Any]
    dtypes: frozenset[np.dtype] | None  # dtypes of the primary argument it accepts; None: any
    priority: int = 0
    dtype_arg: int = 0  # position of the primary array argument


@dataclass(frozen=True)
class Decomposition:
    """An op defined in terms of other ops (called through ``call``); runs on any device."""

    op: str
    fn: Callable[..., Any]
    dtypes: frozenset[np.dtype] | None = None


@dataclass(frozen=True)
class Plan:
    """How a call runs: the function, the path taken and, for a fallback, why."""

    op: str
    device: str  # requested device
    dtype: Any  # primary argument's dtype (None when the call has no primary argument)
    path: str  # NATIVE, DECOMPOSITION or "device:<name>"
    fn: Callable[..., Any]
    target: str  # device the function runs on
    reason: str = ""
    dtype_name: str = ""  # str(dtype), precomputed: the audit uses it on every fallback call


def accepts(dtypes: frozenset[np.dtype] | None, dtype: Any) -> bool:
    """True if a kernel/decomposition restricted to ``dtypes`` takes a primary argument of ``dtype``."""
    return dtypes is None or (dtype is not None and dtype in dtypes)


def dtype_list(dtypes: Iterable[Any] | None) -> str:
    """``float16, float32`` (sorted names) or ``any dtype``."""
    return "any dtype" if dtypes is None else ", ".join(sorted(str(d) for d in dtypes))


def _reason(op: str, device: str, dtype: Any, entries: Sequence[KernelEntry]) -> str:
    if not entries:
        return f"no {op} kernel on {device}"
    have = set().union(*(e.dtypes or () for e in entries))
    return f"{device} has {op} only for {dtype_list(have)}, not {dtype}"


def resolve(
    kernels: Mapping[str, Mapping[str, Sequence[KernelEntry]]],
    decomps: Mapping[str, Decomposition],
    op: str,
    device: str,
    dtype: Any,
    chain: Sequence[str],
    *,
    decompose: bool = True,
) -> Plan | None:
    """The plan for one call, or None when nothing in the chain can run it."""
    by_device = kernels.get(op, {})
    entries = by_device.get(device, ())
    for e in entries:
        if accepts(e.dtypes, dtype):
            return Plan(op, device, dtype, NATIVE, e.fn, device)
    reason = _reason(op, device, dtype, entries)
    dec = decomps.get(op)
    if decompose and dec is not None and accepts(dec.dtypes, dtype):
        return Plan(op, device, dtype, DECOMPOSITION, dec.fn, device, reason, str(dtype))
    for other in chain:
        for e in by_device.get(other, ()):
            if accepts(e.dtypes, dtype):
                return Plan(op, device, dtype, f"device:{other}", e.fn, other, reason, str(dtype))
    return None


def registered_summary(
    kernels: Mapping[str, Mapping[str, Sequence[KernelEntry]]], decomps: Mapping[str, Decomposition], op: str
) -> dict[str, str]:
    """``{device: "float32, float64"}`` for ``op``, plus ``"decomposition"`` if it has one."""
    out: dict[str, str] = {}
    for dev, entries in kernels.get(op, {}).items():
        if entries:
            any_dtype = any(e.dtypes is None for e in entries)
            out[dev] = dtype_list(None if any_dtype else set().union(*(e.dtypes or () for e in entries)))
    if op in decomps:
        out["decomposition"] = dtype_list(decomps[op].dtypes)
    return out
