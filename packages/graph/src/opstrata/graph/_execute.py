"""Reference executor: runs a Graph node by node on opstrata.ops kernels (the one IR-op -> kernel map).

Ops that only touch shapes or metadata (Shape, Range, ConstantOfShape, Trilu masks, bool logic,
integer Div of shape arithmetic) run as host numpy code listed in :data:`HOST_OPS`; every other op
calls an opstrata.ops kernel, so the ops fallback policy and audit see it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import opstrata.ops as ops

from ._errors import GraphError
from ._ir import Graph
from .opdefs import (
    families as _families,  # noqa: F401  (loads every op definition)
    registry,
)

__all__ = ["HOST_OPS", "KERNELS", "run_graph"]

Arr = np.ndarray
KERNELS = registry.KERNELS

#: IR ops computed by host numpy code rather than an opstrata.ops kernel (metadata / shape tensors).
HOST_OPS = frozenset([*(d.qualified for d in registry.DEFS.values() if registry.HOST in d.uses), "Div(int)"])


# --------------------------------------------------------------------------- driver


def _check_feeds(graph: Graph, feeds: Mapping[str, Any]) -> dict[str, Arr]:
    unknown = sorted(set(feeds) - set(graph.inputs))
    missing = [x for x in graph.inputs if x not in feeds]
    if unknown or missing:
        raise GraphError(
            f"run_graph('{graph.name}')",
            f"feeds {'name unknown inputs ' + str(unknown) if unknown else ''}"
            f"{' and ' if unknown and missing else ''}{'miss inputs ' + str(missing) if missing else ''}",
            f"feed exactly the graph inputs {graph.inputs}",
        )
    bound: dict[str, tuple[int, str]] = {}
    out: dict[str, Arr] = {}
    for name in graph.inputs:
        v = graph.values[name]
        if v.kind != "tensor":  # a sequence (list of arrays) or optional (None or the value): run-time form
            from .opdefs.sequence import feed_value

            out[name] = feed_value(feeds[name], v.kind)
            continue
        arr = np.asarray(feeds[name])
        if v.dtype is not None and v.dtype.hasobject and arr.dtype.kind in "US":
            arr = arr.astype(object)  # string tensors: numpy str arrays are accepted
        where = f"run_graph('{graph.name}'): input '{name}'"
        if v.dtype is not None and arr.dtype != v.dtype:
            raise GraphError(
                where, f"expected dtype {v.dtype}, got {arr.dtype}", f"pass x.astype(np.{v.dtype})"
            )
        if v.shape is not None:
            if arr.ndim != len(v.shape):
                raise GraphError(where, f"expected rank {len(v.shape)} {v.type_str()}, got shape {arr.shape}")
            for i, (d, got) in enumerate(zip(v.shape, arr.shape, strict=True)):
                if isinstance(d, int) and d != got:
                    raise GraphError(where, f"dim {i} must be {d} ({v.type_str()}), got shape {arr.shape}")
                if isinstance(d, str) and d.isidentifier():
                    if d in bound and bound[d][0] != got:
                        raise GraphError(
                            where,
                            f"symbolic dim '{d}' is {got} here but {bound[d][0]} in input '{bound[d][1]}'",
                            f"feed inputs that agree on '{d}'",
                        )
                    bound.setdefault(d, (got, name))
        out[name] = arr
    return out


def run_graph(
    graph: Graph,
    feeds: Mapping[str, Any],
    device: str | None = None,
    *,
    outputs: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """Execute ``graph`` on ``feeds`` with opstrata.ops kernels; returns ``{output name: array}``.

    ``device`` selects the ops device (default: the current one); ``outputs`` may name any values
    (intermediates too) to return instead of the graph outputs.
    """
    env: dict[str, Any] = dict(graph.initializers)
    env.update(_check_feeds(graph, feeds))
    wanted = list(outputs) if outputs is not None else list(graph.outputs)
    last_use: dict[str, int] = {}
    for i, n in enumerate(graph.nodes):
        for x in n.inputs:
            last_use[x] = i
    keep = set(wanted) | set(graph.initializers)
    ctx = ops.device(device) if device is not None else contextlib.nullcontext()
    with ctx:
        for i, n in enumerate(graph.nodes):
            fn = KERNELS.get(("" if n.domain == "ai.onnx" else n.domain, n.op_type))
            if fn is None:
                raise GraphError(
                    f"node '{n.name}' ({n.qualified_type})",
                    "the executor has no implementation for this op type",
                    "lower it to supported ops first; supported: "
                    + ", ".join(sorted(op if not d else f"{d}::{op}" for d, op in KERNELS)),
                )
            args = []
            for x in n.inputs:
                if x and x not in env:
                    raise GraphError(
                        f"node '{n.name}' ({n.op_type})",
                        f"input '{x}' has not been computed",
                        "call graph.validate()",
                    )
                args.append(env[x] if x else None)
            while args and args[-1] is None:
                args.pop()
            results = fn(n, args)
            for name, val in zip(n.outputs, results, strict=False):
                if name:
                    env[name] = val
            for x in n.inputs:
                if x and last_use.get(x) == i and x not in keep:
                    env.pop(x, None)
    missing = [w for w in wanted if w not in env]
    if missing:
        raise GraphError(
            f"run_graph('{graph.name}')",
            f"values {missing} were not computed",
            "name values the graph produces",
        )
    return {w: env[w] for w in wanted}
