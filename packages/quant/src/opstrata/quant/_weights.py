"""Weight-only quantization: int8 or int4 weights (per output channel, or per group of 32/64/128 along the
input channels via opset-21 blocked DequantizeLinear) in front of the unchanged float MatMul/Gemm/Conv.

Rounding is to nearest (``method="rtn"``) or GPTQ (``method="gptq"``, MatMul/Gemm: each rounding error
is compensated on the input channels not yet rounded, using the calibration activations' Hessian)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

import numpy as np
import onnx

from ._calibrate import collect
from ._common import finish_model, quantize_weight, require_float32
from ._errors import CalibrationError, QuantError
from ._gptq import HessianObserver, gptq_quantize
from ._model import ModelInfo, ensure_opset, load_model
from ._qdq import Rewriter
from ._qparams import QuantParams
from ._report import enforce, precheck
from ._select import channel_axis, reduction_axis, select_targets

__all__ = ["quantize_weights"]

_WHERE = "quantize_weights"
_STORAGE = ("int4", "int8")
_METHODS = ("rtn", "gptq")


def _check(node: str, s: Mapping[str, Any]) -> None:
    where = f"{_WHERE}({'overrides' if node else 'bits, group_size'})" + (f" node {node!r}" if node else "")
    if s["bits"] not in (4, 8):
        raise QuantError(where, f"bits must be 4 or 8, got {s['bits']!r}", "use bits=8 or bits=4")
    g = s["group_size"]
    if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 2):
        raise QuantError(where, f"group_size must be None or an int >= 2, got {g!r}", "use 32, 64 or 128")
    if s["storage"] not in _STORAGE:
        raise QuantError(where, f"unknown storage {s['storage']!r}", f"use one of {', '.join(_STORAGE)}")


def _dtype(s: Mapping[str, Any]) -> str:
    sym = bool(s["symmetric"])
    return ("int" if sym else "uint") + str(s["bits"])


def _stored(q: np.ndarray, p: QuantParams, storage: str) -> tuple[np.ndarray, QuantParams]:
    """4-bit values kept in 8-bit containers (``storage="int8"``): same values, int8/uint8 dtype."""
    if storage != "int8" or p.qtype.bits != 4:
        return q, p
    dt = np.dtype(np.int8 if p.qtype.signed else np.uint8)
    return q.astype(dt), QuantParams(p.scale, np.asarray(p.zero_point).astype(dt), p.axis, p.block_size, dt)


def _quantized(
    w: np.ndarray, s: Mapping[str, Any], axis: int | None, g: int, observer: Any, node: str, tensor: str
) -> tuple[np.ndarray, QuantParams]:
    q, p = quantize_weight(w, dtype=_dtype(s), symmetric=bool(s["symmetric"]), axis=axis, group_size=g,
                           observer=observer, node=node, tensor=tensor)  # fmt: skip
    return _stored(q, p, s["storage"])


def _gptq_layout(node: onnx.NodeProto, w: np.ndarray, name: str) -> bool:
    """True when weight ``w`` is stored [N, K] (Gemm transB=1), False for [K, N]; errors for other forms."""
    if node.op_type not in ("MatMul", "Gemm") or w.ndim != 2:
        raise QuantError(
            f"{_WHERE}(method='gptq') node {node.name!r}",
            f"GPTQ handles 2-D MatMul/Gemm weights; this is a {node.op_type} with weight {name!r} of shape {w.shape}",
            f"exclude it (exclude=[{node.name!r}]) or quantize it with method='rtn'",
        )  # fmt: skip
    return bool(node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute))


def _hessians(
    m: onnx.ModelProto, info: ModelInfo, targets: list[Any], data: Any, progress: Any
) -> dict[str, Any]:
    """One HessianObserver per activation feeding a GPTQ weight, filled in one pass over ``data``."""
    if data is None:
        raise CalibrationError(f"{_WHERE}(method='gptq')", "GPTQ needs calibration_data (no data was given)",
                               "pass calibration_data=[{input: array, ...}, ...] (a few dozen batches)")  # fmt: skip
    observers: dict[str, list[Any]] = {}
    for t in targets:
        w = info.array(t.node.input[1])
        transposed = _gptq_layout(t.node, w, t.node.input[1])
        k = w.shape[1] if transposed else w.shape[0]
        trans_a = t.node.op_type == "Gemm" and any(a.name == "transA" and a.i for a in t.node.attribute)
        x = t.node.input[0]
        observers.setdefault(x, [HessianObserver(k, transpose=trans_a)])
    collect(m, data, observers, progress=progress, where=f"{_WHERE}(method='gptq')")
    return {x: obs[0] for x, obs in observers.items()}


def _gptq_weight(
    w: np.ndarray, transposed: bool, hessian: np.ndarray, s: Mapping[str, Any], damp: float, node: str
) -> tuple[np.ndarray, QuantParams]:
    """GPTQ of one weight, returned in the weight's own layout with QDQ parameters to match."""
    g = s["group_size"] or 0
    r = gptq_quantize(w if transposed else w.T, hessian, dtype=_dtype(s), symmetric=bool(s["symmetric"]),
                      group_size=g, damp=damp, where=f"{_WHERE}(method='gptq') node {node!r}")  # fmt: skip
    if transposed:  # [N, K]: channels on axis 0, groups along axis 1
        q, scale, zp, axis = r.q, r.scale, r.zero_point, (1 if g else 0)
    else:  # [K, N]: groups along axis 0, channels on axis 1
        q, scale, zp, axis = r.q.T, r.scale.T, r.zero_point.T, (0 if g else 1)
    if not g:
        scale, zp = scale.reshape(-1), zp.reshape(-1)
    p = QuantParams(np.ascontiguousarray(scale), np.ascontiguousarray(zp), axis, g, r.q.dtype)
    return _stored(np.ascontiguousarray(q), p, s["storage"])


