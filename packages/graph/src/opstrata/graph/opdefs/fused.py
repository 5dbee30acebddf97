"""The fused ops the level 2/3 passes create: shape rules, executor kernels, ONNX exporters, one row each.

| op (``ai.opstrata``) | inputs | attrs | outputs |
|---|---|---|---|
| ``Linear`` | x, w (out, in), b? | ``activation`` = "" / relu / gelu / gelu_tanh / sigmoid / tanh | y |
| ``SkipLayerNorm`` | x, skip, gamma, beta? | ``axis``, ``epsilon`` | y, sum? (``x + skip``) |
| ``SkipRMSNorm`` | x, skip, w? | ``axis``, ``epsilon`` | y, sum? |
| ``FusedElementwise`` | x0, x1, ... | ``expr``: steps ``[op, [refs]]``, ref ``"x<i>"`` / ``"t<j>"`` / ``"c<k>"``; ``consts``: floats | the last step |
| ``FusedConv`` | x, w, b?, e1, e2, ... | Conv's attrs; ``conv_inputs`` (2 or 3); ``expr`` / ``consts`` over ``x0`` = the convolution, ``x<i>`` = ``e<i>`` | the last step |
| ``RotaryHalf`` | x (..., D), cos, sin (broadcast to x) | | ``x cos + concat(-x[..., D/2:], x[..., :D/2]) sin`` |
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import opstrata.ops as ops

from .._errors import GraphError
from .._ir import OPSTRATA_DOMAIN, Node
from .._shape_rules import RuleContext, TypeShape, bcast, linear_rule, unary_float
from ..onnx.export import (
    ExportContext,
    _gelu_body,
    _layer_norm_body,
    _linear_body,
    _rms_norm_export,
    export_as_function,
    export_standard_from,
    register_export,
)
from . import registry
from .common import Arr
from .fused_codegen import result_dtype, run_fused
from .registry import define

__all__ = ["ACTIVATIONS", "check_expr", "emit_expr", "fused_steps"]

#: ``Linear`` epilogue activations -> the ONNX op they stand for.
ACTIVATIONS = {
    "": None,
    "relu": "Relu",
    "gelu": "Gelu",
    "gelu_tanh": "Gelu",
    "sigmoid": "Sigmoid",
    "tanh": "Tanh",
}


def check_expr(expr: Sequence[Sequence], n_inputs: int, where: str, n_consts: int = 0) -> None:
    """Validate a FusedElementwise expression (GraphError naming the bad step)."""
    from .._errors import GraphError

    if not expr:
        raise GraphError(where, "expr is empty", "give at least one step [op, [refs]]")
    for j, step in enumerate(expr):
        op, refs = step[0], list(step[1])
        unary, binary = (
            registry.elementwise_ops("unary", codegen=True),
            registry.elementwise_ops("binary", "variadic", codegen=True),
        )
        arity = 1 if op in unary else 2 if op in binary else None
        if arity is None or len(refs) != arity:
            raise GraphError(
                where, f"step {j} {op}({refs}) is not a supported {arity or '?'}-ary elementwise op",
                f"use {sorted(unary)} (1 ref) or {sorted(binary)} (2 refs)",
            )  # fmt: skip
        for r in refs:
            limit = {"x": n_inputs, "t": j, "c": n_consts}.get(r[:1], 0)
            if not (r[1:].isdigit() and int(r[1:]) < limit):
                raise GraphError(
                    where, f"step {j} refers to '{r}', which is neither an input x0..x{n_inputs - 1}, "
                    f"an earlier step nor one of the {n_consts} consts",
                    "refs are 'x<i>' (node input i), 't<j>' (result of step j < this one) or 'c<k>' (consts[k])",
                )  # fmt: skip


# --------------------------------------------------------------------------- shape rules


def _skip_norm(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = ctx.same_dtype([0, 1])
    s = bcast(ctx, [0, 1])
    return [(dt, s), (dt, s)][: len(n.outputs)]


def _rotary_half(n: Node, ctx: RuleContext) -> list[TypeShape]:
    """x's type: cos and sin broadcast to x (checked when the pass matched; the kernel checks again)."""
    return [(ctx.same_dtype([0, 1, 2]), bcast(ctx, [0, 1, 2]))]


def _fused_elementwise(n: Node, ctx: RuleContext) -> list[TypeShape]:
    from .._errors import GraphError

    where = f"node '{n.name}' ({n.qualified_type})"
    consts = n.attrs.get("consts") or []
    if not all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in consts):
        raise GraphError(where, f"consts must be numbers, got {consts!r}", "give consts as a list of floats")
    check_expr(n.attrs.get("expr") or [], len(n.inputs), where, len(consts))
    from .fused_codegen import result_dtype

    dts = [ctx.dtype(i) for i in range(len(n.inputs))]
    dt = (
        result_dtype(n, dts) if all(d is not None for d in dts) else None
    )  # ONNX typing: Pow keeps its base's
    return [(dt, bcast(ctx, range(len(n.inputs))))]


