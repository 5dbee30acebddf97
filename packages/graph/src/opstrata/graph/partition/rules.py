"""Per-op layout rules of tensor-parallel partitioning: how a split activation flows through an op.

A rule sees an op some of whose inputs are split across ranks (a :class:`Shard`: the axis, the
blocks of that axis, the column-parallel region it came from) and either records the split of its
outputs — plus the initializer slices and shape-constant rewrites the rank graphs need — or records
why the split cannot be followed (``a.fail``), which makes the region's linear layers *unmatched*.
Megatron-LM (Shoeybi et al. 2019) splits attention by heads and MLPs by hidden features; these rules
follow those splits through the ops torch exports between the linear layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .._ir import Node
from .._symbolic import Dim, Shape, dim_mul, dim_prod, dims_equal
from ..opdefs import registry

if TYPE_CHECKING:
    from .partition import _Analysis

__all__ = ["RULES", "Shard", "divisors", "ops_with_rules", "rule_for", "split_sizes"]


@dataclass(frozen=True)
class Shard:
    """A value split across ranks along ``axis``: each block of ``segments`` (full sizes) is cut in k."""

    axis: int
    segments: tuple[int, ...]
    region: int


# --------------------------------------------------------------------------- propagation rules


Rule = Callable[["_Analysis", Node, list[tuple[int, str, Shard]], int], None]


def _elementwise(a: _Analysis, n: Node, sharded: list[tuple[int, str, Shard]], region: int) -> None:
    out_rank = len(a.shape(n.outputs[0]))
    axes = {s.axis + out_rank - len(a.shape(x)) for _, x, s in sharded}
    segs = {s.segments for _, _, s in sharded}
    if len(axes) > 1 or len(segs) > 1:
        a.fail(n, {region}, "its inputs are split along different axes or in different blocks", "")
        return
    ax, seg = axes.pop(), segs.pop()
    for i, x in enumerate(n.inputs):
        if x and x not in a.layout and not a.broadcast_operand(n, i, ax, out_rank, seg, {region}):
            return
    a.layout[n.outputs[0]] = Shard(ax, seg, region)


def _transpose(a: _Analysis, n: Node, sharded: list[tuple[int, str, Shard]], region: int) -> None:
    s = sharded[0][2]
    perm = n.attrs.get("perm") or list(reversed(range(len(a.shape(n.inputs[0])))))
    a.layout[n.outputs[0]] = Shard(list(perm).index(s.axis), s.segments, region)


def _unsqueeze(a: _Analysis, n: Node, sharded: list[tuple[int, str, Shard]], region: int) -> None:
    s, r = sharded[0][2], len(a.shape(n.outputs[0]))
    new = sorted(x % r for x in n.attrs["axes"])
    kept = [i for i in range(r) if i not in new]
    a.layout[n.outputs[0]] = Shard(kept[s.axis], s.segments, region)


def _squeeze(a: _Analysis, n: Node, sharded: list[tuple[int, str, Shard]], region: int) -> None:
    s, shp = sharded[0][2], a.shape(n.inputs[0])
    axes = n.attrs.get("axes")
    gone = {x % len(shp) for x in axes} if axes is not None else {i for i, d in enumerate(shp) if d == 1}
    if s.axis in gone:
        a.fail(n, {region}, f"it squeezes the split axis {s.axis}", "")
        return
    a.layout[n.outputs[0]] = Shard(s.axis - sum(1 for g in gone if g < s.axis), s.segments, region)


def _softmax(a: _Analysis, n: Node, sharded: list[tuple[int, str, Shard]], region: int) -> None:
    s, rank = sharded[0][2], len(a.shape(n.inputs[0]))
    if n.attrs.get("axis", -1) % rank == s.axis:
        a.fail(n, {region}, f"it normalises over the split axis {s.axis}", "")
        return
    a.layout[n.outputs[0]] = s


def _norm(a: _Analysis, n: Node, sharded: list[tuple[int, str, Shard]], region: int) -> None:
    i, _, s = sharded[0]
    rank = len(a.shape(n.inputs[0]))
    if i != 0 or s.axis >= n.attrs.get("axis", -1) % rank:
        a.fail(
            n,
            {region},
            f"it normalises over axes that include the split axis {s.axis} (each rank would see a part)",
            "",
        )
        return
    a.layout[n.outputs[0]] = s


def _reduce(a: _Analysis, n: Node, sharded: list[tuple[int, str, Shard]], region: int) -> None:
    s, rank = sharded[0][2], len(a.shape(n.inputs[0]))
    axes = n.attrs.get("axes")
    axes = list(range(rank)) if axes is None else [x % rank for x in axes]
    if s.axis in axes:
        a.fail(n, {region}, f"it reduces over the split axis {s.axis} (a partial sum)", "")
        return
    keep = n.attrs.get("keepdims", 1)
    a.layout[n.outputs[0]] = Shard(
        s.axis - (0 if keep else sum(x < s.axis for x in axes)), s.segments, region
    )


def _split(a: _Analysis, n: Node, sharded: list[tuple[int, str, Shard]], region: int) -> None:
    s, shp = sharded[0][2], a.shape(n.inputs[0])
    axis = n.attrs.get("axis", 0) % len(shp)
    if axis != s.axis:
        for out in n.outputs:
            a.layout[out] = s
        return
    sizes = split_sizes(n, sum(s.segments))
    if tuple(sizes) != s.segments:
        a.fail(
            n,
            {region},
            f"it splits axis {axis} into {sizes}, but column-parallel '{a.head_of(region)}' split it in blocks "
            f"{list(s.segments)}",
            "split a fused projection right after its linear layer (and bias)",
        )
        return
    if n.attrs.get("split") is not None:
        a.split_edits[n.name] = [x // a.tp for x in sizes]
    for out, size in zip(n.outputs, sizes, strict=True):
        a.layout[out] = Shard(axis, (size,), region)


def _reshape(a: _Analysis, n: Node, sharded: list[tuple[int, str, Shard]], region: int) -> None:
    i, x, s = sharded[0]
    ins, outs = a.shape(x), a.shape(n.outputs[0])
    j = _map_axis(ins, outs, s.axis) if i == 0 and len(s.segments) == 1 else None
    if j is None:
        a.fail(
            n,
            {region},
            f"it reshapes '{x}' {list(ins)} (split along axis {s.axis}) to {list(outs)} in a way that does "
            "not keep the split axis the outermost of its group (static sizes are needed there)",
            "split/merge heads as (..., H*D) <-> (..., H, D)",
        )
        return
    full = outs[j]
    assert isinstance(full, int)  # _map_axis checked
    if full % a.tp:
        raise a.heads_error(
            n, region, f"reshape of '{x}' {list(ins)} -> {list(outs)} splits its features into", full
        )
    identity = j == s.axis and dims_equal(ins[s.axis], full)
    if _rewrite_entry(a, n, 1, j, full, identity, region):
        a.layout[n.outputs[0]] = Shard(j, (full,), region)


def _expand(a: _Analysis, n: Node, sharded: list[tuple[int, str, Shard]], region: int) -> None:
    i, x, s = sharded[0]
    outs = a.shape(n.outputs[0])
    j = s.axis + len(outs) - len(a.shape(x))
    target = a.shape(n.inputs[1])
    if i != 0 or len(target) != 1 or not isinstance(target[0], int):
        a.fail(
            n, {region}, f"its target shape '{n.inputs[1]}' has unknown length", "use a 1-D constant shape"
        )
        return
    e = j - (len(outs) - target[0])  # the split axis' entry in the target shape (< 0: not named there)
    if e >= 0 and not _rewrite_entry(a, n, 1, e, sum(s.segments), True, region, keep_one=True):
        return
    a.layout[n.outputs[0]] = Shard(j, s.segments, region)


def _matmul(a: _Analysis, n: Node, sharded: list[tuple[int, str, Shard]], region: int) -> None:
    """Activation @ activation (attention scores and context): split along a batch (head) axis, or
    along A's rows / B's columns; a split contraction axis would be a partial sum."""
    r_out = len(a.shape(n.outputs[0]))
    roles = {}
    for i, x, s in sharded:
        r = len(a.shape(x))
        if r < 2 or s.axis == (r - 1 if i == 0 else r - 2):
            a.fail(
                n,
                {region},
                f"it contracts over the split axis of '{x}' (a partial sum); only linear layers are row-parallel",
                "",
            )
            return
        roles[i] = (s.axis + r_out - r, s.segments)
    outs = set(roles.values())
    if len(outs) > 1:
        a.fail(n, {region}, f"its operands are split along different axes {sorted(outs)}", "")
        return
    ax, segs = outs.pop()
    if len(roles) == 1 and ax < r_out - 2:  # a head (batch) axis: the other operand must broadcast there
        if not a.broadcast_operand(n, 1 - next(iter(roles)), ax, r_out, segs, {region}):
            return
    a.layout[n.outputs[0]] = Shard(ax, segs, region)


def _attention(a: _Analysis, n: Node, sharded: list[tuple[int, str, Shard]], region: int) -> None:
    split = {i: s for i, _, s in sharded}
    bshd = {int(i) for i in n.attrs.get("bshd") or ()}  # (B, S, H, D) inputs: heads on axis 2
    head = {i: 2 if i in bshd else 1 for i in (0, 1, 2)}
    if set(split) - {0, 1, 2} or any(i not in split or split[i].axis != head[i] for i in (0, 1, 2)):
        a.fail(
            n,
            {region},
            "fused Attention needs q, k and v all split along their head axis "
            f"{[head[i] for i in (0, 1, 2)]} (got inputs {sorted(split)} split along "
            f"{[s.axis for s in split.values()]})",
            "make Q, K and V all column-parallel",
        )
        return
    if len(n.inputs) > 3 and n.inputs[3] and not a.broadcast_operand(n, 3, 1, 4, split[0].segments, {region}):
        return
    out_axis = 2 if n.attrs.get("bshd_out") else 1
    a.layout[n.outputs[0]] = Shard(out_axis, (int(a.shape(n.outputs[0])[out_axis]),), region)


def _shape(a: _Analysis, n: Node, sharded: list[tuple[int, str, Shard]], region: int) -> None:
    """Shape of a split value reports local sizes: allowed when only other dims are gathered from it."""
    s, rank = sharded[0][2], len(a.shape(n.inputs[0]))
    start, end = n.attrs.get("start", 0), n.attrs.get("end", rank)
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    if not start <= s.axis < end:
        return
    pos = s.axis - start
    for c in a.consumers.get(n.outputs[0], []):
        idx = a.graph.initializers.get(c.inputs[1]) if c.op_type == "Gather" and len(c.inputs) > 1 else None
        if idx is None or pos in {int(v) % (end - start) for v in np.ravel(idx)}:
            a.fail(
                c,
                {region},
                f"it reads the split dim {s.axis} of '{n.inputs[0]}' through Shape '{n.name}' (each rank "
                "sees its local size there)",
                "build shapes from the other dims, or from constants partition rewrites",
            )
            return


#: layout class (an OpDef's ``layout_rule``, registry.LAYOUT_CLASSES) -> rule
RULES: dict[str, Rule] = {
    "elementwise": _elementwise,
    "transpose": _transpose,
    "unsqueeze": _unsqueeze,
    "squeeze": _squeeze,
    "softmax": _softmax,
    "norm": _norm,
    "reduce": _reduce,
    "split": _split,
    "reshape": _reshape,
    "expand": _expand,
    "matmul": _matmul,
    "attention": _attention,
    "shape": _shape,
}
assert set(RULES) == set(registry.LAYOUT_CLASSES), "every layout class has a rule"


def rule_for(n: Node) -> Rule | None:
    """The layout rule of ``n``'s op (its OpDef's ``layout_rule``), or None when partition has none."""
    d = registry.lookup(n.op_type, n.domain)
    cls = d.layout_rule if d is not None else None
    return RULES[cls] if cls is not None else None


def ops_with_rules() -> list[str]:
    """Qualified names of the non-elementwise ops that name a layout rule (for error messages)."""
    return sorted(d.qualified for d in registry.DEFS.values() if d.layout is not None)


# --------------------------------------------------------------------------- small helpers


def divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def split_sizes(n: Node, dim: int) -> list[int]:
    sizes = n.attrs.get("split")
    if sizes is not None:
        return [int(x) for x in sizes]
    c = -(-dim // len(n.outputs))
    return [c] * (len(n.outputs) - 1) + [dim - c * (len(n.outputs) - 1)]


def _map_axis(ins: Shape, outs: Shape, i: int) -> int | None:
    """The output axis that a Reshape maps input axis ``i`` to, when ``i`` stays the outer factor."""
    pre = dim_prod(ins[:i])
    j = next((j for j in range(len(outs) + 1) if dims_equal(dim_prod(outs[:j]), pre)), None)
    if j is None:
        return None
    if j >= len(outs) or not isinstance(ins[i], int) or not isinstance(outs[j], int):
        return None
    d, o = ins[i], outs[j]
    if d == o:
        return j
    seq, target = (outs[j:], d) if d % o == 0 else (ins[i:], o) if o % d == 0 else ((), 0)
    p: Dim = 1
    for t in seq:
        p = dim_mul(p, t)
        if p == target:
            return j
        if not isinstance(p, int) or p > target:
            return None
    return None


def _rewrite_entry(
    a: _Analysis,
    n: Node,
    idx: int,
    entry: int,
    full: int,
    identity: bool,
    region: int,
    *,
    keep_one: bool = False,
) -> bool:
    """Make entry ``entry`` of shape input ``idx`` of ``n`` say ``full // tp``; False (and a failure) if
    the entry is computed in a way partition cannot rewrite."""
    found = _trace_entry(a, n, idx, entry)
    if found is None:
        a.fail(
            n,
            {region},
            f"entry {entry} of its target shape '{n.inputs[idx]}' (the split axis, {full} in the whole model) "
            "is computed at run time in a way partition cannot rewrite",
            "build the target shape from constants (or 0 / -1)",
        )
        return False
    node, i, flat, value = found
    if value == -1 and n.op_type == "Reshape":
        return True
    if (value == 0 and identity and n.op_type == "Reshape") or (value == 1 and keep_one):
        return True
    if value != full:
        a.fail(
            n,
            {region},
            f"entry {entry} of its target shape is {value}, expected {full} (the whole split axis), 0 or -1",
            "check the model's shapes",
        )
        return False
    prev = a.init_edits.get((node.name, i), ("set",))
    if (flat, full // a.tp) not in prev:
        a.edit_init(node, i, (*prev, (flat, full // a.tp)))
    return True


def _trace_entry(a: _Analysis, n: Node, idx: int, entry: int) -> tuple | None:
    """Where entry ``entry`` of int input ``idx`` of ``n`` comes from: ``(node, input, flat, value)`` of
    the initializer holding it (through Concat / Unsqueeze / Cast), else None."""
    name = n.inputs[idx]
    init = a.graph.initializers.get(name)
    if init is not None:
        flat = np.ravel(init)
        return (n, idx, entry, int(flat[entry])) if 0 <= entry < flat.size else None
    p = a.producers.get(name)
    if p is None:
        return None
    if p.op_type in ("Cast", "Identity"):
        return _trace_entry(a, p, 0, entry)
    if p.op_type == "Unsqueeze" and len(a.shape(p.inputs[0])) == 0:
        return _trace_entry(a, p, 0, 0) if entry == 0 else None
    if p.op_type == "Concat":
        off = 0
        for k, x in enumerate(p.inputs):
            shp = a.shape(x)
            length = 1 if len(shp) == 0 else shp[0]
            if not isinstance(length, int):
                return None
            if entry < off + length:
                return _trace_entry(a, p, k, entry - off)
            off += length
        return None
    return None
