"""Signal ops of the ONNX operator specification: DFT (opset 17's axis attribute and opset 20's axis
input), STFT, HannWindow, HammingWindow, BlackmanWindow and MelWeightMatrix.

Scalar inputs (dft_length, frame_step, frame_length, window sizes, mel parameters) stay inputs of the
IR node, so values computed at run time work; shape rules use their contents when shape folding knows
them and leave the dims unknown otherwise. DFT's axis becomes an attribute when it is a constant.
Each executor kernel is one opstrata.ops call (module ``opstrata.ops.kernels.signal``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import opstrata.ops as ops

from .._ir import Node
from .._shape_rules import RuleContext, TypeShape, float_dtype
from ..onnx.context import ImportContext
from ..onnx.export import ExportContext, register_export
from ..onnx.types import dtype_from_onnx
from .common import Arr
from .registry import define


def _scalar(ctx: RuleContext, i: int) -> int | None:
    v = ctx.static_ints(i)
    return v[0] if v is not None and len(v) == 1 else None


def _int_input(x: list[Any], i: int) -> int | None:
    return int(np.asarray(x[i]).ravel()[0]) if i < len(x) and x[i] is not None else None


def _out_dtype(n: Node) -> np.dtype:
    return dtype_from_onnx(
        int(n.attrs.get("output_datatype", 1)), f"node '{n.name}' attribute 'output_datatype'"
    )


# --------------------------------------------------------------------------- DFT


def _import_dft(ctx: ImportContext) -> None:
    attrs = {"inverse": int(ctx.attrs.get("inverse", 0)), "onesided": int(ctx.attrs.get("onesided", 0))}
    inputs = ctx.inputs[:2]
    if ctx.since < 20:
        attrs["axis"] = int(ctx.attrs.get("axis", 1))
    else:
        axis, runtime = ctx.ints_or_input(2)
        if axis is not None and len(axis) != 1:
            raise ctx.unsupported(f"DFT needs a scalar axis, got {axis}")
        if runtime:
            inputs = [ctx.input(0), ctx.input(1), runtime[0]]
        else:
            attrs["axis"] = axis[0] if axis is not None else -2
    ctx.emit("DFT", inputs, ctx.outputs, attrs)


def _dft_axis(n: Node, rank: int, x: list[Any] | None = None, known: int | None = None) -> int | None:
    if "axis" in n.attrs:
        return int(n.attrs["axis"])
    if x is not None:
        return _int_input(x, 2)
    return known


def _dft_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt, x = float_dtype(ctx), ctx.shape(0)
    if x is None:
        return [(dt, None)]
    r = len(x)
    axis = _dft_axis(n, r, known=_scalar(ctx, 2))
    if axis is None:
        return [(dt, (*([None] * (r - 1)), None))]
    a = ctx.axis(axis, r)
    assert a is not None
    if a == r - 1:
        raise ctx.fail(
            f"DFT axis {axis} is the trailing (real, imaginary) dim of {x}", f"use an axis in [0, {r - 2}]"
        )
    inverse, onesided = bool(n.attrs.get("inverse", 0)), bool(n.attrs.get("onesided", 0))
    length: Any = _scalar(ctx, 1) if len(n.inputs) > 1 and n.inputs[1] else None
    if length is None and not (len(n.inputs) > 1 and n.inputs[1]):
        d = x[a]
        length = (2 * (d - 1) if isinstance(d, int) else None) if inverse and onesided else d
    size = length
    if onesided and not inverse:
        size = length // 2 + 1 if isinstance(length, int) else None
    last = 1 if inverse and onesided else 2
    return [(dt, tuple(size if i == a else (last if i == r - 1 else d) for i, d in enumerate(x)))]


def _export_dft(n: Node, ctx: ExportContext) -> None:
    """The IR's axis attribute back to opset 20's axis input (opset 17-19: the attribute)."""
    a = n.attrs
    inputs = list(n.inputs)
    kw: dict[str, Any] = {"inverse": a.get("inverse", 0), "onesided": a.get("onesided", 0)}
    if "axis" in a:
        if ctx.opset >= 20:
            axis = ctx.const(np.array(a["axis"], np.int64), "axis")
            inputs = [inputs[0], inputs[1] if len(inputs) > 1 else "", axis]
        else:
            kw["axis"] = a["axis"]
    ctx.emit("DFT", inputs, n.outputs, **kw)


def _run_dft(n: Node, x: list[Arr]) -> list[Arr]:
    axis = _dft_axis(n, x[0].ndim, x)
    return [
        ops.dft(
            x[0], x[1] if len(x) > 1 else None, axis=-2 if axis is None else axis,
            inverse=bool(n.attrs.get("inverse", 0)), onesided=bool(n.attrs.get("onesided", 0)),
        )
    ]  # fmt: skip


# --------------------------------------------------------------------------- STFT


def _stft_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt, x = float_dtype(ctx), ctx.shape(0)
    batch = x[0] if x is not None else None
    step, length = _scalar(ctx, 1), _scalar(ctx, 3) if len(n.inputs) > 3 and n.inputs[3] else None
    w = ctx.shape(2)
    if length is None and w is not None and len(w) == 1 and isinstance(w[0], int):
        length = w[0]
    sig = x[1] if x is not None and len(x) > 1 else None
    frames = 1 + (sig - length) // step if isinstance(sig, int) and length and step else None
    bins = (length // 2 + 1 if n.attrs.get("onesided", 1) else length) if length else None
    return [(dt, (batch, frames, bins, 2))]


def _run_stft(n: Node, x: list[Arr]) -> list[Arr]:
    window = x[2] if len(x) > 2 else None
    length = x[3] if len(x) > 3 else None
    return [ops.stft(x[0], x[1], window, length, onesided=bool(n.attrs.get("onesided", 1)))]


# --------------------------------------------------------------------------- windows, mel


def _window_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(0, "iu", "an integer scalar")
    return [(_out_dtype(n), (_scalar(ctx, 0),))]


def _window_kernel(fn: Any) -> Any:
    def run(n: Node, x: list[Arr]) -> list[Arr]:
        return [fn(x[0], periodic=bool(n.attrs.get("periodic", 1)), dtype=_out_dtype(n))]

    return run


def _mel_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    m, d = _scalar(ctx, 0), _scalar(ctx, 1)
    return [(_out_dtype(n), (d // 2 + 1 if d is not None else None, m))]


def _run_mel(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.mel_weight_matrix(*x[:5], dtype=_out_dtype(n))]


# --------------------------------------------------------------------------- the rows

define(
    "DFT", importer=_import_dft, shape=_dft_rule, kernel=_run_dft, uses=("dft",), dtypes="float",
    doc="complex as a trailing dim of 2; onesided, inverse, dft_length",
)  # fmt: skip
register_export("DFT", _export_dft)
define("STFT", attrs={"onesided": 1}, shape=_stft_rule, kernel=_run_stft, uses=("stft",), dtypes="float")
for _name, _fn in {
    "HannWindow": "hann_window",
    "HammingWindow": "hamming_window",
    "BlackmanWindow": "blackman_window",
}.items():
    define(
        _name, attrs={"periodic": 1, "output_datatype": 1}, shape=_window_rule,
        kernel=_window_kernel(getattr(ops, _fn)), uses=(_fn,), dtypes="int size",
    )  # fmt: skip
define(
    "MelWeightMatrix", attrs={"output_datatype": 1}, shape=_mel_rule, kernel=_run_mel, uses=("mel_weight_matrix",),
    dtypes="int/float scalars",
)  # fmt: skip
