"""Kernels that write a node's results straight into its arena slots (``out=``) instead of copying them in.

The executor's generic path calls a node's kernel, which returns fresh arrays, and copies them
into the node's planned arena views; for the large results of a transformer block the fresh
allocations (page faults) and copies cost as much as a few elementwise passes each. Here GEMMs write
through ``ops.linear(..., out=)`` / ``ops.matmul(..., out=)`` (BLAS fills the arena view itself; a
Linear's bias + relu / gelu / silu runs in place on that view with ``ops.bias_act(..., out=)``: one C
loop for float32 when the ops native library is built, numpy tiles in cache otherwise), and ``SkipLayerNorm`` writes its residual sum with
``ops.add(..., out=)`` (into the output's view when the sum is not an output) and normalizes it into
the output's view with ``ops.layer_norm(..., out=)`` (in place when the sum is not an output).
``DynamicQMatMul`` writes through ``ops.dynamic_qmatmul(..., out=)`` (quantize, int8 GEMM and float
epilogue straight into the view) when every registered kernel of that op takes ``out=``.
``FusedElementwise`` runs its generated kernel into the view (``graph.run_fused(..., out=)``; the view
may be its input's, the node is planned in place). None of these ops is planned in place, so no output aliases an input. A node
whose kernel in the graph's table was replaced (a test, a user override) keeps the generic path.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import opstrata.graph as og
import opstrata.ops as ops
from opstrata.graph import EXECUTOR_KERNELS as KERNELS, OPSTRATA_DOMAIN, Node

__all__ = ["into_kernel"]

Into = Callable[[list[Any], list[np.ndarray]], object]

_LINEAR, _MATMUL, _SKIP_LN = (OPSTRATA_DOMAIN, "Linear"), ("", "MatMul"), (OPSTRATA_DOMAIN, "SkipLayerNorm")
_DYN_QMM, _QCONV = (OPSTRATA_DOMAIN, "DynamicQMatMul"), (OPSTRATA_DOMAIN, "QConv")
_QCONV_Q = (OPSTRATA_DOMAIN, "QConvQuantize")
_DQ_MM, _FUSED = (OPSTRATA_DOMAIN, "DequantMatMul"), (OPSTRATA_DOMAIN, "FusedElementwise")
#: the graph's kernels these writers stand for
_STANDS_FOR = {
    k: KERNELS[k]
    for k in (_LINEAR, _MATMUL, _SKIP_LN, _DYN_QMM, _QCONV, _QCONV_Q, _DQ_MM, _FUSED)
    if k in KERNELS
}

#: Linear epilogues (the graph's fused-op contract, docs of ai.opstrata::Linear) as ops calls
_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": ops.relu, "sigmoid": ops.sigmoid, "tanh": ops.tanh,
    "gelu": partial(ops.gelu, approximate="none"), "gelu_tanh": partial(ops.gelu, approximate="tanh"),
}  # fmt: skip


def _call_into(op: str, out: np.ndarray, *args: Any, **kw: Any) -> np.ndarray:
    """``ops.call(op, ..., out=out)``: the registered kernel without the public wrapper's ``out=`` checks,
    which the memory plan already guarantees (shape, dtype, no partial overlap); the kernels still
    validate their operands. A kernel that returned a fresh result (a fallback) is copied in."""
    r = ops.call(op, *args, out=out, **kw)
    if r is not out:
        np.copyto(out, r)
    return out


def _bias(args: list[Any]) -> Any:
    return args[2] if len(args) > 2 else None


def _linear(args: list[Any], dsts: list[np.ndarray]) -> object:
    return _call_into("linear", dsts[0], args[0], args[1], _bias(args))


def _linear_bias_act(act: str, args: list[Any], dsts: list[np.ndarray]) -> object:
    """GEMM into the arena view, then bias + activation in place (one pass over the view)."""
    y = _call_into("linear", dsts[0], args[0], args[1], None)
    return _call_into("bias_act", y, y, _bias(args), None, act=act)


def _linear_act(act: Callable[[np.ndarray], np.ndarray], args: list[Any], dsts: list[np.ndarray]) -> object:
    y = _call_into("linear", dsts[0], args[0], args[1], _bias(args))
    np.copyto(y, act(y))
    return y


def _matmul(args: list[Any], dsts: list[np.ndarray]) -> object:
    return _call_into("matmul", dsts[0], args[0], args[1])


def _skip_layer_norm(axis: int, eps: float, args: list[Any], dsts: list[np.ndarray]) -> object:
    y, s = dsts if len(dsts) == 2 else (dsts[0], dsts[0])  # no sum output: y's view holds it first
    ops.add(args[0], args[1], out=s)  # the residual sum
    return _call_into("layer_norm", y, s, args[2], args[3] if len(args) > 3 else None, axis=axis, eps=eps)


def _dynamic_qmatmul(
    scale: Any, bias: Any, kw: dict[str, Any], args: list[Any], dsts: list[np.ndarray]
) -> object:
    w_zp = args[2] if len(args) > 2 else None
    return _call_into("dynamic_qmatmul", dsts[0], args[0], args[1], scale, w_zp, bias, **kw)


def qconv_quantize_kwargs(node: Node, args: list[Any]) -> dict[str, Any]:
    """QConvQuantize's ``ops.qconv_quantize`` keywords: the activation attributes it has (ops' defaults
    for the others) and the residual, its optional seventh input."""
    kw = {k: node.attrs[k] for k in ("activation", "alpha", "beta") if k in node.attrs}
    if len(args) > 6:
        kw["residual"] = args[6]
    return kw


def _qconv(node: Node, args: list[Any], dsts: list[np.ndarray]) -> object:
    """QConv's window from its attributes: graph fuses only Convs with explicit pads (no auto_pad), so
    the defaults are ONNX's (stride 1, no pads, dilation 1, one group)."""
    a, nd = node.attrs, args[0].ndim - 2
    kw = {
        "stride": list(a.get("strides") or [1] * nd), "pads": list(a.get("pads") or [0] * (2 * nd)),
        "dilation": list(a.get("dilations") or [1] * nd), "groups": int(a.get("group", 1)),
    }  # fmt: skip
    if len(args) >= 6:  # QConvQuantize (y_scale, y_zp[, residual])
        kw.update(qconv_quantize_kwargs(node, args))
        return _call_into("qconv_quantize", dsts[0], *args[:4], a["scale"], a.get("bias"), *args[4:6], **kw)
    return _call_into("qconv", dsts[0], *args[:4], a["scale"], a.get("bias"), **kw)


