"""Dynamic quantization: int8 per-channel weights, activations quantized at run time by
DynamicQuantizeLinear (uint8, per-tensor). ``form="integer"`` writes onnxruntime's MatMulInteger graph
(DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul by both scales); ``form="qdq"`` keeps the float op
behind DequantizeLinear (and is used for nodes the integer form cannot express)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

import numpy as np
import onnx
from onnx import helper

from ._common import finish_model, needed_opset, quantize_weight, require_float32
from ._dtypes import qdtype
from ._errors import CalibrationError, QuantError
from ._model import ModelInfo, ensure_opset, load_model, opset as model_opset
from ._qdq import Rewriter
from ._report import enforce, precheck
from ._select import Target, _attr, channel_axis, select_targets
from ._smooth import check_alpha, smooth_for_scheme

__all__ = ["quantize_dynamic"]

_WHERE = "quantize_dynamic"
_FORMS = ("integer", "qdq")


def _dql(rw: Rewriter, tensor: str, before: str) -> tuple[str, str, str]:
    """One DynamicQuantizeLinear per activation tensor: (uint8 values, scale, zero point)."""

    def make() -> tuple[str, str, str]:
        outs = [
            rw.fresh(f"{tensor}_quantized"),
            rw.fresh(f"{tensor}_scale"),
            rw.fresh(f"{tensor}_zero_point"),
        ]
        rw.node("DynamicQuantizeLinear", [tensor], outs, before, f"{tensor}_DynamicQuantizeLinear")
        return outs[0], outs[1], outs[2]

    return rw.cached(("dql", tensor), make)


#: float32's smallest normal: the floor of a per-token scale (as opstrata.ops.TOKEN_SCALE_MIN)
_TOKEN_SCALE_MIN = np.float32(np.finfo(np.float32).tiny)


def _token_q(rw: Rewriter, tensor: str, before: str, model_opset: int) -> tuple[str, str]:
    """Per-token symmetric int8 quantization of ``tensor`` in standard ONNX (one per tensor): ``s =
    Max(ReduceMax(Abs(x), axes=[-1], keepdims=1) / 127, FLT_MIN)``, ``q = Cast<int8>(Clip(Round(x / s),
    -127, 127))``. Returns (q, s); opstrata's graph fuses the chain into DynamicQMatMul(per_token=1)."""

    def make() -> tuple[str, str]:
        f = partial(rw.fresh)
        absx, amax, t, s, xs, xr, xc, q = (f(f"{tensor}_{k}") for k in
                                           ("abs", "amax", "amax_127", "token_scale", "scaled", "rounded", "clipped", "token_quantized"))  # fmt: skip
        c127 = rw.init(f"{tensor}_127", np.array(127, np.float32))
        cm127 = rw.init(f"{tensor}_minus_127", np.array(-127, np.float32))
        cmin = rw.init(f"{tensor}_scale_min", _TOKEN_SCALE_MIN)
        rw.node("Abs", [tensor], [absx], before, f"{tensor}_Abs")
        if model_opset >= 18:
            axes = rw.init(f"{tensor}_last_axis", np.array([-1], np.int64))
            rw.node("ReduceMax", [absx, axes], [amax], before, f"{tensor}_ReduceMax", keepdims=1)
        else:
            rw.node("ReduceMax", [absx], [amax], before, f"{tensor}_ReduceMax", axes=[-1], keepdims=1)
        rw.node("Div", [amax, c127], [t], before, f"{tensor}_amax_Div")
        rw.node("Max", [t, cmin], [s], before, f"{tensor}_scale_Max")
        rw.node("Div", [tensor, s], [xs], before, f"{tensor}_Div")
        rw.node("Round", [xs], [xr], before, f"{tensor}_Round")
        rw.node("Clip", [xr, cm127, c127], [xc], before, f"{tensor}_Clip")
        rw.node("Cast", [xc], [q], before, f"{tensor}_Cast", to=onnx.TensorProto.INT8)
        return q, s

    return rw.cached(("token", tensor), make)


def _dql_dq(rw: Rewriter, tensor: str, before: str) -> str:
    """``tensor`` quantized at run time and dequantized again (the QDQ form's activation)."""

    def make() -> str:
        q, s, z = _dql(rw, tensor, before)
        dq = rw.fresh(f"{tensor}_dequantized")
        rw.node("DequantizeLinear", [q, s, z], [dq], before, f"{tensor}_DequantizeLinear")
        return dq

    return rw.cached(("dql_dq", tensor), make)


def _integer_ok(t: Target, info: ModelInfo) -> bool:
    """Whether MatMulInteger can express the node: activation A, 2-D int8/uint8 weight B, no transA."""
    n, s = t.node, t.settings
    if t.activations != [0] or t.weights != [1] or s["form"] != "integer":
        return False
    if qdtype(s["weight_dtype"]).name not in ("int8", "uint8"):
        return False
    if n.op_type == "Gemm" and _attr(n, "transA", 0):
        return False
    return n.op_type in ("MatMul", "Gemm") and info.array(n.input[1]).ndim == 2


