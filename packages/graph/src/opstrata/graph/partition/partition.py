"""Tensor-parallel partitioning of linear layers, Megatron-LM style (Shoeybi et al. 2019, arXiv:1909.08053).

``partition(graph, tp=k)`` returns k rank graphs. A linear layer whose input is replicated becomes
*column-parallel* (rank r keeps block r of the weight's output features and of the bias); the split
activation is followed through the ops between layers — elementwise ops (GELU, SwiGLU's gate), the
fused-QKV ``Split``, the ``Reshape``/``Transpose`` head split and merge (head counts in shape
constants are rewritten to H/k), attention matmuls, softmax or the fused ``Attention`` — until it
reaches a linear layer, which becomes *row-parallel* (block r of the weight's input features) and is
followed by an ``ai.opstrata::AllReduce`` (sum). Its bias is added once: an ``Add`` after the
MatMul stays after the reduce; a Gemm/Linear bias is kept on rank 0 only. Everything else —
embeddings, norms, residuals, masks — is replicated, as in Megatron-LM. A linear layer whose split
cannot be followed to a row-parallel layer (an LM head, a norm over the split axis, ...) is
*unmatched*: an error naming it (``on_unmatched="error"``, the default) or kept whole on every rank
(``on_unmatched="replicate"``).

Per-op rules are in ``partition/rules.py``. The analysis is a forward propagation of a per-value layout (which axis is split, in which
blocks) over the schedule; every rank graph is then re-inferred and its shapes checked against the
layout, so a head count the rewrite missed is an error here rather than a wrong result later.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .._errors import GraphError
from .._ir import OPSTRATA_DOMAIN, Graph, Node, Value
from .._shape_infer import infer_shapes
from .._symbolic import Shape, dim_div, dims_equal
from .collective import ALL_REDUCE
from .rules import Shard, divisors, ops_with_rules, rule_for, split_sizes

__all__ = ["partition"]

OnUnmatched = Literal["error", "replicate"]

#: A fused Linear's epilogue ``activation`` -> the op that applies it after a row-parallel reduce.
_EPILOGUE = {
    "relu": ("Relu", {}),
    "gelu": ("Gelu", {}),
    "gelu_tanh": ("Gelu", {"approximate": "tanh"}),
    "sigmoid": ("Sigmoid", {}),
    "tanh": ("Tanh", {}),
}


@dataclass(frozen=True)
class _Linear:
    """A linear layer: ``node`` reads activation ``x`` and 2-D weight initializer ``w``."""

    node: Node
    x: str
    w: str
    w_in: int  # axis of w holding input features
    w_out: int  # axis of w holding output features
    bias: int | None  # input index of a Gemm C / Linear b
    problem: str | None = None
    reader: tuple[Node, int] | None = None  # (node, input) reading w, when not ``node`` input 1

    @property
    def weight_reader(self) -> tuple[Node, int]:
        """The (node, input index) where the weight initializer is read (and sliced)."""
        return self.reader or (self.node, 1)

    @property
    def label(self) -> str:
        return f"linear '{self.node.name}' ({self.node.qualified_type}, weight '{self.w}')"


@dataclass
class _Failure:
    node: Node
    regions: set[int]
    problem: str
    fix: str


@dataclass
class _Analysis:
    """One forward pass: layouts, column/row layers, initializer and attribute edits, failures."""

    graph: Graph
    tp: int
    disabled: set[str]
    layout: dict[str, Shard] = field(default_factory=dict)
    parent: list[int] = field(default_factory=list)
    heads: list[str] = field(default_factory=list)  # region -> its first column-parallel layer
    cols: dict[str, tuple[_Linear, tuple[int, ...]]] = field(default_factory=dict)
    rows: dict[str, _Linear] = field(default_factory=dict)
    init_edits: dict[tuple[str, int], tuple] = field(default_factory=dict)  # (node, input) -> edit key
    split_edits: dict[str, list[int]] = field(default_factory=dict)
    weight_views: set[str] = field(default_factory=set)  # Transpose(W) outputs: sliced with W
    failures: list[_Failure] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.consumers = self.graph.consumers()
        self.producers = self.graph.producers()
        self.linears = {
            n.name: lin
            for n in self.graph.nodes
            if (lin := _linear_of(self.graph, n, self.producers, self.consumers))
        }

    # ------------------------------------------------------------------ helpers

    def find(self, r: int) -> int:
        """The root of region ``r`` (regions merge where split values meet, e.g. Q and K at QK^T)."""
        while self.parent[r] != r:
            self.parent[r] = self.parent[self.parent[r]]
            r = self.parent[r]
        return r

    def union(self, regions: set[int]) -> int:
        """Merge ``regions``; returns the root."""
        roots = sorted({self.find(r) for r in regions})
        for r in roots[1:]:
            self.parent[r] = roots[0]
        return roots[0]

    def shape(self, name: str) -> Shape:
        """The inferred shape of ``name`` (GraphError when unknown)."""
        v = self.graph.values.get(name)
        if v is None or v.shape is None:
            raise GraphError(
                f"value '{name}'", "has no known shape, which partition needs", "run infer_shapes(graph)"
            )
        return v.shape

    def fail(self, node: Node, regions: set[int], problem: str, fix: str) -> None:
        """Record that the split of ``regions`` cannot be followed through ``node``."""
        self.failures.append(_Failure(node, set(regions), problem, fix))

    def edit_init(self, node: Node, idx: int, key: tuple) -> None:
        """Slice (``("slice", axis, blocks)``) or set entries of the initializer ``node`` reads at ``idx``."""
        self.init_edits[(node.name, idx)] = key

    def head_of(self, region: int) -> str:
        """The column-parallel layer that started ``region``."""
        return self.heads[region]

    def failed_heads(self, f: _Failure) -> list[str]:
        """The column-parallel layers of every region that ``f`` touches (regions merged at joins)."""
        roots = {self.find(r) for r in f.regions}
        return sorted({self.heads[r] for r in range(len(self.parent)) if self.find(r) in roots})

    # ------------------------------------------------------------------ driver

    def run(self) -> _Analysis:
        for n in self.graph.nodes:
            self.visit(n)
        for out in self.graph.outputs:
            s = self.layout.get(out)
            if s is not None:
                p = self.producers.get(out)
                self.fail(
                    p if p is not None else Node("Output", [out], []),
                    {s.region},
                    f"graph output '{out}' would be split across ranks (axis {s.axis}) with no row-parallel "
                    "linear layer to reduce it",
                    "",
                )
        return self

    def visit(self, n: Node) -> None:
        lin = self.linears.get(n.name)
        sharded = [(i, x, self.layout[x]) for i, x in enumerate(n.inputs) if x and x in self.layout]
        if lin is not None:
            self.visit_linear(n, lin, sharded)
            return
        if not sharded:
            return
        region = self.union({s.region for _, _, s in sharded})
        rule = rule_for(n)
        if rule is None:
            x, s = sharded[0][1], sharded[0][2]
            self.fail(
                n,
                {region},
                f"it reads '{x}', which is split along axis {s.axis} by column-parallel "
                f"'{self.head_of(region)}', and partition has no rule to split {n.qualified_type}",
                "between the linear layers, use ops partition follows: elementwise ops, "
                + ", ".join(ops_with_rules())
                + " (an op's layout rule is its OpDef's `layout`)",
            )
            return
        rule(self, n, sharded, region)

    def visit_linear(self, n: Node, lin: _Linear, sharded: list[tuple[int, str, Shard]]) -> None:
        w = self.graph.initializers[lin.w]
        if not sharded:
            if n.name in self.disabled:
                return
            region = len(self.parent)
            self.parent.append(region)
            self.heads.append(n.name)
            if lin.problem:
                self.fail(n, {region}, lin.problem, "")
                return
            out = n.outputs[0]
            segs = self.segments(lin, int(w.shape[lin.w_out]))
            self.cols[n.name] = (lin, segs)
            self.edit_init(*lin.weight_reader, ("slice", lin.w_out, segs))
            self.weight_views.update(lin.reader[0].outputs if lin.reader else ())
            if lin.bias is not None:
                rank = len(self.shape(out))
                if not self.broadcast_operand(n, lin.bias, rank - 1, rank, segs, {region}):
                    return
            self.layout[out] = Shard(len(self.shape(out)) - 1, segs, region)
            return
        region = self.union({s.region for _, _, s in sharded})
        i, x, s = sharded[0]
        rank = len(self.shape(x))
        if i != 0 or lin.problem:
            self.fail(n, {region}, lin.problem or f"its weight-side input '{x}' is split", "")
        elif s.axis != rank - 1 or len(s.segments) != 1:
            self.fail(
                n,
                {region},
                f"row-parallel {lin.label} needs its input '{x}' split along the feature (last) axis in one "
                f"block, got axis {s.axis} in blocks {list(s.segments)}",
                "merge the heads back to (..., features) before the linear layer",
            )
        elif (n.attrs.get("activation") or "") not in ("", *_EPILOGUE):
            self.fail(
                n,
                {region},
                f"row-parallel {lin.label} has epilogue activation {n.attrs['activation']!r}, which partition "
                f"cannot move after the reduce (known: {sorted(_EPILOGUE)})",
                "",
            )
        else:
            self.rows[n.name] = lin
            self.edit_init(*lin.weight_reader, ("slice", lin.w_in, s.segments))
            self.weight_views.update(lin.reader[0].outputs if lin.reader else ())

    def segments(self, lin: _Linear, full: int) -> tuple[int, ...]:
        """The output blocks of a column-parallel layer: a fused QKV's ``Split`` sizes, else one block."""
        v = lin.node.outputs[0]
        for _ in range(4):
            cons = self.consumers.get(v, [])
            rank = len(self.shape(v))
            for c in cons:
                if c.op_type == "Split" and c.domain == "" and c.attrs.get("axis", 0) % rank == rank - 1:
                    sizes = split_sizes(c, full)
                    if sum(sizes) == full and len(sizes) > 1:
                        return tuple(sizes)
            if len(cons) == 1 and cons[0].op_type in ("Add", "Sub", "Mul", "Div") and cons[0].domain == "":
                others = [x for x in cons[0].inputs if x != v]
                if all(x in self.graph.initializers for x in others):  # a bias or a scale
                    v = cons[0].outputs[0]
                    continue
            break
        return (full,)

    def broadcast_operand(
        self, n: Node, idx: int, out_axis: int, out_rank: int, segs: tuple[int, ...], regions: set[int]
    ) -> bool:
        """A replicated operand of an op whose output is split: fine if it broadcasts along the split
        axis, sliced if it is an initializer, else a failure."""
        x = n.inputs[idx]
        shp = self.shape(x)
        ax = out_axis - (out_rank - len(shp))
        if ax < 0 or shp[ax] == 1:
            return True
        if x in self.graph.initializers:
            self.edit_init(n, idx, ("slice", ax, segs))
            return True
        self.fail(
            n,
            regions,
            f"it combines a value split along axis {out_axis} with '{x}' {list(shp)}, which every rank holds "
            "whole along that axis",
            "",
        )
        return False

    def heads_error(self, n: Node, region: int, what: str, count: int) -> GraphError:
        return GraphError(
            f"node '{n.name}' ({n.qualified_type})",
            f"{what} {count} heads across tp={self.tp} ranks after column-parallel '{self.head_of(region)}', "
            f"but {count} is not divisible by {self.tp}",
            f"choose tp dividing the head count {count} ({divisors(count)})",
        )


