"""The ``ai.opstrata::AllReduce`` collective op: shape rule, ONNX exporter, executor kernel and backend hook.

Tensor-parallel rank graphs (Megatron-LM, Shoeybi et al. 2019) end each row-parallel layer with an
AllReduce. The op is one OpDef row (opdefs/registry.py) plus its exporter so the
rest of the package needs no special case. It executes through the ``all_reduce`` op of opstrata.ops
(so plans bind it like any kernel): ops' kernel is a world of one, and opstrata.comm registers the
multi-process kernel when a process group is initialised. A *collective backend* — an object with
``all_reduce(x, *, op, node) -> ndarray`` — installed with :func:`use_collectives` takes precedence:
the in-process simulator (``simulate_tensor_parallel``) is one.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

import opstrata.ops as ops

from .._errors import GraphError
from .._ir import OPSTRATA_DOMAIN, Node
from .._shape_rules import RuleContext, TypeShape
from ..onnx.export import FUNCTION_DOMAIN, ExportContext, register_export
from ..opdefs.registry import define

__all__ = ["ALL_REDUCE", "REDUCE_OPS", "Collectives", "current_collectives", "use_collectives"]

#: Op type of the collective (domain ``ai.opstrata``); attrs ``op`` (see REDUCE_OPS) and ``group_size``.
ALL_REDUCE = "AllReduce"
#: Reductions an AllReduce may apply across ranks (as ``torch.distributed.ReduceOp``).
REDUCE_OPS = ("sum", "avg", "max", "min")


class Collectives(Protocol):
    """What the executor needs from a collective backend (one instance per rank)."""

    def all_reduce(self, x: np.ndarray, *, op: str, node: Node) -> np.ndarray:
        """Reduce ``x`` across the group with ``op`` and return the result (same shape and dtype)."""
        ...


_BACKEND: contextvars.ContextVar[Collectives | None] = contextvars.ContextVar(
    "opstrata_graph_collectives", default=None
)


def current_collectives() -> Collectives | None:
    """The collective backend installed in this context (None outside :func:`use_collectives`)."""
    return _BACKEND.get()


@contextlib.contextmanager
def use_collectives(backend: Collectives | None) -> Iterator[None]:
    """Run ``run_graph`` calls in this block (this thread / context) with ``backend`` for collectives."""
    token = _BACKEND.set(backend)
    try:
        yield
    finally:
        _BACKEND.reset(token)


def _attrs(n: Node) -> tuple[str, int]:
    op, size = n.attrs.get("op", "sum"), n.attrs.get("group_size", 1)
    where = f"node '{n.name}' ({n.qualified_type})"
    if op not in REDUCE_OPS:
        raise GraphError(where, f"attribute op={op!r} is not a reduction", f"use one of {REDUCE_OPS}")
    if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 1:
        raise GraphError(where, f"attribute group_size={size!r} must be an int >= 1", "set the group size")
    return op, int(size)


# --------------------------------------------------------------------------- shape rule


def _all_reduce_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    _attrs(n)
    if len([x for x in n.inputs if x]) != 1 or len(n.outputs) != 1:
        raise ctx.fail(
            f"AllReduce takes one input and one output, got {len(n.inputs)} -> {len(n.outputs)}",
            "reduce one tensor per node",
        )
    return [(ctx.dtype(0), ctx.shape(0))]  # identity: every rank holds the whole reduced tensor


# --------------------------------------------------------------------------- ONNX export


def _identity_body(node: Node, ctx: ExportContext) -> None:
    ctx.emit("Identity", [node.inputs[0]], [node.outputs[0]])


def _export_all_reduce(node: Node, ctx: ExportContext) -> None:
    """A model-local function with an Identity body, documented as a collective (one rank runs alone)."""
    op, size = _attrs(node)
    state = getattr(ctx._model, "parent", ctx._model)  # the export's shared function table
    fname = state.function_for(node, ctx, _identity_body)
    for fp in state.functions.values():
        if fp.name == fname and not fp.doc_string:
            fp.doc_string = (
                f"ai.opstrata::AllReduce(op={op}, group_size={size}): a tensor-parallel collective that "
                f"reduces this tensor across {size} ranks. The body is Identity so that one rank's graph "
                "runs alone (e.g. in onnxruntime) and yields that rank's partial value; the reduced result "
                "needs all ranks (opstrata.graph.simulate_tensor_parallel or opstrata.comm)."
            )
    call = ctx.emit(fname, [node.inputs[0]], node.outputs, domain=FUNCTION_DOMAIN)
    call.doc_string = f"AllReduce op={op} group_size={size}"


register_export(ALL_REDUCE, _export_all_reduce, domain=OPSTRATA_DOMAIN)


# --------------------------------------------------------------------------- executor


def _all_reduce(n: Node, x: list[Any]) -> list[np.ndarray]:
    """The installed backend if any (the simulator), else the ``all_reduce`` op of opstrata.ops.

    ops' own kernel is a world of one; opstrata.comm registers the multi-process kernel at
    ``init_process_group``, so a rank graph runs its collectives wherever it is executed.
    """
    op, size = _attrs(n)
    backend = _BACKEND.get()
    if backend is not None:
        return [np.asarray(backend.all_reduce(x[0], op=op, node=n))]
    try:
        return [ops.all_reduce(x[0], op=op, group_size=size)]
    except ops.OpError as exc:
        if exc.argument != "group_size":
            raise
        raise GraphError(
            f"node '{n.name}' ({n.qualified_type})",
            f"an AllReduce over {size} ranks needs the other ranks, and no collective kernel is registered",
            "call opstrata.comm.init_process_group in each rank's process (it registers the all_reduce "
            "kernel), or run the rank graphs together with "
            "opstrata.graph.simulate_tensor_parallel(rank_graphs, feeds)",
        ) from exc


define(
    ALL_REDUCE, OPSTRATA_DOMAIN, shape=_all_reduce_rule, kernel=_all_reduce, uses=("all_reduce",), onnx=False,
    doc="a tensor-parallel collective: op (sum/avg/max/min) across group_size ranks",
)  # fmt: skip
