"""Convolution and pooling over ``(N, C, *spatial)`` (ONNX operator spec): Conv, ConvTranspose, MaxPool
(with its Indices output; ``ai.opstrata::MaxPoolNd`` for integer inputs), AveragePool, LpPool, MaxUnpool,
GlobalAveragePool, GlobalMaxPool, GlobalLpPool.

2-D Conv / MaxPool / AveragePool run on the fast 2-D kernels (conv2d, max_pool2d, avg_pool2d) whenever
those take the attributes; 1-D, 3-D and the forms the 2-D kernels refuse (AveragePool dilations, pads
over half the window, MaxPool Indices) run on the N-D kernels of opstrata.ops.kernels.conv_nd.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import opstrata.ops as ops

from .._ir import OPSTRATA_DOMAIN, Node
from .._shape_rules import (
    RuleContext,
    TypeShape,
    conv_pads,
    float_dtype,
    pool_out_size,
)
from .._symbolic import Dim, Shape
from ..onnx.context import ImportContext
from ..onnx.export import ExportContext, register_export
from .common import Arr
from .registry import define

_SAME = ("SAME_UPPER", "SAME_LOWER")


# --------------------------------------------------------------------------- importers


def _input_rank(ctx: ImportContext, i: int = 0) -> int | None:
    v = ctx.graph.values.get(ctx.input(i))
    return None if v is None or v.shape is None else len(v.shape)


def _window_attrs(ctx: ImportContext, nd: int | None, pool: bool, dilations: bool = True) -> dict[str, Any]:
    """The window attributes with ONNX defaults filled in (``nd`` spatial dims; None: left to run time)."""
    a = ctx.attrs
    if nd is not None and nd < 1:
        raise ctx.unsupported(f"{ctx.op_type} needs at least 1 spatial dim (input (N, C, *spatial))")
    out: dict[str, Any] = {}
    if "kernel_shape" in a:
        out["kernel_shape"] = list(a["kernel_shape"])
    if nd is not None:
        out["strides"] = list(a.get("strides", [1] * nd))
        out["pads"] = list(a.get("pads", [0] * 2 * nd))
        if dilations:
            out["dilations"] = list(a.get("dilations", [1] * nd))
    else:
        out.update({k: list(a[k]) for k in ("strides", "pads", "dilations") if k in a})
    out["auto_pad"] = a.get("auto_pad", "NOTSET")
    if pool:
        out["ceil_mode"] = int(a.get("ceil_mode", 0))
    return out


def _conv_nd(ctx: ImportContext) -> int | None:
    w = ctx.const(1)
    ks = ctx.attrs.get("kernel_shape")
    if ks is not None:
        return len(ks)
    if w is not None:
        return w.ndim - 2
    r = _input_rank(ctx)
    return None if r is None else r - 2


def _import_conv(ctx: ImportContext) -> None:
    w = ctx.const(1)
    attrs = _window_attrs(ctx, _conv_nd(ctx), pool=False)
    if "kernel_shape" not in attrs and w is not None:
        attrs["kernel_shape"] = list(w.shape[2:])
    attrs["group"] = int(ctx.attrs.get("group", 1))
    ctx.emit("Conv", ctx.inputs, ctx.outputs, attrs)


def _import_conv_transpose(ctx: ImportContext) -> None:
    w = ctx.const(1)
    nd = _conv_nd(ctx)
    attrs = _window_attrs(ctx, nd, pool=False)
    if "kernel_shape" not in attrs and w is not None:
        attrs["kernel_shape"] = list(w.shape[2:])
    attrs["group"] = int(ctx.attrs.get("group", 1))
    if "output_padding" in ctx.attrs or nd is not None:
        attrs["output_padding"] = list(ctx.attrs.get("output_padding", [0] * (nd or 0)))
    if "output_shape" in ctx.attrs:
        attrs["output_shape"] = list(ctx.attrs["output_shape"])
    ctx.emit("ConvTranspose", ctx.inputs, ctx.outputs, attrs)


def _import_max_pool(ctx: ImportContext) -> None:
    attrs = _window_attrs(ctx, len(ctx.attrs["kernel_shape"]), pool=True)
    attrs["storage_order"] = int(ctx.attrs.get("storage_order", 0))
    v = ctx.graph.values.get(ctx.input(0))
    if v is not None and v.dtype is not None and v.dtype.kind in "iu":  # the 2-D kernel is float-only
        ctx.emit("MaxPoolNd", ctx.inputs[:1], ctx.outputs[:2], attrs, domain=OPSTRATA_DOMAIN)
        return
    ctx.emit("MaxPool", ctx.inputs[:1], ctx.outputs[:2], attrs)


def _import_avg_pool(ctx: ImportContext) -> None:
    attrs = _window_attrs(ctx, len(ctx.attrs["kernel_shape"]), pool=True, dilations="dilations" in ctx.attrs)
    attrs["count_include_pad"] = int(ctx.attrs.get("count_include_pad", 0))
    ctx.emit("AveragePool", ctx.inputs, ctx.outputs, attrs)


def _import_lp_pool(ctx: ImportContext) -> None:
    a = ctx.attrs
    attrs = _window_attrs(ctx, len(a["kernel_shape"]), pool="ceil_mode" in a, dilations="dilations" in a)
    attrs["p"] = int(a.get("p", 2))
    ctx.emit("LpPool", ctx.inputs, ctx.outputs, attrs)


def _import_max_unpool(ctx: ImportContext) -> None:
    nd = len(ctx.attrs["kernel_shape"])
    attrs = _window_attrs(ctx, nd, pool=False, dilations=False)
    del attrs["auto_pad"]
    shape = ctx.const_ints(2, "output_shape")
    if shape is not None:
        attrs["output_shape"] = shape
    ctx.emit("MaxUnpool", ctx.inputs[:2], ctx.outputs, attrs)


# --------------------------------------------------------------------------- geometry


def _spatial(n: Node, ctx: RuleContext, x: Shape, kernel: Sequence[int]) -> list[Dim]:
    nd = len(kernel)
    strides = n.attrs.get("strides") or [1] * nd
    dil = n.attrs.get("dilations") or [1] * nd
    auto = n.attrs.get("auto_pad", "NOTSET")
    ceil = bool(n.attrs.get("ceil_mode", 0))
    sizes = x[2:]
    if len(sizes) != nd:
        raise ctx.fail(
            f"inconsistent shapes: input {x} has {len(sizes)} spatial dims but the kernel {list(kernel)} has {nd}",
            "give an (N, C, *spatial) input with one spatial dim per kernel dim",
        )
    if auto in _SAME:
        return [
            -(-d // s) if isinstance(d, int) else (d if s == 1 else None)
            for d, s in zip(sizes, strides, strict=True)
        ]
    pads = conv_pads([0] * nd, kernel, strides, dil, n.attrs.get("pads") or [], auto)
    out: list[Dim] = []
    for i, d in enumerate(sizes):
        k, s, dl, p0, p1 = kernel[i], strides[i], dil[i], pads[i], pads[i + nd]
        if isinstance(d, int):
            o = pool_out_size(d, k, s, dl, p0, p1, ceil)
            if o <= 0:
                raise ctx.fail(
                    f"inconsistent shapes: spatial dim {i} of size {d} is smaller than the window "
                    f"(kernel {k}, dilation {dl}, pads {p0}+{p1})",
                    "use a larger input or a smaller kernel",
                )
            out.append(o)
        else:
            out.append(d if s == 1 and p0 + p1 == dl * (k - 1) else None)
    return out


def _need_spatial(ctx: RuleContext, x: Shape, what: str) -> None:
    if len(x) < 3:
        raise ctx.fail(
            f"{what} needs an (N, C, *spatial) input of rank >= 3, got shape {x}", "reshape the input"
        )


def conv_geometry(n: Node, x: Arr, kernel: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """(strides, dilations, explicit pads [begin..., end...]) for input ``x``."""
    nd = len(kernel)
    strides = list(n.attrs.get("strides") or [1] * nd)
    dil = list(n.attrs.get("dilations") or [1] * nd)
    pads = conv_pads(
        x.shape[2:], kernel, strides, dil, n.attrs.get("pads") or [], n.attrs.get("auto_pad", "NOTSET")
    )
    return strides, dil, pads


def pool_fits_2d(kernel: Sequence[int], dil: Sequence[int], pads: Sequence[int]) -> bool:
    """The 2-D pooling kernels take pads of at most half the (dilated) window."""
    eff = [d * (k - 1) + 1 for k, d in zip(kernel, dil, strict=True)]
    return max(pads[0], pads[2]) <= eff[0] // 2 and max(pads[1], pads[3]) <= eff[1] // 2


def _convt_geom(
    n: Node, sizes: Sequence[int], kernel: Sequence[int]
) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """ConvTranspose (strides, dilations, pads, output_padding, output sizes) per the ONNX spec:
    ``output_shape`` or SAME_* auto_pad fix the output size and the pads follow from it."""
    nd = len(kernel)
    a = n.attrs
    s = list(a.get("strides") or [1] * nd)
    d = list(a.get("dilations") or [1] * nd)
    op = list(a.get("output_padding") or [0] * nd)
    auto = a.get("auto_pad", "NOTSET")
    full = [
        si * (x - 1) + oi + (k - 1) * di + 1 for x, si, oi, k, di in zip(sizes, s, op, kernel, d, strict=True)
    ]
    want = a.get("output_shape")
    if want or auto in _SAME:
        target = list(want)[-nd:] if want else [x * si for x, si in zip(sizes, s, strict=True)]
        total = [f - t for f, t in zip(full, target, strict=True)]
        begin = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
        pads = begin + [t - b for t, b in zip(total, begin, strict=True)]
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    else:
        pads = list(a.get("pads") or [0] * (2 * nd))
    out = [f - pads[i] - pads[i + nd] for i, f in enumerate(full)]
    return s, d, pads, op, out


# --------------------------------------------------------------------------- shape rules


def _conv_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = ctx.same_dtype([i for i in range(len(n.inputs)) if n.inputs[i]])
    x, w = ctx.shape(0), ctx.shape(1)
    if x is not None:
        _need_spatial(ctx, x, "Conv")
    if x is None or w is None:
        return [(dt, None if x is None else (x[0], None if w is None else w[0], *([None] * (len(x) - 2))))]
    kernel = n.attrs.get("kernel_shape") or list(w[2:])
    if not all(isinstance(k, int) for k in kernel):
        return [(dt, (x[0], w[0], *([None] * (len(x) - 2))))]
    group = n.attrs.get("group", 1)
    if isinstance(x[1], int) and isinstance(w[1], int) and x[1] != w[1] * group:
        raise ctx.fail(
            f"inconsistent shapes: input has {x[1]} channels but weight {w} with group={group} expects {w[1] * group}"
        )
    return [(dt, (x[0], w[0], *_spatial(n, ctx, x, kernel)))]


def _conv_transpose_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = ctx.same_dtype([i for i in range(len(n.inputs)) if n.inputs[i]])
    float_dtype(ctx)
    x, w = ctx.shape(0), ctx.shape(1)
    if x is None:
        return [(dt, None)]
    _need_spatial(ctx, x, "ConvTranspose")
    group = n.attrs.get("group", 1)
    m = w[1] * group if w is not None and isinstance(w[1], int) else None
    kernel = n.attrs.get("kernel_shape") or (list(w[2:]) if w is not None else None)
    sizes = x[2:]
    if kernel is None or not all(isinstance(k, int) for k in [*kernel, *sizes]):
        return [(dt, (x[0], m, *([None] * len(sizes))))]
    if w is not None and isinstance(w[0], int) and isinstance(x[1], int) and w[0] != x[1]:
        raise ctx.fail(f"inconsistent shapes: input has {x[1]} channels but weight {w} expects {w[0]}")
    *_, pads, _, out = _convt_geom(n, sizes, kernel)  # type: ignore[arg-type]
    nd = len(kernel)
    if any(p < 0 for p in pads[:nd]) or any(o < 1 for o in out):
        raise ctx.fail(
            f"ConvTranspose output {out} with pads {pads} is not reachable from input {x}",
            "check output_shape / pads against the input size",
        )
    return [(dt, (x[0], m, *out))]


def _pool_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x = ctx.shape(0)
    is_max = n.op_type in ("MaxPool", "MaxPoolNd")
    dt = ctx.dtype(0) if is_max else float_dtype(ctx)
    if x is None:
        shape: Shape | None = None
    else:
        _need_spatial(ctx, x, n.op_type)
        shape = (x[0], x[1], *_spatial(n, ctx, x, n.attrs["kernel_shape"]))
    out = [(dt, shape)]
    if is_max and len(n.outputs) > 1:
        out.append((np.dtype(np.int64), shape))
    return out


def _global_pool_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x = ctx.shape(0)
    return [(float_dtype(ctx), None if x is None else (*x[:2], *([1] * (len(x) - 2))))]


def _max_unpool_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x = ctx.shape(0)
    ctx.need_dtype(1, "i", "int64 indices")
    if "output_shape" in n.attrs:
        return [(ctx.dtype(0), tuple(n.attrs["output_shape"]))]
    if x is None:
        return [(ctx.dtype(0), None)]
    _need_spatial(ctx, x, "MaxUnpool")
    return [(ctx.dtype(0), (x[0], x[1], *_unpool_sizes(n, x[2:])))]


def _unpool_sizes(n: Node, sizes: Sequence[Dim]) -> list[Dim]:
    k = n.attrs["kernel_shape"]
    nd = len(k)
    s = n.attrs.get("strides") or [1] * nd
    p = n.attrs.get("pads") or [0] * (2 * nd)
    return [
        (d - 1) * s[i] + k[i] - p[i] - p[i + nd] if isinstance(d, int) else None for i, d in enumerate(sizes)
    ]


# --------------------------------------------------------------------------- executor kernels


def _run_conv(n: Node, x: list[Any]) -> list[Arr]:
    w = x[1]
    b = x[2] if len(x) > 2 and x[2] is not None else None
    kernel = n.attrs.get("kernel_shape") or w.shape[2:]
    s, d, pads = conv_geometry(n, x[0], kernel)
    g = n.attrs.get("group", 1)
    if len(kernel) == 2:
        return [ops.conv2d(x[0], w, b, groups=g, stride=tuple(s), padding=tuple(pads), dilation=tuple(d))]
    return [ops.conv_nd(x[0], w, b, groups=g, stride=s, pads=pads, dilation=d)]


def _run_conv_transpose(n: Node, x: list[Any]) -> list[Arr]:
    w = x[1]
    b = x[2] if len(x) > 2 and x[2] is not None else None
    kernel = n.attrs.get("kernel_shape") or w.shape[2:]
    nd = len(kernel)
    s, d, pads, op, _ = _convt_geom(n, x[0].shape[2:], kernel)
    begin, end = pads[:nd], pads[nd:]
    op = [o + max(-e, 0) for o, e in zip(op, end, strict=True)]  # output_shape past the full size: extend
    pads = begin + [max(e, 0) for e in end]
    y = ops.conv_transpose_nd(
        x[0], w, b, stride=s, pads=pads, dilation=d, groups=n.attrs.get("group", 1), output_padding=op
    )
    return [y]


def _run_max_pool(n: Node, x: list[Arr]) -> list[Arr]:
    k = list(n.attrs["kernel_shape"])
    s, d, pads = conv_geometry(n, x[0], k)
    ceil = bool(n.attrs.get("ceil_mode", 0))
    indices = len(n.outputs) > 1
    if (
        n.op_type == "MaxPool"
        and len(k) == 2
        and not indices
        and x[0].dtype.kind not in "iu"
        and pool_fits_2d(k, d, pads)
    ):
        y = ops.max_pool2d(
            x[0],
            kernel_size=tuple(k),
            stride=tuple(s),
            padding=tuple(pads),
            dilation=tuple(d),
            ceil_mode=ceil,
        )
        return [y]
    out = ops.max_pool_nd(
        x[0], kernel_size=k, stride=s, pads=pads, dilation=d, ceil_mode=ceil, return_indices=indices,
        storage_order=int(n.attrs.get("storage_order", 0)),
    )  # fmt: skip
    return list(out) if indices else [out]


def _run_avg_pool(n: Node, x: list[Arr]) -> list[Arr]:
    k = list(n.attrs["kernel_shape"])
    s, d, pads = conv_geometry(n, x[0], k)
    ceil, cip = bool(n.attrs.get("ceil_mode", 0)), bool(n.attrs.get("count_include_pad", 0))
    if len(k) == 2 and all(v == 1 for v in d) and pool_fits_2d(k, d, pads):
        y = ops.avg_pool2d(
            x[0],
            kernel_size=tuple(k),
            stride=tuple(s),
            padding=tuple(pads),
            ceil_mode=ceil,
            count_include_pad=cip,
        )
        return [y]
    return [
        ops.avg_pool_nd(
            x[0], kernel_size=k, stride=s, pads=pads, dilation=d, ceil_mode=ceil, count_include_pad=cip
        )
    ]


def _run_lp_pool(n: Node, x: list[Arr]) -> list[Arr]:
    k = list(n.attrs["kernel_shape"])
    s, d, pads = conv_geometry(n, x[0], k)
    ceil = bool(n.attrs.get("ceil_mode", 0))
    p = n.attrs.get("p", 2)
    return [ops.lp_pool_nd(x[0], kernel_size=k, stride=s, pads=pads, dilation=d, ceil_mode=ceil, p=p)]


def _run_max_unpool(n: Node, x: list[Arr]) -> list[Arr]:
    shape = n.attrs.get("output_shape")
    size = list(shape)[2:] if shape else _unpool_sizes(n, x[0].shape[2:])
    return [ops.max_unpool_nd(x[0], x[1], output_size=size)]


def _run_gap(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.global_avg_pool(x[0])]


def _run_gmp(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.max(x[0], axis=tuple(range(2, x[0].ndim)), keepdims=True)]


def _run_glp(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.lp_pool_nd(x[0], kernel_size=x[0].shape[2:], p=n.attrs.get("p", 2))]


def _export_max_unpool(n: Node, ctx: ExportContext) -> None:
    a = dict(n.attrs)
    shape = a.pop("output_shape", None)
    ins = list(n.inputs[:2]) + ([ctx.ints(shape, "output_shape")] if shape is not None else [])
    ctx.emit("MaxUnpool", ins, n.outputs, **a)


def _export_window(n: Node, ctx: ExportContext) -> None:
    a = dict(n.attrs)
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", ""):
        a.pop("pads", None)  # ONNX forbids pads beside auto_pad
    ctx.emit(n.op_type, n.inputs, n.outputs, **a)


def _export_max_pool_nd(n: Node, ctx: ExportContext) -> None:
    a = dict(n.attrs)
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", ""):
        a.pop("pads", None)
    ctx.emit("MaxPool", n.inputs, n.outputs, **a)


register_export("MaxUnpool", _export_max_unpool)
register_export("MaxPoolNd", _export_max_pool_nd, domain=OPSTRATA_DOMAIN)
register_export("ConvTranspose", _export_window)
register_export("LpPool", _export_window)
define(
    "Conv", importer=_import_conv, shape=_conv_rule, kernel=_run_conv, uses=("conv2d", "conv_nd"),
    dtypes="float", doc="2-D on conv2d, 1-D/3-D on conv_nd",
)  # fmt: skip
define(
    "ConvTranspose", importer=_import_conv_transpose, shape=_conv_transpose_rule, kernel=_run_conv_transpose,
    uses=("conv_transpose_nd",), dtypes="float",
)  # fmt: skip
define(
    "MaxPool", importer=_import_max_pool, shape=_pool_rule, kernel=_run_max_pool,
    uses=("max_pool2d", "max_pool_nd"), dtypes="float", doc="Indices output and N-D on max_pool_nd",
)  # fmt: skip
define(
    "MaxPoolNd", OPSTRATA_DOMAIN, shape=_pool_rule, kernel=_run_max_pool, uses=("max_pool_nd",), onnx=False,
    dtypes="numeric", doc="ONNX MaxPool of an integer input (the 2-D kernel is float-only); exports as MaxPool",
)  # fmt: skip
define(
    "AveragePool", importer=_import_avg_pool, shape=_pool_rule, kernel=_run_avg_pool,
    uses=("avg_pool2d", "avg_pool_nd"), dtypes="float",
)  # fmt: skip
define("LpPool", importer=_import_lp_pool, shape=_pool_rule, kernel=_run_lp_pool, uses=("lp_pool_nd",))
define(
    "MaxUnpool", importer=_import_max_unpool, shape=_max_unpool_rule, kernel=_run_max_unpool,
    uses=("max_unpool_nd",),
)  # fmt: skip
define("GlobalAveragePool", shape=_global_pool_rule, kernel=_run_gap, uses=("global_avg_pool",))
define("GlobalMaxPool", shape=_global_pool_rule, kernel=_run_gmp, uses=("max",))
define("GlobalLpPool", attrs={"p": 2}, shape=_global_pool_rule, kernel=_run_glp, uses=("lp_pool_nd",))


# --------------------------------------------------------------------------- FusedConv (fuse_conv_epilogue)

#: FusedConv attributes that are not Conv's
_EPILOGUE_ATTRS = ("conv_inputs", "expr", "consts")


def _conv_part(n: Node) -> Node:
    """The plain Conv a FusedConv node starts with (its window attributes, its first inputs)."""
    k = int(n.attrs.get("conv_inputs", 3))
    attrs = {a: v for a, v in n.attrs.items() if a not in _EPILOGUE_ATTRS}
    return Node("Conv", n.inputs[:k], [n.outputs[0]], attrs, n.name)


def _fused_conv_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    from .fused import check_expr

    k = n.attrs.get("conv_inputs")
    if k not in (2, 3) or len(n.inputs) < k:
        raise ctx.fail(
            f"conv_inputs must be 2 or 3 (x, w, b?) and at most the {len(n.inputs)} inputs, got {k!r}"
        )
    consts = n.attrs.get("consts") or []
    check_expr(
        n.attrs.get("expr") or [], 1 + len(n.inputs) - k, f"node '{n.name}' ({n.qualified_type})", len(consts)
    )
    return _conv_rule(n, ctx)


def _run_fused_conv(n: Node, x: list[Any]) -> list[Arr]:
    """The Conv's kernel, then the epilogue over its result (in place: the result is this node's own)."""
    from .fused import fused_steps
    from .fused_codegen import run_fused

    k = int(n.attrs["conv_inputs"])
    y = _run_conv(n, x[:k])[0]
    extras = x[k:]
    if ops.get_default_device() != "cpu":
        return [fused_steps(n, [y, *extras])]
    own = y.flags.writeable and not any(a is not None and np.may_share_memory(y, a) for a in x)
    return [run_fused(n, [y, *extras], out=y if own else None)]


def _export_fused_conv(n: Node, ctx: ExportContext) -> None:
    """Conv into a temporary, then the epilogue's steps (a model-local function)."""
    from .fused import emit_expr

    def body(node: Node, c: ExportContext) -> None:
        conv = _conv_part(node)
        conv.outputs = [c.fresh("conv")]
        _export_window(conv, c)
        k = int(node.attrs["conv_inputs"])
        dt = c.dtype_of(node.inputs[0])
        emit_expr(c, node.attrs["expr"], node.attrs.get("consts") or [], [conv.outputs[0], *node.inputs[k:]],
                  node.outputs[0], dt)  # fmt: skip

    ctx.call_function(n, body)


register_export("FusedConv", _export_fused_conv, domain=OPSTRATA_DOMAIN)
define(
    "FusedConv", OPSTRATA_DOMAIN, shape=_fused_conv_rule, kernel=_run_fused_conv, uses=("conv2d", "conv_nd"),
    onnx=False, dtypes="float",
    doc="Conv then an elementwise epilogue (activation, residual add) over its result, in place",
)  # fmt: skip