def quantize_weights(
    model: Any,
    *,
    bits: int = 8,
    group_size: int | None = None,
    symmetric: bool = True,
    storage: str = "int4",
    op_types: Iterable[str] = ("MatMul", "Gemm"),
    exclude: Iterable[str] = (),
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    observer: Any = "minmax",
    method: str = "rtn",
    calibration_data: Any = None,
    damp: float = 0.01,
    progress: bool | None = None,
    eval_data: Any = None,
    min_cosine: float | None = None,
) -> onnx.ModelProto:
    """Weight-only quantization: activations stay float, weights become int8/int4 behind DequantizeLinear.

    ``group_size`` (e.g. 128): one scale per group along the input channels (opset-21 ``block_size``);
    None: one per output channel. 4-bit weights are ONNX INT4 (packed two per byte) unless
    ``storage="int8"`` keeps them in 8-bit containers for runtimes without INT4.
    ``overrides={node: {...}}`` changes bits, group_size, symmetric or storage for one node.
    ``method="gptq"`` rounds MatMul/Gemm weights with GPTQ on ``calibration_data`` (an iterable of feed
    dicts; ``damp`` is the Hessian's diagonal damping as a fraction of its mean); ``"rtn"`` to nearest.
    """
    defaults = {"bits": bits, "group_size": group_size, "symmetric": symmetric, "storage": storage}
    _check("", defaults)
    if method not in _METHODS:
        raise QuantError(
            f"{_WHERE}(method)", f"unknown method {method!r}", f"use one of {', '.join(_METHODS)}"
        )
    if method == "gptq" and not (isinstance(damp, (int, float)) and 0 < damp < 1):
        raise QuantError(f"{_WHERE}(damp)", f"damp must be in (0, 1), got {damp!r}", "use e.g. 0.01")
    precheck(eval_data, min_cosine, _WHERE)
    src = load_model(model, f"{_WHERE}(model)")
    targets = select_targets(ModelInfo(src), op_types=op_types, exclude=exclude, overrides=overrides,
                             defaults=defaults, where=_WHERE)  # fmt: skip
    for t in targets:
        _check(t.name if t.name in (overrides or {}) else "", t.settings)
    int4 = any(t.settings["bits"] == 4 and t.settings["storage"] == "int4" for t in targets)
    blocked = any(t.settings["group_size"] for t in targets)
    m = ensure_opset(src, 21 if (int4 or blocked) else 13, _WHERE)
    info = ModelInfo(m)
    targets = select_targets(info, op_types=op_types, exclude=exclude, overrides=overrides, defaults=defaults,
                             where=_WHERE)  # fmt: skip
    rw = Rewriter(m, info)
    hessians = {}
    if method == "gptq":
        gptq_targets = [t for t in targets if 1 in t.weights and 0 in t.activations]
        hessians = _hessians(m, info, gptq_targets, calibration_data, progress)
    done = 0
    for t in targets:
        s = t.settings
        for pos in t.weights:
            w_name = t.node.input[pos]
            require_float32(info, w_name, t.name, _WHERE)
            w = info.array(w_name)
            if pos == 1 and t.node.input[0] in hessians:
                h = hessians[t.node.input[0]].hessian()
                make = partial(_gptq_weight, w, _gptq_layout(t.node, w, w_name), h, s, damp, t.name)
                t.node.input[pos] = rw.weight(w_name, make, t.name, key=("gptq", t.name))
                done += 1
                continue
            g = s["group_size"] or 0
            axis = reduction_axis(t.node, pos, w.ndim) if g else channel_axis(t.node, pos, w.ndim)
            if g and axis is None:
                raise QuantError(f"{_WHERE} node {t.name!r}", f"weight {w_name!r} of shape {w.shape} has no "
                                 "input-channel axis to group along", "use group_size=None for this node")  # fmt: skip
            make = partial(_quantized, w, s, axis, g, observer, t.name, w_name)
            key = (_dtype(s), bool(s["symmetric"]), axis, g, s["storage"])
            t.node.input[pos] = rw.weight(w_name, make, t.name, key=key)
            done += 1
    if not done:
        raise QuantError(_WHERE, "nothing to quantize: no selected node has a constant weight",
                         "weight-only quantization needs MatMul/Gemm/Conv nodes with initializer weights")  # fmt: skip
    scheme = f"w{bits}" + (f"-g{group_size}" if group_size else "") + ("-gptq" if method == "gptq" else "")
    out = finish_model(rw.finish(), scheme, _WHERE)
    enforce(src, out, eval_data, min_cosine, _WHERE)
    return out