def _integer_node(t: Target, info: ModelInfo, rw: Rewriter) -> None:
    """Replace MatMul/Gemm by DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul (-> Add for Gemm's C)."""
    n, s = t.node, t.settings
    w = info.array(n.input[1])
    alpha, beta = 1.0, 1.0
    if n.op_type == "Gemm":
        alpha, beta = float(_attr(n, "alpha", 1.0)), float(_attr(n, "beta", 1.0))
        if _attr(n, "transB", 0):
            w = w.T
    axis = 1 if s["per_channel"] else None
    base = n.input[1]
    key = ("int_w", base, n.op_type == "Gemm" and bool(_attr(n, "transB", 0)), str(s["weight_dtype"]),
           bool(s["weight_symmetric"]), axis, alpha)  # fmt: skip

    def make() -> tuple[str, str | None, str]:
        q, p = quantize_weight(w, dtype=s["weight_dtype"], symmetric=bool(s["weight_symmetric"]), axis=axis,
                               node=t.name, tensor=base)  # fmt: skip
        rw.replaced(base)
        zp = None
        if np.any(np.asarray(p.zero_point).astype(np.int32) != 0):
            zp = rw.init(f"{base}_zero_point", p.zero_point)
        w_scale = rw.init(f"{base}_scale", (np.asarray(p.scale, np.float64) * alpha).astype(np.float32))
        return rw.init(f"{base}_quantized", q), zp, w_scale

    q_name, zp_name, w_scale = rw.cached(key, make)
    acc, accf, scale = rw.fresh(f"{n.name}_int32"), rw.fresh(f"{n.name}_float"), rw.fresh(f"{n.name}_scale")
    y = n.output[0]
    has_c = n.op_type == "Gemm" and len(n.input) > 2 and n.input[2]
    prod = rw.fresh(f"{n.name}_product") if has_c else y
    if s.get("per_token"):  # symmetric int8 per row: x_q int8 (no zero point), scaled by s then W_scale
        aq, a_s = _token_q(rw, n.input[0], n.name, model_opset(rw.m))
        mm_in = [aq, q_name] + (["", zp_name] if zp_name else [])
        nodes = [
            helper.make_node("MatMulInteger", mm_in, [acc], name=rw.fresh(f"{n.name}_MatMulInteger")),
            helper.make_node(
                "Cast", [acc], [accf], name=rw.fresh(f"{n.name}_Cast"), to=onnx.TensorProto.FLOAT
            ),
            helper.make_node("Mul", [accf, a_s], [scale], name=rw.fresh(f"{n.name}_token_Mul")),
            helper.make_node("Mul", [scale, w_scale], [prod], name=rw.fresh(f"{n.name}_Mul")),
        ]
    else:
        aq, a_s, a_z = _dql(rw, n.input[0], n.name)
        mm_in = [aq, q_name, a_z] + ([zp_name] if zp_name else [])
        nodes = [
            helper.make_node("MatMulInteger", mm_in, [acc], name=rw.fresh(f"{n.name}_MatMulInteger")),
            helper.make_node(
                "Cast", [acc], [accf], name=rw.fresh(f"{n.name}_Cast"), to=onnx.TensorProto.FLOAT
            ),
            helper.make_node("Mul", [a_s, w_scale], [scale], name=rw.fresh(f"{n.name}_scale_Mul")),
            helper.make_node("Mul", [accf, scale], [prod], name=rw.fresh(f"{n.name}_Mul")),
        ]
    if has_c:
        c = n.input[2]
        if beta != 1.0:
            if info.is_const(c):
                rw.replaced(c)
                c = rw.init(f"{c}_beta", (info.array(c) * np.float32(beta)).astype(np.float32))
            else:
                cb, b = rw.fresh(f"{c}_beta"), rw.init(f"{n.name}_beta", np.array(beta, np.float32))
                nodes.append(helper.make_node("Mul", [c, b], [cb], name=rw.fresh(f"{n.name}_beta_Mul")))
                c = cb
        nodes.append(helper.make_node("Add", [prod, c], [y], name=rw.fresh(f"{n.name}_Add")))
    rw.replace(n.name, nodes)


def _qdq_node(t: Target, info: ModelInfo, rw: Rewriter) -> None:
    """Keep the float op; activations through DynamicQuantizeLinear + DequantizeLinear, weights behind DQ."""
    n, s = t.node, t.settings
    for pos in t.activations:
        n.input[pos] = _dql_dq(rw, n.input[pos], n.name)
    for pos in t.weights:
        w_name = n.input[pos]
        w = info.array(w_name)
        axis = channel_axis(n, pos, w.ndim) if s["per_channel"] else None
        make = partial(quantize_weight, w, dtype=s["weight_dtype"], symmetric=bool(s["weight_symmetric"]),
                       axis=axis, node=t.name, tensor=w_name)  # fmt: skip
        key = (str(s["weight_dtype"]), bool(s["weight_symmetric"]), axis)
        n.input[pos] = rw.weight(w_name, make, n.name, key=key)