# --------------------------------------------------------------------------- small helpers


def _linear_of(
    g: Graph, n: Node, producers: dict[str, Node], consumers: dict[str, list[Node]]
) -> _Linear | None:
    """``n`` as a linear layer (MatMul with a 2-D weight initializer, possibly behind its own Transpose;
    Gemm; ai.opstrata::Linear), else None."""
    if len(n.inputs) < 2 or n.inputs[0] in g.initializers:
        return None
    x, w = n.inputs[0], n.inputs[1]
    t = producers.get(w)
    if (
        n.domain == "" and n.op_type == "MatMul" and t is not None and t.op_type == "Transpose"
        and t.inputs[0] in g.initializers and np.ndim(g.initializers[t.inputs[0]]) == 2
        and list(t.attrs.get("perm") or [1, 0]) == [1, 0] and len(consumers.get(w, [])) == 1
    ):  # fmt: skip
        return _Linear(n, x, t.inputs[0], 1, 0, None, reader=(t, 0))  # x @ W^T with W (out, in)
    if w not in g.initializers or np.ndim(g.initializers[w]) != 2:
        return None
    if n.domain == "" and n.op_type == "MatMul":
        return _Linear(n, x, w, 0, 1, None)
    bias = 2 if len(n.inputs) > 2 and n.inputs[2] else None
    if n.domain == "" and n.op_type == "Gemm":
        tb = bool(n.attrs.get("transB", 0))
        problem = "Gemm with transA=1 is not split by partition" if n.attrs.get("transA", 0) else None
        return _Linear(n, x, w, 1 if tb else 0, 0 if tb else 1, bias, problem)
    if n.domain == OPSTRATA_DOMAIN and n.op_type == "Linear":
        return _Linear(n, x, w, 1, 0, bias)
    return None


