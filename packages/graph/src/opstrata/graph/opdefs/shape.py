"""Shape and layout ops: Shape, Size, Reshape, Transpose, Flatten, (Un)Squeeze, Concat, Split, Slice, Gather, Expand,
Range, ConstantOfShape, Trilu; and the import-only forms Constant (an initializer) and Dropout (Identity)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import opstrata.ops as ops

from .._errors import GraphError
from .._ir import Node
from .._shape_rules import (
    RuleContext,
    TypeShape,
)
from .._symbolic import Dim, broadcast_shapes, dim_div, dim_prod
from ..onnx.context import ImportContext
from .common import Arr
from .registry import HOST, define


def _import_shape(ctx: ImportContext) -> None:
    ctx.emit("Shape", ctx.inputs, ctx.outputs, {k: v for k, v in ctx.attrs.items() if k in ("start", "end")})


def _import_transpose(ctx: ImportContext) -> None:
    ctx.emit(
        "Transpose", ctx.inputs, ctx.outputs, {"perm": list(ctx.attrs["perm"])} if "perm" in ctx.attrs else {}
    )


def _import_constant(ctx: ImportContext) -> None:
    a = ctx.attrs
    if "value" in a:
        arr = a["value"]
    elif "value_float" in a:
        arr = np.array(a["value_float"], np.float32)
    elif "value_floats" in a:
        arr = np.array(a["value_floats"], np.float32)
    elif "value_int" in a:
        arr = np.array(a["value_int"], np.int64)
    elif "value_ints" in a:
        arr = np.array(a["value_ints"], np.int64)
    elif "value_string" in a:  # STRING tensors are object arrays of str (opdefs/strings.py)
        arr = np.array(a["value_string"], dtype=object)
    elif "value_strings" in a:
        arr = np.array(list(a["value_strings"]), dtype=object)
    else:
        raise ctx.unsupported(f"Constant with attribute(s) {sorted(a)} is not supported (strings/sparse)")
    ctx.graph.add_initializer(ctx.outputs[0], np.asarray(arr))


def _import_dropout(ctx: ImportContext) -> None:
    """Inference (or training with ratio 0) is an Identity with an all-True mask; a training_mode or
    ratio computed at run time keeps a Dropout node whose kernel checks them; training with a ratio > 0
    is random and refused."""
    training = ctx.const(2) if ctx.input(2) else np.array(False)
    ratio = ctx.const(1) if ctx.input(1) else np.array(ctx.attrs.get("ratio", 0.5))
    if training is None or ratio is None:  # known only at run time
        ctx.emit("Dropout", ctx.inputs[:3], ctx.outputs[:2])
        return
    if bool(np.asarray(training)) and float(np.asarray(ratio)) != 0:
        raise ctx.unsupported(_DROPOUT_RANDOM)
    ctx.emit("Identity", [ctx.input(0)], [ctx.outputs[0]])
    if ctx.is_used(1):  # inference mask: all True
        shape = ctx.fresh("shape")
        ctx.emit("Shape", [ctx.input(0)], [shape])
        ctx.emit("ConstantOfShape", [shape], [ctx.outputs[1]], {"value": np.array([True])})


_DROPOUT_RANDOM = "Dropout training with ratio > 0 (random) is not supported; it runs as inference"


def _dropout_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(ctx.dtype(0), ctx.shape(0)), (np.dtype(np.bool_), ctx.shape(0))][: len(n.outputs)]


def _run_dropout(n: Node, x: list[Arr]) -> list[Arr]:
    """Dropout whose training_mode / ratio arrive at run time: the input and an all-True mask, unless
    training with ratio > 0 (random), which names the node."""
    ratio = float(np.asarray(x[1])) if len(x) > 1 and x[1] is not None else 0.5
    training = bool(np.asarray(x[2])) if len(x) > 2 and x[2] is not None else False
    if training and ratio != 0:
        raise GraphError(
            f"node '{n.name}' (Dropout)",
            f"only ratio 0 in training mode (ratio > 0 is random), got ratio {ratio}",
            "pass training_mode=False or ratio=0",
        )
    return [x[0].copy(), np.ones(x[0].shape, np.bool_)][: len(n.outputs)]


def _import_axes(ctx: ImportContext) -> None:
    """(Un)Squeeze: constant axes (input, or attribute before opset 13) become the ``axes`` attribute;
    axes computed at run time stay the node's second input."""
    if ctx.since < 13:
        ctx.emit(ctx.op_type, ctx.inputs[:1], ctx.outputs, {"axes": ctx.attrs.get("axes")})
        return
    axes, runtime = ctx.ints_or_input(1)
    ctx.emit(ctx.op_type, ctx.inputs[:1] + runtime, ctx.outputs, {} if runtime else {"axes": axes})


