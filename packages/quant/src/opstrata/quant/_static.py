"""W8A8 static quantization: calibrated QuantizeLinear/DequantizeLinear pairs on the activation inputs of
MatMul/Gemm/Conv and per-channel integer weights behind DequantizeLinear (ONNX QDQ, as onnxruntime writes)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

import onnx

from ._calibrate import collect
from ._common import finish_model, needed_opset, quantize_weight, require_float32
from ._model import QUANTIZABLE, ModelInfo, ensure_opset, load_model
from ._observers import Observer, make_observer
from ._qdq import Rewriter
from ._report import enforce, precheck
from ._select import channel_axis, select_targets
from ._smooth import smooth_for_scheme

__all__ = ["quantize_static"]

_WHERE = "quantize_static"


def quantize_static(
    model: Any,
    calibration_data: Any,
    *,
    op_types: Iterable[str] = QUANTIZABLE,
    exclude: Iterable[str] = (),
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    activation_dtype: Any = "uint8",
    activation_symmetric: bool = False,
    weight_dtype: Any = "int8",
    weight_symmetric: bool = True,
    per_channel: bool = True,
    observer: Any = "minmax",
    observer_kwargs: Mapping[str, Any] | None = None,
    weight_observer: Any = "minmax",
    eval_data: Any = None,
    min_cosine: float | None = None,
    progress: bool | None = None,
    smoothquant: float | None = None,
) -> onnx.ModelProto:
    """Static W8A8: one calibration pass over ``calibration_data`` (feed dicts) in opstrata's runtime, then a
    QDQ model (uint8 asymmetric activations, int8 symmetric per-channel weights by default).

    ``overrides={node: {setting: value}}`` changes any of activation_dtype, activation_symmetric,
    weight_dtype, weight_symmetric, per_channel for one node. ``min_cosine`` checks every output against
    float on ``eval_data`` (default: the calibration data, when it is a list) and raises AccuracyError.
    ``smoothquant=alpha`` (in (0, 1], e.g. 0.5) first applies SmoothQuant (:func:`smooth_model`) to the
    MatMul/Gemm layers, calibrated on the same data, then quantizes the smoothed model.
    """
    orig = load_model(model, f"{_WHERE}(model)")
    precheck(eval_data if eval_data is not None else calibration_data, min_cosine, _WHERE)
    src = orig
    if smoothquant is not None:
        src, calibration_data = smooth_for_scheme(orig, calibration_data, smoothquant, op_types=op_types,
                                                  exclude=exclude, progress=progress, where=_WHERE)  # fmt: skip
    defaults = {
        "activation_dtype": activation_dtype, "activation_symmetric": activation_symmetric,
        "weight_dtype": weight_dtype, "weight_symmetric": weight_symmetric, "per_channel": per_channel,
    }  # fmt: skip
    targets = select_targets(ModelInfo(src), op_types=op_types, exclude=exclude, overrides=overrides,
                             defaults=defaults, where=_WHERE)  # fmt: skip
    need = needed_opset([t.settings for t in targets], ("activation_dtype", "weight_dtype"), False)
    m = ensure_opset(src, need, _WHERE)
    info = ModelInfo(m)
    targets = select_targets(info, op_types=op_types, exclude=exclude, overrides=overrides, defaults=defaults,
                             where=_WHERE)  # fmt: skip
    okw = dict(observer_kwargs or {})
    observers: dict[str, list[Observer]] = {}
    slot: dict[tuple[str, str, bool], Observer] = {}
    for t in targets:
        for pos in t.activations:
            name = t.node.input[pos]
            require_float32(info, name, t.name, _WHERE)
            key = (name, str(t.settings["activation_dtype"]), bool(t.settings["activation_symmetric"]))
            if key not in slot:
                slot[key] = make_observer(observer, key[1], symmetric=key[2], **okw)
                observers.setdefault(name, []).append(slot[key])
    if observers:
        collect(m, calibration_data, observers, progress=progress, where=_WHERE)
    params = {k: o.compute() for k, o in slot.items()}
    rw = Rewriter(m, info)
    for t in targets:
        s = t.settings
        for pos in t.activations:
            key = (t.node.input[pos], str(s["activation_dtype"]), bool(s["activation_symmetric"]))
            t.node.input[pos] = rw.qdq(key[0], params[key], t.name, key=key[1:])
        for pos in t.weights:
            w_name = t.node.input[pos]
            require_float32(info, w_name, t.name, _WHERE)
            w = info.array(w_name)
            axis = channel_axis(t.node, pos, w.ndim) if s["per_channel"] else None
            wkey = (str(s["weight_dtype"]), bool(s["weight_symmetric"]), axis)
            make = partial(quantize_weight, w, dtype=s["weight_dtype"], symmetric=bool(s["weight_symmetric"]),
                           axis=axis, observer=weight_observer, node=t.name, tensor=w_name)  # fmt: skip
            t.node.input[pos] = rw.weight(w_name, make, t.name, key=wkey)
    out = finish_model(rw.finish(), "w8a8-static", _WHERE)
    enforce(orig, out, eval_data if eval_data is not None else calibration_data, min_cosine, _WHERE)
    return out
