"""The accuracy contract: ``quantize(model, calibration_data, scheme, accuracy_budget) -> QuantizedModel``.

One entry point over the schemes (``w8a8`` static, ``w8a8-dynamic``, weight-only ``w8`` / ``w4`` with
``-g<N>`` groups, ``fp8`` e4m3 static), measured against the float model on the data given, with an
optional budget that puts the worst nodes back to float one at a time until it holds.
"""

from __future__ import annotations

import inspect
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

import opstrata.ops as ops

from ._dynamic import quantize_dynamic
from ._errors import AccuracyError, CalibrationError, QuantError
from ._feeds import input_specs, materialize
from ._model import QUANTIZABLE, load_model
from ._node_metrics import (
    FloatReference,
    LMSpec,
    Measurement,
    QNode,
    initializer_bytes,
    local_metrics,
    measure,
    quantized_nodes,
)
from ._qparams import QuantParams
from ._quantize_report import NodeReport, OutputReport, QuantizationReport
from ._smooth import describe, smooth_record
from ._static import quantize_static
from ._weights import quantize_weights

__all__ = ["BUDGET_KEYS", "SCHEMES", "TASKS", "QuantizedModel", "parse_scheme", "quantize"]

_WHERE = "quantize"
#: The scheme names (``w<bits>-g<N>`` takes any group size N >= 2, e.g. ``w4-g32``).
SCHEMES = (
    "w8a8",
    "w8a8-dynamic",
    "w8a8-dynamic-token",
    "w8",
    "w4",
    "w8-g<N>",
    "w4-g<N>",
    "w4-g<N>-gptq",
    "fp8",
)
#: Accuracy budget terms: output cosine floor, max abs error ceiling, top-1 agreement floor (0..1),
#: perplexity increase ceiling (task="lm").
BUDGET_KEYS = ("min_cosine", "max_abs", "min_top1", "max_ppl_delta")
TASKS = (None, "classifier", "lm")
_FP8 = "float8_e4m3fn"


@dataclass(frozen=True)
class _Scheme:
    name: str
    func: Callable[..., onnx.ModelProto]
    fixed: dict[str, Any]  # settings the scheme name decides
    calibrated: bool


def parse_scheme(scheme: Any) -> _Scheme:
    """The scheme function and its fixed settings for a scheme name; QuantError listing the valid names."""
    s = scheme.strip().lower() if isinstance(scheme, str) else None
    if s == "w8a8":
        return _Scheme(s, quantize_static, {}, True)
    if s == "fp8":
        return _Scheme(s, quantize_static, {"activation_dtype": _FP8, "weight_dtype": _FP8}, True)
    if s == "w8a8-dynamic":
        return _Scheme(s, quantize_dynamic, {}, False)
    if s == "w8a8-dynamic-token":  # symmetric int8 activations, one scale per row (per token)
        return _Scheme(s, quantize_dynamic, {"per_token": True}, False)
    m = re.fullmatch(r"w(4|8)(?:-g(\d+))?(-gptq)?", s or "")
    if m and (m.group(2) is None or int(m.group(2)) >= 2):
        group = int(m.group(2)) if m.group(2) else None
        fixed: dict[str, Any] = {"bits": int(m.group(1)), "group_size": group}
        if m.group(3):  # GPTQ rounding: needs the calibration activations
            return _Scheme(s or "", quantize_weights, {**fixed, "method": "gptq"}, True)
        return _Scheme(s or "", quantize_weights, fixed, False)
    raise QuantError(f"{_WHERE}(scheme)", f"unknown scheme {scheme!r}",
                     f"use one of {', '.join(SCHEMES)} (e.g. 'w4-g128')")  # fmt: skip


