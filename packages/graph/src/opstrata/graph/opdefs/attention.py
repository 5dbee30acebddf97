"""Attention and RotaryEmbedding of the ONNX operator specification (opset 23+).

The plain Attention form (3-D or 4-D q/k/v, is_causal, scale, attn_mask, grouped-query heads) imports
onto opstrata's fused ``ai.opstrata::Attention`` (B, H, S, D). Every other form (a KV cache through
past_key/past_value with present_key/present_value, nonpad_kv_seqlen, softcap, sliding windows,
qk_matmul_output in any mode, softmax_precision) stays the ONNX ``Attention`` node, run whole by
``opstrata.ops.attention_onnx``. RotaryEmbedding imports as itself (``ops.rotary_embedding_onnx``).
"""

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
#: Attributes of the full form (IR op ``Attention`` in the ONNX domain) and their spec defaults.
_FULL_ATTRS: dict[str, Any] = {
    "is_causal": 0, "softcap": 0.0, "qk_matmul_output_mode": 0, "left_window_size": -1, "right_window_size": -1,
}  # fmt: skip


def _needs_full(ctx: ImportContext) -> bool:
    """True when the node uses anything the fused (B, H, S, D) attention has no equivalent for."""
    if any(ctx.input(i) for i in (4, 5, 6)) or any(ctx.is_used(k) for k in (1, 2, 3)):
        return True
    if any(k in ctx.attrs and ctx.attrs[k] != d for k, d in _ATTENTION_DEFAULTS.items()):
        return True
    return ctx.attrs.get("softmax_precision", 1) != 1


def _import_full(ctx: ImportContext) -> None:
    """The whole ONNX form (KV cache, nonpad_kv_seqlen, softcap, windows, qk output) as IR ``Attention``."""
    # only the attributes the node carries (the window ones exist from opset 25 on); the kernel has defaults
    known = (*_FULL_ATTRS, "scale", "q_num_heads", "kv_num_heads", "softmax_precision")
    attrs = {k: v for k, v in ctx.attrs.items() if k in known}
    if attrs.get("qk_matmul_output_mode", 0) not in (0, 1, 2, 3):
        raise ctx.unsupported(f"Attention qk_matmul_output_mode={attrs['qk_matmul_output_mode']}; use 0..3")
    if bool(ctx.input(4)) != bool(ctx.input(5)):
        raise ctx.unsupported("Attention needs past_key and past_value together (the spec's rule)")
    ctx.emit("Attention", ctx.inputs, ctx.outputs, attrs)


def _import_attention(ctx: ImportContext) -> None:
    """Plain ONNX Attention -> ``ai.opstrata::Attention`` (causal marked for :func:`resolve_causal`);
    any other form -> the whole ONNX ``Attention`` node."""
    if ("q_num_heads" in ctx.attrs) != ("kv_num_heads" in ctx.attrs):
        raise ctx.unsupported(
            "Attention with q_num_heads/kv_num_heads: only one of the two given; 3-D inputs need both, "
            "4-D inputs neither"
        )
    if _needs_full(ctx):
        _import_full(ctx)
        return
    heads = (ctx.attrs.get("q_num_heads"), ctx.attrs.get("kv_num_heads"))
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


def _bshd(n: Node) -> tuple[frozenset[int], bool]:
    """Which of q/k/v come as (B, S, H, D) (``bshd``), and whether the result goes out so (``bshd_out``):
    the layout pass folded the exporters' head Transposes into the node."""
    return frozenset(int(i) for i in n.attrs.get("bshd") or ()), bool(n.attrs.get("bshd_out", 0))


def _attention_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    q, v = ctx.shape(0), ctx.shape(2)
    dt = ctx.same_dtype([0, 1, 2])
    if q is None or v is None:
        return [(dt, None)]
    if len(q) != 4 or len(v) != 4:
        raise ctx.fail(f"Attention expects 4-D (B, H, N, D) q/k/v, got q {q} and v {v}")
    into, out = _bshd(n)
    if not into <= {0, 1, 2}:
        raise ctx.fail(f"Attention bshd lists inputs {sorted(into)}; only q, k, v (0, 1, 2) have a layout")
    qh = (q[0], q[2], q[1], q[3]) if 0 in into else q  # (B, H, N, D)
    y = (*qh[:3], v[3])
    return [(dt, (y[0], y[2], y[1], y[3]) if out else y)]


