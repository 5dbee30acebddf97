"""Errors raised by ops and the dispatcher, and the argument checks kernels use to raise them.

Every message names the op, the argument, what was expected, what was found and, where there is
one, the way out: ``softmax: argument 'x' expected a floating dtype, got int32``.

Kernels validate with the helpers here so the wording is uniform::

    check_dtype("softmax", "x", x, "floating")
    check_ndim("conv2d", "x", x, 4, layout="NCHW")
    check_shape_match("matmul", "a", a, "b", b, axis_a=-1, axis_b=-2)
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "DevicePluginError",
    "FallbackError",
    "FallbackWarning",
    "NoKernelError",
    "OpError",
    "UnknownDeviceError",
    "UnknownOpError",
    "check_broadcastable",
    "check_dtype",
    "check_ndim",
    "check_shape_match",
]

#: Dtype categories accepted by :func:`check_dtype` as ``allowed``; kind letters per numpy.
_CATEGORIES: dict[str, tuple[str, str]] = {
    "floating": ("a floating dtype", "f"),
    "integer": ("an integer dtype", "iu"),
    "signed": ("a signed integer dtype", "i"),
    "index": ("an integer index dtype", "iu"),
    "numeric": ("a numeric dtype", "fiu"),
    "bool": ("a bool dtype", "b"),
}


class OpError(ValueError):
    """An op received an argument of the wrong dtype, rank or shape."""

    def __init__(self, op: str, argument: str, expected: str, actual: str, fix: str | None = None) -> None:
        self.op, self.argument, self.expected, self.actual, self.fix = op, argument, expected, actual, fix
        msg = f"{op}: argument '{argument}' expected {expected}, got {actual}"
        super().__init__(msg + (f". Fix: {fix}" if fix else ""))


class UnknownOpError(LookupError):
    """No op of this name is registered on any device; the message suggests the closest names."""

    def __init__(self, op: str, known: Iterable[str]) -> None:
        known = sorted(known)
        self.op = op
        self.suggestions: list[str] = difflib.get_close_matches(op, known, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(repr(s) for s in self.suggestions)}?" if self.suggestions else ""
        super().__init__(
            f"unknown op {op!r}{hint} ({len(known)} ops are registered: see opstrata.ops.list_ops(), "
            "or docs/op-coverage.md for the op x device x dtype table)"
        )


class NoKernelError(NotImplementedError):
    """Nothing in the fallback chain (native kernel, decomposition, other devices) can run the call."""

    def __init__(
        self,
        op: str,
        device: str,
        dtype: np.dtype | None,
        registered: Mapping[str, str],
        tried: Sequence[str] = (),
    ) -> None:
        self.op, self.device, self.dtype = op, device, dtype
        self.registered, self.tried = dict(registered), list(tried)
        where = "; ".join(f"{d}: {dts}" for d, dts in sorted(self.registered.items())) or "no device"
        tried_txt = f" Tried: {' -> '.join(self.tried)}." if self.tried else ""
        super().__init__(
            f"{op}: no kernel for device {device!r} and dtype {dtype}.{tried_txt} Registered: {where}. "
            f"Fix: pass device= one of those, cast the input to a registered dtype, "
            f"or register a kernel with @opstrata.ops.register({op!r}, device={device!r}, dtypes=[...])"
        )


class UnknownDeviceError(LookupError):
    """A device name that no built-in, plugin or registered kernel provides."""

    def __init__(self, device: str, known: Iterable[str]) -> None:
        known = sorted(known)
        self.device, self.known = device, known
        close = difflib.get_close_matches(device, known, n=2, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        super().__init__(
            f"unknown device {device!r}{hint} Known devices: {', '.join(known)}. Other devices come from "
            "installed distributions declaring an 'opstrata.devices' entry point"
        )


class DeviceUnavailableError(UnknownDeviceError):
    """A device whose plugin is installed but found it absent on this machine (no GPU, no driver)."""

    def __init__(self, device: str, reason: str, known: Iterable[str]) -> None:
        self.reason = reason
        LookupError.__init__(
            self,
            f"device {device!r} is not available here: {reason}. Usable devices here: "
            f"{', '.join(sorted(known))} (`opstrata info` lists every device and why one is absent)",
        )
        self.device, self.known = device, sorted(known)


class DevicePluginError(RuntimeError):
    """A third-party device's ``opstrata.devices`` entry point failed to load."""

    def __init__(self, device: str, entry_point: str, cause: BaseException, skip_env: str) -> None:
        self.device, self.entry_point, self.cause = device, entry_point, cause
        super().__init__(
            f"device plugin {device!r} failed to load (entry point 'opstrata.devices': {entry_point}): "
            f"{type(cause).__name__}: {cause}. Fix: repair or uninstall that distribution, "
            f"or skip it with {skip_env}={device}"
        )


