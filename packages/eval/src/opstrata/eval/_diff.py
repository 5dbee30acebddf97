"""``diff_model``: run a model and a peer with every intermediate exposed, compare tensor by tensor.

Tensors are aligned by name along the model's node order (ONNX graphs are topologically sorted);
each is judged at its dtype's default tolerance (the looser of the two sides' dtypes) unless
``rtol``/``atol`` are given. The report names the first node output out of tolerance together with
the errors of that node's inputs, so the reader sees whether the node or what fed it diverged.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ._compare import Metrics, compare
from ._diff_inputs import load_model, make_feeds, model_label
from ._diff_sides import Side, build_sides, initializers, run_fused, run_side
from ._onnx_edit import node_outputs
from ._tolerances import dtype_class

__all__ = ["DiffReport", "TensorDiff", "diff_model", "diff_sides"]


@dataclass(frozen=True)
class TensorDiff:
    """One aligned tensor: where it comes from, and its metrics (None when it cannot be compared)."""

    name: str
    node: str  # producing node's name; "" for graph inputs and initializers
    op: str  # producing node's op type, or "input" / "initializer"
    index: int  # position of the producing node in the graph (-1 for inputs and initializers)
    inputs: tuple[str, ...] = ()  # the producing node's inputs
    metrics: Metrics | None = None
    note: str = ""  # why there are no metrics, or which fused op computed the value
    differs: bool = False  # no metrics: the sides disagree on shape or kind (out of tolerance)

    @property
    def within(self) -> bool:
        """Close at the tolerance; a pair that cannot be compared (not a tensor) is not judged (True)."""
        return self.metrics.within if self.metrics is not None else not self.differs

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the row."""
        return {
            "name": self.name, "node": self.node, "op": self.op, "index": self.index,
            "inputs": list(self.inputs), "within": self.within, "note": self.note,
            "metrics": self.metrics.to_dict() if self.metrics is not None else None,
        }  # fmt: skip


