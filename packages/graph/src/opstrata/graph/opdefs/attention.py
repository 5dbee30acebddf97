"""Attention: ONNX's Attention op (opset 23+) imported onto opstrata's fused ai.opstrata::Attention (B, H, S, D)."""

from __future__ import annotations

from typing import Any

import numpy as np

import opstrata.ops as ops

from .._ir import OPSTRATA_DOMAIN, Node
from .._shape_rules import (
    RuleContext,
    TypeShape,
)
from ..onnx.attention import CAUSAL_TOP_LEFT
from ..onnx.context import ImportContext
from .common import Arr
from .registry import define

#: Attention attributes whose non-default values opstrata's fused attention has no equivalent for.
_ATTENTION_DEFAULTS = {"softcap": 0.0, "left_window_size": -1, "right_window_size": -1}


def _import_attention(ctx: ImportContext) -> None:
    """4-D ONNX Attention -> ``ai.opstrata::Attention``; causal is marked for :func:`resolve_causal`."""
    extra = [n for i, n in enumerate(("past_key", "past_value", "nonpad_kv_seqlen"), 4) if ctx.input(i)]
    if extra:
        raise ctx.unsupported(
            f"Attention with {', '.join(extra)} (a KV cache inside the op) is not supported"
        )
    if any(ctx.is_used(k) for k in (1, 2, 3)):
        raise ctx.unsupported(
            "Attention's present_key / present_value / qk_matmul_output outputs are not supported"
        )
    odd = {k: ctx.attrs[k] for k, d in _ATTENTION_DEFAULTS.items() if k in ctx.attrs and ctx.attrs[k] != d}
    heads = (ctx.attrs.get("q_num_heads"), ctx.attrs.get("kv_num_heads"))
    if (heads[0] is None) != (heads[1] is None):
        odd["q_num_heads/kv_num_heads"] = "only one of the two given"
    if "softmax_precision" in ctx.attrs and ctx.attrs["softmax_precision"] != 1:
        odd["softmax_precision"] = ctx.attrs["softmax_precision"]
    if odd:
        raise ctx.unsupported(
            f"Attention with {odd} is not supported; opstrata reads 4-D (B, H, S, D) q/k/v with "
            "is_causal, scale and attn_mask"
        )
    attrs: dict[str, Any] = {"causal": int(ctx.attrs.get("is_causal", 0))}
    if "scale" in ctx.attrs:
        attrs["scale"] = float(ctx.attrs["scale"])
    if attrs["causal"]:
        attrs[CAUSAL_TOP_LEFT] = 1
    if heads[0] is None:
        ctx.emit("Attention", ctx.inputs[:4], ctx.outputs[:1], attrs, domain=OPSTRATA_DOMAIN)
        return
    # 3-D (B, S, H*D) inputs: split heads, attend, merge (what the ONNX spec's function does)
    q_heads, kv_heads = heads
    qkv = [
        _split_heads(ctx, x, h, t)
        for x, h, t in zip(ctx.inputs[:3], (q_heads, kv_heads, kv_heads), "qkv", strict=True)
    ]
    y4 = ctx.fresh("y_heads")
    ctx.emit("Attention", [*qkv, *ctx.inputs[3:4]], [y4], attrs, domain=OPSTRATA_DOMAIN)
    yt = ctx.fresh("y_bshd")
    ctx.emit("Transpose", [y4], [yt], {"perm": [0, 2, 1, 3]})
    ctx.emit("Reshape", [yt, _ints(ctx, [0, 0, -1], "merge")], ctx.outputs[:1])


def _ints(ctx: ImportContext, values: list[int], hint: str) -> str:
    name = ctx.fresh(hint)
    ctx.graph.add_initializer(name, np.array(values, np.int64))
    return name


def _split_heads(ctx: ImportContext, x: str, heads: int, hint: str) -> str:
    """(B, S, heads*D) -> (B, heads, S, D)."""
    r, t = ctx.fresh(f"{hint}_bshd"), ctx.fresh(f"{hint}_bhsd")
    ctx.emit("Reshape", [x, _ints(ctx, [0, 0, int(heads), -1], f"{hint}_shape")], [r])
    ctx.emit("Transpose", [r], [t], {"perm": [0, 2, 1, 3]})
    return t


def _attention_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    q, v = ctx.shape(0), ctx.shape(2)
    dt = ctx.same_dtype([0, 1, 2])
    if q is None or v is None:
        return [(dt, None)]
    if len(q) != 4 or len(v) != 4:
        raise ctx.fail(f"Attention expects 4-D (B, H, N, D) q/k/v, got q {q} and v {v}")
    return [(dt, (*q[:3], v[3]))]


def _run_attention(n: Node, x: list[Any]) -> list[Arr]:
    mask = x[3] if len(x) > 3 else None
    a = n.attrs
    return [ops.attention(x[0], x[1], x[2], causal=bool(a.get("causal", 0)), mask=mask, scale=a.get("scale"))]


define("Attention", importer=_import_attention, doc="imported as ai.opstrata::Attention")
define(
    "Attention", OPSTRATA_DOMAIN, shape=_attention_rule, kernel=_run_attention, uses=("attention",),
    onnx=False, doc="(B, H, S, D) q/k/v, causal, scale, additive or boolean mask",
)  # fmt: skip