def quantize_dynamic(
    model: Any,
    *,
    op_types: Iterable[str] = ("MatMul", "Gemm"),
    exclude: Iterable[str] = (),
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    weight_dtype: Any = "int8",
    weight_symmetric: bool = True,
    per_channel: bool = True,
    form: str = "integer",
    eval_data: Any = None,
    min_cosine: float | None = None,
    smoothquant: float | None = None,
    calibration_data: Any = None,
    activation_matmuls: bool = False,
    per_token: bool = False,
) -> onnx.ModelProto:
    """Dynamic W8A8 (no calibration): int8 weights per output channel, uint8 activations quantized per
    tensor at run time (``per_token=True``: symmetric int8 with one scale per row, i.e. per token, in
    standard ONNX ops that onnxruntime runs; opstrata fuses it into one native kernel). MatMul/Gemm with a 2-D weight take the MatMulInteger form unless ``form="qdq"``;
    other nodes (Conv, transA Gemm) use the QDQ form. MatMuls of two activations (attention's scores and
    context) stay float unless ``activation_matmuls=True``, as in onnxruntime's quantize_dynamic: the
    runtime then fuses the attention, and both operands would be quantized on every call.

    ``overrides={node: {setting: value}}`` changes weight_dtype, weight_symmetric, per_channel or form
    for one node; ``min_cosine`` checks every output against float on ``eval_data``.
    ``smoothquant=alpha`` (in (0, 1], e.g. 0.5) first applies SmoothQuant (:func:`smooth_model`) to the
    MatMul/Gemm layers, with per-channel activation ranges from ``calibration_data`` (feed dicts; needed
    only then), and quantizes the smoothed model.
    """
    if form not in _FORMS:
        raise QuantError(f"{_WHERE}(form)", f"unknown form {form!r}", f"use one of {', '.join(_FORMS)}")
    precheck(eval_data, min_cosine, _WHERE)
    orig = src = load_model(model, f"{_WHERE}(model)")
    if smoothquant is not None:
        check_alpha(smoothquant, f"{_WHERE}(smoothquant)")
        if calibration_data is None:
            raise CalibrationError(f"{_WHERE}(calibration_data)", "smoothquant= computes per-channel scales from "
                                   "the activations' ranges, and no calibration data was given",
                                   "pass calibration_data=[feed dicts] (quantize(): its second argument), or "
                                   "drop smoothquant=")  # fmt: skip
        src, _ = smooth_for_scheme(orig, calibration_data, smoothquant, op_types=op_types, exclude=exclude,
                                   progress=None, where=_WHERE)  # fmt: skip
    elif calibration_data is not None:
        raise QuantError(f"{_WHERE}(calibration_data)", "dynamic quantization reads calibration data only for "
                         "smoothquant=, and it was not set", "pass smoothquant=alpha (e.g. 0.5), or drop "
                         "calibration_data=")  # fmt: skip
    defaults = {"weight_dtype": weight_dtype, "weight_symmetric": weight_symmetric, "per_channel": per_channel,
                "form": form, "per_token": bool(per_token)}  # fmt: skip
    for name, o in (overrides or {}).items():
        if isinstance(o, Mapping) and o.get("form", form) not in _FORMS:
            raise QuantError(f"{_WHERE}(overrides)", f"node {name!r}: unknown form {o['form']!r}",
                             f"use one of {', '.join(_FORMS)}")  # fmt: skip
    targets = select_targets(ModelInfo(src), op_types=op_types, exclude=exclude, overrides=overrides,
                             defaults=defaults, where=_WHERE)  # fmt: skip
    m = ensure_opset(src, needed_opset([t.settings for t in targets], ("weight_dtype",), False), _WHERE)
    info = ModelInfo(m)
    targets = select_targets(info, op_types=op_types, exclude=exclude, overrides=overrides, defaults=defaults,
                             where=_WHERE)  # fmt: skip
    if not activation_matmuls:
        targets = [t for t in targets if t.weights]
    if not targets:
        raise QuantError(_WHERE, "nothing to quantize: every selected node multiplies two activations",
                         "pass activation_matmuls=True to quantize them too, or check op_types=")  # fmt: skip
    rw = Rewriter(m, info)
    for t in targets:
        for pos in (*t.activations, *t.weights):
            require_float32(info, t.node.input[pos], t.name, _WHERE)
        (_integer_node if _integer_ok(t, info) else _qdq_node)(t, info, rw)
    out = finish_model(rw.finish(), "w8a8-dynamic-token" if per_token else "w8a8-dynamic", _WHERE)
    enforce(orig, out, eval_data, min_cosine, _WHERE)
    return out