# --------------------------------------------------------------------------- exporters


def _activation(ctx: ExportContext, act: str, x: str, out: str) -> None:
    op = ACTIVATIONS[act]
    if op == "Gelu":
        node = Node("Gelu", [x], [out], {"approximate": "tanh" if act == "gelu_tanh" else "none"})
        if ctx.opset >= 20:
            ctx.emit("Gelu", [x], [out], approximate=node.attrs["approximate"])
        else:
            _gelu_body(node, ctx)
    else:
        ctx.emit(op, [x], [out])  # type: ignore[arg-type]


def _linear_act_body(node: Node, ctx: ExportContext) -> None:
    act = node.attrs.get("activation") or ""
    if not act:
        _linear_body(node, ctx)
        return
    pre = ctx.fresh("pre_act")
    _linear_body(Node("Linear", node.inputs, [pre], {}, node.name, node.domain), ctx)
    _activation(ctx, act, pre, node.outputs[0])


_layer_norm_export = export_standard_from(17, _layer_norm_body)


def _skip_norm_export(node: Node, ctx: ExportContext) -> None:
    s = node.outputs[1] if len(node.outputs) > 1 and node.outputs[1] else ctx.fresh(f"{node.name}_sum")
    ctx.emit("Add", node.inputs[:2], [s])
    if node.op_type == "SkipLayerNorm":
        ln = Node("LayerNormalization", [s, *node.inputs[2:]], node.outputs[:1], dict(node.attrs), node.name)
        _layer_norm_export(ln, ctx)
    else:
        rms = Node(
            "RMSNorm", [s, *node.inputs[2:]], node.outputs[:1], dict(node.attrs), node.name, OPSTRATA_DOMAIN
        )
        _rms_norm_export(rms, ctx)


def _fused_elementwise_body(node: Node, ctx: ExportContext) -> None:
    from .fused_codegen import result_dtype

    dt = result_dtype(node, [ctx.dtype_of(x) for x in node.inputs])
    emit_expr(ctx, node.attrs["expr"], node.attrs.get("consts") or [], node.inputs, node.outputs[0], dt)


def emit_expr(
    ctx: ExportContext, expr: Sequence[Sequence], consts: Sequence[float], inputs: Sequence[str], out: str,
    dt: np.dtype,
) -> None:  # fmt: skip
    """Write a FusedElementwise expression over ``inputs`` as ONNX nodes, the last step into ``out``
    (constants as 0-d tensors of ``dt``)."""
    names: list[str] = []
    const_names = [ctx.scalar(float(c), dt, f"c{k}") for k, c in enumerate(consts)]
    for j, (op, refs) in enumerate(expr):
        args = [
            inputs[int(r[1:])]
            if r[0] == "x"
            else names[int(r[1:])]
            if r[0] == "t"
            else const_names[int(r[1:])]
            for r in refs
        ]
        step_out = out if j == len(expr) - 1 else ctx.fresh(f"t{j}")
        ctx.emit(op, args, [step_out])  # Pow keeps its base's dtype: ONNX takes any exponent dtype
        names.append(step_out)


def _linear_export(node: Node, ctx: ExportContext) -> None:
    ctx.call_function(node, _linear_act_body)


register_export("Linear", _linear_export, domain=OPSTRATA_DOMAIN)
register_export("SkipLayerNorm", _skip_norm_export, domain=OPSTRATA_DOMAIN)
register_export("SkipRMSNorm", _skip_norm_export, domain=OPSTRATA_DOMAIN)
register_export("FusedElementwise", export_as_function(_fused_elementwise_body), domain=OPSTRATA_DOMAIN)


def _rotary_half_export(node: Node, ctx: ExportContext) -> None:
    """The exporters' own form: x cos + Concat(-x[..., D/2:], x[..., :D/2]) sin."""
    x, cos, sin = node.inputs
    shape = ctx.shape_of(x)
    half = int(shape[-1]) // 2  # type: ignore[index]  # the pass fuses only a static even last dim
    axes, lo, mid, hi = (
        ctx.ints([-1], "axes"),
        ctx.ints([0], "zero"),
        ctx.ints([half], "half"),
        ctx.ints([2 * half], "full"),
    )
    x1, x2, neg, rot = (ctx.fresh(f"{node.name}_{h}") for h in ("x1", "x2", "neg", "rot"))
    ctx.emit("Slice", [x, lo, mid, axes], [x1])
    ctx.emit("Slice", [x, mid, hi, axes], [x2])
    ctx.emit("Neg", [x2], [neg])
    ctx.emit("Concat", [neg, x1], [rot], axis=-1)
    a, b = ctx.fresh(f"{node.name}_xcos"), ctx.fresh(f"{node.name}_rotsin")
    ctx.emit("Mul", [x, cos], [a])
    ctx.emit("Mul", [rot, sin], [b])
    ctx.emit("Add", [a, b], node.outputs[:1])


