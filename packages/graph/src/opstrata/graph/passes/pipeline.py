"""Optimisation levels and the pass report: ``optimize(graph, level) -> (Graph, PassReport)``.

Levels follow ONNX Runtime's graph optimisation levels: 0 none, 1 basic (semantics-preserving
clean-ups), 2 extended (pattern fusions into opstrata's fused ops), 3 all (elementwise chains into
one generated kernel).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .._errors import GraphError
from .._ir import Graph, Node
from .._shape_infer import infer_shapes

__all__ = ["LEVELS", "PassReport", "PassResult", "optimize", "passes_for_level"]

Pass = Callable[[Graph], Graph]


@dataclass(frozen=True)
class PassResult:
    """What one pass changed: node counts, nodes removed/added per op type, patterns matched."""

    name: str
    level: int
    nodes_before: int
    nodes_after: int
    removed: dict[str, int] = field(default_factory=dict)
    added: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def matched(self) -> int:
        """Patterns matched: fused nodes created, or (for clean-up passes) nodes removed."""
        return sum(self.added.values()) or sum(self.removed.values())

    @property
    def changed(self) -> bool:
        return bool(self.removed or self.added)


@dataclass
class PassReport:
    """The passes an ``optimize`` call ran, in order; ``str()`` prints a table.

    ``notes`` carries what the import did before the passes (e.g. "converted opset 9 -> 13 on import").
    """

    level: int
    results: list[PassResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def nodes_before(self) -> int:
        return self.results[0].nodes_before if self.results else 0

    @property
    def nodes_after(self) -> int:
        return self.results[-1].nodes_after if self.results else 0

    def matched(self, pass_name: str) -> int:
        """Total patterns matched by the pass called ``pass_name`` (0 when it did not run)."""
        return sum(r.matched for r in self.results if r.name == pass_name)

    def to_dict(self) -> dict:
        """JSON-ready form (used by Plan.save)."""
        return {
            "level": self.level,
            "results": [
                {
                    "name": r.name, "level": r.level, "nodes_before": r.nodes_before,
                    "nodes_after": r.nodes_after, "removed": r.removed, "added": r.added,
                    "seconds": r.seconds,
                }
                for r in self.results
            ],
            "notes": list(self.notes),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict) -> PassReport:
        return cls(d["level"], [PassResult(**r) for r in d["results"]], list(d.get("notes", [])))

    def table(self) -> str:
        """One row per pass run: nodes before -> after, what was removed and added."""
        rows = [("pass", "lvl", "nodes", "removed", "added")]
        for r in self.results:
            fmt = lambda d: ", ".join(f"{k} x{v}" for k, v in sorted(d.items())) or "-"  # noqa: E731
            rows.append(
                (r.name, str(r.level), f"{r.nodes_before} -> {r.nodes_after}", fmt(r.removed), fmt(r.added))
            )
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
            for row in rows
        ]
        lines.insert(1, "-" * len(lines[0]))
        lines.append(f"level {self.level}: {self.nodes_before} -> {self.nodes_after} nodes")
        return "\n".join([*self.notes, *lines])

    def __str__(self) -> str:
        return self.table()


def _basic() -> list[tuple[str, Pass]]:
    from .cse import eliminate_common_subexpressions
    from .dce import eliminate_dead_code
    from .fold import fold_constants
    from .fold_shapes import fold_shapes
    from .identity import remove_identities

    return [
        ("fold_constants", fold_constants),
        ("fold_shapes", fold_shapes),
        ("fold_constants", fold_constants),  # again: what depended on the folded shapes
        ("remove_identities", remove_identities),
        ("eliminate_common_subexpressions", eliminate_common_subexpressions),
        ("eliminate_dead_code", eliminate_dead_code),
    ]


def _extended() -> list[tuple[str, Pass]]:
    from .attention_layout import fold_attention_layout
    from .dce import eliminate_dead_code
    from .fold_conv_bn import batchnorm_to_affine, fold_conv_batchnorm
    from .fold_repeat_kv import fold_repeat_kv
    from .fuse_activation import fuse_bias_activation
    from .fuse_attention import fuse_attention
    from .fuse_gelu import fuse_gelu
    from .fuse_linear import fuse_linear
    from .fuse_norm import fuse_layer_norm, fuse_rms_norm
    from .fuse_qdq import (
        drop_relu_before_quantize,
        fuse_dequant_matmul,
        fuse_dynamic_qmatmul,
        fuse_qconv_quantize,
        fuse_qdq_conv,
        fuse_qdq_matmul,
    )
    from .fuse_rotary import fuse_rotary
    from .fuse_skip_norm import fuse_skip_norm
    from .transpose import fold_transposes

    return [
        ("fold_conv_batchnorm", fold_conv_batchnorm),
        ("batchnorm_to_affine", batchnorm_to_affine),
        ("fuse_qdq_matmul", fuse_qdq_matmul),
        ("fuse_qdq_conv", fuse_qdq_conv),
        ("drop_relu_before_quantize", drop_relu_before_quantize),
        ("fuse_qconv_quantize", fuse_qconv_quantize),
        ("fuse_dequant_matmul", fuse_dequant_matmul),
        ("fuse_dynamic_qmatmul", fuse_dynamic_qmatmul),
        ("fuse_layer_norm", fuse_layer_norm),
        ("fuse_rms_norm", fuse_rms_norm),
        ("fuse_gelu", fuse_gelu),
        ("fuse_rotary", fuse_rotary),
        ("fuse_attention", fuse_attention),
        ("fold_repeat_kv", fold_repeat_kv),
        ("fold_attention_layout", fold_attention_layout),
        ("fold_transposes", fold_transposes),
        ("fuse_linear", fuse_linear),
        ("fuse_skip_norm", fuse_skip_norm),
        ("fuse_bias_activation", fuse_bias_activation),
        ("eliminate_dead_code", eliminate_dead_code),
    ]


def _all() -> list[tuple[str, Pass]]:
    from .dce import eliminate_dead_code
    from .fuse_conv_epilogue import fuse_conv_epilogue
    from .fuse_elementwise import fuse_elementwise

    return [
        ("fuse_elementwise", fuse_elementwise),
        ("fuse_conv_epilogue", fuse_conv_epilogue),
        ("eliminate_dead_code", eliminate_dead_code),
    ]


#: Level number -> what it adds.
LEVELS = {0: "none", 1: "basic", 2: "extended", 3: "all"}


def passes_for_level(level: int) -> list[tuple[int, str, Pass]]:
    """The ``(level, name, pass)`` triples that ``optimize(graph, level)`` runs, in order."""
    if level not in LEVELS:
        raise GraphError(
            "optimize", f"level must be one of {sorted(LEVELS)} ({LEVELS}), got {level!r}", "pass level=2"
        )
    out: list[tuple[int, str, Pass]] = []
    for lvl, group in ((1, _basic), (2, _extended), (3, _all)):
        if level >= lvl:
            out += [(lvl, name, fn) for name, fn in group()]
    return out


def _diff(before: dict[str, int], after: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    removed = {k: v - after.get(k, 0) for k, v in before.items() if v > after.get(k, 0)}
    added = {k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}
    return removed, added


def _prune_values(g: Graph) -> None:
    defined = set(g.inputs) | set(g.initializers) | {o for n in g.nodes for o in n.outputs if o}
    for name in [v for v in g.values if v not in defined]:
        del g.values[name]


def optimize(graph: Graph, level: int = 2) -> tuple[Graph, PassReport]:
    """Run the passes of ``level`` (0 none .. 3 all) on a copy of ``graph``; returns it and a PassReport.

    >>> import opstrata.graph as og
    >>> from opstrata.graph.testing import bert_block_model
    >>> g, report = og.optimize(og.from_onnx(bert_block_model()), level=2)
    >>> g.op_counts()["ai.opstrata::Attention"]
    1
    """
    notes = list(graph.import_notes)  # set by from_onnx
    report = PassReport(level, notes=list(notes))
    g = graph.copy()
    infer_shapes(g)
    for lvl, name, fn in passes_for_level(level):
        before = g.op_counts()
        n0, t0 = len(g), time.perf_counter()
        out = fn(g)
        if out is g:
            raise GraphError(
                f"pass '{name}'", "returned its input graph object", "return graph.copy() modified"
            )
        _prune_values(out)
        infer_shapes(out)
        removed, added = _diff(before, out.op_counts())
        report.results.append(PassResult(name, lvl, n0, len(out), removed, added, time.perf_counter() - t0))
        g = out
    g.validate()
    g.import_notes = notes  # optimizing the result again keeps the note
    dynamic = dynamic_origins(g)
    if dynamic:
        shown = ", ".join(f"'{n.name}' ({n.qualified_type})" for n in dynamic[:6])
        more = f" and {len(dynamic) - 6} more" if len(dynamic) > 6 else ""
        report.notes.append(
            f"{len(dynamic)} node(s) produce values whose shape depends on input values (the runtime "
            f"runs them and what they feed on per-run buffers, the rest in its arena): {shown}{more}"
        )
    return g, report


def _known(shape: object) -> bool:
    """A shape whose rank and dims are known (ints or symbolic names), not data-dependent."""
    return isinstance(shape, tuple) and all(d is not None for d in shape)


def dynamic_origins(g: Graph) -> list[Node]:
    """Nodes whose outputs' shapes depend on input values while their inputs' shapes do not (NonZero, a
    Squeeze with run-time axes, a Loop's scan outputs, ...): where dynamic shapes start in ``g``."""
    out, fed = [], set(g.inputs)  # a feed's dims are whatever is fed: known when the model runs
    for n in g.nodes:
        ins = [g.values.get(x) for x in n.inputs if x and x not in fed]
        outs = [g.values.get(o) for o in n.outputs if o]
        if all(v is not None and v.kind == "tensor" and _known(v.shape) for v in ins) and any(
            v is not None and v.kind == "tensor" and not _known(v.shape) for v in outs
        ):
            out.append(n)
    return out
