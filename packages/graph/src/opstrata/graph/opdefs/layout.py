"""Layout ops (ONNX operator spec): Pad, Tile, DepthToSpace, SpaceToDepth and Resize.

Pad's ``pads``, Tile's ``repeats`` and Resize's ``sizes`` set the output shape; they stay int64 inputs
of the IR node, as Reshape's target does, so shapes computed from other shapes (torchvision's FPN
upsampling, padding to a window multiple) infer. Pad's ``axes`` and Resize's ``roi`` and ``scales``
become attributes when constant (the exporter writes them back as inputs) and stay inputs when
computed at run time; an output shape that depends on run-time values is left to the runtime's
allocator (it has no place in a static memory plan).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import opstrata.ops as ops

from .._errors import GraphError
from .._ir import Node
from .._shape_rules import RuleContext, TypeShape
from .._symbolic import Dim, dim_mul
from ..onnx.context import ImportContext
from ..onnx.export import ExportContext, register_export
from .common import Arr
from .registry import define

# --------------------------------------------------------------------------- Pad


def _import_pad(ctx: ImportContext) -> None:
    axes, runtime_axes = ctx.ints_or_input(3)
    pads = ctx.const(1)
    inputs = [*ctx.inputs[:3], "", ""][:3]
    if axes is not None and pads is not None:  # fold axes into full-rank pads when the rank is known
        v = ctx.graph.values.get(ctx.inputs[0])
        if v is not None and v.shape is not None:
            r, p, k = len(v.shape), [int(t) for t in np.asarray(pads).ravel()], len(axes)
            if len(p) != 2 * k:
                raise ctx.unsupported(f"Pad with {len(p)} pads for {k} axes (needs {2 * k})")
            inputs[1] = ctx.fresh("pads")
            ctx.graph.add_initializer(inputs[1], np.array(_full_pads(p, axes, r), np.int64))
            axes = None
    attrs: dict[str, Any] = {"mode": str(ctx.attrs.get("mode", "constant"))}
    if axes is not None:
        attrs["axes"] = list(axes)
    ctx.emit("Pad", inputs + runtime_axes, ctx.outputs, attrs)


def _full_pads(pads: list[Any], axes: list[int] | None, r: int) -> list[Any]:
    """Pads for every dim (``[begins..., ends...]``) from pads for ``axes``."""
    if axes is None:
        return pads
    k = len(axes)
    full: list[Any] = [0] * (2 * r)
    for i, a in enumerate(axes):
        full[a % r], full[a % r + r] = pads[i], pads[i + k]
    return full


def _pad_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(1, "i", "int64")
    x, pads = ctx.shape(0), ctx.ints(1)
    if x is None:
        return [(ctx.dtype(0), None)]
    r = len(x)
    axes = n.attrs.get("axes")
    if len(n.inputs) > 3 and n.inputs[3]:  # axes computed at run time: known when shape folding knows them
        axes = ctx.static_ints(3)
        if axes is None:
            return [(ctx.dtype(0), (None,) * r)]
    if pads is None:
        return [(ctx.dtype(0), (None,) * r)]
    want = 2 * (len(axes) if axes is not None else r)
    if len(pads) != want:
        raise ctx.fail(
            f"Pad has {len(pads)} pads for input {x}; it needs {want}", "give begin and end per axis"
        )
    p = _full_pads(list(pads), axes, r)
    out: list[Dim] = []
    for d in range(r):
        b, e = p[d], p[d + r]
        out.append(x[d] + b + e if all(isinstance(t, int) for t in (x[d], b, e)) else None)  # type: ignore[operator]
        if isinstance(out[-1], int) and out[-1] < 0:
            raise ctx.fail(f"Pad crops dim {d} of {x} below zero (pads {list(pads)})")
    return [(ctx.dtype(0), tuple(out))]


def _input(x: list[Any], i: int) -> Any:
    """Executor input ``i``, None when omitted."""
    return x[i] if i < len(x) else None


def _run_pad(n: Node, x: list[Any]) -> list[Arr]:
    axes = n.attrs.get("axes")
    if _input(x, 3) is not None:
        axes = [int(v) for v in np.asarray(x[3]).ravel()]
    pads = _full_pads([int(v) for v in np.asarray(x[1]).ravel()], axes, x[0].ndim)
    value = x[2] if _input(x, 2) is not None and np.asarray(x[2]).size else 0
    value = np.asarray(value).ravel()[0] if np.ndim(value) else value
    return [ops.pad(x[0], pads, mode=n.attrs.get("mode", "constant"), value=value)]


def _export_pad(node: Node, ctx: ExportContext) -> None:
    ins = [*node.inputs, "", "", ""][:4]
    axes = node.attrs.get("axes")
    if axes is not None or ins[3]:
        if ctx.opset < 18:
            raise GraphError(
                f"node '{node.name}' (Pad)",
                f"Pad with axes needs opset >= 18, exporting {ctx.opset}",
                "export opset 18+",
            )
        ins[3] = ins[3] or ctx.ints(axes, "axes")
    while ins and not ins[-1]:
        ins.pop()
    ctx.emit("Pad", ins, node.outputs, mode=node.attrs.get("mode", "constant"))


# --------------------------------------------------------------------------- Tile


def _tile_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(1, "i", "int64")
    x, reps = ctx.shape(0), ctx.ints(1)
    if x is None:
        return [(ctx.dtype(0), None)]
    if reps is None:
        return [(ctx.dtype(0), (None,) * len(x))]
    if len(reps) != len(x):
        raise ctx.fail(f"Tile has {len(reps)} repeats for input {x}", "give one repeat per dim")
    return [
        (
            ctx.dtype(0),
            tuple(
                dim_mul(d, t) if d is not None and t is not None else None
                for d, t in zip(x, reps, strict=True)
            ),
        )
    ]


def _run_tile(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.tile(x[0], [int(v) for v in np.asarray(x[1]).ravel()])]


# --------------------------------------------------------------------------- DepthToSpace, SpaceToDepth


def _block_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, bs = ctx.shape(0), int(n.attrs["blocksize"])
    if x is None:
        return [(ctx.dtype(0), None)]
    if len(x) != 4:
        raise ctx.fail(f"{n.op_type} needs a 4-D NCHW input, got {x}")
    b, c, h, w = x
    if n.op_type == "DepthToSpace":
        if isinstance(c, int) and c % (bs * bs):
            raise ctx.fail(f"DepthToSpace channels {c} are not divisible by blocksize**2 = {bs * bs}")
        c2 = c // (bs * bs) if isinstance(c, int) else None
        return [
            (
                ctx.dtype(0),
                (b, c2, dim_mul(h, bs) if h is not None else None, dim_mul(w, bs) if w is not None else None),
            )
        ]
    for d in (h, w):
        if isinstance(d, int) and d % bs:
            raise ctx.fail(f"SpaceToDepth spatial dims {x[2:]} are not divisible by blocksize {bs}")
    sp = tuple(d // bs if isinstance(d, int) else None for d in (h, w))
    return [(ctx.dtype(0), (b, dim_mul(c, bs * bs) if c is not None else None, *sp))]


def _run_depth_to_space(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.depth_to_space(x[0], blocksize=int(n.attrs["blocksize"]), mode=n.attrs.get("mode", "DCR"))]


def _run_space_to_depth(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.space_to_depth(x[0], blocksize=int(n.attrs["blocksize"]), mode=n.attrs.get("mode", "DCR"))]


# --------------------------------------------------------------------------- Resize

_RESIZE_ATTRS = {
    "mode": "nearest",
    "coordinate_transformation_mode": "half_pixel",
    "nearest_mode": "round_prefer_floor",
    "cubic_coeff_a": -0.75,
    "exclude_outside": 0,
    "extrapolation_value": 0.0,
}
_RESIZE_18 = {"antialias": 0, "keep_aspect_ratio_policy": "stretch"}  # opset 18+ only


def _floats_or_input(ctx: ImportContext, i: int) -> tuple[list[float] | None, str]:
    """Input ``i``: ``(floats, "")`` when constant (None when empty), ``(None, name)`` when computed at run
    time (the IR node keeps it as an input), ``(None, "")`` when omitted."""
    if not ctx.input(i):
        return None, ""
    arr = ctx.const(i)
    if arr is None:
        return None, ctx.input(i)
    return [float(v) for v in np.asarray(arr, np.float64).ravel()] or None, ""


def _import_resize(ctx: ImportContext) -> None:
    """IR inputs keep ONNX's positions ``[X, roi, scales, sizes]``: constant roi/scales become attributes,
    run-time ones (and sizes, constant or not) stay inputs."""
    attrs: dict[str, Any] = {k: ctx.attrs.get(k, v) for k, v in {**_RESIZE_ATTRS, **_RESIZE_18}.items()}
    tf_crop = attrs["coordinate_transformation_mode"] == "tf_crop_and_resize"
    attrs["roi"], roi = _floats_or_input(ctx, 1) if tf_crop else (None, "")  # roi only matters there
    attrs["scales"], scales = _floats_or_input(ctx, 2)
    attrs["axes"] = list(ctx.attrs["axes"]) if "axes" in ctx.attrs else None
    sizes = ctx.input(3)
    if sizes and ctx.const(3) is not None and np.asarray(ctx.const(3)).size == 0:
        sizes = ""
    if attrs["scales"] is not None and sizes:
        raise ctx.unsupported("Resize with both scales and sizes is invalid (the spec allows exactly one)")
    if attrs["scales"] is None and not scales and not sizes:
        raise ctx.unsupported("Resize without scales or sizes is invalid (the spec needs exactly one)")
    if tf_crop and attrs["roi"] is None and not roi:
        raise ctx.unsupported("Resize with tf_crop_and_resize needs a roi input")
    ctx.emit("Resize", [ctx.input(0), roi, scales, sizes], ctx.outputs, attrs)


def _has(n: Node, i: int) -> bool:
    return len(n.inputs) > i and bool(n.inputs[i])


def _resize_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x = ctx.shape(0)
    dt = ctx.dtype(0)
    if dt is not None and dt.kind not in "fiu" and "float" not in dt.name:
        raise ctx.fail(f"type mismatch: Resize input must be numeric, got {dt}", "insert a Cast to float32")
    if x is None:
        return [(dt, None)]
    r = len(x)
    axes = [ctx.axis(a, r, "axes") for a in (n.attrs.get("axes") or range(r))]
    unknown = tuple(None if i in axes else d for i, d in enumerate(x))
    out: list[Dim] = list(x)
    scales = n.attrs.get("scales")
    if scales is not None:
        if len(scales) != len(axes):
            raise ctx.fail(f"Resize has {len(scales)} scales for {len(axes)} axes of {x}")
        for a, s in zip(axes, scales, strict=True):
            d = x[a]  # type: ignore[index]
            out[a] = math.floor(d * s) if isinstance(d, int) else (d if s == 1 else None)  # type: ignore[index]
        return [(dt, tuple(out))]
    if not _has(n, 3):  # scales computed at run time
        return [(dt, unknown)]
    ctx.need_dtype(3, "i", "int64")
    sizes = ctx.ints(3)
    if sizes is None:
        return [(dt, unknown)]
    if len(sizes) != len(axes):
        raise ctx.fail(f"Resize has {len(sizes)} sizes for {len(axes)} axes of {x}")
    policy = n.attrs.get("keep_aspect_ratio_policy", "stretch")
    if policy == "stretch":
        for a, s in zip(axes, sizes, strict=True):
            out[a] = s  # type: ignore[index]
        return [(dt, tuple(out))]
    if not all(isinstance(v, int) for v in sizes) or not all(isinstance(x[a], int) for a in axes):  # type: ignore[index]
        return [(dt, unknown)]
    ratios = [s / x[a] for a, s in zip(axes, sizes, strict=True)]  # type: ignore[index, operator]
    k = min(ratios) if policy == "not_larger" else max(ratios)
    for a in axes:
        out[a] = int(k * x[a] + 0.5)  # type: ignore[index, operator]
    return [(dt, tuple(out))]


def _values(v: Any, kind: type) -> list[Any] | None:
    """A run-time input's entries as ``kind`` (None when absent or empty)."""
    return None if v is None or np.asarray(v).size == 0 else [kind(t) for t in np.asarray(v).ravel()]