register_export("RotaryHalf", _rotary_half_export, domain=OPSTRATA_DOMAIN)


# --------------------------------------------------------------------------- executor kernels


_ACT: dict[str, Callable[[Arr], Arr]] = {
    "relu": ops.relu, "sigmoid": ops.sigmoid, "tanh": ops.tanh,
    "gelu": lambda a: ops.gelu(a, approximate="none"), "gelu_tanh": lambda a: ops.gelu(a, approximate="tanh"),
}  # fmt: skip


def _run_linear(n: Node, x: list[Any]) -> list[Arr]:
    y = ops.linear(x[0], x[1], x[2] if len(x) > 2 else None)
    act = n.attrs.get("activation") or ""
    if act:
        if act not in _ACT:
            raise GraphError(
                f"node '{n.name}' ({n.qualified_type})",
                f"unknown activation '{act}'",
                f"use one of {sorted(_ACT)}",
            )
        y = _ACT[act](y)
    return [y]


def _run_skip_norm(n: Node, x: list[Any]) -> list[Arr]:
    s = ops.add(x[0], x[1])  # (..., D): the residual sum, also an output
    a = n.attrs
    if n.op_type == "SkipLayerNorm":
        y = ops.layer_norm(
            s, x[2], x[3] if len(x) > 3 else None, axis=a.get("axis", -1), eps=a.get("epsilon", 1e-5)
        )
    else:
        y = ops.rms_norm(s, x[2] if len(x) > 2 else None, axis=a.get("axis", -1), eps=a.get("epsilon", 1e-6))
    return [y, s]


_STEP_NODES: dict[str, Node] = {}


def fused_steps(n: Node, x: list[Any]) -> Arr:
    """A FusedElementwise expression evaluated step by step on the ops kernels of its unfused ops."""
    t: list[Arr] = []
    consts = n.attrs.get("consts") or []
    dt = result_dtype(n, [a.dtype for a in x])
    for op, refs in n.attrs["expr"]:
        args = [
            x[int(r[1:])]
            if r[0] == "x"
            else t[int(r[1:])]
            if r[0] == "t"
            else np.asarray(consts[int(r[1:])], dt)
            for r in refs
        ]
        step = _STEP_NODES.setdefault(op, Node(op, [], [], name=f"{n.name}/{op}"))
        t.append(registry.KERNELS[("", op)](step, args)[0])
    return t[-1]


def _run_fused_elementwise(n: Node, x: list[Any]) -> list[Arr]:
    """On ``cpu``: one generated kernel (opstrata.ops codegen). Elsewhere (``ref``, plugin devices):
    step by step, so that device's own kernels run."""
    if ops.get_default_device() == "cpu":
        return [run_fused(n, x)]
    return [fused_steps(n, x)]


def _run_rotary_half(n: Node, x: list[Any]) -> list[Arr]:
    return [ops.rope_rotate_half(x[0], x[1], x[2])]


def _run_rms_norm(n: Node, x: list[Any]) -> list[Arr]:
    w = x[1] if len(x) > 1 else None
    return [ops.rms_norm(x[0], w, axis=n.attrs.get("axis", -1), eps=n.attrs.get("epsilon", 1e-6))]


# --------------------------------------------------------------------------- the rows

_O = OPSTRATA_DOMAIN
define("Linear", _O, shape=linear_rule, kernel=_run_linear, uses=("linear",), onnx=False)
define("SkipLayerNorm", _O, shape=_skip_norm, kernel=_run_skip_norm, uses=("add", "layer_norm"), onnx=False)
define("SkipRMSNorm", _O, shape=_skip_norm, kernel=_run_skip_norm, uses=("add", "rms_norm"), onnx=False)
define(
    "FusedElementwise", _O, shape=_fused_elementwise, kernel=_run_fused_elementwise, elementwise="other",
    inplace=True,
    onnx=False, doc="a generated elementwise chain (its steps' kernels are listed per device by the plan)",
)  # fmt: skip
define(
    "RotaryHalf",
    _O,
    shape=_rotary_half,
    kernel=_run_rotary_half,
    uses=("rope_rotate_half",),
    onnx=False,
    doc="x cos + rotate_half(x) sin as exporters write RoPE (Slice, Neg, Concat, Mul, Add) in one node",
)
define("RMSNorm", _O, shape=unary_float, kernel=_run_rms_norm, uses=("rms_norm",), onnx=False, layout="norm")