@dataclass(frozen=True)
class DiffReport:
    """The layer diff of one model: node outputs in graph order, sources, the first divergence."""

    model: str
    actual: str  # label of the actual side
    expected: str  # label of the expected side
    rows: tuple[TensorDiff, ...]  # node outputs, graph order
    sources: tuple[TensorDiff, ...]  # graph inputs and initializers
    feeds: tuple[str, ...] = ()  # where each input came from
    unmatched: tuple[str, ...] = ()  # node outputs only one side produced
    rtol: float | None = None  # None: per-dtype defaults
    atol: float | None = None
    #: with ``fused``: value -> where the passes put it ("inside fused Attention 'Attention_0'", ...)
    whereabouts: tuple[tuple[str, str], ...] = ()

    @property
    def first(self) -> TensorDiff | None:
        """The first node output out of tolerance, or None when every aligned tensor is within it."""
        return next((r for r in self.rows if not r.within), None)

    @property
    def ok(self) -> bool:
        """True when no node output is out of tolerance."""
        return self.first is None

    @functools.cached_property
    def _by_name(self) -> dict[str, TensorDiff]:
        return {r.name: r for r in (*self.sources, *self.rows)}

    def lookup(self, name: str) -> TensorDiff | None:
        """The row of tensor ``name`` (node output, graph input or initializer)."""
        return self._by_name.get(name)

    def first_inputs(self) -> list[tuple[str, TensorDiff | None]]:
        """(input name, its row) for each input of the first divergent node."""
        f = self.first
        return [] if f is None else [(x, self.lookup(x)) for x in f.inputs if x]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the whole report."""
        first = self.first
        return {
            "model": self.model, "actual": self.actual, "expected": self.expected,
            "tolerance": "per-dtype defaults" if self.rtol is None else {"rtol": self.rtol, "atol": self.atol},
            "feeds": list(self.feeds), "ok": self.ok,
            "first_divergence": None if first is None else {
                "node": first.node, "op": first.op, "output": first.name,
                "inputs": [{"name": n, "row": r.to_dict() if r else None} for n, r in self.first_inputs()],
            },
            "rows": [r.to_dict() for r in self.rows],
            "sources": [r.to_dict() for r in self.sources],
            "unmatched": list(self.unmatched),
            "whereabouts": dict(self.whereabouts),
        }  # fmt: skip


def _row(
    name: str, node: str, op: str, index: int, inputs: tuple[str, ...], a: Any, b: Any,
    rtol: float | None, atol: float | None,
) -> TensorDiff:  # fmt: skip
    """The row of one aligned pair: its metrics, or a note saying why there are none."""
    m, note = _pair(a, b, rtol, atol)
    differs = m is None and note.startswith(("shape", "dtype class"))
    return TensorDiff(name, node, op, index, inputs, m, note, differs)


def _pair(a: Any, b: Any, rtol: float | None, atol: float | None) -> tuple[Metrics | None, str]:
    """Metrics of one aligned pair, or a note saying why they cannot be compared."""
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        return None, "not a tensor (sequence or optional): not compared"
    try:
        ka, kb = dtype_class(a.dtype), dtype_class(b.dtype)
    except TypeError:
        return None, f"dtype {a.dtype} / {b.dtype}: not compared"
    if a.shape != b.shape:
        return None, f"shape differs: actual {list(a.shape)}, expected {list(b.shape)}"
    if (ka in ("int", "bool")) != (kb in ("int", "bool")):
        return None, f"dtype class differs: actual {a.dtype}, expected {b.dtype}"
    return compare(a, b, rtol=rtol, atol=atol), ""


def _sources(
    proto: Any, actual: Side, expected: Side, rtol: float | None, atol: float | None
) -> list[TensorDiff]:
    """Graph inputs (as fed to each side) and initializers both sides hold, compared."""
    rows = []
    for name, a in actual.feeds.items():
        if name in expected.feeds:
            rows.append(_row(name, "", "input", -1, (), a, expected.feeds[name], rtol, atol))
    if actual.proto is expected.proto:  # the same model on both sides: its initializers are identical
        return rows
    ia, ib = initializers(actual.proto), initializers(expected.proto)
    used = {x for n in proto.graph.node for x in n.input}
    for name in ib:
        if name in ia and name in used:
            rows.append(_row(name, "", "initializer", -1, (), ia[name], ib[name], rtol, atol))
    return rows


def diff_model(
    model: Any, against: Any = "onnxruntime", feeds: Mapping[str, Any] | None = None, *,
    dims: Mapping[str, int] | None = None, seed: int = 0, device: str = "cpu", level: int = 3,
    rtol: float | None = None, atol: float | None = None, fused: bool = False, feeds_source: str = "feeds",
) -> DiffReport:  # fmt: skip
    """Diff ``model`` (path, bytes or ModelProto) against a peer, node output by node output.

    ``against``: ``"onnxruntime"``, ``"ref"``, ``"float64"``, ``"bfloat16"``, ``"float16"``, or
    another ONNX model (path or ModelProto) with the same inputs. Inputs not in ``feeds`` are seeded
    random (symbolic dims from ``dims``, else 1).
    """
    proto = load_model(model)
    label = model_label(model, proto)
    full_feeds, notes = make_feeds(proto, feeds, dims=dims, seed=seed, source=feeds_source)
    actual, expected = build_sides(proto, label, against, full_feeds, device=device, level=level)
    return diff_sides(proto, label, actual, expected, notes, level=level, rtol=rtol, atol=atol, fused=fused)


def diff_sides(
    proto: Any, label: str, actual: Side, expected: Side, notes: list[str], *, level: int = 3,
    rtol: float | None = None, atol: float | None = None, fused: bool = False,
) -> DiffReport:  # fmt: skip
    """Run both sides with every value exposed and align their tensors along ``proto``'s nodes.

    ``fused``: the actual side runs its optimised graph (see ``run_fused``); values fused away are
    unmatched, and a value a fused node computed says which in its note.
    """
    producers: dict[str, str] = {}
    where: dict[str, str] = {}
    if fused:
        got, producers, graph = run_fused(actual, level=level)
        actual = replace(actual, label=actual.label.replace(f"level {level}", f"level {level}, fused"))
    else:
        got = run_side(actual, level=level)
    want = run_side(expected, level=level)
    rows: list[TensorDiff] = []
    for i, node in enumerate(proto.graph.node):
        for out in node.output:
            if not out or out not in want:
                continue
            held, how = (out, "") if out in got or not fused else _whereabouts(graph, out, got, producers)
            if held not in got:
                if how:
                    where[out] = how
                continue
            row = _row(
                out,
                node.name or f"#{i}",
                node.op_type,
                i,
                tuple(node.input),
                got[held],
                want[out],
                rtol,
                atol,
            )
            by = producers.get(held, node.op_type)
            if how and not row.note:
                row = replace(row, note=how)
            elif by != node.op_type and not row.note:
                row = replace(row, note=f"computed by fused {by}")
            rows.append(row)
    mine = {name for _, name in node_outputs(proto.graph)}
    theirs = {name for _, name in node_outputs(actual.proto.graph)} | {
        name for _, name in node_outputs(expected.proto.graph)
    }
    accounted = {r.name for r in rows} | set(where)
    unmatched = sorted(((mine ^ theirs) | {n for n in mine if n not in got or n not in want}) - accounted)
    return DiffReport(
        label, actual.label, expected.label, tuple(rows), tuple(_sources(proto, actual, expected, rtol, atol)),
        tuple(notes), tuple(unmatched), rtol, atol, tuple(where.items()),
    )  # fmt: skip


def _whereabouts(
    graph: Any, value: str, got: Mapping[str, Any], producers: Mapping[str, str]
) -> tuple[str, str]:
    """Where the passes put ``value`` (absent from the optimised graph): the value holding it now and why.

    Follows the graph's provenance: a merged duplicate or removed Identity is compared as the value
    that holds the same tensor; a folded constant as its initializer; a value computed inside a fused
    node, or one no longer needed, is named but cannot be compared.
    """
    alias = graph.resolve_alias(value)
    if alias != value and alias in got:
        return alias, f"same tensor as '{alias}' after the passes"
    if alias in graph.initializers:
        got[alias] = graph.initializers[alias]  # type: ignore[index]
        how = "folded to a constant at compile time" if value in graph.folded else "a constant"
        return alias, how if alias == value else f"{how}, same tensor as '{alias}'"
    into = graph.resolve_fused(value)
    if into is not None and into in producers:
        node = next((n for n in graph.nodes if into in n.outputs), None)
        label = f"'{node.name}'" if node is not None and node.name else f"producing '{into}'"
        return value, f"inside fused {producers[into]} {label}"
    if value in graph.folded:
        return value, "folded at compile time, then no longer needed"
    return value, "removed by the passes (no longer needed)"