def _dequant_matmul(axis: int, block_size: int, args: list[Any], dsts: list[np.ndarray]) -> object:
    zp = args[3] if len(args) > 3 else None
    return _call_into(
        "dequant_matmul", dsts[0], args[0], args[1], args[2], zp, axis=axis, block_size=block_size
    )


def _fused(node: Node, args: list[Any], dsts: list[np.ndarray]) -> object:
    """FusedElementwise's generated kernel writing the view (on cpu; elsewhere the graph's kernel runs
    the chain step by step on that device's kernels and its result is copied in)."""
    if ops.get_default_device() == "cpu":
        return og.run_fused(node, args, out=dsts[0])
    np.copyto(dsts[0], KERNELS[_FUSED](node, args)[0])
    return dsts[0]


def _kernels_take_out(op: str) -> bool:
    """Every kernel registered for ``op`` accepts ``out=`` (one that does not, e.g. from an older
    package, keeps the generic path rather than failing at run time)."""
    entries = ops.kernels(op)
    return bool(entries) and all("out" in inspect.signature(e.fn).parameters for e in entries)


def into_kernel(node: Node) -> Into | None:
    """The ``(args, output views) -> None`` writer for ``node``, or None for the generic path."""
    key = ("" if node.domain == "ai.onnx" else node.domain, node.op_type)
    if key not in _STANDS_FOR or KERNELS.get(key) is not _STANDS_FOR[key]:
        return None
    if key == _SKIP_LN:
        return partial(_skip_layer_norm, node.attrs.get("axis", -1), node.attrs.get("epsilon", 1e-5))
    if key == _DYN_QMM:
        if len(node.outputs) != 1 or not _kernels_take_out("dynamic_qmatmul"):
            return None
        kw = {"per_token": True} if node.attrs.get("per_token") else {}
        return partial(_dynamic_qmatmul, node.attrs["w_scale"], node.attrs.get("bias"), kw)
    if key == _DQ_MM:
        if len(node.outputs) != 1 or not _kernels_take_out("dequant_matmul"):
            return None
        return partial(_dequant_matmul, int(node.attrs.get("axis", 1)), int(node.attrs.get("block_size", 0)))
    if key in (_QCONV, _QCONV_Q):
        if len(node.outputs) != 1 or not _kernels_take_out("qconv" if key == _QCONV else "qconv_quantize"):
            return None
        return partial(_qconv, node)
    if len(node.outputs) != 1:
        return None
    if key == _FUSED:
        return partial(_fused, node) if hasattr(og, "run_fused") else None
    if key == _MATMUL:
        return _matmul
    act = node.attrs.get("activation") or ""
    if not act:
        return _linear
    if act in ("relu", "gelu", "gelu_tanh", "silu"):  # ops.bias_act's names: the bias joins the epilogue
        return partial(_linear_bias_act, act)
    return partial(_linear_act, _ACTIVATIONS[act]) if act in _ACTIVATIONS else None