def _run_resize(n: Node, x: list[Any]) -> list[Arr]:
    a = n.attrs
    roi = a.get("roi") if a.get("roi") is not None else _values(_input(x, 1), float)
    scales = a.get("scales") if a.get("scales") is not None else _values(_input(x, 2), float)
    sizes = _values(_input(x, 3), int)
    return [
        ops.resize(
            x[0],
            scales=None if sizes is not None else scales,
            sizes=sizes,
            axes=a.get("axes"),
            roi=roi,
            **{k: a.get(k, v) for k, v in {**_RESIZE_ATTRS, **_RESIZE_18}.items()},
        )
    ]


def _export_resize(node: Node, ctx: ExportContext) -> None:
    a = node.attrs
    ins = [*node.inputs, "", "", ""][:4]
    if a.get("roi") is not None:
        ins[1] = ctx.const(np.array(a["roi"], np.float32), "roi")
    if a.get("scales") is not None:
        ins[2] = ctx.const(np.array(a["scales"], np.float32), "scales")
    while not ins[-1]:
        ins.pop()
    kw = {k: a.get(k, v) for k, v in _RESIZE_ATTRS.items()}
    newer = {k: a[k] for k, v in _RESIZE_18.items() if a.get(k, v) != v}
    if a.get("axes") is not None:
        newer["axes"] = list(a["axes"])
    if newer and ctx.opset < 18:
        raise GraphError(
            f"node '{node.name}' (Resize)",
            f"Resize attributes {sorted(newer)} need opset >= 18, exporting {ctx.opset}",
            "export opset 18+",
        )
    ctx.emit("Resize", ins, node.outputs, **kw, **newer)


define("Pad", importer=_import_pad, shape=_pad_rule, kernel=_run_pad, uses=("pad",), dtypes="all")
define("Tile", shape=_tile_rule, kernel=_run_tile, uses=("tile",), dtypes="all")
define("DepthToSpace", attrs={"mode": "DCR"}, shape=_block_rule, kernel=_run_depth_to_space,
       uses=("depth_to_space",), dtypes="all")  # fmt: skip
define("SpaceToDepth", shape=_block_rule, kernel=_run_space_to_depth, uses=("space_to_depth",), dtypes="all",
       doc="mode (opset 28) defaults to DCR")  # fmt: skip
define("Resize", importer=_import_resize, shape=_resize_rule, kernel=_run_resize, uses=("resize",),
       dtypes="numeric", doc="nearest/linear/cubic, all coordinate modes, antialias; roi/scales/sizes constant or run-time")  # fmt: skip
register_export("Pad", _export_pad)
register_export("Resize", _export_resize)