# --------------------------------------------------------------------------- rewrite


def _apply_edit(arr: np.ndarray, key: tuple, rank: int, tp: int) -> np.ndarray:
    if key[0] == "slice":
        _, axis, segs = key
        parts, off = [], 0
        for seg in segs:
            step = seg // tp
            parts.append(np.take(arr, np.arange(off + rank * step, off + (rank + 1) * step), axis=axis))
            off += seg
        return np.ascontiguousarray(np.concatenate(parts, axis=axis))
    out = np.array(arr, copy=True)
    flat = out.reshape(-1)
    for pos, value in key[1:]:
        flat[pos] = value
    return out


def _rank_graph(g: Graph, a: _Analysis, rank: int) -> Graph:
    rg = g.copy()
    rg.name = f"{g.name}_tp{a.tp}_rank{rank}"
    by_init: dict[str, dict[tuple, list[tuple[Node, int]]]] = {}
    uses: dict[str, list[tuple[Node, int]]] = {}
    for n in rg.nodes:
        for i, x in enumerate(n.inputs):
            if x in rg.initializers:
                uses.setdefault(x, []).append((n, i))
                key = a.init_edits.get((n.name, i))
                if key is not None:
                    by_init.setdefault(x, {}).setdefault(key, []).append((n, i))
    for name, groups in by_init.items():
        arr = rg.initializers[name]
        in_place = len(groups) == 1 and sum(map(len, groups.values())) == len(uses[name])
        for key, readers in groups.items():
            new = _apply_edit(arr, key, rank, a.tp)
            target = name if in_place and name not in rg.outputs else rg.fresh_name(f"{name}_tp")
            rg.add_initializer(target, new)
            for n, i in readers:
                n.inputs[i] = target
    for n in rg.nodes:
        if n.name in a.split_edits:
            n.attrs["split"] = list(a.split_edits[n.name])
    for name, lin in a.rows.items():
        n = rg.node(name)
        if rank != 0 and lin.bias is not None:  # the bias is added once, by rank 0
            n.inputs = n.inputs[: lin.bias]
        y = n.outputs[0]
        partial = rg.fresh_name(f"{y}_partial")
        n.outputs[0] = partial
        rg.values[partial] = Value(partial)
        act = n.attrs.pop("activation", "") or ""  # a fused epilogue applies to the sum, not to each part
        reduced = rg.fresh_name(f"{y}_reduced") if act else y
        at = rg.nodes.index(n) + 1
        rg.add_node(
            ALL_REDUCE,
            [partial],
            [reduced],
            {"op": "sum", "group_size": a.tp},
            name=f"{name}/allreduce",
            domain=OPSTRATA_DOMAIN,
            index=at,
        )
        if act:
            op, attrs = _EPILOGUE[act]
            rg.add_node(op, [reduced], [y], attrs, name=f"{name}/{act}", index=at + 1)
    used = {x for n in rg.nodes for x in n.inputs}
    for name in set(uses) - used - set(rg.outputs):  # replaced by a shard, or a bias rank 0 adds
        rg.remove_initializer(name)
    infer_shapes(rg, reset=True)
    _check_shapes(g, rg, a, rank)
    return rg


