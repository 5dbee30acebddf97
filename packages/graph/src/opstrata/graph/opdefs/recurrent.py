"""Recurrent ops of the ONNX operator specification: RNN, GRU and LSTM (every direction, activation,
clip, sequence_lens, initial state, peepholes, linear_before_reset, layout and output).

Each imports as itself (attribute defaults filled in); the executor kernel is one opstrata.ops call
(``rnn``/``gru``/``lstm``) returning every output.
"""

from __future__ import annotations

from typing import Any

import opstrata.ops as ops

from .._ir import Node
from .._shape_rules import RuleContext, TypeShape
from .common import Arr
from .registry import define

#: attribute defaults filled in on import (activations and their alpha/beta default per op in the kernel)
_COMMON: dict[str, Any] = {"direction": "forward", "layout": 0}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _recurrent_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = ctx.same_dtype([0, 1, 2])
    x, w, r = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    outs = 3 if n.op_type == "LSTM" else 2
    if x is None or w is None or r is None:
        return [(dt, None)] * outs
    if len(x) != 3 or len(w) != 3 or len(r) != 3:
        raise ctx.fail(f"{n.op_type} expects 3-D X, W and R, got {x}, {w}, {r}")
    dirs = 2 if n.attrs.get("direction", "forward") == "bidirectional" else 1
    h = r[2]
    if n.attrs.get("hidden_size") not in (None, h) and isinstance(h, int):
        raise ctx.fail(f"{n.op_type} hidden_size={n.attrs['hidden_size']} but R is {r}", "make them agree")
    if n.attrs.get("layout", 0):
        y, st = (x[0], x[1], dirs, h), (x[0], dirs, h)
    else:
        y, st = (x[0], dirs, x[1], h), (dirs, x[1], h)
    return [(dt, y), (dt, st), (dt, st)][:outs]


def _kw(n: Node) -> dict[str, Any]:
    a = n.attrs
    clip = a.get("clip")
    return {
        "direction": a.get("direction", "forward"),
        "activations": list(a.get("activations") or []) or None,
        "alphas": [float(v) for v in a.get("activation_alpha") or []],
        "betas": [float(v) for v in a.get("activation_beta") or []],
        "clip": None if clip is None else float(clip),
        "layout": int(a.get("layout", 0)),
    }


def _run_rnn(n: Node, x: list[Any]) -> list[Arr]:
    return list(ops.rnn(*x[:6], **_kw(n)))


def _run_gru(n: Node, x: list[Any]) -> list[Arr]:
    return list(ops.gru(*x[:6], linear_before_reset=bool(n.attrs.get("linear_before_reset", 0)), **_kw(n)))


def _run_lstm(n: Node, x: list[Any]) -> list[Arr]:
    return list(ops.lstm(*x[:8], input_forget=bool(n.attrs.get("input_forget", 0)), **_kw(n)))


define("RNN", attrs=_COMMON, shape=_recurrent_rule, kernel=_run_rnn, uses=("recurrent",), dtypes="float",
       doc="ONNX RNN: H = f(X W^T + H R^T + b), every direction, outputs (Y, Y_h)")  # fmt: skip
define("GRU", attrs={**_COMMON, "linear_before_reset": 0}, shape=_recurrent_rule, kernel=_run_gru,
       uses=("recurrent",), dtypes="float", doc="ONNX GRU (z, r, h gates), outputs (Y, Y_h)")  # fmt: skip
define("LSTM", attrs={**_COMMON, "input_forget": 0}, shape=_recurrent_rule, kernel=_run_lstm,
       uses=("recurrent",), dtypes="float", doc="ONNX LSTM (i, o, f, c gates, peepholes), outputs (Y, Y_h, Y_c)")  # fmt: skip
