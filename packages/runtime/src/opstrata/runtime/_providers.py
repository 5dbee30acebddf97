"""Which device a session runs on: ``device=`` or onnxruntime's ``providers=[...]`` spelling.

``providers`` is read as onnxruntime reads it: the first provider whose device is usable here wins;
a listed device that is absent (cuda without a GPU) is skipped with a warning that gives the reason,
and none usable is an error naming each reason. Names map ``CUDAExecutionProvider -> cuda``,
``CPUExecutionProvider -> cpu``; opstrata device names are accepted as they are.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import opstrata.ops as ops

from ._errors import InvalidArgument

__all__ = ["PROVIDER_DEVICES", "provider_option", "resolve_device"]

PROVIDER_DEVICES: dict[str, str] = {"CUDAExecutionProvider": "cuda", "CPUExecutionProvider": "cpu"}


def _absent_reason(name: str) -> str:
    if not hasattr(ops, "device_status"):  # opstrata-ops before 0.4.67 knows no absent devices
        return ""
    return next((s.reason for s in ops.device_status() if s.name == name and not s.available), "")


def _check(where: str, device: Any) -> str:
    if isinstance(device, str) and device in ops.list_devices():
        return device
    why = _absent_reason(device) if isinstance(device, str) else ""
    if why:
        raise InvalidArgument(
            where, f"device {device!r} is not available here: {why}", f"use one of {ops.list_devices()}"
        )
    raise InvalidArgument(where, f"unknown device {device!r}", f"use one of {ops.list_devices()}")


def resolve_device(device: str | None, providers: Sequence[Any] | None) -> str:
    """The session's device from ``device`` (default cpu) or ``providers`` (not both)."""
    where = "InferenceSession"
    if providers is None:
        return _check(where, "cpu" if device is None else device)
    if device is not None:
        raise InvalidArgument(where, "both device= and providers= were given", "pass one of them")
    if isinstance(providers, str) or not providers:
        raise InvalidArgument(where, f"providers must be a non-empty list of names, got {providers!r}", 'e.g. providers=["CUDAExecutionProvider", "CPUExecutionProvider"]')  # fmt: skip
    skipped = []
    for p in providers:
        name = p[0] if isinstance(p, tuple) else p  # onnxruntime also takes (name, options) pairs
        if not isinstance(name, str):
            raise InvalidArgument(where, f"provider {p!r} is not a name", 'e.g. "CUDAExecutionProvider"')
        dev = PROVIDER_DEVICES.get(name, name)
        if dev in ops.list_devices():
            if skipped:
                warnings.warn(
                    f"InferenceSession: {'; '.join(skipped)}; running on '{dev}'",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return dev
        why = (
            _absent_reason(dev)
            or f"unknown provider (known: {sorted(PROVIDER_DEVICES)} or {ops.list_devices()})"
        )
        skipped.append(f"{name} skipped: {why}")
    raise InvalidArgument(where, f"no listed provider is usable here: {'; '.join(skipped)}", f"add 'CPUExecutionProvider' or use one of {ops.list_devices()}")  # fmt: skip


def provider_option(providers: Sequence[Any] | None, device: str, key: str) -> bool:
    """True when the provider chosen for ``device`` was given ``(name, {key: true})``, as onnxruntime's
    ``("CUDAExecutionProvider", {"enable_cuda_graph": "1"})``; "0" / "false" / False read as off."""
    for p in providers or ():
        if isinstance(p, tuple) and len(p) == 2 and PROVIDER_DEVICES.get(p[0], p[0]) == device:
            value = dict(p[1]).get(key, False)
            return str(value).strip().lower() not in ("", "0", "false", "none")
    return False