def _check_shapes(g: Graph, rg: Graph, a: _Analysis, rank: int) -> None:
    """Every value of the rank graph has the whole model's shape, divided by tp along its split axis."""
    for name, v in g.values.items():
        got = rg.values.get(name)
        if (
            name in g.initializers
            or name in a.weight_views
            or got is None
            or got.shape is None
            or v.shape is None
        ):
            continue
        want = list(v.shape)
        s = a.layout.get(name)
        if s is not None:
            want[s.axis] = dim_div(want[s.axis], a.tp)
        bad = len(want) != len(got.shape) or any(
            w is not None and d is not None and not dims_equal(w, d)
            for w, d in zip(want, got.shape, strict=True)
        )
        if bad:
            p = rg.producer(name)
            raise GraphError(
                f"partition(tp={a.tp}) rank {rank}: value '{name}' (from node '{p.name if p else '?'}')",
                f"has shape {list(got.shape)} but the split layout needs {want}",
                "a head count or feature size is computed in a way partition does not rewrite; build "
                "reshape targets from constants, or keep the layer whole (on_unmatched='replicate')",
            )


# --------------------------------------------------------------------------- public entry point


def _describe(a: _Analysis, f: _Failure) -> GraphError:
    labels = ", ".join(a.linears[h].label for h in a.failed_heads(f))
    return GraphError(
        f"node '{f.node.name}' ({f.node.qualified_type})",
        f"cannot split {labels} tensor-parallel (no column-/row-parallel MLP or attention pattern): {f.problem}",
        (f"{f.fix}; or " if f.fix else "")
        + "pass on_unmatched='replicate' to keep the unmatched layers whole on every rank",
    )


