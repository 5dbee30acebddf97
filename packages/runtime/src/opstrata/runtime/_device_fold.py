"""Host steps a device session computes once per input shape: the shape subgraphs exporters emit.

A torch.onnx export of a transformer spends most of its nodes on shape arithmetic (Shape -> Gather ->
Unsqueeze -> Concat -> Reshape targets, Range / Expand for positions and masks): GPT-2's TorchScript
export runs 132 of its 180 nodes on the host, each a Python call per run. Once the feeds' shapes are
fixed their results are too (the cpu session folds them into its arena the same way,
``_bound.shape_static_steps``), so a device session's first eager run at a shape keeps them (read-only,
up to ``FOLD_MAX_BYTES`` each) and later runs skip those steps; a device copy a device node reads is
made once and kept beside them. A shape whose values' shapes depend on the feeds' values (the memory
plan's ``dynamic`` values) folds only what follows from the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from opstrata.graph import GraphError, plan_memory

from ._bound import FOLD_MAX_BYTES, NOT_PURE, SHAPE_ONLY

if TYPE_CHECKING:
    from ._device_exec import DeviceProgram

__all__ = ["Folded", "fold", "keep", "static_steps"]


@dataclass
class Folded:
    """One input-shape signature's run without its folded steps."""

    order: list[int]  # the steps a run executes, in order
    frees: list[list[str]]  # per entry of ``order``: the values dead after it
    values: dict[str, Any]  # the folded steps' results (read-only host arrays, numpy scalars)
    skipped: int = 0  # steps left out of ``order``
    uploads: dict[str, Any] = field(
        default_factory=dict
    )  # their device copies, made once, for device readers


def static_steps(prog: DeviceProgram, shapes: dict[str, Sequence[int]]) -> set[int]:
    """Steps whose results follow from the feeds' shapes alone: ``Shape`` / ``Size`` of a value whose shape
    does (not one of the memory plan's ``dynamic`` values), and pure host steps reading only initializers
    and such results."""
    graph = prog.graph
    try:
        plan = plan_memory(graph, input_shapes=shapes, dynamic=True)
    except GraphError:
        return set()  # shapes the planner cannot make concrete: nothing is known to be fixed
    sized = set(graph.inputs) | set(graph.initializers) | (set(plan.shapes) - set(plan.dynamic))
    static = set(graph.initializers)
    found: set[int] = set()
    for i, (n, on_dev, _) in enumerate(prog.steps):
        ins = [x for x in n.inputs if x]
        outs = [o for o in n.outputs if o]
        if not ins or not outs or n.op_type in NOT_PURE or n.domain not in ("", "ai.onnx"):
            continue
        if n.op_type in SHAPE_ONLY:
            ok = ins[0] in sized
        else:
            ok = not on_dev and all(x in static for x in ins)
        if ok:
            found.add(i)
            static.update(outs)
    return found


def keep(prog: DeviceProgram, step: int, results: Sequence[Any], kept: dict[str, Any]) -> bool:
    """Keep a static step's results in ``kept`` when every one is a small host array (or numpy scalar, as
    a host Gather of one index gives); True when kept."""
    n = prog.steps[step][0]
    pairs = [(o, r) for o, r in zip(n.outputs, results, strict=False) if o]
    if len(pairs) != len([o for o in n.outputs if o]) or not all(
        isinstance(r, np.generic)
        or (isinstance(r, np.ndarray) and not prog.memory.is_array(r) and r.nbytes <= FOLD_MAX_BYTES)
        for _, r in pairs
    ):
        return False
    for o, r in pairs:
        if isinstance(r, np.ndarray):
            r = np.array(r, copy=True)
            r.flags.writeable = False
        kept[o] = r  # a numpy scalar is immutable already
    return True


def fold(prog: DeviceProgram, skipped: set[int], kept: dict[str, Any]) -> Folded:
    """The run order without ``skipped`` steps, and when each remaining value dies (its last executed
    reader; a result no executed step reads dies where it is made)."""
    order = [i for i in range(len(prog.steps)) if i not in skipped]
    last: dict[str, int] = {}
    for pos, i in enumerate(order):
        n = prog.steps[i][0]
        for x in (*n.inputs, *n.outputs):
            if x:
                last[x] = pos
    outputs = set(prog.graph.outputs)
    frees: list[list[str]] = [[] for _ in order]
    for x, pos in last.items():
        if x not in outputs:
            frees[pos].append(x)
    return Folded(order, frees, kept, skipped=len(skipped))
