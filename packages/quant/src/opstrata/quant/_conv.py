"""Exact int8 2-D convolution on the native library, scaled to float32: what a QDQ Conv computes.

``prepack_conv(w, w_zero_point, groups)`` prepares an (OC, C/groups, kh, kw) int8/uint8 weight once: per
group a (kh * kw * C/groups, OC/groups) GEMM operand packed for :func:`~opstrata.quant.qgemm`'s kernels
(rows tap-major, matching the channels-last patches the C code builds), or, for a depthwise convolution
(groups == C == OC), the weight centred by its zero point as int16 for the direct kernel.
``qconv2d(x, packed, x_zero_point, scale, bias, stride=, pads=, dilation=)`` then returns float32
``conv(x - x_zp, w - w_zp) * scale + bias`` in NCHW (``scale``: x_scale * w_scale, scalar or per output
channel), the integer part exact on every code path.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import opstrata.ops as ops

from ._errors import QuantError
from ._qgemm import _ERRORS, PackedWeight, _lib, prepack_weight
from .native._library import count, entry_address, path_id

__all__ = [
    "PackedConv",
    "conv_geometry",
    "prepack_conv",
    "qconv2d",
    "qconv_call",
    "qconv_native_call",
    "run_qconv2d",
    "run_qconv_call",
]

_U8, _S8, _F32 = np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.float32)


@dataclass(frozen=True, eq=False)
class PackedConv:
    """An int8/uint8 conv weight prepared for :func:`qconv2d` (build with :func:`prepack_conv`)."""

    oc: int
    cg: int  # input channels per group
    kh: int
    kw: int
    groups: int
    dtype: np.dtype
    groups_packed: tuple[PackedWeight, ...] = ()  # the GEMM path: one per group
    centred: np.ndarray | None = None  # the depthwise path: (C, kh * kw) int16
    centred_f32: np.ndarray | None = None  # the same as float32 (exact): the float depthwise kernels read it
    centred_lanes: np.ndarray | None = (
        None  # and in blocks of 16 channels, (blocks, kh * kw, 16), zero-padded
    )
    ptrs: tuple[Any, Any, Any] | None = field(default=None, repr=False)

    @property
    def depthwise(self) -> bool:
        return self.centred is not None


def prepack_conv(w: Any, w_zero_point: Any = None, groups: int = 1) -> PackedConv:
    """Prepare a (OC, C/groups, kh, kw) int8/uint8 weight (zero point None, scalar or one per output
    channel) for :func:`qconv2d`."""
    op = "prepack_conv"
    w = np.asarray(w)
    if w.dtype not in (_U8, _S8) or w.ndim != 4:
        raise QuantError(
            op, f"w must be a 4-D int8/uint8 (OC, C/groups, kh, kw) weight, got {w.dtype}{list(w.shape)}"
        )
    oc, cg, kh, kw = (int(v) for v in w.shape)
    if groups < 1 or oc % groups:
        raise QuantError(op, f"groups={groups} must divide the {oc} output channels", "pass the Conv's group")
    zp = (
        np.zeros(1, np.int32)
        if w_zero_point is None
        else np.asarray(w_zero_point).reshape(-1).astype(np.int32)
    )
    if zp.size not in (1, oc):
        raise QuantError(op, f"w_zero_point must be a scalar or one per output channel ({oc}), got {zp.size}")
    if groups == oc and cg == 1:  # depthwise, channel multiplier 1
        centred = (w.reshape(oc, kh * kw).astype(np.int32) - zp.reshape(-1, 1)).astype(np.int16)
        centred.flags.writeable = False
        as_f32 = centred.astype(np.float32)
        lanes = np.zeros((-(-oc // 16) * 16, kh * kw), np.float32)
        lanes[:oc] = as_f32
        lanes = np.ascontiguousarray(lanes.reshape(-1, 16, kh * kw).transpose(0, 2, 1))
        as_f32.flags.writeable = lanes.flags.writeable = False
        return PackedConv(
            oc, cg, kh, kw, groups, w.dtype, centred=centred, centred_f32=as_f32, centred_lanes=lanes
        )
    ocg = oc // groups
    packed = []
    for g in range(groups):
        wg = w[g * ocg : (g + 1) * ocg]  # (ocg, cg, kh, kw) -> (kh * kw * cg, ocg), rows tap-major
        b = np.ascontiguousarray(wg.transpose(2, 3, 1, 0).reshape(kh * kw * cg, ocg))
        zg = zp if zp.size == 1 else zp[g * ocg : (g + 1) * ocg]
        packed.append(
            prepack_weight(b, zg.astype(w.dtype) if zg.size > 1 else zg.astype(w.dtype).reshape(()))
        )
    arrs = tuple((ctypes.c_void_p * groups)(*(p.ptrs[i] for p in packed)) for i in range(3))
    return PackedConv(oc, cg, kh, kw, groups, w.dtype, groups_packed=tuple(packed), ptrs=arrs)


def _pair(op: str, name: str, v: Any, n: int) -> tuple[int, ...]:
    if isinstance(v, (list, tuple)) and all(isinstance(t, (int, np.integer)) for t in v):
        vals = [int(t) for t in v]
    elif isinstance(v, (int, np.integer)):
        vals = [int(v)] * n
    else:
        vals = [int(v)] * n if np.ndim(v) == 0 else [int(t) for t in np.asarray(v).reshape(-1)]
    if len(vals) != n:
        raise QuantError(op, f"{name} must have {n} values for a 2-D convolution, got {vals}")
    return tuple(vals)


Geometry = tuple[tuple[int, int], tuple[int, int, int, int], tuple[int, int], tuple[int, int]]


def conv_geometry(
    x_shape: tuple[int, ...], packed: PackedConv, stride: Any = 1, pads: Any = 0, dilation: Any = 1
) -> Geometry:
    """(stride, pads [top, left, bottom, right], dilation, output (OH, OW)) of a 2-D convolution."""
    op = "qconv2d"
    s, d, p = _pair(op, "stride", stride, 2), _pair(op, "dilation", dilation, 2), _pair(op, "pads", pads, 4)
    if min(s) < 1 or min(d) < 1 or min(p) < 0:
        raise QuantError(op, f"stride {s} and dilation {d} must be >= 1, pads {p} >= 0")
    h, w = x_shape[2], x_shape[3]
    oh = (h + p[0] + p[2] - d[0] * (packed.kh - 1) - 1) // s[0] + 1
    ow = (w + p[1] + p[3] - d[1] * (packed.kw - 1) - 1) // s[1] + 1
    return (s[0], s[1]), (p[0], p[1], p[2], p[3]), (d[0], d[1]), (max(oh, 0), max(ow, 0))


def run_qconv2d(
    x: np.ndarray, packed: PackedConv, x_zp: int, scale: np.ndarray, bias: np.ndarray | None,
    geometry: Geometry, threads: int, path: str | None, out: np.ndarray | None,
) -> np.ndarray:  # fmt: skip
    """The C call for checked arguments: x C-contiguous (N, C, H, W) int8/uint8, ``scale`` / ``bias``
    contiguous float32 (1 or OC / OC values), ``geometry`` from :func:`conv_geometry`, ``out`` None or a
    C-contiguous float32 array of the output shape."""
    dst = np.empty((x.shape[0], packed.oc, *geometry[3]), _F32) if out is None else out
    return run_qconv_call(qconv_call(x, packed, scale, bias, geometry, threads, path, dst), x_zp, x, dst)


def run_qconv_call(
    call: tuple[Any, tuple[Any, ...], tuple[Any, ...]], x_zp: int, x: np.ndarray, out: np.ndarray
) -> np.ndarray:
    """Make a :func:`qconv_call` with activation zero point ``x_zp``; ``out`` (its destination) back, or a
    QuantError naming the code and ``x``."""
    fn, head, tail = call
    rc = fn(*head, x_zp, *tail)
    if rc != 0:
        raise QuantError(
            "qconv2d", f"the native kernel failed ({_ERRORS.get(rc, rc)}) for x {x.dtype}{list(x.shape)}"
        )
    count("qconv", "native")
    return out


def qconv_call(
    x: np.ndarray, packed: PackedConv, scale: np.ndarray, bias: np.ndarray | None, geometry: Geometry,
    threads: int, path: str | None, out: np.ndarray,
) -> tuple[Any, tuple[Any, ...], tuple[Any, ...]]:  # fmt: skip
    """(C function, arguments before the activation zero point, arguments after it) of one convolution
    (``run_qconv2d``'s checked arguments, ``out`` its destination): a bound call makes it once per shape and
    passes only the zero point, which may change between runs."""
    lib = _lib("qconv2d")
    (sh, sw), (ph, pw, _, _), (dh, dw), (oh, ow) = geometry
    n, c, h, w = x.shape
    signed = int(x.dtype == _S8)
    common = (
        scale.ctypes.data,
        scale.size,
        None if bias is None else bias.ctypes.data,
        out.ctypes.data,
        int(threads),
    )
    head = (path_id(path, lib), n, c, h, w, x.ctypes.data, signed)
    geo = (sh, sw, ph, pw, dh, dw, oh, ow)
    if packed.centred is not None:
        wf = None if packed.centred_f32 is None else packed.centred_f32.ctypes.data
        wl = None if packed.centred_lanes is None else packed.centred_lanes.ctypes.data
        tail = (packed.kh, packed.kw, *geo, packed.centred.ctypes.data, wf, wl, *common)
        return lib.opstrata_qconv2d_depthwise, head, tail
    assert packed.ptrs is not None
    tail = (packed.oc, packed.kh, packed.kw, *geo, packed.groups, *packed.ptrs, *common)
    return lib.opstrata_qconv2d, head, tail


def qconv_native_call(
    call: tuple[Any, tuple[Any, ...], tuple[Any, ...]],
    x_zero_point: np.ndarray | None,
    x: np.ndarray,
    keep: tuple[Any, ...],
    result: np.ndarray | None = None,
) -> Any:
    """A :func:`qconv_call` as one ``opstrata.ops.foreign_call`` (the library's packed entry point): the
    runtime merges it into a native batch with the ops around it. The activation zero point is read through
    its address when the call runs (``x_zero_point``: one value of x's dtype, or None for 0). None with an
    opstrata-ops without foreign calls (< 0.4.56) or a zero point of another dtype; ``keep`` holds the arrays
    the C arguments point into; calling it returns ``result`` (the destination)."""
    packed = _packed_args(call, x_zero_point, x)
    if packed is None:
        return None
    foreign, args = packed
    entry = call[0].__name__ + "_packed"
    return foreign(entry_address(_lib("qconv2d"), entry), args, (keep, x_zero_point, call[2]),
                   _failure("qconv2d", x), result, name=entry)  # fmt: skip


def _packed_args(
    call: tuple[Any, tuple[Any, ...], tuple[Any, ...]], x_zero_point: np.ndarray | None, x: np.ndarray
) -> tuple[Any, list[int]] | None:
    """(ops.foreign_call, the call's C arguments as integers with the activation zero point's address), or
    None with an opstrata-ops without foreign calls (< 0.4.56) or a zero point of another dtype / size."""
    foreign = getattr(ops, "foreign_call", None)
    if foreign is None or (
        x_zero_point is not None and (x_zero_point.dtype != x.dtype or x_zero_point.size != 1)
    ):
        return None
    _, head, tail = call
    zp_addr = 0 if x_zero_point is None else x_zero_point.ctypes.data
    args = [ctypes.addressof(a) if isinstance(a, ctypes.Array) else (a or 0) for a in (*head, zp_addr, *tail)]
    return foreign, args


def _failure(op: str, x: np.ndarray) -> Any:
    """The error a failed packed call raises: the C code's reason and the activation."""
    shape = f"{x.dtype}{list(x.shape)}"

    def error(rc: int) -> QuantError:
        return QuantError(op, f"the native kernel failed ({_ERRORS.get(rc, rc)}) for x {shape}")

    return error


def qconv_quantize_native_call(
    call: tuple[Any, tuple[Any, ...], tuple[Any, ...]],
    x_zero_point: np.ndarray | None,
    x: np.ndarray,
    keep: tuple[Any, ...],
    requant: tuple[int, np.ndarray, np.ndarray, np.ndarray, int, int, np.ndarray | None],
    out: np.ndarray,
) -> Any:
    """A :func:`qconv_call` whose float result goes through an activation into int8/uint8 ``out`` as one
    ``opstrata.ops.foreign_call`` (``opstrata_qconv_quantize_packed``): the convolution writes a per-thread
    scratch, not the arena. ``requant``: (activation id, [alpha, beta] float32, y_scale float32 scalar,
    y_zero_point int8/uint8 scalar, signed output, threads, a float32 residual of out's shape or None); the
    scale and zero point are read when the call runs. None where :func:`qconv_native_call` would be."""
    packed = _packed_args(call, x_zero_point, x)
    if packed is None:
        return None
    foreign, conv_args = packed
    block = np.array(conv_args, np.int64)
    act, ab, y_scale, y_zp, signed, threads, residual = requant
    depthwise = int(call[0].__name__.endswith("_depthwise"))
    args = [depthwise, block.ctypes.data, block.size, block.size - 2, out.size, act, ab.ctypes.data,
            y_scale.ctypes.data, y_zp.ctypes.data, signed, out.ctypes.data, threads,
            0 if residual is None else residual.ctypes.data]  # fmt: skip
    entry = "opstrata_qconv_quantize_packed"
    keep_alive = (keep, x_zero_point, call[2], block, ab, y_scale, y_zp, residual)
    return foreign(entry_address(_lib("qconv2d"), entry), args, keep_alive, _failure("qconv_quantize", x), out,
                   name=entry)  # fmt: skip


def qconv2d(
    x: Any,
    packed: PackedConv,
    x_zero_point: Any,
    scale: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    pads: Any = 0,
    dilation: Any = 1,
    threads: int = 1,
    path: str | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """float32 ``conv(x - x_zero_point, w - w_zp) * scale + bias`` for x (N, C, H, W) int8/uint8 (NCHW
    out); ``pads`` ONNX-style ``[top, left, bottom, right]`` (or one int). Exact int32 accumulation."""
    op = "qconv2d"
    _lib(op)  # NativeUnavailableError before any work
    x = np.ascontiguousarray(x)
    if x.dtype not in (_U8, _S8) or x.ndim != 4 or x.shape[1] != packed.cg * packed.groups:
        raise QuantError(op, f"x must be (N, {packed.cg * packed.groups}, H, W) int8/uint8, got {x.dtype}{list(x.shape)}",
                         "pass the activation the weight was packed for")  # fmt: skip
    zx = np.asarray(0 if x_zero_point is None else x_zero_point)
    if zx.size != 1:
        raise QuantError(op, f"x_zero_point must be one value (per tensor), got shape {zx.shape}")
    sc = np.ascontiguousarray(np.asarray(scale, _F32).reshape(-1))
    if sc.size not in (1, packed.oc):
        raise QuantError(op, f"scale must be a scalar or one per output channel ({packed.oc}), got {sc.size}")
    bi = None if bias is None else np.ascontiguousarray(np.asarray(bias, _F32).reshape(-1))
    if bi is not None and bi.size != packed.oc:
        raise QuantError(op, f"bias must have one value per output channel ({packed.oc}), got {bi.size}")
    geometry = conv_geometry(x.shape, packed, stride, pads, dilation)
    shape = (x.shape[0], packed.oc, *geometry[3])
    if out is not None and not (
        isinstance(out, np.ndarray) and out.shape == shape and out.dtype == _F32 and out.flags.c_contiguous
        and out.flags.writeable
    ):  # fmt: skip
        raise QuantError(
            op, f"out must be a writeable C-contiguous float32 array of shape {shape}", "pass one"
        )
    return run_qconv2d(x, packed, int(zx.reshape(())), sc, bi, geometry, threads, path, out)