def partition(graph: Graph, tp: int, *, on_unmatched: OnUnmatched = "error") -> list[Graph]:
    """Split ``graph``'s linear layers across ``tp`` ranks (Megatron-LM); returns the ``tp`` rank graphs.

    Column-parallel for layers fed by replicated values (QKV, MLP up/gate), row-parallel for layers
    fed by split values (attention output, MLP down) followed by ``ai.opstrata::AllReduce(op="sum")``;
    attention heads are split (H/tp and Hkv/tp per rank). ``on_unmatched="error"`` (default) raises
    on a linear layer that is not part of such a pair, naming it; ``"replicate"`` keeps it whole on
    every rank. Run the result with :func:`simulate_tensor_parallel`.

    >>> from opstrata.graph import from_onnx
    >>> from opstrata.graph.testing import mlp_model
    >>> ranks = partition(from_onnx(mlp_model(hidden=32)), tp=2)
    >>> [[r.initializers[n.inputs[1]].shape for n in r.nodes if n.op_type == "Gemm"] for r in ranks]
    [[(16, 16), (8, 16)], [(16, 16), (8, 16)]]
    >>> ranks[0].op_counts()["ai.opstrata::AllReduce"]
    1
    """
    if isinstance(tp, bool) or not isinstance(tp, (int, np.integer)) or tp < 1:
        raise GraphError(
            "partition", f"tp must be an int >= 1, got {tp!r}", "pass the tensor-parallel size, e.g. tp=2"
        )
    if on_unmatched not in ("error", "replicate"):
        raise GraphError(
            "partition", f"on_unmatched={on_unmatched!r} is not an option", "use 'error' or 'replicate'"
        )
    if not isinstance(graph, Graph):
        raise GraphError("partition", f"expected a Graph, got {type(graph).__name__}", "use from_onnx(model)")
    tp = int(tp)
    g = graph.copy()
    g.validate()
    infer_shapes(g)
    _check_attention_heads(g, tp)
    disabled: set[str] = set()
    while True:
        a = _Analysis(g, tp, disabled).run()
        if not a.failures:
            break
        failed = {h for f in a.failures for h in a.failed_heads(f)}
        if on_unmatched == "error" or not failed - disabled:
            raise _describe(a, a.failures[0])
        disabled |= failed
    _check_divisible(g, a)
    ranks = [_rank_graph(g, a, r) for r in range(tp)]
    summary = (
        f"tensor-parallel rank {{r}} of {tp} (partition, Megatron-LM): column-parallel {sorted(a.cols)}; "
        f"row-parallel {sorted(a.rows)}; replicated linear layers {sorted(disabled)}"
    )
    for r, rg in enumerate(ranks):
        rg.doc_string = (graph.doc_string + "\n" if graph.doc_string else "") + summary.format(r=r)
    return ranks


def _check_attention_heads(g: Graph, tp: int) -> None:
    for n in g.nodes:
        if n.domain == OPSTRATA_DOMAIN and n.op_type == "Attention":
            bshd = {int(i) for i in n.attrs.get("bshd") or ()}  # (B, S, H, D) inputs: heads on axis 2
            hq = g.value(n.inputs[0]).shape
            hk = g.value(n.inputs[1]).shape
            for i, what, shp in ((0, "query heads H", hq), (1, "key/value heads Hkv", hk)):
                h = shp[2 if i in bshd else 1] if shp is not None and len(shp) == 4 else None
                if isinstance(h, int) and h % tp:
                    raise GraphError(
                        f"node '{n.name}' ({n.qualified_type})",
                        f"attention has {what}={h}, which tp={tp} does not divide (each rank holds H/tp heads)",
                        f"choose tp dividing {h} ({divisors(h)})",
                    )


def _check_divisible(g: Graph, a: _Analysis) -> None:
    checks: list[tuple[_Linear, str, Sequence[int]]] = [
        (lin, "output", segs) for lin, segs in a.cols.values()
    ]
    checks += [(lin, "input", (int(g.initializers[lin.w].shape[lin.w_in]),)) for lin in a.rows.values()]
    for lin, what, segs in checks:
        bad = [s for s in segs if s % a.tp]
        if bad:
            raise GraphError(
                f"node '{lin.node.name}' ({lin.node.qualified_type})",
                f"{lin.label} has {what} features {list(segs)}; {bad[0]} is not divisible by tp={a.tp}",
                f"choose tp dividing {math.gcd(*segs)} ({divisors(math.gcd(*segs))})",
            )
