"""LinearAttention (opset 27) and SwiGLU (opset 28) of the ONNX operator specification.

LinearAttention imports as itself (q/k/v packed (B, T, H*D), optional past_state/decay/beta) and runs
whole through ``opstrata.ops.linear_attention`` (the spec's recurrence; the chunk_size tuning hint is
kept but does not change results). SwiGLU is ``Swish_alpha(A) * B`` with A and B of one shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import opstrata.ops as ops

from .._ir import Node
from .._shape_rules import RuleContext, TypeShape, float_dtype
from ..onnx import context as _context  # noqa: F401  (installs the passthrough importer these rows use)
from .common import Arr
from .registry import define


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _div(a: Any, b: int) -> Any:
    return a // b if isinstance(a, int) else None


def _linear_attention_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = ctx.same_dtype([0, 1, 2])
    hq, hkv = int(n.attrs.get("q_num_heads", 0)), int(n.attrs.get("kv_num_heads", 0))
    if hq <= 0 or hkv <= 0 or hq % hkv:
        raise ctx.fail(
            f"q_num_heads={hq} must be a positive multiple of kv_num_heads={hkv}", "set both head counts"
        )
    for i in (0, 1, 2):
        if ctx.rank(i) not in (None, 3):
            raise ctx.fail(
                f"input {i} must be 3-D (B, T, H*D), got {ctx.shape(i)}", "pack heads into the last dim"
            )
    q, v = ctx.shape(0), ctx.shape(2)
    if q is None or v is None:
        return [(dt, None), (ctx.dtype(3) or dt, None)]
    dk, dv = _div(q[2], hq), _div(v[2], hkv)
    y_last = hq * dv if dv is not None else None
    return [(dt, (q[0], q[1], y_last)), (ctx.dtype(3) or dt, (q[0], hkv, dk, dv))]


def _run_linear_attention(n: Node, x: list[Any]) -> list[Arr]:
    x = [*x, *[None] * (6 - len(x))]
    a = n.attrs
    y, state = ops.linear_attention(
        *x[:6], q_num_heads=int(a["q_num_heads"]), kv_num_heads=int(a["kv_num_heads"]),
        update_rule=_text(a.get("update_rule", "gated_delta")), scale=float(a.get("scale", 0.0)),
    )  # fmt: skip
    return [y, state]


def _swiglu_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = ctx.same_dtype([0, 1])
    float_dtype(ctx)
    a, b = ctx.shape(0), ctx.shape(1)
    if a is not None and b is not None and len(a) == len(b):
        bad = [
            (p, q) for p, q in zip(a, b, strict=True) if isinstance(p, int) and isinstance(q, int) and p != q
        ]
        if bad:
            raise ctx.fail(
                f"SwiGLU needs A and B of one shape, got {a} and {b}", "Split the projection evenly"
            )
    elif a is not None and b is not None:
        raise ctx.fail(f"SwiGLU needs A and B of one shape, got {a} and {b}", "Split the projection evenly")
    return [(dt, a if a is not None else b)]


def _run_swiglu(n: Node, x: list[Arr]) -> list[Arr]:
    if np.shape(x[0]) != np.shape(x[1]):
        raise ValueError(f"SwiGLU '{n.name}': A {np.shape(x[0])} and B {np.shape(x[1])} must have one shape")
    return [ops.mul(ops.swish(x[0], alpha=float(n.attrs.get("alpha", 1.0))), x[1])]


define(
    "LinearAttention",
    attrs={"chunk_size": 64, "scale": 0.0, "update_rule": "gated_delta"},
    shape=_linear_attention_rule, kernel=_run_linear_attention, uses=("linear_attention",), dtypes="float",
    doc="ONNX LinearAttention: linear/gated/delta/gated_delta recurrence, GQA, past_state (run whole)",
)  # fmt: skip
define(
    "SwiGLU", attrs={"alpha": 1.0}, shape=_swiglu_rule, kernel=_run_swiglu, uses=("swish", "mul"),
    dtypes="float", doc="Swish_alpha(A) * B (A, B of one shape)",
)  # fmt: skip
