"""SmoothQuant (Xiao et al., 2023): move activation outliers into the weights before W8A8 quantization.

For a linear layer ``y = X W`` (X [..., K], W [K, N]) a few input channels of X often carry values far
larger than the rest, and one per-tensor activation scale then spends its codes on them. With one factor
per input channel ``s_j = max|X_j|^alpha / max|W_j,:|^(1 - alpha)``, ``X' = X / s`` and ``W' = diag(s) W``
give the same product in float while X' has no outlier channels left (alpha sets how much of the range
moves into the weights).

``1 / s`` goes where it costs nothing when it can: into the scale and bias of a preceding
LayerNormalization, or of a preceding ``Mul`` by a constant (optionally followed by an ``Add`` of a
constant: a decomposed norm's tail), when that node's output feeds only the layers being smoothed. All
layers reading one activation share one ``s`` (from the largest weight row over all of them: Q/K/V
projections behind one LayerNormalization). Otherwise a ``Mul(x, 1/s)`` node goes in front of them.
Which layers were folded and which got a Mul (and which were skipped, why) is recorded in the model's
metadata under ``opstrata.quant.smoothquant`` (JSON).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx

from opstrata.graph import tensor_from_array

from ._calibrate import collect
from ._common import require_float32
from ._errors import CalibrationError, QuantError
from ._model import ModelInfo, load_model
from ._qdq import Rewriter
from ._select import Target, _attr, select_targets

__all__ = ["METADATA_KEY", "ChannelAbsMaxObserver", "check_alpha", "smooth", "smooth_model"]

METADATA_KEY = "opstrata.quant.smoothquant"
_WHERE = "smooth_model"
_OPS = ("MatMul", "Gemm")
_S_MIN, _S_MAX = 1e-5, 1e5


class ChannelAbsMaxObserver:
    """Running max of ``|x|`` per channel of the last axis (``transpose``: the first) over every batch."""

    def __init__(self, channels: int, *, transpose: bool = False, where: str = _WHERE) -> None:
        self.k, self.transpose, self.where = channels, transpose, where
        self.max = np.zeros(channels, np.float64)
        self.rows = 0

    def observe(self, x: np.ndarray) -> None:
        """Fold one batch of activations into the per-channel maxima."""
        a = np.abs(np.asarray(x, np.float64))
        a = a.T if self.transpose else a
        if a.ndim == 0 or a.shape[-1] != self.k:
            raise CalibrationError(f"{self.where}(calibration_data)", f"an activation has shape {np.shape(x)}; "
                                   f"the layer's weight expects {self.k} input channels on its "
                                   f"{'first' if self.transpose else 'last'} axis",
                                   "calibrate with the model's own inputs")  # fmt: skip
        rows = a.reshape(-1, self.k)
        if rows.shape[0]:
            self.max = np.maximum(
                self.max, np.nan_to_num(rows.max(0), nan=0.0, posinf=np.finfo(np.float32).max)
            )
        self.rows += rows.shape[0]


def check_alpha(alpha: Any, where: str) -> float:
    """``alpha`` as a float in (0, 1]; QuantError naming ``where`` otherwise."""
    ok = isinstance(alpha, numbers.Real) and not isinstance(alpha, bool) and math.isfinite(float(alpha))
    if not ok or not 0.0 < float(alpha) <= 1.0:
        raise QuantError(where, f"SmoothQuant's alpha must be a number in (0, 1], got {alpha!r}",
                         "pass e.g. 0.5 (the paper's default; 0.75-0.85 for models with strong outliers)")  # fmt: skip
    return float(alpha)


def _transposed(node: onnx.NodeProto) -> bool:
    """True when the node's weight is stored [N, K] (Gemm transB=1), False for [K, N]."""
    return bool(node.op_type == "Gemm" and _attr(node, "transB", 0))


def _k_of(node: onnx.NodeProto, w: np.ndarray) -> int:
    """The input-channel count of a 2-D weight in its own layout."""
    return int(w.shape[1] if _transposed(node) else w.shape[0])


def _row_max(node: onnx.NodeProto, w: np.ndarray) -> np.ndarray:
    """``max |W_j,:|`` per input channel j."""
    a = np.abs(w.astype(np.float64))
    return a.max(0) if _transposed(node) else a.max(1)


