"""The ``all_reduce`` op: the seam a communication layer fills with a real collective.

ops defines the op and its single-process meaning; it cannot talk to other processes. The ``ref``
and ``cpu`` kernels here are the *world of one*: with ``group_size=1`` the reduction over one rank
is the identity (a copy), and with ``group_size > 1`` they raise an :class:`OpError` that names the
fix, because the other ranks' values do not exist in this process. ``opstrata.comm`` registers a
``cpu`` kernel of higher priority when a process group is initialised (and removes it when the
group is destroyed), so graph nodes bound to ``all_reduce`` run the real collective without ops
(or graph, or runtime) importing anything above them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtypes import ALL_DTYPES
from .._errors import OpError
from .._registry import call, register
from .elementwise import checked

__all__ = ["REDUCE_OPS", "all_reduce"]

#: Reductions ``all_reduce`` applies across ranks (torch.distributed.ReduceOp names).
REDUCE_OPS: tuple[str, ...] = ("sum", "avg", "max", "min", "prod")


def _check(op: Any, group_size: Any) -> None:
    if op not in REDUCE_OPS:
        raise OpError("all_reduce", "op", f"one of {REDUCE_OPS}", repr(op))
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise OpError(
            "all_reduce", "group_size", "an int >= 1 (the number of ranks reducing)", repr(group_size)
        )


def all_reduce(x: Any, *, op: str = "sum", group_size: int = 1, device: str | None = None) -> np.ndarray:
    """``x`` reduced with ``op`` across the ``group_size`` ranks of the current process group (a new array).

    Without a communication layer only ``group_size=1`` runs (the identity); ``opstrata.comm`` registers
    the multi-process kernel at ``init_process_group``.

    >>> all_reduce(np.array([1.0, 2.0]), group_size=1)
    array([1., 2.])
    """
    _check(op, group_size)
    return call(
        "all_reduce", checked("all_reduce", "x", x, ALL_DTYPES), op=op, group_size=group_size, device=device
    )


def _world_of_one(x: Any, *, op: str = "sum", group_size: int = 1) -> np.ndarray:
    _check(op, group_size)
    if group_size != 1:
        raise OpError(
            "all_reduce",
            "group_size",
            "1 (no collective kernel is registered, so this process is a world of one)",
            str(group_size),
            "call opstrata.comm.init_process_group first (it registers the multi-process all_reduce kernel), "
            f"in each of {group_size} processes, e.g. under `opstrata-launch --nproc {group_size}`",
        )
    return np.array(x, copy=True)


register("all_reduce", device="ref", dtypes=ALL_DTYPES)(_world_of_one)
register("all_reduce", device="cpu", dtypes=ALL_DTYPES)(_world_of_one)