def _axes_of(n: Node, ctx: RuleContext) -> tuple[list[int] | None, bool]:
    """(axes, known): the attribute, or the run-time axes input's contents when shape folding knows them."""
    if len(n.inputs) > 1 and n.inputs[1]:
        axes = ctx.static_ints(1)
        return axes, axes is not None
    return n.attrs.get("axes"), True


def _import_split(ctx: ImportContext) -> None:
    sizes, runtime = ctx.ints_or_input(1) if ctx.since >= 13 else (ctx.attrs.get("split"), [])
    n = ctx.attrs.get("num_outputs")
    if n is not None and n != len(ctx.outputs):
        raise GraphError(
            f"node '{ctx.name}' (Split)", f"num_outputs={n} but the node has {len(ctx.outputs)} outputs"
        )
    if sizes is not None and len(sizes) != len(ctx.outputs):
        raise GraphError(
            f"node '{ctx.name}' (Split)", f"{len(sizes)} split sizes for {len(ctx.outputs)} outputs"
        )
    ctx.emit(
        "Split",
        ctx.inputs[:1] + runtime,
        ctx.outputs,
        {"axis": int(ctx.attrs.get("axis", 0)), "split": sizes},
    )


def _import_constant_of_shape(ctx: ImportContext) -> None:
    value = ctx.attrs.get("value", np.zeros(1, np.float32))
    ctx.emit("ConstantOfShape", ctx.inputs, ctx.outputs, {"value": np.asarray(value).reshape(1)})


def _shape_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    r = ctx.rank(0)
    if r is None:
        return [(np.dtype(np.int64), (None,))]
    start, end = n.attrs.get("start", 0), n.attrs.get("end", r)
    return [(np.dtype(np.int64), (len(range(r)[slice(start, end)]),))]


def _size_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(np.dtype(np.int64), ())]


def _reshape_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, target = ctx.shape(0), ctx.ints(1)
    ctx.need_dtype(1, "i", "int64")
    if target is None:
        s = ctx.shape(1)
        return [(ctx.dtype(0), None if s is None or not isinstance(s[0], int) else (None,) * s[0])]
    allowzero = n.attrs.get("allowzero", 0)
    out: list[Dim] = []
    for i, t in enumerate(target):
        if t == 0 and not allowzero:
            out.append(x[i] if x is not None and i < len(x) else None)
        else:
            out.append(t)
    if sum(1 for t in out if t == -1) > 1:
        raise ctx.fail(f"Reshape target {list(target)} has more than one -1", "give at most one -1")
    if -1 in out:
        k = out.index(-1)
        known = dim_prod(d for j, d in enumerate(out) if j != k)
        out[k] = dim_div(dim_prod(x), known) if x is not None else None
    elif x is not None:
        a, b = dim_prod(x), dim_prod(out)
        if isinstance(a, int) and isinstance(b, int) and a != b:
            raise ctx.fail(
                f"inconsistent shapes: cannot reshape {x} ({a} elements) to {tuple(out)} ({b} elements)",
                "fix the target shape so the element counts agree",
            )
    return [(ctx.dtype(0), tuple(out))]


