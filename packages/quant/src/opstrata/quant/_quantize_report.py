"""The report of :func:`opstrata.quant.quantize`: per quantized node SQNR / cosine against float, the nodes an
accuracy budget kept in float (in order, and why), model-level metrics and sizes. ``to_dict()`` is the
JSON form other tools render (keys documented on :meth:`QuantizationReport.to_dict`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NodeReport", "OutputReport", "QuantizationReport"]


def _num(x: float | None) -> float | str | None:
    """A float for JSON: inf as the string ``"inf"`` (``"-inf"``), NaN and None as None."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


def _fmt(x: float | None, spec: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return format(x, spec)


@dataclass(frozen=True)
class NodeReport:
    """One MatMul/Gemm/Conv node: quantized, or kept in float (by the budget or the caller) and why.

    ``sqnr_db`` / ``cosine``: the node's output tensor in the quantized model against the float model
    (error accumulated up to here; for a node the budget put back: measured when it was put back).
    ``local_sqnr_db`` / ``local_cosine``: the node's quantized form on float inputs (the error it adds).
    None: not measured (no data, or a node the caller excluded).
    """

    node: str
    op: str
    sqnr_db: float | None
    cosine: float | None
    kept_float: bool = False
    reason: str = ""
    local_sqnr_db: float | None = None
    local_cosine: float | None = None
    max_abs: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (SQNR ``"inf"`` when exact)."""
        return {
            "node": self.node, "op": self.op, "sqnr_db": _num(self.sqnr_db), "cosine": _num(self.cosine),
            "kept_float": self.kept_float, "reason": self.reason, "local_sqnr_db": _num(self.local_sqnr_db),
            "local_cosine": _num(self.local_cosine), "max_abs": _num(self.max_abs),
        }  # fmt: skip


@dataclass(frozen=True)
class OutputReport:
    """One float model output: cosine / SQNR / max abs error against float, top-1 agreement (None when the
    output is not treated as class scores)."""

    name: str
    cosine: float
    sqnr_db: float
    max_abs: float
    top1_agreement: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "name": self.name, "cosine": _num(self.cosine), "sqnr_db": _num(self.sqnr_db),
            "max_abs": _num(self.max_abs), "top1_agreement": _num(self.top1_agreement),
        }  # fmt: skip


@dataclass
class QuantizationReport:
    """What :func:`opstrata.quant.quantize` did and measured (see :meth:`to_dict` for the keys)."""

    scheme: str
    nodes: list[NodeReport]
    outputs: list[OutputReport]
    size_float: int
    size_quantized: int
    batches: int = 0
    data: str = "none"  # "calibration_data", "eval_data" or "none" (nothing measured)
    budget: dict[str, float] | None = None
    budget_met: bool | None = None
    perplexity: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def quantized(self) -> list[NodeReport]:
        """The nodes that are quantized in the final model."""
        return [n for n in self.nodes if not n.kept_float]

    @property
    def fallback(self) -> list[NodeReport]:
        """The nodes the accuracy budget put back to float, in the order it did."""
        return [n for n in self.nodes if n.kept_float and n.reason.startswith("budget")]

    @property
    def min_cosine(self) -> float | None:
        """The lowest output cosine (None when nothing was measured)."""
        return min((o.cosine for o in self.outputs), default=None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form. Keys: ``kind`` ("quant"), ``scheme``, ``nodes`` ([{node, op, sqnr_db, cosine,
        kept_float, reason, local_sqnr_db, local_cosine, max_abs}], graph order, then the budget's
        put-backs), ``fallback`` (node names the budget put back, in order), ``outputs`` ([{name, cosine,
        sqnr_db, max_abs, top1_agreement}]), ``size_bytes`` ({float, quantized}: initializer bytes),
        ``perplexity`` (None or {logits, labels, float, quantized, delta}), ``budget``, ``budget_met``,
        ``batches``, ``data``, ``notes``. Non-finite numbers: ``"inf"`` / ``"-inf"``; not measured: None.
        """
        return {
            "kind": "quant",
            "scheme": self.scheme,
            "nodes": [n.to_dict() for n in self.nodes],
            "fallback": [n.node for n in self.fallback],
            "outputs": [o.to_dict() for o in self.outputs],
            "size_bytes": {"float": self.size_float, "quantized": self.size_quantized},
            "perplexity": None if self.perplexity is None else {
                k: (_num(v) if isinstance(v, float) else v) for k, v in self.perplexity.items()},
            "budget": dict(self.budget) if self.budget is not None else None,
            "budget_met": self.budget_met,
            "batches": self.batches,
            "data": self.data,
            "notes": list(self.notes),
        }  # fmt: skip

    def __str__(self) -> str:
        n_q, n_f = len(self.quantized), len(self.fallback)
        ratio = self.size_float / self.size_quantized if self.size_quantized else float("inf")
        head = [
            f"scheme {self.scheme}: {n_q} node(s) quantized"
            + (f", {n_f} put back to float by the accuracy budget" if n_f else "")
            + (
                f"; measured on {self.batches} batch(es) of {self.data}" if self.batches else "; not measured"
            ),
            f"initializers: {self.size_float:,} -> {self.size_quantized:,} bytes ({ratio:.2f}x smaller)",
        ]
        w = max([len("node"), *(len(n.node) for n in self.nodes)])
        rows = [f"{'node':<{w}}  {'op':<7} {'SQNR dB':>8} {'cosine':>9} {'local dB':>8}  state"]
        for n in self.nodes:
            state = f"float: {n.reason}" if n.kept_float else "quantized"
            rows.append(f"{n.node:<{w}}  {n.op:<7} {_fmt(n.sqnr_db, '8.2f'):>8} {_fmt(n.cosine, '9.6f'):>9} "
                        f"{_fmt(n.local_sqnr_db, '8.2f'):>8}  {state}")  # fmt: skip
        if self.outputs:
            w = max([len("output"), *(len(o.name) for o in self.outputs)])
            rows.append(f"{'output':<{w}}  {'cosine':>9} {'SQNR dB':>8} {'max abs':>10} {'top-1':>7}")
            for o in self.outputs:
                rows.append(f"{o.name:<{w}}  {_fmt(o.cosine, '9.6f'):>9} {_fmt(o.sqnr_db, '8.2f'):>8} "
                            f"{_fmt(o.max_abs, '10.4g'):>10} {_fmt(o.top1_agreement, '7.2%'):>7}")  # fmt: skip
        if self.perplexity is not None:
            p = self.perplexity
            rows.append(f"perplexity ({p['logits']} vs next {p['labels']}): float {_fmt(p['float'], '.4f')} -> "
                        f"quantized {_fmt(p['quantized'], '.4f')} (delta {_fmt(p['delta'], '+.4f')})")  # fmt: skip
        if self.budget is not None:
            terms = ", ".join(f"{k}={v}" for k, v in self.budget.items())
            rows.append(f"accuracy budget {terms}: {'met' if self.budget_met else 'NOT met'}")
        return "\n".join(head + rows + self.notes)
