"""Static memory planning: liveness over the schedule, one arena, greedy-by-size offsets, in-place reuse.

Offsets follow TFLite's ``GreedyBySize`` planner (Pisarchyk & Lee, "Efficient Memory Management for
Deep Neural Net Inference", 2020): buffers sorted by size, largest first, each placed at the lowest
offset that does not overlap an already placed buffer whose lifetime intersects its own. An
elementwise node's output shares its input's buffer when that input dies at the node (in-place), and
a reshape-like node's output always shares its input's buffer (the same bytes viewed with a new
shape: executors return the view and copy nothing); a buffer is then live until its last view dies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ._errors import GraphError
from ._ir import Graph
from ._shape_infer import infer_shapes
from .opdefs import registry

__all__ = ["ALIGNMENT", "MemoryPlan", "MemoryPlanner", "pack_buffers", "plan_memory"]

#: Byte alignment of every offset and size in the arena (a cache line; AVX-512 loads).
ALIGNMENT = 64


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


@dataclass
class MemoryPlan:
    """Where every intermediate lives in one arena: offsets, sizes, lifetimes and the headline numbers.

    ``arena_bytes`` is the arena size; ``lower_bound_bytes`` the most bytes live at any step (no
    plan can do better); ``no_reuse_bytes`` the total when every value has its own buffer.
    """

    graph_name: str
    shapes: dict[str, tuple[int, ...]]  # planned value -> concrete shape
    sizes: dict[str, int]  # planned value -> aligned bytes
    offsets: dict[str, int]  # planned value -> arena offset
    lifetimes: dict[str, tuple[int, int]]  # planned value -> (defining step, last step that reads it)
    inplace: dict[str, str] = field(default_factory=dict)  # output -> the input whose buffer it reuses
    arena_bytes: int = 0
    lower_bound_bytes: int = 0
    no_reuse_bytes: int = 0
    alignment: int = ALIGNMENT
    dims: dict[str, int] = field(default_factory=dict)
    #: values left out of the arena because their shape depends on input values (``dynamic=True``):
    #: the executor gives them allocator buffers each run
    dynamic: list[str] = field(default_factory=list)

    @property
    def ratio_to_lower_bound(self) -> float:
        """``arena_bytes / lower_bound_bytes`` (1.0 is optimal)."""
        return self.arena_bytes / self.lower_bound_bytes if self.lower_bound_bytes else 1.0

    @property
    def reuse_saving(self) -> float:
        """``no_reuse_bytes / arena_bytes``: how many times smaller than one buffer per value."""
        return self.no_reuse_bytes / self.arena_bytes if self.arena_bytes else 1.0

    def summary(self) -> str:
        """One line: arena, lower bound, no-reuse total and the ratios."""
        return (
            f"arena {self.arena_bytes} B, lower bound {self.lower_bound_bytes} B "
            f"(x{self.ratio_to_lower_bound:.3f}), no reuse {self.no_reuse_bytes} B "
            f"(x{self.reuse_saving:.2f} saved), {len(self.offsets)} values, {len(self.inplace)} in place"
            + (f", {len(self.dynamic)} dynamic (shape depends on input values)" if self.dynamic else "")
        )

    def table(self) -> str:
        """One row per planned value, by offset: bytes, offset range, lifetime, in-place source."""
        rows = [("value", "shape", "bytes", "offset", "end", "live", "in place of")]
        for name in sorted(self.offsets, key=lambda v: (self.offsets[v], self.lifetimes[v])):
            first, last = self.lifetimes[name]
            rows.append((
                name, str(self.shapes[name]), str(self.sizes[name]), str(self.offsets[name]),
                str(self.offsets[name] + self.sizes[name]), f"{first}..{last}", self.inplace.get(name, ""),
            ))  # fmt: skip
        w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(x) for c, x in zip(r, w, strict=True)).rstrip() for r in rows]
        lines.insert(1, "-" * len(lines[0]))
        return "\n".join([f"memory plan of '{self.graph_name}' {self.dims}", *lines, self.summary()])

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "graph_name": self.graph_name, "shapes": {k: list(v) for k, v in self.shapes.items()},
            "sizes": self.sizes, "offsets": self.offsets,
            "lifetimes": {k: list(v) for k, v in self.lifetimes.items()}, "inplace": self.inplace,
            "arena_bytes": self.arena_bytes, "lower_bound_bytes": self.lower_bound_bytes,
            "no_reuse_bytes": self.no_reuse_bytes, "alignment": self.alignment, "dims": self.dims,
            "dynamic": list(self.dynamic),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping) -> MemoryPlan:
        return cls(**{
            **d, "shapes": {k: tuple(v) for k, v in d["shapes"].items()},
            "lifetimes": {k: (v[0], v[1]) for k, v in d["lifetimes"].items()},
        })  # fmt: skip


# --------------------------------------------------------------------------- concrete shapes


def _eval_dim(d: object, dims: Mapping[str, int], where: str) -> int:
    if isinstance(d, int):
        return d
    if isinstance(d, str):
        out = 1
        for part in d.split("*"):
            part = part.strip()
            if part.lstrip("-").isdigit():
                out *= int(part)
            elif part in dims:
                out *= int(dims[part])
            else:
                raise GraphError(
                    where, f"symbolic dim '{part}' has no value", f"pass dims={{'{part}': n, ...}}"
                )
        return out
    raise GraphError(where, "has an unknown (None) dim", "give its input shape in input_shapes=")


def concrete_graph(
    graph: Graph,
    dims: Mapping[str, int] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> Graph:
    """A copy of ``graph`` whose inputs have concrete shapes and whose values are re-inferred."""
    g = graph.copy()
    dims, input_shapes = dict(dims or {}), dict(input_shapes or {})
    unknown = sorted(set(input_shapes) - set(g.inputs))
    if unknown:
        raise GraphError(
            f"graph '{g.name}'", f"input_shapes names unknown inputs {unknown}", f"use {g.inputs}"
        )
    for name in g.inputs:
        v = g.values[name]
        where = f"graph '{g.name}': input '{name}' {v.type_str()}"
        if v.kind != "tensor":  # sequences/optionals have no tensor shape: per-run values
            continue
        if name in input_shapes:
            shape = tuple(int(d) for d in input_shapes[name])
            if v.shape is not None and len(shape) != len(v.shape):
                raise GraphError(where, f"expected rank {len(v.shape)}, got shape {shape}")
            for sym, got in zip(v.shape or (), shape, strict=False):
                if isinstance(sym, int) and sym != got:
                    raise GraphError(where, f"expected {v.shape}, got {shape}")
                if isinstance(sym, str) and sym.isidentifier():
                    if dims.setdefault(sym, got) != got:
                        raise GraphError(where, f"dim '{sym}' is {got} here but {dims[sym]} elsewhere")
        elif v.shape is None:
            raise GraphError(where, "has unknown rank", "give its shape in input_shapes=")
        else:
            shape = tuple(_eval_dim(d, dims, where) for d in v.shape)
        v.shape = shape
    infer_shapes(g, reset=True)
    return g


# --------------------------------------------------------------------------- planning


def _lifetimes(g: Graph) -> tuple[dict[str, tuple[int, int]], list[str]]:
    end = len(g.nodes)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, n in enumerate(g.nodes):
        for x in n.inputs:
            if x in first:
                last[x] = i
        for o in n.outputs:
            if o and o not in g.initializers:
                first[o] = last[o] = i
    for o in g.outputs:
        if o in first:
            last[o] = end  # graph outputs outlive the schedule
    return {v: (first[v], last[v]) for v in first}, list(first)


def _nbytes(g: Graph, name: str) -> tuple[tuple[int, ...], int]:
    v = g.values.get(name)
    if v is not None and _per_run(g, name):
        raise GraphError(
            f"graph '{g.name}': value '{name}'",
            f"needs a concrete dtype and shape to be planned, got {v.type_str()} (strings, sequences and "
            "optionals are not arena values)",
            "plan with dynamic=True: such values get per-run buffers",
        )
    if v is None or v.dtype is None or v.shape is None or not all(isinstance(d, int) for d in v.shape):
        raise GraphError(
            f"graph '{g.name}': value '{name}'",
            f"needs a concrete dtype and shape to be planned, got {v.type_str() if v else 'no value'}",
            "give every symbolic dim in dims= / input_shapes=",
        )
    shape = tuple(int(d) for d in v.shape)  # type: ignore[arg-type]
    return shape, int(np.prod(shape, dtype=np.int64)) * v.dtype.itemsize


def _greedy_by_size(bufs: list[tuple[int, int, int]]) -> list[int]:
    """Offsets for buffers ``(size, first, last)``: largest first, lowest non-overlapping offset."""
    order = sorted(range(len(bufs)), key=lambda i: (-bufs[i][0], bufs[i][1]))
    offsets = [0] * len(bufs)
    placed: list[int] = []
    for i in order:
        size, first, last = bufs[i]
        live = sorted((offsets[j], bufs[j][0]) for j in placed if bufs[j][1] <= last and first <= bufs[j][2])
        cand = 0  # the lowest offset whose [cand, cand + size) misses every live placed buffer
        for off, sz in live:
            if off - cand >= size:
                break
            cand = max(cand, off + sz)
        offsets[i] = cand
        placed.append(i)
    return offsets


def pack_buffers(
    buffers: Sequence[tuple[int, int, int]], *, alignment: int = ALIGNMENT
) -> tuple[list[int], int]:
    """Offsets for buffers ``(nbytes, first step, last step)`` in one arena, and the arena's size.

    The planner :func:`plan_memory` uses (greedy by size), for buffers that are not graph values: a device
    executor lays out the allocations its kernels make (traced over one run) with it. Two buffers share
    bytes only when their ``[first, last]`` ranges are disjoint; sizes are rounded up to ``alignment``.

    >>> pack_buffers([(100, 0, 1), (100, 2, 3), (50, 1, 2)], alignment=64)
    ([0, 0, 128], 192)
    """
    if alignment <= 0 or alignment & (alignment - 1):
        raise GraphError("pack_buffers", f"alignment must be a power of two, got {alignment}", "use 64")
    bufs = []
    for k, (size, first, last) in enumerate(buffers):
        if size < 0 or first > last:
            raise GraphError(
                "pack_buffers", f"buffer {k} must have nbytes >= 0 and first <= last, got {(size, first, last)}",
                "pass (nbytes, first step, last step) per buffer",
            )  # fmt: skip
        bufs.append((_align(max(int(size), 1), alignment), int(first), int(last)))
    offsets = _greedy_by_size(bufs)
    return offsets, max((off + b[0] for off, b in zip(offsets, bufs, strict=True)), default=0)


def plan_memory(
    graph: Graph,
    dims: Mapping[str, int] | None = None,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    alignment: int = ALIGNMENT,
    inplace: bool = True,
    dynamic: bool = False,
) -> MemoryPlan:
    """Plan one arena for every node output of ``graph`` at concrete ``dims`` (or ``input_shapes``).

    A value whose shape depends on input values (NonZero, a run-time Squeeze axes, ...) has no
    concrete shape at planning time: an error, or with ``dynamic=True`` left out of the arena and
    listed in ``MemoryPlan.dynamic`` (the executor allocates it per run; the rest stays planned).

    >>> import opstrata.graph as og
    >>> from opstrata.graph.testing import mlp_model
    >>> mp = og.plan_memory(og.from_onnx(mlp_model()), {"batch": 4})
    >>> mp.arena_bytes <= mp.no_reuse_bytes
    True
    """
    if alignment <= 0 or alignment & (alignment - 1):
        raise GraphError("plan_memory", f"alignment must be a power of two, got {alignment}", "use 64")
    g = concrete_graph(graph, dims, input_shapes)
    lifetimes, order = _lifetimes(g)
    left_out = [v for v in order if dynamic and (not _concrete(g, v) or _per_run(g, v))]
    order = [v for v in order if v not in set(left_out)]
    lifetimes = {v: lifetimes[v] for v in order}
    shapes, sizes = {}, {}
    for v in order:
        shapes[v], raw = _nbytes(g, v)
        sizes[v] = _align(max(raw, 1), alignment)
    # buffers: in-place chains share one
    buf_of: dict[str, int] = {}
    bufs: list[list[int]] = []  # [size, first, last]
    reuse: dict[str, str] = {}
    outs = set(g.outputs)
    for i, n in enumerate(g.nodes):
        d = registry.lookup(n.op_type, n.domain)  # the OpDef says whether it may run in place / is a view
        can = inplace and d is not None and d.inplace
        view = inplace and d is not None and d.view and len(n.outputs) == 1
        claimed: set[int] = set()
        for o in n.outputs:
            if not o or o not in sizes:
                continue
            src = None
            if view:  # a view of the input: share its buffer whether or not the input dies here
                x = n.inputs[0]
                if buf_of.get(x) is not None and x not in outs and sizes[x] == sizes[o]:
                    src = x
            elif can and len(n.outputs) == 1:
                for x in dict.fromkeys(n.inputs):
                    b = buf_of.get(x)
                    if (
                        b is not None and b not in claimed and x not in outs
                        and lifetimes[x][1] == i and bufs[b][2] <= i  # x and every view of it die here
                        and shapes[x] == shapes[o]  # no broadcasting in place
                        and g.values[x].dtype.itemsize == g.values[o].dtype.itemsize  # type: ignore[union-attr]
                    ):  # fmt: skip
                        src = x
                        break
            if src is not None:
                b = buf_of[src]
                bufs[b][2] = max(bufs[b][2], lifetimes[o][1])
                reuse[o] = src
            else:
                b = len(bufs)
                bufs.append([sizes[o], *lifetimes[o]])
            buf_of[o] = b
            claimed.add(b)
    offsets_b = _greedy_by_size([tuple(b) for b in bufs])  # type: ignore[misc]
    arena = max((offsets_b[k] + b[0] for k, b in enumerate(bufs)), default=0)
    steps = len(g.nodes) + 1
    live = np.zeros(steps, np.int64)
    for size, first, last in bufs:
        live[first : last + 1] += size
    return MemoryPlan(
        graph_name=g.name,
        shapes=shapes,
        sizes=sizes,
        offsets={v: offsets_b[buf_of[v]] for v in order},
        lifetimes=lifetimes,
        inplace=reuse,
        arena_bytes=int(arena),
        lower_bound_bytes=int(live.max(initial=0)),
        no_reuse_bytes=int(sum(sizes.values())),
        alignment=alignment,
        dims=_bound_dims(graph, g),
        dynamic=left_out,
    )


def _per_run(g: Graph, name: str) -> bool:
    """True for values that never live in the byte arena: strings (object arrays) and sequences/optionals."""
    v = g.values[name]
    return v.kind != "tensor" or (v.dtype is not None and v.dtype.hasobject)


def _concrete(g: Graph, name: str) -> bool:
    v = g.values.get(name)
    return (
        v is not None
        and v.dtype is not None
        and v.shape is not None
        and all(isinstance(d, int) for d in v.shape)
    )


def _bound_dims(sym: Graph, conc: Graph) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in sym.inputs:
        for d, c in zip(sym.values[name].shape or (), conc.values[name].shape or (), strict=False):
            if isinstance(d, str) and d.isidentifier() and isinstance(c, int):
                out[d] = c
    return out


class MemoryPlanner:
    """Plans ``graph`` once per concrete input shape and caches the plans (symbolic dims)."""

    def __init__(self, graph: Graph, *, alignment: int = ALIGNMENT, inplace: bool = True) -> None:
        self.graph, self.alignment, self.inplace = graph, alignment, inplace
        self._cache: dict[tuple, MemoryPlan] = {}

    def _key(self, input_shapes: Mapping[str, Sequence[int]]) -> tuple:
        return tuple(
            (n, tuple(int(d) for d in input_shapes[n])) for n in self.graph.inputs if n in input_shapes
        )

    def forget(self, input_shapes: Mapping[str, Sequence[int]]) -> None:
        """Drop the cached plan for these input shapes (no error when there is none)."""
        self._cache.pop(self._key(input_shapes), None)

    def seed(self, input_shapes: Mapping[str, Sequence[int]], plan: MemoryPlan) -> None:
        """Cache an already made ``plan`` (a loaded Plan's) for these input shapes."""
        self._cache[self._key(input_shapes)] = plan

    def for_shapes(self, input_shapes: Mapping[str, Sequence[int]], *, dynamic: bool = False) -> MemoryPlan:
        """The plan for these input shapes (planned on first use, then cached); ``dynamic`` as in
        :func:`plan_memory`."""
        key = self._key(input_shapes)
        plan = self._cache.get(key)
        if plan is None or (plan.dynamic and not dynamic):  # a partial plan does not answer a full request
            plan = plan_memory(
                self.graph, input_shapes=input_shapes, alignment=self.alignment, inplace=self.inplace,
                dynamic=dynamic,
            )  # fmt: skip
            self._cache[key] = plan
        return plan

    def for_feeds(self, feeds: Mapping[str, np.ndarray]) -> MemoryPlan:
        """The plan for the shapes of ``feeds``."""
        return self.for_shapes({k: np.shape(v) for k, v in feeds.items() if k in self.graph.inputs})

    def __len__(self) -> int:
        return len(self._cache)
