"""Kernel registry and dispatch (MINIMAL STUB — to be completed: fallback chain, audit, cache, entry points).

Contract used by kernel modules (stable):

    @register("softmax", device="ref", dtypes=FLOAT_DTYPES, priority=0)
    def softmax_ref(x, *, axis=-1): ...

    call("softmax", x, axis=-1, device=None)   # device None -> the default device ("cpu")

``dtypes`` is an iterable of numpy dtypes accepted for the op's *primary* array argument
(positional argument ``dtype_arg``, default 0), or None for "any dtype".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class KernelEntry:
    op: str
    device: str
    fn: Callable[..., Any]
    dtypes: frozenset[np.dtype] | None
    priority: int = 0
    dtype_arg: int = 0


@dataclass
class _Registry:
    kernels: dict[str, dict[str, list[KernelEntry]]] = field(default_factory=dict)


_REGISTRY = _Registry()
DEFAULT_DEVICE = "cpu"


def register(
    name: str,
    *,
    device: str = "cpu",
    dtypes: Iterable[Any] | None = None,
    priority: int = 0,
    dtype_arg: int = 0,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` as the kernel for op ``name`` on ``device`` (decorator)."""
    dts = None if dtypes is None else frozenset(np.dtype(d) for d in dtypes)

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        entry = KernelEntry(name, device, fn, dts, priority, dtype_arg)
        lst = _REGISTRY.kernels.setdefault(name, {}).setdefault(device, [])
        lst.append(entry)
        lst.sort(key=lambda e: -e.priority)
        return fn

    return deco


def call(name: str, *args: Any, device: str | None = None, **kwargs: Any) -> Any:
    """Dispatch op ``name`` to the kernel registered for ``device`` and the primary dtype."""
    device = device or DEFAULT_DEVICE
    for entry in _REGISTRY.kernels.get(name, {}).get(device, []):
        if entry.dtypes is None or np.asarray(args[entry.dtype_arg]).dtype in entry.dtypes:
            return entry.fn(*args, **kwargs)
    raise NotImplementedError(f"{name}: no kernel on device {device!r}")
