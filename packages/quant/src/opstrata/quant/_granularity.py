"""Granularity layouts: how a tensor splits into the slices that share one scale (tensor, channel, group).

A tensor is viewed as ``rows`` (one row per scale) so every observer reduces along axis 1 whatever the
granularity; ``param_shape`` is the shape the scales take in ONNX (``()``, ``(C,)`` or the blocked shape).
"""

from __future__ import annotations

import numpy as np

from ._errors import QuantError

__all__ = ["param_shape", "to_rows", "validate_granularity"]


def validate_granularity(axis: int | None, group_size: int, where: str) -> None:
    """Reject a group size without an axis, a negative group size or a non-int axis."""
    if axis is not None and (isinstance(axis, bool) or not isinstance(axis, (int, np.integer))):
        raise QuantError(where, f"axis must be an int or None, got {axis!r}", "pass e.g. axis=0")
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 0:
        raise QuantError(where, f"group_size must be an int >= 0, got {group_size!r}", "use 0, 32, 64 or 128")
    if group_size and axis is None:
        raise QuantError(
            where,
            f"group_size={group_size} needs an axis to group along",
            "pass axis= (e.g. the input-channel axis)",
        )


def _norm_axis(axis: int, shape: tuple[int, ...], where: str) -> int:
    if not -len(shape) <= axis < len(shape):
        raise QuantError(
            where, f"axis {axis} is out of range for a tensor of shape {shape}",
            f"use an axis in [{-len(shape)}, {len(shape) - 1}]",
        )  # fmt: skip
    return axis % len(shape)


def param_shape(shape: tuple[int, ...], axis: int | None, group_size: int, where: str) -> tuple[int, ...]:
    """The shape of the scale for a tensor of ``shape``: ``()``, ``(shape[axis],)`` or blocked."""
    if axis is None:
        return ()
    ax = _norm_axis(axis, shape, where)
    if not group_size:
        return (shape[ax],)
    if shape[ax] % group_size:
        raise QuantError(
            where, f"group_size {group_size} does not divide dimension {ax} of size {shape[ax]} (shape {shape})",
            f"use a group size that divides {shape[ax]} (e.g. {_divisor_hint(shape[ax])}) or per-channel "
            "quantization (group_size=None)",
        )  # fmt: skip
    return (*shape[:ax], shape[ax] // group_size, *shape[ax + 1 :])


def _divisor_hint(n: int) -> str:
    good = [g for g in (128, 64, 32, 16) if n % g == 0]
    return str(good[0]) if good else "a divisor of the dimension"


def to_rows(
    x: np.ndarray, axis: int | None, group_size: int, where: str
) -> tuple[np.ndarray, tuple[int, ...]]:
    """``x`` as a 2-D array with one row per scale (rows ordered as ``param_shape`` flattens), and that shape."""
    pshape = param_shape(x.shape, axis, group_size, where)
    if axis is None:
        return x.reshape(1, -1), pshape
    ax = _norm_axis(axis, x.shape, where)
    if not group_size:
        return np.moveaxis(x, ax, 0).reshape(x.shape[ax], -1), pshape
    pre = int(np.prod(x.shape[:ax], dtype=np.int64))
    post = int(np.prod(x.shape[ax + 1 :], dtype=np.int64))
    nb = x.shape[ax] // group_size
    v = x.reshape(pre, nb, group_size, post).transpose(0, 1, 3, 2)
    return v.reshape(pre * nb * post, group_size), pshape