def _budget(budget: Any) -> dict[str, float] | None:
    where = f"{_WHERE}(accuracy_budget)"
    if budget is None:
        return None
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        budget = {"min_cosine": budget}
    if not isinstance(budget, Mapping) or not budget:
        raise QuantError(where, f"expected a number (the minimum output cosine) or a dict of "
                         f"{', '.join(BUDGET_KEYS)}, got {budget!r}", "pass e.g. 0.999 or {'min_cosine': 0.999}")  # fmt: skip
    out: dict[str, float] = {}
    for k, v in budget.items():
        if k not in BUDGET_KEYS:
            raise QuantError(where, f"unknown budget term {k!r}", f"use among {', '.join(BUDGET_KEYS)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise QuantError(where, f"{k} must be a finite number, got {v!r}", f"pass e.g. {{{k!r}: 0.99}}")
        lo, hi = {"min_cosine": (-1.0, 1.0), "min_top1": (0.0, 1.0), "max_abs": (0.0, math.inf)}.get(
            k, (-math.inf, math.inf))  # fmt: skip
        if not lo <= v <= hi:
            raise QuantError(where, f"{k} must lie in [{lo}, {hi}], got {v}", f"pass a {k} in that range")
        out[k] = float(v)
    return out


def _achieved(budget: Mapping[str, float], m: Measurement) -> dict[str, float]:
    """The measured value of each budget term."""
    got: dict[str, float] = {}
    for k in budget:
        if k == "min_cosine":
            got[k] = min(o.cosine for o in m.outputs.values())
        elif k == "max_abs":
            got[k] = max(o.max_abs for o in m.outputs.values())
        elif k == "min_top1":
            got[k] = min(m.top1.values())
        elif k == "max_ppl_delta":
            assert m.perplexity is not None
            got[k] = m.perplexity[1] - m.perplexity[0]
    return got


def _misses(budget: Mapping[str, float], got: Mapping[str, float]) -> list[str]:
    out = []
    for k, limit in budget.items():
        v = got[k]
        ok = v >= limit if k.startswith("min_") else v <= limit
        if not ok:  # NaN misses too
            out.append(f"{k}={limit} missed ({k[4:]} {v:.6g})")
    return out


def _better(k: str, a: float, b: float) -> bool:
    return (a > b) if k.startswith("min_") else (a < b)


def _top1_rule(task: str | None) -> Callable[[str, np.ndarray], bool]:
    if task == "classifier":
        return lambda _n, a: a.ndim >= 1 and a.shape[-1] >= 2
    if task is None:  # [batch, classes] logits
        return lambda _n, a: a.ndim == 2 and a.shape[-1] >= 2
    return lambda _n, _a: False


def _lm_spec(task: str | None, labels: str | None, logits: str | None, src: onnx.ModelProto) -> LMSpec | None:
    where = f"{_WHERE}(task)"
    if task not in TASKS:
        raise QuantError(where, f"unknown task {task!r}", "use None, 'classifier' or 'lm'")
    outs = [o.name for o in src.graph.output]
    if logits is not None and logits not in outs:
        raise QuantError(f"{_WHERE}(logits)", f"{logits!r} is not an output of the model (outputs: {outs})",
                         "name the output holding the logits")  # fmt: skip
    if task != "lm":
        if labels is not None:
            raise QuantError(f"{_WHERE}(labels)", "labels= applies to task='lm' (perplexity)",
                             "pass task='lm' as well, or drop labels=")  # fmt: skip
        return None
    specs = input_specs(src)
    ints = [s.name for s in specs if s.dtype is not None and s.dtype.kind in "iu"]
    if labels is None:
        if len(ints) != 1:
            raise QuantError(f"{_WHERE}(labels)", f"task='lm' needs the input of token ids; the model has "
                             f"{len(ints)} integer inputs ({ints})", "pass labels='<input of token ids>'")  # fmt: skip
        labels = ints[0]
    elif labels not in [s.name for s in specs]:
        raise QuantError(f"{_WHERE}(labels)", f"{labels!r} is not an input of the model (inputs: "
                         f"{[s.name for s in specs]})", "name the input holding the token ids")  # fmt: skip
    return LMSpec(logits if logits is not None else outs[0], labels)


def _options(sch: _Scheme, options: Mapping[str, Any]) -> dict[str, Any]:
    params = inspect.signature(sch.func).parameters
    own = {"model", "calibration_data", "exclude", "overrides", "eval_data", "min_cosine"}
    allowed = [p for p in params if p not in own and p not in sch.fixed]
    for k, v in options.items():
        if k == "min_cosine":
            raise QuantError(f"{_WHERE}(min_cosine)", "quantize() takes its accuracy contract as accuracy_budget",
                             f"pass accuracy_budget={{'min_cosine': {v!r}}}")  # fmt: skip
        if k in sch.fixed:
            raise QuantError(f"{_WHERE}({k})", f"scheme {sch.name!r} sets {k}={sch.fixed[k]!r}",
                             f"drop {k}= or choose another scheme ({', '.join(SCHEMES)})")  # fmt: skip
        if k not in allowed:
            raise QuantError(f"{_WHERE}({k})", f"scheme {sch.name!r} ({sch.func.__name__}) takes no option {k!r}",
                             f"use among {', '.join(allowed)}")  # fmt: skip
    return {**sch.fixed, **options}


class QuantizedModel:
    """A quantized ONNX model (standard QDQ) with its :class:`QuantizationReport`.

    ``model``: the onnx.ModelProto; ``save(path)`` writes it atomically; ``session()`` runs it in
    opstrata's runtime; ``report``: per node and per output metrics against float, sizes, budget put-backs.
    """

    def __init__(self, model: onnx.ModelProto, report: QuantizationReport, scheme: str) -> None:
        self.model, self.report, self.scheme = model, report, scheme

    def __repr__(self) -> str:
        return (f"QuantizedModel(scheme={self.scheme!r}, nodes quantized={len(self.report.quantized)}, "
                f"put back={len(self.report.fallback)}, min cosine={self.report.min_cosine})")  # fmt: skip

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model to ``path`` (temp file in the same directory, then rename: never half written)."""
        p = Path(path)
        where = f"QuantizedModel.save('{p}')"
        if not p.parent.is_dir():
            raise QuantError(
                where, f"directory '{p.parent}' does not exist", "create it first or pick another path"
            )
        data = self.model.SerializeToString()  # > 2 GiB raises in protobuf itself, before any file exists
        return ops.atomic_write(p, data, fsync=True)

    def session(self, sess_options: Any = None, **kwargs: Any) -> Any:
        """An :class:`opstrata.runtime.InferenceSession` over the model (``device=``, SessionOptions)."""
        from opstrata.runtime import InferenceSession

        return InferenceSession(self.model, sess_options, **kwargs)


def _node_entries(
    qnodes: list[QNode], meas: Measurement | None, local: Mapping[str, Any]
) -> list[NodeReport]:
    out = []
    for n in qnodes:
        m = meas.nodes.get(n.output) if meas is not None else None
        lm = local.get(n.name)
        out.append(NodeReport(
            n.name, n.op, m.sqnr_db if m else None, m.cosine if m else None, False, "",
            lm.sqnr_db if lm else None, lm.cosine if lm else None, m.max_abs if m else None,
        ))  # fmt: skip
    return out


def quantize(
    model: Any,
    calibration_data: Iterable[Mapping[str, Any]] | None = None,
    scheme: str = "w8a8",
    accuracy_budget: float | Mapping[str, float] | None = None,
    *,
    eval_data: Iterable[Mapping[str, Any]] | None = None,
    exclude: Iterable[str] = (),
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    task: str | None = None,
    labels: str | None = None,
    logits: str | None = None,
    **options: Any,
) -> QuantizedModel:
    """Quantize ``model`` (path, bytes or ModelProto) with ``scheme`` and measure it against float.

    Schemes: ``"w8a8"`` (static: calibrated uint8 activations, int8 per-channel weights),
    ``"w8a8-dynamic"`` (int8 weights, activations quantized at run time per tensor; ``"w8a8-dynamic-token"``:
    per token, symmetric int8), ``"w8"`` / ``"w4"`` /
    ``"w4-g128"`` (weight-only, per channel or per group of N input channels; ``"w4-g128-gptq"`` rounds with
    GPTQ on the calibration data instead of to nearest), ``"fp8"`` (static float8 e4m3fn activations and
    weights). ``calibration_data``: an iterable of feed dicts {input name: array}
    (read once, kept as a list); static schemes need it, the others use it only to measure.
    ``eval_data``: measure on these feed dicts instead. ``exclude`` / ``overrides`` / ``**options``: passed to
    the scheme function (quantize_static / quantize_dynamic / quantize_weights: observer=, per_channel=,
    op_types=, ``smoothquant=0.5`` for SmoothQuant before w8a8 / w8a8-dynamic / fp8, ...).

    ``accuracy_budget``: a minimum output cosine (``0.999``) or a dict of ``min_cosine``, ``max_abs``,
    ``min_top1``, ``max_ppl_delta``. While it is missed, the quantized node adding the most error (lowest
    local SQNR) goes back to float and the model is quantized again; :class:`AccuracyError` when even one
    node quantized misses it. ``task``: ``"classifier"`` (top-1 agreement of every output's last-axis
    argmax), ``"lm"`` (perplexity delta of ``logits`` [..., T, vocab] against the next token of the integer
    input ``labels``), None (top-1 agreement for [batch, classes] outputs).
    """
    if isinstance(model, np.ndarray) or isinstance(calibration_data, QuantParams):
        raise QuantError(f"{_WHERE}(model)", "got an array (and QuantParams): quantize() quantizes models; the "
                         "array-level quantize(x, params) is now quantize_array(x, params)",
                         "call opstrata.quant.quantize_array(x, params)")  # fmt: skip
    sch = parse_scheme(scheme)
    budget = _budget(accuracy_budget)
    kwargs = _options(sch, options)
    src = load_model(model, f"{_WHERE}(model)")
    if not any(n.op_type in QUANTIZABLE and n.domain in ("", "ai.onnx") for n in src.graph.node):
        raise QuantError(
            f"{_WHERE}(model)", f"nothing to quantize: the model has no {'/'.join(QUANTIZABLE)} node (its ops: "
            f"{', '.join(sorted({n.op_type for n in src.graph.node}))})",
            "quantization rewrites MatMul/Gemm/Conv nodes; run this model in float as it is",
        )  # fmt: skip
    lm = _lm_spec(task, labels, logits, src)
    if sch.calibrated and calibration_data is None:
        raise CalibrationError(f"{_WHERE}(calibration_data)", f"scheme {sch.name!r} is static: activation "
                               "ranges come from calibration data, and none was given",
                               "pass calibration_data=[feed dicts], or use 'w8a8-dynamic' / 'w8' / 'w4-g128', "
                               "which need none")  # fmt: skip
    calib = (
        materialize(calibration_data, src, f"{_WHERE}(calibration_data)")
        if calibration_data is not None
        else None
    )
    ev = materialize(eval_data, src, f"{_WHERE}(eval_data)") if eval_data is not None else calib
    source = "eval_data" if eval_data is not None else ("calibration_data" if calib is not None else "none")
    if budget is not None and ev is None:
        raise QuantError(f"{_WHERE}(accuracy_budget)", "the budget needs data to measure the model on",
                         "pass calibration_data= or eval_data= (feed dicts)")  # fmt: skip
    if lm is not None and ev is None:
        raise QuantError(f"{_WHERE}(task)", "task='lm' measures perplexity on data, and none was given",
                         "pass calibration_data= or eval_data= with the token ids")  # fmt: skip
    user_excluded = [exclude] if isinstance(exclude, str) else list(exclude)

    def run(excl: list[str]) -> onnx.ModelProto:
        if sch.calibrated and sch.func is quantize_weights:  # GPTQ: keyword-only calibration_data
            out = sch.func(src, calibration_data=calib, exclude=excl, overrides=overrides, **kwargs)
        elif sch.calibrated:
            out = sch.func(src, calib, exclude=excl, overrides=overrides, **kwargs)
        elif kwargs.get("smoothquant") is not None:  # w8a8-dynamic + SmoothQuant: scales from the data
            out = sch.func(src, calibration_data=calib, exclude=excl, overrides=overrides, **kwargs)
        else:
            out = sch.func(src, exclude=excl, overrides=overrides, **kwargs)
        for prop in out.metadata_props:  # the scheme as quantize() names it ("fp8", not "w8a8-static")
            if prop.key == "opstrata.quant.scheme":
                prop.value = sch.name
        return out

    q = run(user_excluded)
    qnodes = quantized_nodes(src, q)
    if not qnodes:
        raise QuantError(f"{_WHERE}(model)", f"nothing to quantize: scheme {sch.name!r} changed no node",
                         "check exclude= / op_types=, or pick a scheme that covers the model's nodes")  # fmt: skip
    notes: list[str] = []
    ref = meas = None
    local: dict[str, Any] = {}
    if ev is not None:
        ref = FloatReference(src, ev, [n.output for n in qnodes], top1=_top1_rule(task), lm=lm)
        if budget and "min_top1" in budget and not ref.top1_outputs:
            raise QuantError(f"{_WHERE}(accuracy_budget)", "min_top1 needs class scores, and no output looks "
                             "like [batch, classes]", "pass task='classifier' (top-1 of every output's last axis)")  # fmt: skip
        if budget and "max_ppl_delta" in budget and lm is None:
            raise QuantError(f"{_WHERE}(accuracy_budget)", "max_ppl_delta needs task='lm'",
                             "pass task='lm' (and labels= / logits= when they cannot be guessed)")  # fmt: skip
        local = local_metrics(src, q, qnodes, ev)
        meas = measure(ref, q, qnodes)
    else:
        notes.append("not measured: pass calibration_data= or eval_data= to get per-node and output metrics")
    record = smooth_record(q)
    if record is not None:
        notes.append(describe(record))
    if not sch.calibrated and calib is not None and eval_data is None and kwargs.get("smoothquant") is None:
        notes.append(f"scheme {sch.name} needs no calibration: calibration_data was used to measure only")

    put_back: list[NodeReport] = []
    met: bool | None = None
    if budget is not None:
        assert ref is not None and meas is not None
        order = sorted(qnodes, key=lambda n: local[n.name].sqnr_db if n.name in local else math.inf)
        got = _achieved(budget, meas)
        best = dict(got)
        misses = _misses(budget, got)
        current = qnodes
        while misses:
            if len(current) <= 1:
                report = _report(sch, src, q, current, meas, local, put_back, user_excluded, ref, budget, False,
                                 source, notes)  # fmt: skip
                shown = ", ".join(f"{k[4:]} {v:.6g}" for k, v in best.items())
                raise AccuracyError(
                    f"{_WHERE}(accuracy_budget)",
                    f"the budget {budget} cannot be met with any node quantized: best achieved {shown} (with "
                    f"{len(put_back)} of {len(qnodes)} node(s) back in float: {[n.node for n in put_back]})",
                    "loosen the budget, or use a finer scheme (w8a8-dynamic, w8, smaller groups), a clipping "
                    "observer (observer='percentile'), or more representative calibration data", report=report,
                )  # fmt: skip
            live = {n.name for n in current}
            worst = next(n for n in order if n.name in live)
            m, lc = meas.nodes.get(worst.output), local.get(worst.name)
            reason = (f"budget: {'; '.join(misses)} with {len(current)} node(s) quantized; lowest local SQNR "
                      f"{lc.sqnr_db:.2f} dB" if lc else f"budget: {'; '.join(misses)}")  # fmt: skip
            put_back.append(NodeReport(
                worst.name, worst.op, m.sqnr_db if m else None, m.cosine if m else None, True, reason,
                lc.sqnr_db if lc else None, lc.cosine if lc else None, m.max_abs if m else None,
            ))  # fmt: skip
            q = run(user_excluded + [n.node for n in put_back])
            current = quantized_nodes(src, q)
            meas = measure(ref, q, current)
            got = _achieved(budget, meas)
            best = {k: (got[k] if _better(k, got[k], best[k]) else best[k]) for k in best}
            misses = _misses(budget, got)
        met = True
        qnodes = current
    report = _report(
        sch, src, q, qnodes, meas, local, put_back, user_excluded, ref, budget, met, source, notes
    )
    return QuantizedModel(q, report, sch.name)


def _report(
    sch: _Scheme,
    src: onnx.ModelProto,
    q: onnx.ModelProto,
    qnodes: list[QNode],
    meas: Measurement | None,
    local: Mapping[str, Any],
    put_back: list[NodeReport],
    user_excluded: list[str],
    ref: FloatReference | None,
    budget: dict[str, float] | None,
    met: bool | None,
    source: str,
    notes: list[str],
) -> QuantizationReport:
    entries = {e.node: e for e in _node_entries(qnodes, meas, local)}
    ops = {n.name: n.op_type for n in src.graph.node}
    for name in user_excluded:
        if ops.get(name) in QUANTIZABLE:
            entries[name] = NodeReport(name, ops[name], None, None, True, "excluded by the caller (exclude=)")
    order = [n.name for n in src.graph.node if n.name in entries]
    nodes = [entries[n] for n in order] + put_back
    outputs: list[OutputReport] = []
    ppl = None
    if meas is not None:
        outputs = [OutputReport(o.name, o.cosine, o.sqnr_db, o.max_abs, meas.top1.get(o.name))
                   for o in meas.outputs.values()]  # fmt: skip
        if meas.perplexity is not None and ref is not None and ref.lm is not None:
            f, qv = meas.perplexity
            ppl = {
                "logits": ref.lm.logits,
                "labels": ref.lm.labels,
                "float": f,
                "quantized": qv,
                "delta": qv - f,
            }
    return QuantizationReport(
        scheme=sch.name, nodes=nodes, outputs=outputs, size_float=initializer_bytes(src),
        size_quantized=initializer_bytes(q), batches=len(ref.data) if ref is not None else 0, data=source,
        budget=budget, budget_met=met, perplexity=ppl, notes=list(notes),
    )  # fmt: skip
