"""Weight-only quantization: int8 or int4 weights (per output channel, or per group of 32/64/128 along the
input channels via opset-21 blocked DequantizeLinear) in front of the unchanged float MatMul/Gemm/Conv."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

import numpy as np
import onnx

from ._common import finish_model, quantize_weight, require_float32
from ._errors import QuantError
from ._model import ModelInfo, ensure_opset, load_model
from ._qdq import Rewriter
from ._qparams import QuantParams
from ._report import enforce, precheck
from ._select import channel_axis, reduction_axis, select_targets

__all__ = ["quantize_weights"]

_WHERE = "quantize_weights"
_STORAGE = ("int4", "int8")


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
    eval_data: Any = None,
    min_cosine: float | None = None,
) -> onnx.ModelProto:
    """Weight-only quantization: activations stay float, weights become int8/int4 behind DequantizeLinear.

    ``group_size`` (e.g. 128): one scale per group along the input channels (opset-21 ``block_size``);
    None: one per output channel. 4-bit weights are ONNX INT4 (packed two per byte) unless
    ``storage="int8"`` keeps them in 8-bit containers for runtimes without INT4.
    ``overrides={node: {...}}`` changes bits, group_size, symmetric or storage for one node.
    """
    defaults = {"bits": bits, "group_size": group_size, "symmetric": symmetric, "storage": storage}
    _check("", defaults)
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
    done = 0
    for t in targets:
        s = t.settings
        for pos in t.weights:
            w_name = t.node.input[pos]
            require_float32(info, w_name, t.name, _WHERE)
            w = info.array(w_name)
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
    scheme = f"w{bits}" + (f"-g{group_size}" if group_size else "")
    out = finish_model(rw.finish(), scheme, _WHERE)
    enforce(src, out, eval_data, min_cosine, _WHERE)
    return out
