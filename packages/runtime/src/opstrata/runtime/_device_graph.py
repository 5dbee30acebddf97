"""Device graphs for a DeviceProgram: which plans one graph can hold, recording it, replaying it.

Each input-shape signature runs eagerly once; its second run stages the feeds in buffers the graph owns,
runs the plan once more to upload every value the host makes for device readers, then records the run
through the memory's ``capture`` (CUDA: stream capture) under ``ops.capturing()``, so index checks become
device flags. A replay copies the feeds into the staged buffers, replays, raises a failed check naming
its node and returns copies of the outputs (the next replay rewrites the graph's buffers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

import opstrata.ops as ops

from ._device_nodes import HOST_INPUTS, feed_valued, node_key
from ._errors import ExecutionError

if TYPE_CHECKING:
    from ._device_exec import DeviceProgram

__all__ = ["Recorded", "c_order", "capture_blockers", "record", "replay", "stage"]


def c_order(a: np.ndarray) -> np.ndarray:
    """``a`` in C order, keeping its shape (``np.ascontiguousarray`` turns a 0-d array into 1-d)."""
    return a if a.flags.c_contiguous else np.array(a, order="C")


@dataclass
class Recorded:
    """One signature's device graph: the input buffers it reads, its outputs and its deferred checks."""

    graph: Any  # ops.DeviceGraph: .result = (outputs, checks), .replay()
    staged: dict[str, Any]  # feed name -> the device buffer the graph reads it from
    outputs: dict[str, Any] = field(default_factory=dict)  # graph output -> device array (or a host constant)
    checks: list[Any] = field(default_factory=list)  # ops.DeferredCheck, flags rewritten by each replay


def capture_blockers(prog: DeviceProgram) -> list[str]:
    """Why this plan cannot be recorded as one device graph (empty: it can).

    A recorded graph replays device work only: a host node runs once, while recording, so its result
    must follow from the input shapes alone (Shape outputs, initializers), and it may not read a value
    the device made (a copy down is illegal while recording).
    """
    if getattr(prog.memory, "capture", None) is None:
        return [f"device '{prog.device}' cannot record device graphs (its memory has no capture)"]
    on_feeds = feed_valued(prog.graph)
    made_on_device: set[str] = set()
    out: list[str] = []
    for n, on_dev, _ in prog.steps:
        if node_key(n) in (("", "Shape"), ("", "Size")):
            continue  # reads metadata: its output follows from shapes
        host_pos = HOST_INPUTS.get(node_key(n), frozenset()) if on_dev else frozenset(range(len(n.inputs)))
        for k, x in enumerate(n.inputs):
            if not x or k not in host_pos:
                continue
            if x in made_on_device:
                out.append(f"node '{n.name}' ({n.qualified_type}) reads '{x}' from the device on the host")
                break
            if x in on_feeds:
                out.append(f"node '{n.name}' ({n.qualified_type}) computes on the host from the values of the feeds ('{x}')")  # fmt: skip
                break
        if on_dev:
            made_on_device.update(o for o in n.outputs if o)
    return out


def stage(prog: DeviceProgram, buf: Any, v: Any) -> None:
    """Copy a feed into the graph's input buffer (host arrays up; device arrays within the device)."""
    if prog.memory.is_array(v):
        buf[...] = v
    else:
        prog.memory.from_host(c_order(np.asarray(v, dtype=buf.dtype)), out=buf)


def record(prog: DeviceProgram, feeds: dict[str, Any]) -> Recorded:
    """Record the plan for these feeds' shapes: upload the feeds into buffers the graph owns, run once to
    upload every host-made value the device reads, then capture the run that reuses those copies."""
    mem = prog.memory
    staged = {x: v.copy() if mem.is_array(v) else mem.from_host(c_order(v)) for x, v in feeds.items()}
    hoisted: dict[str, Any] = {}
    prog._execute(dict(staged), hoisted=hoisted)  # uploads initializers and host-made values once
    wanted = list(prog.graph.outputs)
    for x in wanted:
        if x in prog.graph.initializers:
            prog._initializer(x)  # an output that is an initializer: uploaded now, not while recording
    prog.memory.synchronize()

    def work() -> tuple[dict[str, Any], list[Any]]:
        with ops.capturing() as checks:
            vals = prog._execute(dict(staged), hoisted=hoisted, recording=True)
            outs = {x: vals[x] if x in vals else prog._initializer(x) for x in wanted}
        return outs, list(checks)

    try:
        graph = prog.memory.capture(work)  # type: ignore[misc]
    except ExecutionError:
        raise
    except Exception as exc:
        raise ExecutionError(
            f"device graph on {prog.device}", f"recording failed: {type(exc).__name__}: {exc}",
            "run the session without enable_device_graph, and report the model and this message",
        ) from exc  # fmt: skip
    outs, checks = graph.result
    return Recorded(graph, staged, outs, checks)


def replay(
    prog: DeviceProgram, rec: Recorded, feeds: dict[str, Any], outputs: Sequence[str], on_device: bool
) -> list[Any]:
    """One run on a recorded graph: feeds into its buffers, replay, deferred checks, copies of the outputs."""
    for x, buf in rec.staged.items():
        stage(prog, buf, feeds[x])
    with ops.device(prog.device):
        rec.graph.replay()
    for c in rec.checks:
        if bool(prog.memory.to_host(c.flag)):
            raise ExecutionError(f"node '{c.node}' ({c.op})", c.message(), "check the feeds against get_inputs() (index values)")  # fmt: skip
    out = []
    for name in outputs:
        v = rec.outputs[name]
        if not prog.memory.is_array(v):
            out.append(prog._to_device(v, [0, 0.0]) if on_device else np.array(v, copy=True))
        else:  # copies: the next replay rewrites the graph's buffers
            out.append(v.copy() if on_device else prog.memory.to_host(v))
    return out
