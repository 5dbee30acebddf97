"""Tensor parallelism through the runtime: comm's kernel for the ``all_reduce`` op of opstrata.ops.

opstrata.ops defines ``all_reduce`` with a world-of-one kernel; the graph's ``ai.opstrata::AllReduce``
nodes (inserted by ``opstrata.graph.partition``) bind to it, so ``InferenceSession`` runs them like any
other kernel. ``init_process_group`` registers :func:`_all_reduce_kernel` on ``cpu`` at a higher
priority and ``destroy_process_group`` removes exactly that kernel again: a rank graph then reduces
across the processes of the tensor-parallel group (the default group unless
:func:`set_tensor_parallel_group` chose another), and nothing below comm imports comm.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import opstrata.ops as ops

from ._group import NON_GROUP_MEMBER, ProcessGroup

__all__ = ["KERNEL_PRIORITY", "get_tensor_parallel_group", "set_tensor_parallel_group"]

#: Dispatch priority of comm's ``all_reduce`` kernel on cpu (above ops' world-of-one kernel at 0).
KERNEL_PRIORITY = 100

_state: dict[str, Any] = {"default": None, "tp": None}


def _all_reduce_kernel(x: Any, *, op: str = "sum", group_size: int = 1) -> np.ndarray:
    """``x`` reduced across the tensor-parallel group; a new array (the input may be an arena view)."""
    group: ProcessGroup | None = _state["tp"] or _state["default"]
    if group is None:  # registered but torn down underneath: behave like a world of one would
        raise RuntimeError(
            "all_reduce: the process group this kernel served was destroyed; call "
            "opstrata.comm.init_process_group again"
        )
    if group_size != group.size:
        which = "the default group" if _state["tp"] is None else f"tensor-parallel group {group.gid}"
        raise ValueError(
            f"all_reduce: the graph was partitioned for group_size={group_size} ranks but {which} has "
            f"{group.size} ranks; partition with tp={group.size}, launch {group_size} processes "
            f"(opstrata-launch --nproc {group_size}), or choose a group of that size with "
            "opstrata.comm.set_tensor_parallel_group"
        )
    out = np.array(x, copy=True, order="C")
    group.all_reduce(out, op, None, False, None)
    return out


def set_tensor_parallel_group(group: ProcessGroup | None) -> None:
    """Reduce graph AllReduce nodes over ``group`` (from ``new_group``) instead of the default group; None resets.

    Needed when tensor parallelism spans part of the world (e.g. tp=2 inside a data-parallel job of 4).
    """
    if group is NON_GROUP_MEMBER:
        raise ValueError(
            "set_tensor_parallel_group: this rank is not a member of that group (new_group returned "
            "NON_GROUP_MEMBER); pass the group this rank belongs to"
        )
    if group is not None and not isinstance(group, ProcessGroup):
        raise TypeError(
            f"set_tensor_parallel_group: expected a ProcessGroup from new_group() or None, got {type(group).__name__}"
        )
    if _state["default"] is None:
        raise RuntimeError(
            "set_tensor_parallel_group: no process group is initialised; call init_process_group() first"
        )
    _state["tp"] = group


def get_tensor_parallel_group() -> ProcessGroup | None:
    """The group graph AllReduce nodes reduce over (None when no process group is initialised)."""
    return _state["tp"] or _state["default"]


def forget(group: ProcessGroup) -> None:
    """A destroyed subgroup stops being the tensor-parallel group (AllReduce nodes use the default again)."""
    if _state["tp"] is group:
        _state["tp"] = None


def install(default: ProcessGroup) -> None:
    """Register comm's ``all_reduce`` kernel for ``default`` (called by ``init_process_group``)."""
    _state["default"], _state["tp"] = default, None
    if not hasattr(ops, "all_reduce"):  # an opstrata-ops older than the op: nothing to fill
        return
    ops.register("all_reduce", device="cpu", dtypes=ops.ALL_DTYPES, priority=KERNEL_PRIORITY)(
        _all_reduce_kernel
    )


def uninstall() -> None:
    """Remove the kernel again, leaving ops' own kernels (called when the default group is destroyed)."""
    _state["default"], _state["tp"] = None, None
    if hasattr(ops, "all_reduce"):
        ops.unregister("all_reduce", device="cpu", kernel=_all_reduce_kernel)