def _scaled_weight(node: onnx.NodeProto, w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``diag(s) W`` in the weight's own layout."""
    w64 = w.astype(np.float64)
    return (w64 * s[None, :] if _transposed(node) else w64 * s[:, None]).astype(np.float32)


def _why_not(t: Target, info: ModelInfo) -> str | None:
    """Why node ``t`` cannot be smoothed (None: it can)."""
    n = t.node
    if 0 not in t.activations:
        return "its first input is a constant"
    if t.weights != [1]:
        return "its second input is an activation, not a constant weight"
    if n.op_type == "Gemm" and _attr(n, "transA", 0):
        return "Gemm with transA=1"
    w = info.array(n.input[1])
    if w.ndim != 2:
        return f"weight of rank {w.ndim} (only 2-D weights are smoothed)"
    if not np.issubdtype(w.dtype, np.floating):
        return f"weight of dtype {w.dtype}"
    return None


def _channel_vector(c: np.ndarray, k: int) -> bool:
    """Whether constant ``c`` broadcasts along the last axis only (scalar, [K], [1, .., 1, K] or all ones)."""
    return all(d == 1 for d in c.shape[:-1]) and (c.ndim == 0 or c.shape[-1] in (1, k))


class _Smoother:
    def __init__(self, m: onnx.ModelProto, where: str) -> None:
        self.m, self.where = m, where
        self.info = ModelInfo(m)
        self.rw = Rewriter(m, self.info)
        self.producer = {o: n for n in m.graph.node for o in n.output if o}
        self.graph_outputs = {o.name for o in m.graph.output}

    def only_feeds(self, tensor: str, nodes: set[str]) -> bool:
        """Whether every reader of ``tensor`` is one of ``nodes`` (and it is no graph output)."""
        if tensor in self.graph_outputs:
            return False
        return all(c.name in nodes for c in self.info.consumers.get(tensor, []))

    def set_const(self, node: onnx.NodeProto, pos: int, value: np.ndarray) -> None:
        """Input ``pos`` of ``node`` becomes ``value``: in place when ``node`` alone reads it, else a copy."""
        name = node.input[pos]
        readers = self.info.consumers.get(name, [])
        if (
            all(r.name == node.name for r in readers)
            and name not in self.graph_outputs
            and name in self.info.inits
        ):
            self.info.inits[name].CopyFrom(tensor_from_array(value.astype(np.float32), name))
        else:
            node.input[pos] = self.rw.init(f"{name}_smoothed", value.astype(np.float32))
            self.rw.replaced(name)

    def scale_weights(self, nodes: list[onnx.NodeProto], s: np.ndarray) -> None:
        """Every weight of ``nodes`` becomes ``diag(s) W``: in place when only these nodes read it (in one
        layout), else as a copy for them (a weight shared with other layers stays as it was for those)."""
        made: dict[tuple[str, bool], str] = {}
        for n in nodes:
            name, key = n.input[1], (n.input[1], _transposed(n))
            if key in made:
                n.input[1] = made[key]
                continue
            w = _scaled_weight(n, self.info.array(name), s)
            same = {r.name for r in nodes if r.input[1] == name and _transposed(r) == key[1]}
            if self.only_feeds(name, same):
                self.info.inits[name].CopyFrom(tensor_from_array(w, name))
                made[key] = name
            else:
                made[key] = n.input[1] = self.rw.init(f"{name}_smoothed", w)
                self.rw.replaced(name)

    def const_input(self, node: onnx.NodeProto) -> int | None:
        """The position of the single constant float32 input of a binary node, or None."""
        consts = [i for i, x in enumerate(node.input[:2]) if x and self.info.is_const(x)]
        if len(node.input) != 2 or len(consts) != 1:
            return None
        c = self.info.array(node.input[consts[0]])
        return consts[0] if c.dtype == np.float32 else None

    def fold(self, x: str, group: set[str], s: np.ndarray) -> str | None:
        """Fold ``1/s`` into the producer of ``x`` when that is safe; returns the folded node's name."""
        p = self.producer.get(x)
        k = s.shape[0]
        if p is None or p.domain not in ("", "ai.onnx") or not self.only_feeds(x, group):
            return None
        if p.op_type == "LayerNormalization" and p.output[0] == x:
            if len(p.input) < 2 or not self.info.is_const(p.input[1]):
                return None
            g = self.info.array(p.input[1])
            has_b = len(p.input) > 2 and bool(p.input[2])
            if g.shape != (k,) or g.dtype != np.float32:
                return None
            if has_b:
                if not self.info.is_const(p.input[2]):
                    return None
                b = self.info.array(p.input[2])
                if b.shape != (k,) or b.dtype != np.float32:
                    return None
                self.set_const(p, 2, b.astype(np.float64) / s)
            self.set_const(p, 1, g.astype(np.float64) / s)
            return p.name
        mul, add = p, None
        if p.op_type == "Add":  # Mul(z, gamma) -> Add(., beta): both constants scale by 1/s
            pos = self.const_input(p)
            if pos is None or not _channel_vector(self.info.array(p.input[pos]), k):
                return None
            mul = self.producer.get(p.input[1 - pos])
            if mul is None or not self.only_feeds(p.input[1 - pos], {p.name}):
                return None
            add = p
        if mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx"):
            return None
        mpos = self.const_input(mul)
        if mpos is None or not _channel_vector(self.info.array(mul.input[mpos]), k):
            return None
        c = self.info.array(mul.input[mpos]).astype(np.float64)
        self.set_const(mul, mpos, c / s.reshape((1,) * max(c.ndim - 1, 0) + (k,)))
        if add is not None:
            apos = self.const_input(add)
            assert apos is not None
            b = self.info.array(add.input[apos]).astype(np.float64)
            self.set_const(add, apos, b / s.reshape((1,) * max(b.ndim - 1, 0) + (k,)))
            return f"{mul.name}+{add.name}"
        return mul.name


def _scales(act: np.ndarray, wmax: np.ndarray, alpha: float) -> np.ndarray:
    """``s_j = max|X_j|^alpha / max|W_j|^(1-alpha)``; 1 where either side is zero (a dead channel)."""
    live = (act > 0) & (wmax > 0)
    s = np.ones_like(act)
    s[live] = act[live] ** alpha / wmax[live] ** (1.0 - alpha)
    return np.clip(np.where(np.isfinite(s), s, 1.0), _S_MIN, _S_MAX)


def smooth(
    model: Any,
    calibration_data: Any,
    *,
    alpha: Any,
    op_types: Iterable[str],
    exclude: Iterable[str],
    progress: bool | None,
    where: str,
    alpha_name: str = "alpha",
) -> onnx.ModelProto:
    """:func:`smooth_model` with the caller's name in errors (``where``, and ``alpha_name`` for alpha)."""
    a = check_alpha(alpha, f"{where}({alpha_name})")
    if calibration_data is None:
        raise CalibrationError(f"{where}(calibration_data)", "SmoothQuant computes its per-channel scales from "
                               "the activations' ranges, and no calibration data was given",
                               f"pass calibration_data=[feed dicts], or drop {alpha_name}=")  # fmt: skip
    ops = (op_types,) if isinstance(op_types, str) else tuple(op_types)
    bad = [o for o in ops if o not in _OPS]
    if bad:
        raise QuantError(f"{where}(op_types)", f"SmoothQuant cannot smooth op type(s) {bad}",
                         f"choose among {', '.join(_OPS)} (Conv is not smoothed)")  # fmt: skip
    m = load_model(model, f"{where}(model)")
    sm = _Smoother(m, where)
    info = sm.info
    targets = select_targets(info, op_types=ops, exclude=exclude, overrides=None, defaults={"_": None},
                             supported=_OPS, where=where)  # fmt: skip
    groups: dict[str, list[onnx.NodeProto]] = {}
    skipped: dict[str, str] = {}
    for t in targets:
        why = _why_not(t, info)
        if why is not None:
            skipped[t.name] = why
            continue
        require_float32(info, t.node.input[0], t.name, where)
        require_float32(info, t.node.input[1], t.name, where)
        groups.setdefault(t.node.input[0], []).append(t.node)
    if not groups:
        raise QuantError(where, "nothing to smooth: no selected MatMul/Gemm has an activation input and a 2-D "
                         f"constant weight ({'; '.join(f'{k}: {v}' for k, v in skipped.items())})",
                         "SmoothQuant applies to linear layers (activation x weight); drop smoothquant= for "
                         "this model or check op_types= / exclude=")  # fmt: skip
    observers: dict[str, list[Any]] = {}
    wmax: dict[str, np.ndarray] = {}
    for x, nodes in groups.items():
        ks = {_k_of(n, info.array(n.input[1])) for n in nodes}
        if len(ks) != 1:
            raise QuantError(where, f"the layers reading {x!r} ({[n.name for n in nodes]}) have weights with "
                             f"different input-channel counts {sorted(ks)}", "check the model: it cannot run")  # fmt: skip
        wmax[x] = np.max([_row_max(n, info.array(n.input[1])) for n in nodes], axis=0)
        observers[x] = [ChannelAbsMaxObserver(ks.pop(), where=where)]
    collect(m, calibration_data, observers, progress=progress, where=f"{where}(calibration_data)")
    folded: dict[str, str] = {}
    mul: list[str] = []
    for x, nodes in groups.items():
        s = _scales(observers[x][0].max, wmax[x], a)
        sm.scale_weights(nodes, s)
        into = sm.fold(x, {n.name for n in nodes}, s)
        if into is not None:
            folded.update({n.name: into for n in nodes})
            continue
        inv = sm.rw.init(f"{x}_smooth_scale", (1.0 / s).astype(np.float32))
        xs = sm.rw.fresh(f"{x}_smoothed")
        sm.rw.node("Mul", [x, inv], [xs], nodes[0].name, f"{x}_smooth_Mul")
        for n in nodes:
            n.input[0] = xs
            mul.append(n.name)
    out = sm.rw.finish()
    record = {"alpha": a, "folded": folded, "mul": mul, "skipped": skipped}
    meta = {p.key: p.value for p in out.metadata_props}
    onnx.helper.set_model_props(out, {**meta, METADATA_KEY: json.dumps(record)})
    if out.ByteSize() < 2**31 - 1:
        try:
            onnx.checker.check_model(out)
        except onnx.checker.ValidationError as exc:  # pragma: no cover - a bug here, not the user's
            raise QuantError(where, f"the smoothed model fails onnx.checker: {exc}",
                             "report this with the model; exclude the node it names meanwhile") from exc  # fmt: skip
    return out


def smooth_model(
    model: Any,
    calibration_data: Any,
    *,
    alpha: float = 0.5,
    op_types: Iterable[str] = _OPS,
    exclude: Iterable[str] = (),
    progress: bool | None = None,
) -> onnx.ModelProto:
    """SmoothQuant's float rewrite of ``model`` (path, bytes or ModelProto): per input channel j of every
    MatMul/Gemm with a 2-D constant weight, ``s_j = max|X_j|^alpha / max|W_j,:|^(1-alpha)`` from one pass
    over ``calibration_data`` (feed dicts) in opstrata's runtime; the weight becomes ``diag(s) W`` and the
    activation ``X / s`` (folded into a preceding LayerNormalization or Mul/Add by constants that feed only
    these layers, else an inserted ``Mul``). The result computes the same outputs in float (to float32
    rounding); quantize it (or pass ``smoothquant=alpha`` to quantize_static / quantize_dynamic).

    ``alpha`` in (0, 1]: the share of the activation range moved into the weights. ``exclude``: node names
    left as they are. What was folded, given a Mul or skipped is in the metadata key
    ``opstrata.quant.smoothquant`` (JSON: alpha, folded {layer: node}, mul [layers], skipped {layer: why}).
    """
    return smooth(model, calibration_data, alpha=alpha, op_types=op_types, exclude=exclude, progress=progress,
                  where=_WHERE)  # fmt: skip


def smooth_for_scheme(
    src: onnx.ModelProto,
    calibration_data: Any,
    alpha: Any,
    *,
    op_types: Iterable[str],
    exclude: Iterable[str],
    progress: bool | None,
    where: str,
) -> tuple[onnx.ModelProto, Any]:
    """A scheme's ``smoothquant=alpha``: the smoothed model of ``src`` (its MatMul/Gemm among ``op_types``,
    ``exclude`` left alone) and the calibration data, as a list when it was a one-shot iterator (the scheme
    reads it again)."""
    check_alpha(alpha, f"{where}(smoothquant)")
    ops = (op_types,) if isinstance(op_types, str) else tuple(op_types)
    smoothable = tuple(o for o in ops if o in _OPS)
    if not smoothable:
        raise QuantError(f"{where}(smoothquant)", f"SmoothQuant smooths MatMul/Gemm layers and op_types={ops} "
                         "has none", "add 'MatMul'/'Gemm' to op_types, or drop smoothquant=")  # fmt: skip
    data = calibration_data
    if data is not None and not isinstance(data, (Mapping, str, bytes)) and iter(data) is data:
        data = list(data)
    out = smooth(src, data, alpha=alpha, op_types=smoothable, exclude=exclude, progress=progress, where=where,
                 alpha_name="smoothquant")  # fmt: skip
    return out, data


def smooth_record(m: onnx.ModelProto) -> Mapping[str, Any] | None:
    """The SmoothQuant record in ``m``'s metadata, or None."""
    for p in m.metadata_props:
        if p.key == METADATA_KEY:
            return dict(json.loads(p.value))
    return None


def describe(record: Mapping[str, Any]) -> str:
    """One line for reports: alpha, folded layers (into which node), Mul layers, skipped layers."""
    by: dict[str, list[str]] = {}
    for layer, node in record.get("folded", {}).items():
        by.setdefault(node, []).append(layer)
    parts = [f"SmoothQuant alpha={record['alpha']:g}"]
    if by:
        parts.append("folded: " + "; ".join(f"{', '.join(v)} into {k}" for k, v in by.items()))
    if record.get("mul"):
        parts.append(f"Mul inserted before: {', '.join(record['mul'])}")
    if record.get("skipped"):
        parts.append("not smoothed: " + "; ".join(f"{k} ({v})" for k, v in record["skipped"].items()))
    return " | ".join(parts)