def _run_attention(n: Node, x: list[Any]) -> list[Arr]:
    mask = x[3] if len(x) > 3 else None
    a = n.attrs
    into, out = _bshd(n)
    q, k, v = (np.swapaxes(t, 1, 2) if i in into else t for i, t in enumerate(x[:3]))  # views, no copies
    y = ops.attention(q, k, v, causal=bool(a.get("causal", 0)), mask=mask, scale=a.get("scale"))
    return [np.swapaxes(y, 1, 2) if out else y]


def _full_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    dt = ctx.same_dtype([0, 1, 2])
    if q is None or k is None or v is None:
        return [(dt, None)] * 4
    if len(q) not in (3, 4) or len(k) != len(q) or len(v) != len(q):
        raise ctx.fail(f"Attention expects 3-D or 4-D q/k/v of one rank, got q {q}, k {k}, v {v}")
    a = n.attrs
    past = ctx.shape(4)
    if len(q) == 3:
        hq, hk = a.get("q_num_heads"), a.get("kv_num_heads")
        if not hq or not hk:
            raise ctx.fail("3-D Attention needs q_num_heads and kv_num_heads", "set both attributes")
        dv = _div(v[2], hk)
        y = (q[0], q[1], hq * dv if dv is not None else None)
        kv = [(k[0], hk, _div(k[2], hk)), (v[0], hk, _div(v[2], hk))]
        kv = [(s[0], s[1], _plus(past, k[1]), s[2]) for s in kv]
        qk = (q[0], hq, q[1], _plus(past, k[1]))
    else:
        y = (*q[:3], v[3])
        kv = [(*s[:2], _plus(past, s[2]), s[3]) for s in (k, v)]
        qk = (q[0], q[1], q[2], _plus(past, k[2]))
    return [(dt, y), (dt, kv[0]), (dt, kv[1]), (dt, qk)]


def _div(x: Any, h: int) -> Any:
    return x // h if isinstance(x, int) else None


def _plus(past: Any, m: Any) -> Any:
    if past is None:
        return m
    p = past[2]
    return p + m if isinstance(p, int) and isinstance(m, int) else None


def _run_full(n: Node, x: list[Any]) -> list[Arr]:
    x = [*x, *[None] * (7 - len(x))]
    a = n.attrs
    return list(
        ops.attention_onnx(
            *x[:7], causal=bool(a.get("is_causal", 0)), scale=a.get("scale"), softcap=float(a.get("softcap", 0.0)),
            q_num_heads=a.get("q_num_heads"), kv_num_heads=a.get("kv_num_heads"),
            qk_output_mode=int(a.get("qk_matmul_output_mode", 0)),
            window=(int(a.get("left_window_size", -1)), int(a.get("right_window_size", -1))),
        )
    )  # fmt: skip


define(
    "Attention", importer=_import_attention, shape=_full_rule, kernel=_run_full, uses=("attention_onnx",),
    dtypes="float", doc="ONNX Attention; the plain form imports as ai.opstrata::Attention, the rest runs whole",
)  # fmt: skip
define(
    "Attention", OPSTRATA_DOMAIN, shape=_attention_rule, kernel=_run_attention, uses=("attention",),
    onnx=False, layout="attention",
    doc="(B, H, S, D) q/k/v (or (B, S, H, D): bshd, bshd_out), causal, scale, additive or boolean mask",
)  # fmt: skip


def _rotary_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = ctx.same_dtype([0, 1, 2])
    r = ctx.rank(0)
    if r is not None and r not in (3, 4):
        raise ctx.fail(f"RotaryEmbedding expects 3-D or 4-D input, got {ctx.shape(0)}")
    if r == 3 and not n.attrs.get("num_heads"):
        raise ctx.fail("3-D RotaryEmbedding input needs num_heads", "set the num_heads attribute")
    return [(dt, ctx.shape(0))]


def _run_rotary(n: Node, x: list[Any]) -> list[Arr]:
    a = n.attrs
    pos = x[3] if len(x) > 3 else None
    return [
        ops.rotary_embedding_onnx(
            x[0], x[1], x[2], pos, interleaved=bool(a.get("interleaved", 0)),
            rotary_dim=int(a.get("rotary_embedding_dim", 0)), num_heads=int(a.get("num_heads", 0)),
        )
    ]  # fmt: skip


define(
    "RotaryEmbedding", attrs={"interleaved": 0, "rotary_embedding_dim": 0, "num_heads": 0},
    shape=_rotary_rule, kernel=_run_rotary, uses=("rotary_embedding_onnx",), dtypes="float",
    doc="ONNX RotaryEmbedding: rotate-half or interleaved, partial rotary dim, position_ids",
)  # fmt: skip