def _transpose_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x = ctx.shape(0)
    if x is None:
        return [(ctx.dtype(0), None)]
    perm = n.attrs.get("perm") or list(range(len(x)))[::-1]
    if sorted(perm) != list(range(len(x))):
        raise ctx.fail(f"perm {list(perm)} is not a permutation of the {len(x)} dims of {x}")
    return [(ctx.dtype(0), tuple(x[p] for p in perm))]


def _flatten_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x = ctx.shape(0)
    if x is None:
        return [(ctx.dtype(0), (None, None))]
    a = n.attrs.get("axis", 1)
    a = a + len(x) if a < 0 else a
    return [(ctx.dtype(0), (dim_prod(x[:a]), dim_prod(x[a:])))]


def _squeeze_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, (axes, known) = ctx.shape(0), _axes_of(n, ctx)
    if x is None or not known:
        return [(ctx.dtype(0), None)]
    if axes is None:
        if any(not isinstance(d, int) for d in x):
            return [(ctx.dtype(0), None)]
        return [(ctx.dtype(0), tuple(d for d in x if d != 1))]
    ax = {ctx.axis(a, len(x), "axes") for a in axes}
    for a in ax:
        if isinstance(x[a], int) and x[a] != 1:
            raise ctx.fail(f"cannot squeeze axis {a} of shape {x}: its size is {x[a]}, not 1")
    return [(ctx.dtype(0), tuple(d for i, d in enumerate(x) if i not in ax))]


def _unsqueeze_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, (axes, known) = ctx.shape(0), _axes_of(n, ctx)
    if x is None:
        return [(ctx.dtype(0), None)]
    if not known:  # run-time axes: the rank is known when the axes tensor's length is
        k = ctx.shape(1)
        return [(ctx.dtype(0), None if not k or not isinstance(k[0], int) else (None,) * (len(x) + k[0]))]
    assert axes is not None
    r = len(x) + len(axes)
    ax = {ctx.axis(a, r, "axes") for a in axes}
    it = iter(x)
    return [(ctx.dtype(0), tuple(1 if i in ax else next(it) for i in range(r)))]


def _concat_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    idx = [i for i in range(len(n.inputs)) if n.inputs[i]]
    dt = ctx.same_dtype(idx)
    shapes = [ctx.shape(i) for i in idx]
    if any(s is None for s in shapes):
        return [(dt, None)]
    r = len(shapes[0])  # type: ignore[arg-type]
    a = ctx.axis(n.attrs["axis"], r)
    out = list(shapes[0])  # type: ignore[arg-type]
    total: Dim = 0
    for i, s in zip(idx, shapes, strict=True):
        assert s is not None
        if len(s) != r:
            raise ctx.fail(
                f"inconsistent shapes: Concat inputs have ranks {r} and {len(s)} ('{n.inputs[i]}' {s})"
            )
        for j in range(r):
            if j != a and isinstance(s[j], int) and isinstance(out[j], int) and s[j] != out[j]:
                raise ctx.fail(
                    f"inconsistent shapes: Concat input '{n.inputs[i]}' {s} differs from {tuple(shapes[0])} "  # type: ignore[arg-type]
                    f"in dim {j} (only axis {a} may differ)"
                )
            if j != a and out[j] is None:
                out[j] = s[j]
        total = total + s[a] if isinstance(total, int) and isinstance(s[a], int) else None  # type: ignore[assignment]
    out[a] = total  # type: ignore[index]
    return [(dt, tuple(out))]