class FallbackWarning(UserWarning):
    """A call did not run on its requested device's native kernel (policy ``warn``)."""


class FallbackError(RuntimeError):
    """A call would have fallen back while the policy is ``error``; the message holds the audit text."""

    def __init__(self, message: str, record: Any = None) -> None:
        self.record = record
        super().__init__(message)


#: The cast a message suggests for each category.
_SUGGEST = {
    "floating": "float32",
    "integer": "int64",
    "signed": "int64",
    "index": "int64",
    "numeric": "float32",
    "bool": "bool",
}


def _suggest(allowed: list[np.dtype]) -> str:
    return "float32" if np.dtype("float32") in allowed else str(allowed[0])


def _cast_fix(arg_name: str, dtype: str) -> str:
    if arg_name.isidentifier():
        return f"cast '{arg_name}' first, e.g. {arg_name}.astype({dtype!r})"
    return f"cast '{arg_name}' to {dtype}"


def _describe(array: Any) -> tuple[np.dtype, tuple[int, ...]]:
    """(dtype, shape) of an array-like without copying arrays."""
    if not hasattr(array, "dtype") or not hasattr(array, "shape"):
        array = np.asarray(array)
    return np.dtype(array.dtype), tuple(array.shape)


#: id(allowed dtype tuple) -> (that tuple, its dtypes as a set): check_dtype's fast path (the tuple is
#: kept, so its id cannot be reused while cached)
_ALLOWED: dict[int, tuple[Any, frozenset[np.dtype]]] = {}


def check_dtype(op: str, arg_name: str, array: Any, allowed: str | Iterable[Any]) -> np.dtype:
    """Raise :class:`OpError` unless ``array``'s dtype is allowed; return the dtype.

    ``allowed`` is a category (``"floating"``, ``"integer"``, ``"signed"``, ``"index"``,
    ``"numeric"``, ``"bool"``) or an iterable of dtypes.
    """
    if type(array) is np.ndarray and type(allowed) in (tuple, frozenset):  # the common call: no list built
        entry = _ALLOWED.get(id(allowed))
        if entry is None or entry[0] is not allowed:
            if len(_ALLOWED) > 512:
                _ALLOWED.clear()
            entry = _ALLOWED[id(allowed)] = (allowed, frozenset(np.dtype(d) for d in allowed))
        if array.dtype in entry[1]:
            return array.dtype
    dtype, _ = _describe(array)
    if isinstance(allowed, str):
        if allowed not in _CATEGORIES:
            raise ValueError(
                f"check_dtype: unknown category {allowed!r}; expected one of {sorted(_CATEGORIES)}"
            )
        text, kinds = _CATEGORIES[allowed]
        # ml_dtypes floats (bfloat16, float8) report kind "V"; treat them as floating.
        kind = "f" if dtype.kind == "V" and "float" in dtype.name else dtype.kind
        if kind not in kinds:
            raise OpError(op, arg_name, text, str(dtype), fix=_cast_fix(arg_name, _SUGGEST[allowed]))
        return dtype
    allowed_set = [np.dtype(d) for d in allowed]
    if dtype not in allowed_set:
        names = ", ".join(str(d) for d in allowed_set)
        raise OpError(
            op, arg_name, f"one of ({names})", str(dtype), fix=_cast_fix(arg_name, _suggest(allowed_set))
        )
    return dtype


