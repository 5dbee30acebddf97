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
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from ._errors import DevicePluginError, UnknownDeviceError

__all__ = [
    "BUILTIN_DEVICES",
    "ENTRY_POINT_GROUP",
    "device",
    "get_default_device",
    "get_fallback_chain",
    "set_default_device",
    "set_fallback_chain",
]

BUILTIN_DEVICES: tuple[str, ...] = ("ref", "cpu")
ENTRY_POINT_GROUP = "opstrata.devices"
SKIP_ENV = "OPSTRATA_SKIP_DEVICES"
#: Chain for devices without an explicit one: run on the host, then on the oracle.
DEFAULT_CHAIN: tuple[str, ...] = ("cpu", "ref")


@dataclass
class _State:
    """Process-wide device state (the ``device()`` override lives in ``CURRENT``)."""

    default: str = "cpu"
    chains: dict[str, tuple[str, ...]] = field(default_factory=lambda: {"cpu": ("ref",), "ref": ()})
    plugin_devices: dict[str, str] = field(default_factory=dict)  # device -> its entry point, as text
    plugins_loaded: bool = False
    loading: bool = False


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
    """Return ``name`` if it is a known device, else raise :class:`UnknownDeviceError`."""
    _check_name(name, "device")
    known = known_devices(extra)
    if name not in known:
        raise UnknownDeviceError(name, known)
    return name


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
