"""The accuracy report: per-output cosine, SQNR and max abs error of a quantized model against its float
original on held-out data, and the ``min_cosine`` contract check."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ._calibrate import _iterate, check_feeds
from ._errors import AccuracyError, QuantError
from ._model import graph_input_names, load_model

__all__ = ["OutputMetrics", "QuantReport", "accuracy_report", "session_for"]


@dataclass(frozen=True)
class OutputMetrics:
    """One model output compared over every batch: ``cosine``, ``sqnr_db`` (inf when exact), ``max_abs``."""

    name: str
    cosine: float
    sqnr_db: float
    max_abs: float
    elements: int


@dataclass
class QuantReport:
    """Per-output metrics of a quantized model vs float on the given data (``runtime`` ran both)."""

    outputs: dict[str, OutputMetrics]
    batches: int
    runtime: str
    notes: list[str] = field(default_factory=list)

    @property
    def worst(self) -> OutputMetrics:
        """The output with the lowest cosine similarity."""
        return min(self.outputs.values(), key=lambda o: o.cosine)

    @property
    def min_cosine(self) -> float:
        """The lowest per-output cosine similarity."""
        return self.worst.cosine

    def check(self, min_cosine: float, where: str = "QuantReport.check") -> None:
        """Raise :class:`AccuracyError` naming the worst output when its cosine is below ``min_cosine``."""
        w = self.worst
        if not w.cosine >= min_cosine:
            raise AccuracyError(
                where, f"output {w.name!r} has cosine {w.cosine:.6f} to the float model, below min_cosine="
                f"{min_cosine} (SQNR {w.sqnr_db:.1f} dB, max abs error {w.max_abs:.4g}, {self.batches} batches)",
                "exclude the most sensitive nodes (exclude=[...]), use per-channel weights, a clipping observer "
                "('percentile', 'entropy', 'mse'), more calibration data, or lower the threshold",
                report=self,
            )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-serialisable)."""
        return {
            "runtime": self.runtime, "batches": self.batches, "notes": list(self.notes),
            "outputs": {k: dict(vars(v)) for k, v in self.outputs.items()},
        }  # fmt: skip

    def __str__(self) -> str:
        rows = [f"{'output':<24} {'cosine':>10} {'SQNR dB':>9} {'max abs':>10}"]
        for o in self.outputs.values():
            rows.append(f"{o.name:<24} {o.cosine:>10.6f} {o.sqnr_db:>9.2f} {o.max_abs:>10.4g}")
        rows.append(f"({self.batches} batches, runtime {self.runtime})")
        return "\n".join(rows + self.notes)


def session_for(model: onnx.ModelProto, runtime: str, *, ort_level: Any = None) -> tuple[Any, str]:
    """A session running ``model`` in ``"opstrata"`` or ``"onnxruntime"`` and a note on what was adapted
    (nothing today: both run every format the schemes write, int4 included)."""
    if runtime == "opstrata":
        from opstrata.runtime import InferenceSession

        return InferenceSession(model), ""
    if runtime == "onnxruntime":
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise QuantError("runtime", "onnxruntime is not installed", "pip install onnxruntime") from exc
        so = ort.SessionOptions()
        if ort_level is not None:
            so.graph_optimization_level = ort_level
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]), ""
    raise QuantError("runtime", f"unknown runtime {runtime!r}", "use 'opstrata' or 'onnxruntime'")


class _Acc:
    def __init__(self) -> None:
        self.dot = self.ref = self.q = self.err = self.max_abs = 0.0
        self.n = 0

    def add(self, r: np.ndarray, q: np.ndarray) -> None:
        r64, q64 = np.asarray(r, np.float64).ravel(), np.asarray(q, np.float64).ravel()
        self.dot += float(r64 @ q64)
        self.ref += float(r64 @ r64)
        self.q += float(q64 @ q64)
        d = r64 - q64
        self.err += float(d @ d)
        self.max_abs = max(self.max_abs, float(np.max(np.abs(d))) if d.size else 0.0)
        self.n += r64.size

    def metrics(self, name: str) -> OutputMetrics:
        den = math.sqrt(self.ref * self.q)
        cos = self.dot / den if den > 0 else (1.0 if self.ref == self.q == 0 else 0.0)
        sqnr = (
            math.inf
            if self.err == 0
            else (10 * math.log10(self.ref / self.err) if self.ref > 0 else -math.inf)
        )
        return OutputMetrics(name, cos, sqnr, self.max_abs, self.n)


def accuracy_report(
    float_model: Any, quant_model: Any, data: Any, *, runtime: str = "opstrata", progress: bool | None = None
) -> QuantReport:
    """Run both models on ``data`` (feed dicts) in ``runtime`` and compare every float output."""
    fm = load_model(float_model, "accuracy_report(float_model)")
    qm = load_model(quant_model, "accuracy_report(quant_model)")
    fs, _ = session_for(fm, runtime)
    qs, note = session_for(qm, runtime)
    names = [o.name for o in fm.graph.output]
    qnames = {o.name for o in qm.graph.output}
    missing = [n for n in names if n not in qnames]
    if missing:
        raise QuantError("accuracy_report(quant_model)", f"the quantized model lacks output(s) {missing}",
                         "pass the model quantized from float_model")  # fmt: skip
    inputs = graph_input_names(fm)
    acc = {n: _Acc() for n in names}
    batches = 0
    for i, batch in enumerate(_iterate(data, progress, "accuracy_report")):
        feeds = check_feeds(batch, inputs, i, "accuracy_report(data)")
        ref, got = fs.run(names, feeds), qs.run(names, feeds)
        for n, r, q in zip(names, ref, got, strict=True):
            if np.asarray(r).dtype.kind == "f":
                acc[n].add(r, q)
        batches += 1
    if batches == 0:
        raise QuantError("accuracy_report(data)", "no batch to evaluate", "pass at least one feed dict")
    outs = {n: a.metrics(n) for n, a in acc.items() if a.n}
    if not outs:
        raise QuantError(
            "accuracy_report", "the model has no float output to compare", "compare float outputs"
        )
    return QuantReport(outs, batches, runtime, [note] if note else [])


def enforce(
    float_model: onnx.ModelProto, qmodel: onnx.ModelProto, data: Any, min_cosine: float | None, where: str
) -> QuantReport | None:
    """The ``min_cosine`` contract of the schemes: report on ``data`` and raise if it fails."""
    if min_cosine is None:
        return None
    precheck(data, min_cosine, where)
    report = accuracy_report(float_model, qmodel, data)
    report.check(float(min_cosine), where)
    return report


def precheck(data: Any, min_cosine: float | None, where: str) -> None:
    """Fail before any work when ``min_cosine`` is set but there is no reusable data to measure it on."""
    if min_cosine is None:
        return
    if isinstance(min_cosine, bool) or not isinstance(min_cosine, (int, float)) or not -1 <= min_cosine <= 1:
        raise QuantError(f"{where}(min_cosine)", f"expected a number in [-1, 1], got {min_cosine!r}",
                         "use e.g. min_cosine=0.99")  # fmt: skip
    if data is None:
        raise QuantError(f"{where}(min_cosine)", "min_cosine needs held-out data to measure",
                         "pass eval_data=[feed dicts] as well")  # fmt: skip
    if not isinstance(data, Mapping) and iter(data) is data:
        raise QuantError(f"{where}(eval_data)", "the evaluation data is a one-shot iterator",
                         "pass a list of feed dicts (it is read after calibration)")  # fmt: skip
