"""The kernel registry and ``call``, the one dispatch path every public op goes through.

Contract used by kernel modules (stable)::

    @register("softmax", device="ref", dtypes=FLOAT_DTYPES, priority=0)
    def softmax_ref(x, *, axis=-1): ...

    call("softmax", x, axis=-1, device=None)   # device None -> the current default device ("cpu")

``dtypes`` is an iterable of numpy dtypes accepted for the op's *primary* array argument
(positional argument ``dtype_arg``, default 0; the same for every kernel of an op), or None for
"any dtype". Among kernels of one (op, device) accepting a dtype, the highest ``priority`` wins,
and on a tie the one registered last (so a plugin can override). Resolution (see ``_dispatch``)
is cached per (op, device, primary dtype); registering anything clears the cache.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import numpy as np

from . import _devices
from ._dispatch import DECOMPOSITION, NATIVE, Decomposition, KernelEntry, Plan, registered_summary, resolve
from ._errors import NoKernelError, UnknownOpError
from ._fallback import audit, get_fallback_policy, record_copies
from ._transfer import Mover

__all__ = [
    "KernelEntry",
    "call",
    "coverage",
    "dispatch_path",
    "kernels",
    "list_devices",
    "list_ops",
    "register",
    "register_decomposition",
    "registry_generation",
    "resolve_kernel",
    "unregister",
]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class _Registry:
    kernels: dict[str, dict[str, list[KernelEntry]]] = field(default_factory=dict)
    decomps: dict[str, Decomposition] = field(default_factory=dict)
    dtype_arg: dict[str, int] = field(default_factory=dict)  # op -> position of its primary argument


_REGISTRY = _Registry()
DEFAULT_DEVICE = "cpu"
_CACHE: dict[tuple[str, str, Any], tuple[Callable[..., Any], Plan | None]] = {}
_GENERATION = [0]  # bumped on every change; a resolution racing a change is not cached
#: (op, device, path) of the fallbacks running in this thread/task, innermost last.
_ACTIVE: ContextVar[tuple[tuple[str, str, str], ...]] = ContextVar("opstrata_ops_active", default=())


def _invalidate() -> None:
    _GENERATION[0] += 1
    _CACHE.clear()


_devices.LISTENERS.append(_invalidate)


def _as_dtypes(dtypes: Iterable[Any] | None, what: str) -> frozenset[np.dtype] | None:
    if dtypes is None:
        return None
    if isinstance(dtypes, (str, np.dtype, type)):
        dtypes = (dtypes,)
    out = frozenset(np.dtype(d) for d in dtypes)
    if not out:
        raise ValueError(f"{what}: dtypes is empty; pass None for 'any dtype' or list the accepted dtypes")
    return out


def _check_dtype_arg(name: str, dtype_arg: int, where: str) -> None:
    prev = _REGISTRY.dtype_arg.setdefault(name, dtype_arg)
    if prev != dtype_arg:
        raise ValueError(
            f"{where}: op {name!r} already uses dtype_arg={prev} (its primary argument); got "
            f"dtype_arg={dtype_arg}. Fix: register every kernel of {name!r} with dtype_arg={prev}"
        )


def register(
    name: str,
    *,
    device: str = "cpu",
    dtypes: Iterable[Any] | None = None,
    priority: int = 0,
    dtype_arg: int = 0,
) -> Callable[[F], F]:
    """Register the decorated function as the kernel for op ``name`` on ``device``; returns it unchanged."""
    where = f"register({name!r}, device={device!r})"
    if not isinstance(name, str) or not name:
        raise TypeError(f"register: op name must be a non-empty str, got {name!r}")
    if not isinstance(device, str) or not device:
        raise TypeError(f"{where}: device must be a non-empty str, got {device!r}")
    dts = _as_dtypes(dtypes, where)

    def deco(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"{where}: expected a callable kernel, got {fn!r}")
        _check_dtype_arg(name, dtype_arg, where)
        entry = KernelEntry(name, device, fn, dts, priority, dtype_arg)
        lst = _REGISTRY.kernels.setdefault(name, {}).setdefault(device, [])
        lst.insert(0, entry)  # newest first, so the stable sort makes the newest win a priority tie
        lst.sort(key=lambda e: -e.priority)
        _invalidate()
        return fn

    return deco


def register_decomposition(name: str, fn: F | None = None, *, dtypes: Iterable[Any] | None = None) -> Any:
    """Define op ``name`` by other ops (``fn`` calls them through ``call``); usable as a decorator.

    The decomposition is the composite's definition and the first fallback on any device that
    lacks a kernel: it runs with the requested device current, so its ``call``s stay there.
    """

    def deco(f: F) -> F:
        if not callable(f):
            raise TypeError(f"register_decomposition({name!r}): expected a callable, got {f!r}")
        _REGISTRY.dtype_arg.setdefault(name, 0)
        _REGISTRY.decomps[name] = Decomposition(
            name, f, _as_dtypes(dtypes, f"register_decomposition({name!r})")
        )
        _invalidate()
        return f

    return deco if fn is None else deco(fn)


def unregister(
    name: str,
    *,
    device: str | None = None,
    decomposition: bool = True,
    kernel: Callable[..., Any] | None = None,
) -> int:
    """Remove op ``name``'s kernels (on ``device``, or all) and its decomposition; return how many.

    With ``kernel``, only the entries registering that function go (a plugin removing its own override
    leaves the op's other kernels and its decomposition in place).
    """
    removed = 0
    by_device = _REGISTRY.kernels.get(name, {})
    for dev in [device] if device is not None else list(by_device):
        if kernel is None:
            removed += len(by_device.pop(dev, []))
            continue
        keep = [e for e in by_device.get(dev, []) if e.fn is not kernel]
        removed += len(by_device.get(dev, [])) - len(keep)
        if keep:
            by_device[dev] = keep
        else:
            by_device.pop(dev, None)
    if kernel is not None:
        decomposition = False
    if device is None and decomposition and _REGISTRY.decomps.pop(name, None) is not None:
        removed += 1
    if not by_device:
        _REGISTRY.kernels.pop(name, None)
        if name not in _REGISTRY.decomps:
            _REGISTRY.dtype_arg.pop(name, None)
    _invalidate()
    return removed


def snapshot() -> Any:
    """Opaque copy of the registry and device state, for :func:`restore` (tests)."""
    _devices.load_plugins()  # plugins' kernels and absences belong to the state restored
    r = _REGISTRY
    kern = {op: {d: list(es) for d, es in by.items()} for op, by in r.kernels.items()}
    st = _devices.STATE
    return (
        kern,
        dict(r.decomps),
        dict(r.dtype_arg),
        dict(st.chains),
        st.default,
        dict(st.memories),
        dict(st.unavailable),
    )


def restore(snap: Any) -> None:
    """Put back the state captured by :func:`snapshot`."""
    kern, decomps, dtype_arg, chains, default, memories, unavailable = snap
    _REGISTRY.kernels.clear()
    _REGISTRY.kernels.update({op: {d: list(es) for d, es in by.items()} for op, by in kern.items()})
    _REGISTRY.decomps.clear()
    _REGISTRY.decomps.update(decomps)
    _REGISTRY.dtype_arg.clear()
    _REGISTRY.dtype_arg.update(dtype_arg)
    _devices.STATE.chains = dict(chains)
    _devices.STATE.default = default
    _devices.STATE.memories = dict(memories)
    _devices.STATE.unavailable = dict(unavailable)
    _invalidate()


_DEVICES: list[Any] = [-1, frozenset()]  # [registry generation, devices with a kernel then]


def registered_devices() -> set[str]:
    """Devices that have at least one kernel (recomputed only after a registry change: every
    ``ops.device(...)`` block and session run asks)."""
    gen = _GENERATION[0]
    if _DEVICES[0] != gen:
        _DEVICES[1] = frozenset(d for by in _REGISTRY.kernels.values() for d, es in by.items() if es)
        _DEVICES[0] = gen
    return set(_DEVICES[1])


def _all_ops() -> list[str]:
    ops = {op for op, by in _REGISTRY.kernels.items() if any(by.values())}
    return sorted(ops | set(_REGISTRY.decomps))


def _plan(name: str, device: str, dt: Any, *, decompose: bool = True) -> Plan:
    _devices.load_plugins()
    if name not in _REGISTRY.decomps and not any(_REGISTRY.kernels.get(name, {}).values()):
        raise UnknownOpError(name, _all_ops())
    _devices.validate_device(device, registered_devices())
    chain = _devices.get_fallback_chain(device)
    plan = resolve(_REGISTRY.kernels, _REGISTRY.decomps, name, device, dt, chain, decompose=decompose)
    if plan is None:
        tried = [device, *(["decomposition"] if name in _REGISTRY.decomps else []), *chain]
        raise NoKernelError(
            name, device, dt, registered_summary(_REGISTRY.kernels, _REGISTRY.decomps, name), tried
        )
    return plan


def _miss(name: str, device: str, dt: Any) -> tuple[Callable[..., Any], Plan | None]:
    get_fallback_policy()  # an invalid OPSTRATA_FALLBACK fails on the first call, not the first fallback
    gen = _GENERATION[0]
    plan = _plan(name, device, dt)
    hit = (plan.fn, None if plan.path == NATIVE else plan)
    if gen == _GENERATION[0]:
        _CACHE[(name, device, dt)] = hit
    return hit


def _run_fallback(plan: Plan, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    active = _ACTIVE.get()
    if plan.path == DECOMPOSITION and (plan.op, plan.device, DECOMPOSITION) in active:
        plan = _plan(plan.op, plan.device, plan.dtype, decompose=False)  # a decomposition calling itself
    key = audit(
        plan.op, plan.device, plan.path, plan.dtype_name, plan.reason, active[-1][0] if active else ""
    )
    src, dst = _devices.STATE.memories.get(plan.device), _devices.STATE.memories.get(plan.target)
    dev_token = _devices.CURRENT.set(plan.target)  # sub-calls without device= stay on the target
    act_token = _ACTIVE.set((*active, (plan.op, plan.device, plan.path)))
    try:
        if src is dst:
            return plan.fn(*args, **kwargs)
        mover = Mover(src, dst)  # the target computes in another memory: copy there and back
        out = mover.run(plan.fn, args, kwargs)
        record_copies(key, mover.nbytes, mover.seconds)
        return out
    finally:
        _ACTIVE.reset(act_token)
        _devices.CURRENT.reset(dev_token)


_DTYPE_ARG = _REGISTRY.dtype_arg
_CURRENT = _devices.CURRENT
_STATE = _devices.STATE


def _primary_dtype(a: Any) -> np.dtype | None:
    """Dtype of a non-array primary argument: a sequence (concat's list) keys on its first element."""
    if isinstance(a, (list, tuple)):
        return _primary_dtype(a[0]) if a else None
    return getattr(a, "dtype", None) or np.asarray(a).dtype


def call(name: str, *args: Any, device: str | None = None, **kwargs: Any) -> Any:
    """Dispatch op ``name`` on ``device`` (default: the current device) by its primary argument's dtype.

    Runs the device's kernel, else the audited fallback chain (decomposition, then other devices).

    >>> import numpy as np, opstrata.ops as ops
    >>> ops.call("add", np.ones(2, np.float32), np.ones(2, np.float32)).tolist()  # doctest: +SKIP
    [2.0, 2.0]
    """
    if device is None:
        device = _CURRENT.get() or _STATE.default
    i = _DTYPE_ARG.get(name, 0)
    if i < len(args):
        a = args[i]
        try:
            dt = a.dtype
        except AttributeError:
            dt = _primary_dtype(a)
    else:
        dt = None
    hit = _CACHE.get((name, device, dt))
    if hit is None:
        hit = _miss(name, device, dt)
    fn, plan = hit
    if plan is None:
        return fn(*args, **kwargs)
    return _run_fallback(plan, args, kwargs)


def registry_generation() -> int:
    """A counter bumped by every registry or device change: a caller caching :func:`resolve_kernel`
    results re-resolves when it moved."""
    return _GENERATION[0]


def bind(
    name: str, *args: Any, out: Any, device: str | None = None, **kwargs: Any
) -> Callable[[], Any] | None:
    """A zero-argument call doing ``call(name, *args, out=out, **kwargs)`` on these very arrays, or None
    when the call would take a fallback path (which :func:`call` audits at each call).

    For callers that run the same op on the same buffers many times (opstrata.runtime's arena: every
    view is fixed per input shape): a kernel with a ``binder`` attribute validates the operands once
    and returns its inner call (the same arithmetic, so the same bits); other kernels are bound with
    their arguments when they take ``out=`` (None when they do not). The binding stands until
    :func:`registry_generation` changes.
    """
    i = _DTYPE_ARG.get(name, 0)
    dtype = getattr(args[i], "dtype", None) if i < len(args) else None
    fn = resolve_kernel(name, dtype, device)
    if fn is None:
        return None
    binder = getattr(fn, "binder", None)
    if binder is not None:
        bound = binder(*args, out=out, **kwargs)
        if bound is not None:
            return bound
    try:
        takes_out = "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_out = False
    return partial(fn, *args, out=out, **kwargs) if takes_out else None


def resolve_kernel(name: str, dtype: Any, device: str | None = None) -> Callable[..., Any] | None:
    """The kernel :func:`call` would run for op ``name`` on ``device`` with a primary argument of
    ``dtype``, when that is the device's own (native) kernel; None when the call takes a fallback path
    (decomposition or another device, which :func:`call` audits) or none exists. For callers that bind
    a kernel once and call it many times (opstrata.runtime's arena runs); pair with :func:`registry_generation`.
    """
    dev = device or _CURRENT.get() or _STATE.default
    dt = None if dtype is None else np.dtype(dtype)
    try:
        fn, plan = _CACHE.get((name, dev, dt)) or _miss(name, dev, dt)
    except (LookupError, NotImplementedError):  # unknown op or device, no kernel: call() raises it
        return None
    return fn if plan is None else None


def list_ops(device: str | None = None) -> list[str]:
    """Registered op names (with a kernel or a decomposition); with ``device``, those native there."""
    _devices.load_plugins()
    if device is None:
        return _all_ops()
    return sorted(op for op, by in _REGISTRY.kernels.items() if by.get(device))


def list_devices() -> list[str]:
    """Every device: built-in (ref, cpu), plugins and any with registered kernels."""
    return _devices.known_devices(registered_devices())


def kernels(op: str) -> list[KernelEntry]:
    """The kernels registered for ``op``, by device then dispatch order."""
    _devices.load_plugins()
    if op not in _all_ops():
        raise UnknownOpError(op, _all_ops())
    by = _REGISTRY.kernels.get(op, {})
    return [e for dev in sorted(by) for e in by[dev]]


def dispatch_path(op: str, device: str | None = None, dtype: Any = "float32") -> str:
    """The path a call would take: ``"native"``, ``"decomposition"`` or ``"device:<name>"`` (no audit)."""
    dev = device or _devices.get_default_device()
    return _plan(op, dev, None if dtype is None else np.dtype(dtype)).path


def coverage(
    ops: Iterable[str] | None = None,
    devices: Iterable[str] | None = None,
    dtypes: Iterable[Any] | None = None,
) -> dict[str, dict[str, dict[str, str]]]:
    """``{op: {device: {dtype: cell}}}`` with cells ``native | decomposed | fallback:<dev> | missing``."""
    from ._dtypes import ALL_DTYPES

    ops = list_ops() if ops is None else list(ops)
    devices = list_devices() if devices is None else list(devices)
    dts = [np.dtype(d) for d in (ALL_DTYPES if dtypes is None else dtypes)]
    cells = {NATIVE: "native", DECOMPOSITION: "decomposed"}
    out: dict[str, dict[str, dict[str, str]]] = {}
    for op in ops:
        for dev in devices:
            chain = _devices.get_fallback_chain(dev)
            row = out.setdefault(op, {}).setdefault(dev, {})
            for dt in dts:
                plan = resolve(_REGISTRY.kernels, _REGISTRY.decomps, op, dev, dt, chain)
                row[str(dt)] = (
                    "missing"
                    if plan is None
                    else cells.get(plan.path, plan.path.replace("device:", "fallback:"))
                )
    return out
