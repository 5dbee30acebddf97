"""Devices: the default device, a per-thread/per-task ``device()`` override, fallback chains, plugins.

Built-in devices are ``ref`` (the oracle) and ``cpu`` (optimized numpy). Other distributions add
devices through the entry-point group ``opstrata.devices`` (as pytest finds plugins through
``pytest11``)::

    [project.entry-points."opstrata.devices"]
    mydev = "mydev_ops:register_kernels"   # a callable run once, or a module imported once

Plugins load lazily, once, on the first dispatch or listing. A plugin that fails to load raises
:class:`DevicePluginError` naming its entry point; ``OPSTRATA_SKIP_DEVICES=mydev`` (comma-separated,
or ``*``) skips plugins by entry-point name.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._errors import DevicePluginError, DeviceUnavailableError, UnknownDeviceError

__all__ = [
    "BUILTIN_DEVICES",
    "ENTRY_POINT_GROUP",
    "DeviceAllocations",
    "DeviceMemory",
    "DeviceStatus",
    "device",
    "device_memory",
    "device_status",
    "get_default_device",
    "get_fallback_chain",
    "mark_unavailable",
    "register_memory",
    "set_default_device",
    "set_fallback_chain",
]

BUILTIN_DEVICES: tuple[str, ...] = ("ref", "cpu")
ENTRY_POINT_GROUP = "opstrata.devices"
SKIP_ENV = "OPSTRATA_SKIP_DEVICES"
#: Chain for devices without an explicit one: run on the host, then on the oracle.
DEFAULT_CHAIN: tuple[str, ...] = ("cpu", "ref")


def _no_sync() -> None:
    return None


@dataclass(frozen=True)
class DeviceAllocations:
    """How an executor lays out a device's allocations itself: one reserved block, carved by its own plan.

    Inside ``route(fn)`` (this thread) every allocation the device's kernels make calls ``fn(nbytes)``,
    which answers with ``carve(block, offset, nbytes, owner)`` (bytes of a block from ``reserve``) or
    ``fresh(nbytes, owner)`` (from the device's pool). Either keeps ``owner`` alive exactly as long as
    the memory is in use (arrays and views on it), so a weakref finalizer on ``owner`` sees the free.
    CuPy: ``using_allocator``, one ``cudaMalloc``, ``UnownedMemory`` over it, the default memory pool.
    """

    route: Callable[[Callable[[int], Any]], AbstractContextManager[Any]]
    reserve: Callable[[int], Any]  # reserve(nbytes): one device block
    carve: Callable[[Any, int, int, Any], Any]  # carve(block, offset, nbytes, owner): memory inside block
    fresh: Callable[
        [int, Any], Any
    ]  # fresh(nbytes, owner): memory from the device's pool (owner None: as is)
    alignment: int = 256  # offsets the plan gives must be multiples of this (cudaMalloc's 256 bytes)


@dataclass(frozen=True)
class DeviceMemory:
    """Where a device's arrays live and how they cross to host memory (numpy arrays) and back.

    ``ref`` and ``cpu`` have none: they compute on numpy arrays. A fallback from a device with its
    own memory to another memory copies each array argument across and each result back; the audit
    counts the bytes and the time (:func:`opstrata.ops.fallback_report`).
    """

    name: str  # the memory's name in reports, e.g. "cuda:0"
    is_array: Callable[[Any], bool]  # True for an array living in this memory
    to_host: Callable[[Any], np.ndarray]  # a host copy of one of its arrays (synchronous)
    from_host: Callable[..., Any]  # from_host(host_array, out=None): a device copy, or written into out
    synchronize: Callable[[], None] = _no_sync  # wait for queued work (timing of the copies)
    #: capture(fn) records fn's device work once and returns a DeviceGraph (``.result``, ``.replay()``):
    #: CUDA graphs; None where the device cannot record
    capture: Callable[[Callable[[], Any]], Any] | None = None
    #: mark() puts a timestamp on the device's queue (a recorded CUDA event); elapsed_ms(a, b) reads two
    #: after a sync, so a profiler times every kernel with one sync per run; None: time on the host
    mark: Callable[[], Any] | None = None
    elapsed_ms: Callable[[Any, Any], float] | None = None
    #: lets an executor serve the kernels' allocations from one block laid out by its memory plan; None:
    #: the device allocates for itself
    allocations: DeviceAllocations | None = None


@dataclass(frozen=True)
class DeviceStatus:
    """One device as this process sees it: usable or not, and why not."""

    name: str
    available: bool
    reason: str = ""  # why it is absent ("" when available)
    source: str = "built-in"  # "built-in" or the plugin entry point that provides it
    memory: str = "host"  # the memory its arrays live in


@dataclass
class _State:
    """Process-wide device state (the ``device()`` override lives in ``CURRENT``)."""

    default: str = "cpu"
    chains: dict[str, tuple[str, ...]] = field(default_factory=lambda: {"cpu": ("ref",), "ref": ()})
    plugin_devices: dict[str, str] = field(default_factory=dict)  # device -> its entry point, as text
    plugins_loaded: bool = False
    loading: bool = False
    memories: dict[str, DeviceMemory] = field(default_factory=dict)  # devices with their own memory
    unavailable: dict[str, str] = field(default_factory=dict)  # device -> why it is absent here


STATE = _State()
#: Device set by ``with device(...)``; None means the process default. Per thread and asyncio task.
CURRENT: ContextVar[str | None] = ContextVar("opstrata_ops_device", default=None)
_LOCK = threading.RLock()
#: Called after anything that changes dispatch results (the registry clears its kernel cache).
LISTENERS: list[Callable[[], None]] = []


def _changed() -> None:
    for fn in LISTENERS:
        fn()


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{what}: expected a device name (non-empty str), got {name!r}")
    return name


def known_devices(extra: Iterable[str] = ()) -> list[str]:
    """Built-in, plugin and chain-configured devices, plus ``extra`` (devices with kernels)."""
    load_plugins()
    names = set(BUILTIN_DEVICES) | set(STATE.plugin_devices) | set(STATE.chains) | set(extra)
    return sorted(names)


def validate_device(name: str, extra: Iterable[str] = ()) -> str:
    """Return ``name`` if it is a known device, else raise :class:`DeviceUnavailableError` for a device
    whose plugin found it absent here (with the reason), or :class:`UnknownDeviceError`."""
    _check_name(name, "device")
    known = known_devices(extra)
    if name not in known:
        if name in STATE.unavailable:
            raise DeviceUnavailableError(name, STATE.unavailable[name], known)
        raise UnknownDeviceError(name, known)
    return name


def register_memory(device_name: str, memory: DeviceMemory) -> None:
    """Declare that ``device_name`` computes on arrays in ``memory`` (not numpy arrays in host memory)."""
    _check_name(device_name, "register_memory")
    if not isinstance(memory, DeviceMemory):
        raise TypeError(f"register_memory({device_name!r}): expected a DeviceMemory, got {memory!r}")
    STATE.memories[device_name] = memory
    STATE.unavailable.pop(device_name, None)
    _changed()


def device_memory(name: str) -> DeviceMemory | None:
    """The memory ``name``'s arrays live in; None for host memory (numpy arrays)."""
    return STATE.memories.get(name)


def is_device_array(x: Any) -> bool:
    """True for an array of a registered device memory (not a numpy array)."""
    return any(m.is_array(x) for m in STATE.memories.values())


def mark_unavailable(name: str, reason: str) -> None:
    """Record that device ``name`` is absent here and why (a plugin's probe found no hardware, say):
    asking for it then raises :class:`DeviceUnavailableError` with ``reason`` instead of running."""
    _check_name(name, "mark_unavailable")
    STATE.unavailable[name] = str(reason)


def device_status() -> list[DeviceStatus]:
    """Every device this process knows of, usable or not, with the reason an absent one is absent."""
    from ._registry import registered_devices

    rows = []
    for name in known_devices(registered_devices()):
        mem = STATE.memories.get(name)
        source = STATE.plugin_devices.get(name, "built-in")
        rows.append(DeviceStatus(name, True, "", source, mem.name if mem else "host"))
    for name, why in sorted(STATE.unavailable.items()):
        rows.append(DeviceStatus(name, False, why, STATE.plugin_devices.get(name, "plugin")))
    return rows


def get_default_device() -> str:
    """The device ``call(..., device=None)`` uses here: the ``device()`` override, else the default."""
    return CURRENT.get() or STATE.default


def set_default_device(name: str) -> None:
    """Set the process-wide default device (``"cpu"`` unless changed); threads share it."""
    from ._registry import registered_devices

    STATE.default = validate_device(name, registered_devices())


@contextmanager
def device(name: str) -> Iterator[str]:
    """Run calls without ``device=`` on ``name`` inside the block; per thread and asyncio task.

    >>> import opstrata.ops as ops
    >>> with ops.device("ref"):
    ...     ops.get_default_device()
    'ref'
    """
    from ._registry import registered_devices

    token = CURRENT.set(validate_device(name, registered_devices()))
    try:
        yield name
    finally:
        CURRENT.reset(token)


def get_fallback_chain(name: str) -> tuple[str, ...]:
    """Devices tried, in order, when ``name`` has no kernel and no decomposition applies."""
    return STATE.chains.get(name, tuple(d for d in DEFAULT_CHAIN if d != name))


def set_fallback_chain(name: str, chain: Iterable[str]) -> None:
    """Set the devices ``name`` falls back to, in order (default: cpu -> ref; ``ref`` has none)."""
    _check_name(name, "set_fallback_chain")
    chain = tuple(_check_name(d, "set_fallback_chain") for d in chain)
    if name in chain:
        raise ValueError(f"set_fallback_chain: device {name!r} cannot fall back to itself; got chain {chain}")
    STATE.chains[name] = chain
    _changed()


def _skipped() -> set[str]:
    raw = os.environ.get(SKIP_ENV, "")
    return {s.strip() for s in raw.split(",") if s.strip()}


def _entry_points() -> list[md.EntryPoint]:
    seen: dict[tuple[str, str], md.EntryPoint] = {}
    for ep in md.entry_points(group=ENTRY_POINT_GROUP):
        seen.setdefault((ep.name, ep.value), ep)  # a dist on sys.path twice lists its entry points twice
    return sorted(seen.values(), key=lambda ep: ep.name)


def _load_one(ep: md.EntryPoint) -> None:
    label = f"{ep.name} = {ep.value}"
    dist = getattr(ep, "dist", None)
    dist_txt = f" from distribution {dist.metadata['Name']} {dist.version}" if dist is not None else ""
    try:
        obj = ep.load()
        if callable(obj) and not isinstance(obj, types.ModuleType):
            obj()
    except Exception as exc:
        raise DevicePluginError(ep.name, label + dist_txt, exc, SKIP_ENV) from exc
    if ep.name not in STATE.unavailable:  # a plugin that found its hardware absent marks it so
        STATE.plugin_devices[ep.name] = label


def load_plugins() -> None:
    """Load every ``opstrata.devices`` entry point once (idempotent; re-entrant from plugins)."""
    if STATE.plugins_loaded or STATE.loading:
        return
    with _LOCK:
        if STATE.plugins_loaded or STATE.loading:
            return
        STATE.loading = True
        try:
            skip = _skipped()
            for ep in _entry_points():
                if ep.name in STATE.plugin_devices or ep.name in skip or "*" in skip:
                    continue
                _load_one(ep)  # raises: plugins_loaded stays False so the error is never swallowed
            STATE.plugins_loaded = True
        finally:
            STATE.loading = False
    _changed()