def _split_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, k = ctx.shape(0), len(n.outputs)
    if x is None:
        return [(ctx.dtype(0), None)] * k
    a = ctx.axis(n.attrs.get("axis", 0), len(x))
    assert a is not None
    sizes: list[Dim] | None = n.attrs.get("split")
    if len(n.inputs) > 1 and n.inputs[1]:
        sizes = ctx.static_ints(1) or [None] * k  # type: ignore[assignment]
    d = x[a]
    if sizes is None:
        sizes = [None] * k if not isinstance(d, int) else [-(-d // k)] * (k - 1) + [d - -(-d // k) * (k - 1)]
    elif isinstance(d, int) and all(isinstance(s, int) for s in sizes) and sum(sizes) != d:  # type: ignore[arg-type]  # type: ignore[arg-type]
        raise ctx.fail(
            f"inconsistent shapes: split sizes {sizes} sum to {sum(sizes)} but axis {a} of {x} is {d}"
        )  # type: ignore[arg-type]
    return [(ctx.dtype(0), (*x[:a], s, *x[a + 1 :])) for s in sizes]


def _slice_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x = ctx.shape(0)
    if x is None:
        return [(ctx.dtype(0), None)]
    starts, ends = ctx.static_ints(1), ctx.static_ints(2)
    axes = ctx.static_ints(3) if len(n.inputs) > 3 and n.inputs[3] else None
    steps = ctx.static_ints(4) if len(n.inputs) > 4 and n.inputs[4] else None
    out = list(x)
    if starts is None or ends is None or (len(n.inputs) > 3 and n.inputs[3] and axes is None):
        if axes is not None:
            for a in axes:
                out[a % len(x)] = None
            return [(ctx.dtype(0), tuple(out))]
        return [(ctx.dtype(0), (None,) * len(x))]
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        a = ctx.axis(a, len(x), "axes")
        if st == 0:
            raise ctx.fail("Slice step 0 is invalid", "use a non-zero step")
        d = x[a]
        if isinstance(d, int):
            out[a] = len(range(d)[slice(max(min(s, 2**62), -(2**62)), max(min(e, 2**62), -(2**62)), st)])
        elif st == 1 and s == 0 and e >= 2**31 - 1:
            out[a] = d
        else:
            out[a] = None
    return [(ctx.dtype(0), tuple(out))]


def _gather_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, idx = ctx.shape(0), ctx.shape(1)
    ctx.need_dtype(1, "iu", "int32 or int64")
    if x is None or idx is None:
        return [(ctx.dtype(0), None)]
    a = ctx.axis(n.attrs.get("axis", 0), len(x))
    assert a is not None
    return [(ctx.dtype(0), (*x[:a], *idx, *x[a + 1 :]))]


def _expand_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, target = ctx.shape(0), ctx.ints(1)
    if target is None:
        s = ctx.shape(1)
        if x is None or s is None or not isinstance(s[0], int):
            return [(ctx.dtype(0), None)]
        return [(ctx.dtype(0), (None,) * max(len(x), s[0]))]
    if x is None:
        return [(ctx.dtype(0), tuple(t if t != 1 else None for t in target))]
    try:
        return [(ctx.dtype(0), broadcast_shapes(x, target))]
    except ValueError as exc:
        raise ctx.fail(f"inconsistent shapes: cannot expand {x} to {tuple(target)} ({exc})") from None


def _range_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = ctx.same_dtype([0, 1, 2])
    vals = [ctx.ints(i) for i in range(3)]
    if not all(v is not None and len(v) == 1 for v in vals):
        return [(dt, (None,))]
    s, lim, d = (v[0] for v in vals)  # type: ignore[index]
    if isinstance(s, int) and isinstance(lim, int) and isinstance(d, int):
        return [(dt, (max(math.ceil((lim - s) / d), 0),))]
    return [(dt, (lim if s == 0 and d == 1 else None,))]


def _constant_of_shape_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    value = n.attrs.get("value")
    dt = np.dtype(np.float32) if value is None else np.asarray(value).dtype
    target = ctx.ints(0)
    if target is None:
        s = ctx.shape(0)
        return [(dt, None if s is None or not isinstance(s[0], int) else (None,) * s[0])]
    return [(dt, tuple(target))]


def _trilu_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    if ctx.rank(0) is not None and ctx.rank(0) < 2:  # type: ignore[operator]
        raise ctx.fail(f"Trilu needs rank >= 2, got shape {ctx.shape(0)}")
    return [(ctx.dtype(0), ctx.shape(0))]


def _run_shape(n: Node, x: list[Arr]) -> list[Arr]:
    r = x[0].ndim
    return [np.array(x[0].shape[slice(n.attrs.get("start", 0), n.attrs.get("end", r))], np.int64)]


def _run_size(n: Node, x: list[Arr]) -> list[Arr]:
    return [np.array(x[0].size, np.int64)]


def _run_reshape(n: Node, x: list[Arr]) -> list[Arr]:
    data, target = x[0], [int(t) for t in x[1]]
    if not n.attrs.get("allowzero", 0):  # ONNX: 0 copies the input dim
        target = [data.shape[i] if t == 0 else t for i, t in enumerate(target)]
    return [ops.reshape(data, shape=target)]


def _run_flatten(n: Node, x: list[Arr]) -> list[Arr]:
    a = n.attrs.get("axis", 1)
    a = a + x[0].ndim if a < 0 else a
    return [ops.reshape(x[0], shape=(math.prod(x[0].shape[:a]), math.prod(x[0].shape[a:])))]


def _run_squeeze(n: Node, x: list[Arr]) -> list[Arr]:
    axes = [int(a) for a in x[1]] if len(x) > 1 and x[1] is not None else n.attrs.get("axes")
    r = x[0].ndim
    drop = {a % r for a in axes} if axes is not None else {i for i, d in enumerate(x[0].shape) if d == 1}
    bad = [a for a in drop if x[0].shape[a] != 1]
    if bad:
        raise GraphError(f"node '{n.name}' (Squeeze)", f"axis {bad[0]} of shape {x[0].shape} is not 1")
    return [ops.reshape(x[0], shape=[d for i, d in enumerate(x[0].shape) if i not in drop])]


def _run_unsqueeze(n: Node, x: list[Arr]) -> list[Arr]:
    given = [int(a) for a in x[1]] if len(x) > 1 and x[1] is not None else n.attrs["axes"]
    r = x[0].ndim + len(given)
    axes = {a % r for a in given}
    if len(axes) != len(given):
        raise GraphError(
            f"node '{n.name}' (Unsqueeze)", f"axes {list(given)} repeat an axis of the rank-{r} output"
        )
    it = iter(x[0].shape)
    return [ops.reshape(x[0], shape=[1 if i in axes else next(it) for i in range(r)])]


def _run_transpose(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.transpose(x[0], perm=n.attrs.get("perm"))]


class _Arrays(list):  # type: ignore[type-arg]
    """A list of arrays that reports its dtype: ops' dispatcher reads ``.dtype`` of the primary
    argument and would otherwise call ``np.asarray`` on pieces of different shapes (which fails)."""

    @property
    def dtype(self) -> np.dtype:
        return self[0].dtype


def _run_concat(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.concat(_Arrays(a for a in x if a is not None), axis=n.attrs["axis"])]


def _run_split(n: Node, x: list[Arr]) -> list[Arr]:
    axis = n.attrs.get("axis", 0)
    sizes = [int(s) for s in x[1]] if len(x) > 1 and x[1] is not None else n.attrs.get("split")
    if sizes is None:  # ONNX: equal chunks of ceil(d / k), the last one smaller
        d, k = x[0].shape[axis], len(n.outputs)
        c = -(-d // k)
        sizes = [c] * (k - 1) + [d - c * (k - 1)]
    return list(ops.split(x[0], list(sizes), axis=axis))


def _run_slice(n: Node, x: list[Any]) -> list[Arr]:
    opt = [None if i >= len(x) or x[i] is None else [int(v) for v in x[i]] for i in (3, 4)]
    return [
        ops.slice(x[0], starts=[int(v) for v in x[1]], ends=[int(v) for v in x[2]], axes=opt[0], steps=opt[1])
    ]


def _run_gather(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.gather(x[0], x[1], axis=n.attrs.get("axis", 0))]


def _run_expand(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.expand(x[0], shape=[int(v) for v in x[1]])]


def _run_range(n: Node, x: list[Arr]) -> list[Arr]:
    start, limit, delta = (v.item() for v in x)
    return [np.arange(start, limit, delta, dtype=x[0].dtype)]


def _run_constant_of_shape(n: Node, x: list[Arr]) -> list[Arr]:
    value = n.attrs.get("value")
    v = np.zeros(1, np.float32) if value is None else np.asarray(value)
    return [np.full([int(d) for d in x[0]], v.ravel()[0], v.dtype)]


def _run_trilu(n: Node, x: list[Any]) -> list[Arr]:
    k = int(x[1]) if len(x) > 1 and x[1] is not None else 0
    a = np.asarray(x[0])
    if a.ndim < 2:  # shape inference rejects it; a direct call gets the same message
        raise ValueError(f"Trilu needs an input of rank >= 2, got shape {a.shape}")
    rows, cols = np.indices(a.shape[-2:])
    keep = cols - rows >= k if n.attrs.get("upper", 1) else cols - rows <= k
    zero = np.zeros((), a.dtype) if a.dtype != object else np.array("", object)  # strings: the empty string
    return [np.where(keep, a, zero)]


define("Shape", importer=_import_shape, shape=_shape_rule, kernel=_run_shape, uses=(HOST,), layout="shape")
define("Size", shape=_size_rule, kernel=_run_size, uses=(HOST,))
define("Reshape", shape=_reshape_rule, kernel=_run_reshape, uses=("reshape",), view=True, layout="reshape")
define(
    "Transpose", importer=_import_transpose, shape=_transpose_rule, kernel=_run_transpose, uses=("transpose",),
    layout="transpose",
)  # fmt: skip
define("Flatten", attrs={"axis": 1}, shape=_flatten_rule, kernel=_run_flatten, uses=("reshape",), view=True)
define(
    "Squeeze", importer=_import_axes, shape=_squeeze_rule, kernel=_run_squeeze, uses=("reshape",), view=True,
    layout="squeeze",
)  # fmt: skip
define(
    "Unsqueeze", importer=_import_axes, shape=_unsqueeze_rule, kernel=_run_unsqueeze, uses=("reshape",),
    view=True, layout="unsqueeze",
)  # fmt: skip
define("Concat", shape=_concat_rule, kernel=_run_concat, uses=("concat",))
define("Split", importer=_import_split, shape=_split_rule, kernel=_run_split, uses=("split",), layout="split")
define("Slice", shape=_slice_rule, kernel=_run_slice, uses=("slice",))
define("Gather", attrs={"axis": 0}, shape=_gather_rule, kernel=_run_gather, uses=("gather",))
define("Expand", shape=_expand_rule, kernel=_run_expand, uses=("expand",), layout="expand")
define("Range", shape=_range_rule, kernel=_run_range, uses=(HOST,))
define(
    "ConstantOfShape", importer=_import_constant_of_shape, shape=_constant_of_shape_rule,
    kernel=_run_constant_of_shape, uses=(HOST,),
)  # fmt: skip
define("Trilu", attrs={"upper": 1}, shape=_trilu_rule, kernel=_run_trilu, uses=(HOST,))
define("Constant", importer=_import_constant, doc="imported as an initializer")
define(
    "Dropout", importer=_import_dropout, shape=_dropout_rule, kernel=_run_dropout, uses=(HOST,),
    doc="inference (or ratio 0): imported as Identity; run-time training_mode/ratio: checked when run",
)  # fmt: skip