def check_ndim(
    op: str,
    arg_name: str,
    array: Any,
    ndim: int | tuple[int, int | None] | Iterable[int],
    *,
    layout: str = "",
) -> int:
    """Raise :class:`OpError` unless ``array.ndim`` fits ``ndim``; return the ndim.

    ``ndim`` is an int, an inclusive ``(lo, hi)`` tuple (``hi`` None for no upper bound), or an
    iterable such as ``range(2, 5)`` or ``{3, 4}``. ``layout`` (e.g. ``"NCHW"``) is shown in the message.
    """
    if type(array) is np.ndarray:  # the common call: ok without building the message
        n = array.ndim
        if type(ndim) is int:
            if n == ndim:
                return n
        elif type(ndim) is tuple and len(ndim) == 2 and n >= ndim[0] and (ndim[1] is None or n <= ndim[1]):
            return n
    _, shape = _describe(array)
    n = len(shape)
    if isinstance(ndim, int):
        ok, text = n == ndim, f"{ndim} dims"
    elif isinstance(ndim, tuple) and len(ndim) == 2 and not isinstance(ndim, range):
        lo, hi = ndim
        ok = n >= lo and (hi is None or n <= hi)
        text = f"at least {lo} dims" if hi is None else f"{lo} to {hi} dims"
    else:
        allowed = sorted(ndim)
        ok, text = n in allowed, f"one of {allowed} dims"
    if not ok:
        layout_txt = f" ({layout})" if layout else ""
        raise OpError(op, arg_name, text + layout_txt, f"{n} dims with shape {shape}")
    return n


def check_shape_match(
    op: str,
    arg_a: str,
    a: Any,
    arg_b: str,
    b: Any,
    *,
    axis_a: int | None = None,
    axis_b: int | None = None,
) -> None:
    """Raise :class:`OpError` unless the shapes of ``a`` and ``b`` are equal (or their chosen axes are).

    With ``axis_a``/``axis_b`` only those dims are compared (``axis_b`` defaults to ``axis_a``):
    ``check_shape_match("matmul", "a", a, "b", b, axis_a=-1, axis_b=-2)``.
    """
    _, sa = _describe(a)
    _, sb = _describe(b)
    if axis_a is None and axis_b is None:
        if sa != sb:
            raise OpError(op, arg_b, f"the shape of '{arg_a}' {sa}", str(sb))
        return
    ia = axis_a if axis_a is not None else axis_b
    ib = axis_b if axis_b is not None else axis_a
    assert ia is not None and ib is not None
    for name, shape, axis in ((arg_a, sa, ia), (arg_b, sb, ib)):
        if not -len(shape) <= axis < len(shape):
            raise OpError(op, name, f"a dim at axis {axis}", f"shape {shape} with {len(shape)} dims")
    if sa[ia] != sb[ib]:
        raise OpError(
            op,
            arg_b,
            f"dim {ib} to equal dim {ia} of '{arg_a}' ({sa[ia]})",
            f"{sb[ib]}; shapes {sa} and {sb}",
        )


def check_broadcastable(op: str, arg_a: str, a: Any, arg_b: str, b: Any) -> tuple[int, ...]:
    """Raise :class:`OpError` unless ``a`` and ``b`` broadcast (numpy rules); return the result shape."""
    _, sa = _describe(a)
    _, sb = _describe(b)
    try:
        return tuple(np.broadcast_shapes(sa, sb))
    except ValueError:
        raise OpError(op, arg_b, f"a shape broadcastable with '{arg_a}' {sa}", str(sb)) from None
