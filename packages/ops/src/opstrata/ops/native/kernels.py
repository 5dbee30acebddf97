"""cpu kernels backed by the native library (:mod:`._native`): GELU, bias + activation, layer norm, RMS norm,
softmax, convolution (depthwise in C; the rest as a GEMM over columns made in C), max pooling. Layer norm and RMS norm carry ``ops.bind`` binders (the C call with its
pointers resolved once).

Registered on ``cpu`` above the numpy kernels (priority 1) for float32 only. Each takes the cases the C
loops cover -- C-contiguous float32 rows, a bias / weight of one row; an ``out`` the loop cannot write
in place (strided, partly overlapping) receives a copy -- and hands the rest (other activations, a
residual, strided views, broadcasting) to the numpy kernel of the same device, counting both paths in
:func:`opstrata.ops.native_status`.
"""

from __future__ import annotations

import math
import threading
import weakref
from functools import partial
from typing import Any

import numpy as np

from .._registry import register
from ..kernels.activation import _check_approximate, gelu_cpu, relu_cpu
from ..kernels.conv import _arr, _check_conv, bind_conv2d, conv2d_cpu
from ..kernels.elementwise import add_cpu, div_cpu, mul_cpu, nd, sub_cpu
from ..kernels.fused import bias_act_cpu
from ..kernels.matmul import (
    _bind_linear as _bind_linear_numpy,
    _bind_matmul as _bind_matmul_numpy,
    linear_cpu,
    matmul_cpu,
)
from ..kernels.normalization import _trailing, layer_norm_cpu, rms_norm_cpu
from ..kernels.pool import _check_pool, avg_pool2d_cpu, max_pool2d_cpu
from ..kernels.reduce import bind_mean as _bind_mean_numpy, mean_cpu, normalize_axes
from ..kernels.rotary import rope_rotate_half_cpu
from ..kernels.softmax import softmax_cpu
from . import library as _native
from .blas import gemm_call, linear_call
from .library import count, library, native_threads
from .packed import BoundSteps, NativeCall

_F32 = np.dtype(np.float32)


def _rows_f32(a: np.ndarray) -> bool:
    return a.dtype == _F32 and a.flags.c_contiguous and a.ndim >= 1


def _row_vector(v: Any, n: int, *, broadcast: bool = False) -> np.ndarray | bool | None:
    """``v`` as n contiguous float32 values (None stays None); False when the C loop cannot take it.

    ``broadcast``: v broadcasts against rows of n (its last dim must then be n, e.g. ``(1, n)``).
    """
    if v is None:
        return None
    v = nd(v)
    if v.dtype != _F32 or v.size != n or not v.flags.c_contiguous or (broadcast and v.shape[-1:] != (n,)):
        return False
    return v


def _writable_out(out: np.ndarray | None, x: np.ndarray) -> bool:
    """out is None, or a C-contiguous float32 array of x's shape that is x itself or disjoint from it."""
    if out is None:
        return True
    if out.dtype != _F32 or out.shape != x.shape or not out.flags.c_contiguous or not out.flags.writeable:
        return False
    return out.ctypes.data == x.ctypes.data or not np.may_share_memory(out, x)  # bounds only: cheap


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _target(out: np.ndarray | None, x: np.ndarray) -> np.ndarray:
    """Where the C loop writes: ``out`` when it can take it, else a fresh buffer (copied into out after)."""
    return out if out is not None and _writable_out(out, x) else np.empty(x.shape, _F32)


def _deliver(dst: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """The result: dst itself, or copied into a caller's ``out`` the C loop could not write directly
    (strided, or overlapping x partially), so either way ``out`` holds the native result."""
    if out is None or dst is out:
        return dst
    np.copyto(out, dst, casting="unsafe")
    return out


#: the C library's activation codes: exact GELU (Eigen's rational erf), tanh GELU and SiLU (a vector exp)
ACT_CODES = {"gelu": 0, "gelu_tanh": 1, "relu": 2, "silu": 3}


def _bias_act(lib: Any, act: str, x: np.ndarray, bias: np.ndarray | None, dst: np.ndarray, cols: int) -> None:
    rc = lib.opstrata_bias_act_f32(
        x.ctypes.data, _ptr(bias), dst.ctypes.data, x.size // cols, cols, ACT_CODES[act]
    )
    if rc != 0:  # the bindings and the library disagree: a stale or foreign build
        raise RuntimeError(
            f"native bias_act: the library at {_native.native_status().library} rejected act={act!r}"
        )


@register("gelu", device="cpu", dtypes=[np.float32], priority=1)
def gelu_native(x: Any, *, approximate: str = "none") -> np.ndarray:
    """GELU (exact or tanh form) in one C loop, ~1e-6 absolute."""
    _check_approximate(approximate)
    x = nd(x)
    lib = library() if _rows_f32(x) and x.size else None
    if lib is None:
        count("gelu", "numpy")
        return gelu_cpu(x, approximate=approximate)
    out = np.empty(x.shape, _F32)
    _bias_act(lib, "gelu_tanh" if approximate == "tanh" else "gelu", x, None, out, x.size)
    count("gelu", "native")
    return out


@register("bias_act", device="cpu", dtypes=[np.float32], priority=1)
def bias_act_native(
    x: Any, bias: Any = None, residual: Any = None, *, act: str = "gelu", out: np.ndarray | None = None
) -> np.ndarray:
    """``act(x + bias)`` over rows in one C loop (in place when ``out`` is x: the GEMM epilogue)."""
    x = nd(x)
    cols = x.shape[-1] if x.ndim else 1
    b = _row_vector(bias, cols, broadcast=True) if x.ndim else False
    fits = act in ACT_CODES and residual is None and _rows_f32(x) and x.size and b is not False
    lib = library() if fits else None
    if lib is None:
        count("bias_act", "numpy")
        return bias_act_cpu(x, bias, residual, act=act, out=out)
    dst = _target(out, x)
    _bias_act(lib, act, x, b, dst, cols)  # type: ignore[arg-type]
    count("bias_act", "native")
    return _deliver(dst, out)


def _bind_bias_act(
    x: Any, bias: Any = None, residual: Any = None, *, act: str = "gelu", out: Any = None
) -> Any:
    """``bias_act_native(..., out=out)`` with its checks done once: the C loop (see ops.bind)."""
    if (
        type(x) is not np.ndarray
        or type(out) is not np.ndarray
        or residual is not None
        or act not in ACT_CODES
    ):
        return None
    cols = x.shape[-1] if x.ndim else 1
    b = _row_vector(bias, cols, broadcast=True) if x.ndim else False
    if not (_rows_f32(x) and x.size and b is not False and _writable_out(out, x) and out.flags.c_contiguous):
        return None
    lib = library()
    if lib is None:
        return None
    args = (x.ctypes.data, _ptr(b), out.ctypes.data, x.size // cols, cols, ACT_CODES[act])  # type: ignore[arg-type]
    return NativeCall(
        lib,
        "opstrata_bias_act_f32",
        args,
        (x, b, out),
        lambda rc: RuntimeError(
            f"native bias_act: the library at {_native.native_status().library} rejected act={act!r}"
        ),
    )


bias_act_native.binder = _bind_bias_act  # type: ignore[attr-defined]


@register("layer_norm", device="cpu", dtypes=[np.float32], priority=1)
def layer_norm_native(
    x: Any,
    weight: Any = None,
    bias: Any = None,
    *,
    axis: int = -1,
    eps: float = 1e-5,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Layer norm over the trailing dims in one C routine per row set (two-pass variance, float32)."""
    xa, a, (w, b) = _trailing("layer_norm", x, axis, {"weight": weight, "bias": bias})
    n = math.prod(xa.shape[a:])
    wv, bv = _row_vector(w, n), _row_vector(b, n)
    fits = _rows_f32(xa) and xa.size and wv is not False and bv is not False
    lib = library() if fits else None
    if lib is None:
        count("layer_norm", "numpy")
        return layer_norm_cpu(x, weight, bias, axis=axis, eps=eps, out=out)
    dst = _target(out, xa)
    rows, fn = xa.size // n, lib.opstrata_layer_norm_f32
    fn(xa.ctypes.data, _ptr(wv), _ptr(bv), dst.ctypes.data, rows, n, float(eps))  # type: ignore[arg-type]
    count("layer_norm", "native")
    return _deliver(dst, out)


def _bind_layer_norm(
    x: Any, weight: Any = None, bias: Any = None, *, axis: int = -1, eps: float = 1e-5, out: Any = None
) -> Any:
    """``layer_norm_native(..., out=out)`` with its checks done once: the C call (see ops.bind)."""
    bound = _norm_args("layer_norm", x, {"weight": weight, "bias": bias}, axis, out)
    if bound is None:
        return None
    lib, xa, n, (wv, bv) = bound
    args = (xa.ctypes.data, _ptr(wv), _ptr(bv), out.ctypes.data, xa.size // n, n, float(eps))
    return NativeCall(lib, "opstrata_layer_norm_f32", args, (xa, wv, bv, out))


def _norm_args(op: str, x: Any, params: dict[str, Any], axis: int, out: Any) -> Any:
    """(library, x, row length, parameter rows) when the C loop can write ``out`` directly; else None."""
    if type(x) is not np.ndarray or type(out) is not np.ndarray:
        return None
    try:
        xa, a, vals = _trailing(op, x, axis, params)
    except Exception:
        return None  # the kernel's own call raises it where it is made
    n = math.prod(xa.shape[a:])
    rows = [_row_vector(v, n) for v in vals]
    if not (_rows_f32(xa) and xa.size and all(r is not False for r in rows)):
        return None
    if out.shape != xa.shape or out.dtype != _F32 or not out.flags.c_contiguous or not out.flags.writeable:
        return None
    if out.ctypes.data != xa.ctypes.data and np.may_share_memory(out, xa):
        return None
    lib = library()
    return None if lib is None else (lib, xa, n, rows)


layer_norm_native.binder = _bind_layer_norm  # type: ignore[attr-defined]


@register("rms_norm", device="cpu", dtypes=[np.float32], priority=1)
def rms_norm_native(
    x: Any, weight: Any = None, *, axis: int = -1, eps: float = 1e-6, out: np.ndarray | None = None
) -> np.ndarray:
    """RMS norm over the trailing dims in one C loop per row (mean of squares accumulated in double)."""
    xa, a, (w,) = _trailing("rms_norm", x, axis, {"weight": weight})
    n = math.prod(xa.shape[a:])
    wv = _row_vector(w, n)
    lib = library() if _rows_f32(xa) and xa.size and wv is not False else None
    if lib is None:
        count("rms_norm", "numpy")
        y = rms_norm_cpu(x, weight, axis=axis, eps=eps)
        return y if out is None else _deliver(y, out)
    dst = _target(out, xa)
    lib.opstrata_rms_norm_f32(xa.ctypes.data, _ptr(wv), dst.ctypes.data, xa.size // n, n, float(eps))
    count("rms_norm", "native")
    return _deliver(dst, out)


def _bind_rms_norm(x: Any, weight: Any = None, *, axis: int = -1, eps: float = 1e-6, out: Any = None) -> Any:
    """``rms_norm_native(..., out=out)`` with its checks done once: the C call (see ops.bind)."""
    bound = _norm_args("rms_norm", x, {"weight": weight}, axis, out)
    if bound is None:
        return None
    lib, xa, n, (wv,) = bound
    args = (xa.ctypes.data, _ptr(wv), out.ctypes.data, xa.size // n, n, float(eps))
    return NativeCall(lib, "opstrata_rms_norm_f32", args, (xa, wv, out))


rms_norm_native.binder = _bind_rms_norm  # type: ignore[attr-defined]


def _rope_args(x: Any, cos: Any, sin: Any, out: Any) -> Any:
    """(library, C arguments, arrays to keep) for ``rope_rotate_half`` into ``out``; None when the C loop
    does not take these arrays (not float32, x / out not C-contiguous, more than four row dims, a
    cos / sin column stride other than 0 / 1, out overlapping x)."""
    arrays = (x, cos, sin, out)
    if not all(type(t) is np.ndarray and t.dtype == _F32 for t in arrays) or x.ndim < 1 or x.size == 0:
        return None
    if x.shape[-1] % 2 or out.shape != x.shape or not (_rows_f32(x) and out.flags.c_contiguous):
        return None
    if not out.flags.writeable or np.may_share_memory(out, x):
        return None
    try:
        cb, sb = np.broadcast_to(cos, x.shape), np.broadcast_to(sin, x.shape)
    except ValueError:
        return None
    lead = [i for i, n in enumerate(x.shape[:-1]) if n != 1]
    if len(lead) > 4:
        return None
    col = [t.strides[-1] // 4 if x.shape[-1] > 1 else 1 for t in (cb, sb)]
    if any(c not in (0, 1) for c in col) or any(st % 4 for t in (cb, sb) for st in t.strides):
        return None
    lib = library()
    if lib is None:
        return None
    pad = [0] * (4 - len(lead))
    rdims = np.array([1] * (4 - len(lead)) + [x.shape[i] for i in lead], np.int64)
    c_rs = np.array(pad + [cb.strides[i] // 4 for i in lead], np.int64)
    s_rs = np.array(pad + [sb.strides[i] // 4 for i in lead], np.int64)
    args = (x.ctypes.data, cb.ctypes.data, sb.ctypes.data, out.ctypes.data, rdims.ctypes.data, c_rs.ctypes.data,
            s_rs.ctypes.data, col[0], col[1], x.shape[-1])  # fmt: skip
    return lib, args, (arrays, cb, sb, rdims, c_rs, s_rs)


@register("rope_rotate_half", device="cpu", dtypes=[np.float32], priority=1)
def rope_rotate_half_native(x: Any, cos: Any, sin: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    """Rotate-half RoPE in one C loop over rows (the same roundings as the numpy kernel: same bits)."""
    xa, ca, sa = nd(x), nd(cos), nd(sin)
    dst = np.empty(xa.shape, _F32) if out is None or not out.flags.c_contiguous else out
    got = _rope_args(xa, ca, sa, dst)
    if got is None:
        count("rope_rotate_half", "numpy")
        return rope_rotate_half_cpu(x, cos, sin, out=out)
    lib, args, _keep = got
    lib.opstrata_rope_half_f32(*args)
    count("rope_rotate_half", "native")
    return _deliver(dst, out)


def _bind_rope(x: Any, cos: Any, sin: Any, *, out: Any) -> Any:
    """``rope_rotate_half_native(x, cos, sin, out=out)`` with its checks done once (see ops.bind)."""
    got = _rope_args(x, cos, sin, out)
    if got is None:
        return None
    lib, args, keep = got
    return NativeCall(lib, "opstrata_rope_half_f32", args, keep)


rope_rotate_half_native.binder = _bind_rope  # type: ignore[attr-defined]


def _bind_softmax_native(x: Any, *, axis: int = -1, out: Any) -> Any:
    """``softmax_native(x, axis)`` into ``out`` as one packed call of the same C row loop (same bits), for a
    C-contiguous float32 ``x`` over its last axis; None otherwise (the kernel keeps its numpy path)."""
    if type(x) is not np.ndarray or type(out) is not np.ndarray or not x.ndim or axis not in (-1, x.ndim - 1):
        return None
    if not (
        _rows_f32(x) and x.size and out.shape == x.shape and out.dtype == _F32 and out.flags.c_contiguous
    ):
        return None
    lib = library()
    if (
        lib is None
        or not out.flags.writeable
        or (np.may_share_memory(out, x) and out.ctypes.data != x.ctypes.data)
    ):
        return None
    n = x.shape[-1]
    return NativeCall(
        lib, "opstrata_softmax_rows_f32", (x.ctypes.data, out.ctypes.data, None, x.size // n, n), (x, out)
    )


@register("softmax", device="cpu", dtypes=[np.float32], priority=1)
def softmax_native(x: Any, *, axis: int = -1) -> np.ndarray:
    """Softmax over the last axis of a C-contiguous float32 array in one C loop per row (vector exp)."""
    x = nd(x)
    last = x.ndim and axis in (-1, x.ndim - 1)
    lib = library() if last and _rows_f32(x) and x.size else None
    if lib is None:
        count("softmax", "numpy")
        return softmax_cpu(x, axis=axis)
    out = np.empty(x.shape, _F32)
    lib.opstrata_softmax_rows_f32(x.ctypes.data, out.ctypes.data, None, x.size // x.shape[-1], x.shape[-1])
    count("softmax", "native")
    return out


softmax_native.binder = _bind_softmax_native  # type: ignore[attr-defined]


def softmax_rows_inplace(sc: np.ndarray, lse: np.ndarray) -> bool:
    """Softmax every row of a C-contiguous float32 ``sc`` in place and write each row's logsumexp into
    ``lse`` (C-contiguous float32, one per row); False (nothing done) when the library is unavailable."""
    lib = library()
    if lib is None or not (_rows_f32(sc) and lse.dtype == _F32 and lse.flags.c_contiguous):
        count("attention", "numpy")
        return False
    n = sc.shape[-1]
    lib.opstrata_softmax_rows_f32(sc.ctypes.data, sc.ctypes.data, lse.ctypes.data, sc.size // n, n)
    count("attention", "native")
    return True


def _im2col_args(x: np.ndarray, cols: np.ndarray, g: Any, kh: int, kw: int) -> tuple[int, ...]:
    n, c, h, wd = x.shape
    (sh, sw), (dh, dw), (ho, wo) = g.stride, g.dilation, g.out_hw
    return (
        x.ctypes.data, cols.ctypes.data, n, c, h, wd, kh, kw, sh, sw, dh, dw, g.pads[0], g.pads[1], ho, wo,
        native_threads(),
    )  # fmt: skip


def _plain_1x1(g: Any, kh: int, kw: int) -> bool:
    """A 1x1, stride-1, unpadded convolution: the image is its own columns (no copy to make)."""
    return (kh, kw) == (1, 1) and g.stride == (1, 1) and not any(g.pads)


def _direct_conv(g: Any, x: np.ndarray, kh: int, kw: int) -> bool:
    """``opstrata_conv_direct_f32`` runs this convolution: stride 1, output rows as wide as the input's (the
    3x3 pad-1 layers), more outputs per plane than the narrow products' limit (:data:`LANES_MAX_N`), at
    most 64 taps, and not a plain 1x1 (whose image already is its columns)."""
    ho, wo = g.out_hw
    return (
        g.stride == (1, 1)
        and wo == x.shape[3]
        and ho * wo > LANES_MAX_N
        and kh * kw <= 64
        and not _plain_1x1(g, kh, kw)
    )


def _conv_error(form: str, rc: int) -> Exception:
    """The error of a non-zero code from one of the conv entry points (``form`` names it: "direct",
    "gathered strips", "narrow GEMM"); the Python side checks what they refuse, so -3 is a bug to report."""
    if rc == -1:
        return MemoryError(f"conv2d ({form}, native): cannot allocate a thread's column panel")
    what = "a library without the AVX-512 tiles" if rc == -2 else "arguments it refused"
    return RuntimeError(
        f"conv2d ({form}, native): code {rc}, {what}; expected 0 -- rebuild the native library "
        "(opstrata.ops.native.build) or report the layer's shapes"
    )


_direct_conv_error = partial(_conv_error, "direct")
_gather_conv_error = partial(_conv_error, "gathered strips")
_lanes_error = partial(_conv_error, "narrow GEMM")


def _gather_conv(g: Any, x: np.ndarray, kh: int, kw: int) -> bool:
    """``opstrata_conv_gather_f32`` runs this convolution: more outputs per plane than the lanes kernel's
    limit, neither a direct one nor a plain 1x1 (whose image already is its columns)."""
    ho, wo = g.out_hw
    return ho * wo > LANES_MAX_N and not _direct_conv(g, x, kh, kw) and not _plain_1x1(g, kh, kw)


def _gather_conv_args(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, out: np.ndarray, g: Any, epi: Any = None
) -> tuple[Any, ...]:
    """``opstrata_conv_gather_f32`` arguments: every image and group in one call, ``epi`` a parsed
    :data:`CONV_EPILOGUES` entry (kind, constants, residual) or None."""
    n, c, h, wd = x.shape
    o, _, kh, kw = weight.shape
    kind, params, res = epi if epi is not None else (0, None, None)
    return (
        x.ctypes.data, weight.ctypes.data, _ptr(bias), out.ctypes.data, n, c, h, wd, o, g.groups, kh, kw,
        g.stride[0], g.stride[1], g.dilation[0], g.dilation[1], g.pads[0], g.pads[1], g.out_hw[0], g.out_hw[1],
        native_threads(), kind, _ptr(params), _ptr(res),
    )  # fmt: skip


def immutable(a: np.ndarray) -> bool:
    """Read-only all the way down: ``a`` and every array it views are read-only and the memory at the
    bottom is its own or a ``bytes`` object -- a weight a binder may pack once (an InferenceSession makes
    its convolution weights so); any other is packed again on every call (a weight fed as an input)."""
    v: Any = a
    while isinstance(v, np.ndarray):
        if v.flags.writeable:
            return False
        v = v.base
    return v is None or isinstance(v, bytes)


def _repack(packed: np.ndarray, pack: Any, *args: Any) -> None:
    """``packed`` refreshed from the weight as it is now (a bound call on a weight that may change)."""
    np.copyto(packed, pack(*args))


def _direct_weights(weight: np.ndarray, groups: int) -> np.ndarray:
    """The weights as ``opstrata_conv_direct_f32`` reads them: per group, the (Og, Cg * kh * kw) rows in
    panels of 4, each stored (k, 4), and the last Og % 4 rows as one (k, Og % 4) panel -- a tile's weights
    for one step of the sum lie in short runs that stream in order."""
    o = weight.shape[0]
    og = o // groups
    wg = weight.reshape(groups, og, -1)
    k, full = wg.shape[2], og - og % 4
    panels = wg[:, :full].reshape(groups, full // 4, 4, k).transpose(0, 1, 3, 2).reshape(groups, -1)
    tail = wg[:, full:].transpose(0, 2, 1).reshape(groups, -1)
    return np.ascontiguousarray(np.concatenate([panels, tail], axis=1))


def _direct_conv_args(
    x: np.ndarray, wt: np.ndarray, weight_shape: tuple[int, ...], bias: np.ndarray | None, out: np.ndarray,
    g: Any, epi: Any = None,
) -> tuple[Any, ...]:  # fmt: skip
    """``opstrata_conv_direct_f32`` arguments: every image and group in one call; ``wt`` the
    :func:`_direct_weights` of a weight of ``weight_shape``, ``epi`` a parsed :data:`CONV_EPILOGUES` entry
    (kind, constants, residual) or None."""
    n, c, h, wd = x.shape
    o, _, kh, kw = weight_shape
    kind, params, res = epi if epi is not None else (0, None, None)
    return (
        x.ctypes.data, wt.ctypes.data, _ptr(bias), out.ctypes.data, n, c, h, wd, o, g.groups, kh, kw,
        g.dilation[0], g.dilation[1], g.pads[0], g.pads[1], g.out_hw[0], native_threads(), kind, _ptr(params),
        _ptr(res),
    )  # fmt: skip


def fma_gemm_available(lib: Any) -> bool:
    """The library was built with the AVX-512 tiles of ``opstrata_sgemm_fma_f32`` (else only its
    portable loop, slower than the BLAS: the callers keep the BLAS)."""
    fast = getattr(lib, "_opstrata_fma_fast", None)
    if fast is None:
        fast = bool(lib.opstrata_sgemm_fma_fast())
        lib._opstrata_fma_fast = fast
    return fast


def _fma_conv_args(
    wm: np.ndarray, cols: np.ndarray, out4: np.ndarray, bias: np.ndarray | None, img: int
) -> tuple[Any, ...]:
    """``opstrata_sgemm_fma_f32`` arguments for image ``img``: per group, out = bias + w @ cols, on up to
    :func:`native_threads` threads."""
    groups, og, k = wm.shape
    cols_n = cols.shape[-1]
    return (
        wm.ctypes.data, cols[img].ctypes.data, out4[img].ctypes.data, _ptr(bias),
        og, cols_n, k, k, cols_n, cols_n, groups, og * k, k * cols_n, og * cols_n, og, native_threads(),
    )  # fmt: skip


#: convolution GEMMs at most this many columns wide (images of at most 16 outputs: a network's last
#: stages) run with the output rows in vector lanes (``opstrata_sgemm_lanes_f32``, weights packed once)
LANES_MAX_N = 16


def _lanes_weights(wm: np.ndarray) -> np.ndarray:
    """(G, Og, K) weights as ``opstrata_sgemm_lanes_f32`` reads them: per group, blocks of 16 rows, each
    stored (K, 16), rows past Og zero -- one weight vector per block and step of the sum."""
    groups, og, k = wm.shape
    blocks = -(-og // 16)
    padded = np.zeros((groups, blocks * 16, k), _F32)
    padded[:, :og] = wm
    return np.ascontiguousarray(padded.reshape(groups, blocks, 16, k).transpose(0, 1, 3, 2))


def _lanes_conv_args(
    packed: np.ndarray, wm_shape: tuple[int, ...], cols: np.ndarray, out4: np.ndarray, bias: np.ndarray | None,
    img: int, epi: Any = None,
) -> tuple[Any, ...]:  # fmt: skip
    """``opstrata_sgemm_lanes_f32`` arguments for image ``img`` (every group): ``packed`` the
    :func:`_lanes_weights` of weights shaped ``wm_shape`` (G, Og, K), ``epi`` a parsed
    :data:`CONV_EPILOGUES` entry or None."""
    groups, og, k = wm_shape
    cols_n = cols.shape[-1]
    kind, params, res = epi if epi is not None else (0, None, None)
    return (
        packed.ctypes.data, cols[img].ctypes.data, out4[img].ctypes.data, _ptr(bias),
        og, cols_n, k, k, cols_n, cols_n, groups, packed[0].size, k * cols_n, og * cols_n, og, native_threads(),
        kind, _ptr(params), None if res is None else res[img].ctypes.data,
    )  # fmt: skip


#: Epilogues a bound conv2d can apply as its GEMM stores each output (``ops.bind("conv2d", ...,
#: epilogue=...)``), name -> (kernel code, float constants): ``("relu",)``; ``("clip", lo, hi)`` =
#: min(max(h, lo), hi); ``("hardswish", c0, c1, c2, c3)`` = h * min(max(h * c0 + c1, c2), c3) (the
#: hard-swish exporters write); ``("add", r)`` = h + r and ``("add_relu", r)`` = relu(h + r) for a residual
#: ``r`` shaped as the output. Each is the elementwise VM's operations in its order (NaN-propagating
#: max / min, products and sums rounded apart), so the bits equal the conv followed by that epilogue.
#: (SiLU is left to the VM's pass: its exp made the tiles slower than the pass it would save.)
CONV_EPILOGUES = {
    "relu": (1, 0),
    "clip": (2, 2),
    "hardswish": (3, 4),
    "add": (4, 0),
    "add_relu": (5, 0),
}


def _epilogue_params(
    epilogue: Any, out: np.ndarray
) -> tuple[int, np.ndarray | None, np.ndarray | None] | None:
    """(kernel code, float32 constants, residual) of a :data:`CONV_EPILOGUES` entry, or None when it is not
    one (or its residual is not a float32 C-contiguous array of ``out``'s shape apart from ``out``)."""
    if not isinstance(epilogue, tuple) or not epilogue or epilogue[0] not in CONV_EPILOGUES:
        return None
    kind, n = CONV_EPILOGUES[epilogue[0]]
    rest = epilogue[1:]
    res = None
    if kind in (4, 5):
        if len(rest) != 1:
            return None
        res = rest[0]
        if (type(res) is not np.ndarray or res.dtype != _F32 or not res.flags.c_contiguous
                or res.shape != out.shape or np.may_share_memory(res, out)):  # fmt: skip
            return None
        return kind, None, res
    if len(rest) != n or not all(isinstance(c, (int, float, np.floating, np.integer)) for c in rest):
        return None
    params = np.zeros(4, _F32)
    params[:n] = np.asarray(rest, np.float64).astype(_F32)
    return kind, params if n else None, None


def _conv_columns(x: np.ndarray, g: Any, kh: int, kw: int, cg: int) -> np.ndarray | None:
    """``x`` as its own columns ``(n, G, Cg, h * w)`` for a plain 1x1 convolution, else None."""
    n = x.shape[0]
    return x.reshape(n, g.groups, cg, -1) if _plain_1x1(g, kh, kw) else None


@register("conv2d", device="cpu", dtypes=[np.float32], priority=1)
def conv2d_native(
    x: Any,
    weight: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> np.ndarray:
    """Depthwise convolution (groups == C_in == C_out: MobileNet, EfficientNet, ConvNeXt) in one C loop per
    channel plane; every other convolution as a GEMM over columns made by one C pass (padding included,
    no padded copy of the image; a plain 1x1 reads the image itself): on the library's FMA tiles with the
    bias folded in where they are built (AVX-512), else the numpy kernel's GEMM (a plain 1x1 on the
    numpy kernel itself)."""
    x, weight, b = nd(x), nd(weight), _arr(bias)
    g = _check_conv(x, weight, b, stride, padding, dilation, groups)
    n, c, h, wd = x.shape
    kh, kw = weight.shape[2:]
    depthwise = g.groups == c == weight.shape[0] and c > 1
    plain = all(a is None or (a.dtype == _F32 and a.flags.c_contiguous) for a in (x, weight, b))
    lib = library() if plain and x.size else None
    (sh, sw), (dh, dw), (ho, wo) = g.stride, g.dilation, g.out_hw
    fma = lib is not None and not depthwise and fma_gemm_available(lib)
    if lib is not None and not (depthwise or fma) and _plain_1x1(g, kh, kw):
        lib = None  # numpy's own GEMM on the image, uncounted as before
    kw_args = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    if lib is None:
        if depthwise or not _plain_1x1(g, kh, kw):
            count("conv2d", "numpy")
        return conv2d_cpu(x, weight, bias, **kw_args)
    if not depthwise and fma and _direct_conv(g, x, kh, kw):
        out = np.empty((n, weight.shape[0], ho, wo), _F32)
        wt = _direct_weights(weight, g.groups)
        rc = lib.opstrata_conv_direct_f32(*_direct_conv_args(x, wt, weight.shape, b, out, g))
        if rc != 0:
            raise _direct_conv_error(rc)
        count("conv2d", "native")
        return out
    if not depthwise and fma and _gather_conv(g, x, kh, kw):
        out = np.empty((n, weight.shape[0], ho, wo), _F32)
        rc = lib.opstrata_conv_gather_f32(*_gather_conv_args(x, weight, b, out, g))
        if rc != 0:
            raise _gather_conv_error(rc)
        count("conv2d", "native")
        return out
    if not depthwise:
        o, cg = weight.shape[:2]
        cols = _conv_columns(x, g, kh, kw, cg)
        if cols is None:
            cols = np.empty((n, g.groups, cg * kh * kw, ho * wo), _F32)
            lib.opstrata_im2col_f32(*_im2col_args(x, cols, g, kh, kw))
        wm = weight.reshape(g.groups, o // g.groups, cg * kh * kw)
        if fma:
            out = np.empty((n, o, ho, wo), _F32)
            out4 = out.reshape(n, g.groups, o // g.groups, ho * wo)
            packed = _lanes_weights(wm) if ho * wo <= LANES_MAX_N else None
            for img in range(n):
                if packed is None:
                    lib.opstrata_sgemm_fma_f32(*_fma_conv_args(wm, cols, out4, b, img))
                elif (
                    rc := lib.opstrata_sgemm_lanes_f32(
                        *_lanes_conv_args(packed, wm.shape, cols, out4, b, img)
                    )
                ) != 0:
                    raise _lanes_error(rc)
            count("conv2d", "native")
            return out
        out = np.matmul(wm, cols)  # as conv2d_cpu
        out = out.reshape(n, o, ho, wo)
        if b is not None:
            out += b[:, None, None]
        count("conv2d", "native")
        return out
    out = np.empty((n, c, ho, wo), _F32)
    dims = (n, c, h, wd, kh, kw, sh, sw, dh, dw, g.pads[0], g.pads[1], ho, wo, native_threads())
    if _depthwise_lanes(lib, wo):
        rc = lib.opstrata_depthwise_lanes_f32(
            x.ctypes.data, weight.ctypes.data, _ptr(b), out.ctypes.data, *dims, 0, None
        )
        if rc != 0:
            raise _depthwise_lanes_error(rc, h, wd)
    elif lib.opstrata_depthwise_conv2d_f32(
        x.ctypes.data, weight.ctypes.data, _ptr(b), out.ctypes.data, *dims
    ):
        raise MemoryError(
            f"conv2d (depthwise, native): cannot allocate a padded {h}x{wd} plane scratch buffer"
        )
    count("conv2d", "native")
    return out


#: depthwise planes narrower than this run with 16 channels in the lanes of an AVX-512 vector
#: (``opstrata_depthwise_lanes_f32``: EfficientNet-B0's 8x8 .. 2x2 stages 2.2-3.1x onnxruntime's time on
#: the plane loop); wider ones keep the plane loop, whose rows fill whole vectors
DEPTHWISE_LANES_MAX_WO = 16


def _depthwise_lanes(lib: Any, wo: int) -> bool:
    """Whether a depthwise convolution with ``wo`` output columns runs channels-in-lanes."""
    return wo < DEPTHWISE_LANES_MAX_WO and fma_gemm_available(lib)


def _depthwise_lanes_error(rc: int, h: int, wd: int) -> Exception:
    """The error of a failed ``opstrata_depthwise_lanes_f32`` call."""
    if rc == -1:
        return MemoryError(
            f"conv2d (depthwise, native): cannot allocate the padded scratch of a {h}x{wd} plane"
        )
    if rc == -4:
        return ValueError(
            f"conv2d (depthwise, native): a {h}x{wd} plane passes the 32-bit gather offsets of the "
            "channels-in-lanes loop; run it in pieces of fewer rows"
        )
    return ValueError(f"conv2d (depthwise, native): unknown epilogue kind (code {rc})")


def _bind_conv2d_native(
    x: Any, weight: Any, bias: Any = None, *, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
    groups: int = 1, out: Any = None, epilogue: Any = None,
) -> Any:  # fmt: skip
    """``conv2d_native(...)`` into ``out`` with its checks done once (see ops.bind): the depthwise C call,
    or the C im2col into a columns buffer kept for every call, the GEMM into ``out`` and the bias add; the
    numpy kernel's binder where the kernel delegates to it. ``epilogue`` (one of :data:`CONV_EPILOGUES`)
    is applied by the FMA GEMM, or (ReLU / clip / hard-swish) the channels-in-lanes depthwise loop, as it
    stores each output; None (decline) where neither runs."""
    kw = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    epi = None
    if epilogue is not None:
        if type(out) is not np.ndarray:
            return None
        epi = _epilogue_params(epilogue, out)
        if epi is None:
            return None
    if not all(type(t) is np.ndarray and t.dtype == _F32 and t.flags.c_contiguous for t in (x, weight, out)):
        return None
    if bias is not None and (
        type(bias) is not np.ndarray or bias.dtype != _F32 or not bias.flags.c_contiguous
    ):
        return None
    try:
        g = _check_conv(x, weight, bias, stride, padding, dilation, groups)
    except Exception:
        return None
    n, c, h, wd = x.shape
    o, cg, kh, kw_ = weight.shape
    depthwise = g.groups == c == o and c > 1
    (sh, sw), (dh, dw), (ho, wo) = g.stride, g.dilation, g.out_hw
    if out.shape != (n, o, ho, wo) or not out.flags.writeable or np.may_share_memory(out, x) or not x.size:
        return None
    lib = library()
    lanes = depthwise and lib is not None and _depthwise_lanes(lib, wo)
    if epi is not None and (
        lib is None or (depthwise and not (lanes and epi[0] <= 3)) or not fma_gemm_available(lib)
    ):
        return None  # only the FMA GEMM and the channels-in-lanes depthwise apply an epilogue (no residual)
    if lib is None:
        return bind_conv2d(x, weight, bias, out=out, **kw) if _plain_1x1(g, kh, kw_) else None
    if not depthwise and fma_gemm_available(lib) and _direct_conv(g, x, kh, kw_):
        wt = _direct_weights(weight, g.groups)  # the bound call reads this packed copy
        refs = (x, wt, bias, out) if epi is None else (x, wt, bias, out, epi[1], epi[2])
        args = _direct_conv_args(x, wt, weight.shape, bias, out, g, epi)
        call = NativeCall(lib, "opstrata_conv_direct_f32", args, refs, _direct_conv_error)
        if immutable(weight):
            return call
        return BoundSteps([partial(_repack, wt, _direct_weights, weight, g.groups), call])
    if not depthwise and fma_gemm_available(lib) and _gather_conv(g, x, kh, kw_):
        refs = (x, weight, bias, out) if epi is None else (x, weight, bias, out, epi[1], epi[2])
        args = _gather_conv_args(x, weight, bias, out, g, epi)
        return NativeCall(lib, "opstrata_conv_gather_f32", args, refs, _gather_conv_error)
    if not depthwise:
        steps: list[Any] = []
        cols = _conv_columns(x, g, kh, kw_, cg)  # a plain 1x1: the image is its own columns
        if cols is None:
            cols = np.empty((n, g.groups, cg * kh * kw_, ho * wo), _F32)
            steps.append(NativeCall(lib, "opstrata_im2col_f32", _im2col_args(x, cols, g, kh, kw_), (x, cols)))
        wm = weight.reshape(g.groups, o // g.groups, cg * kh * kw_)
        out4 = out.reshape(n, g.groups, o // g.groups, ho * wo)
        if fma_gemm_available(lib) and ho * wo <= LANES_MAX_N:  # as conv2d_native: rows in lanes
            packed = _lanes_weights(wm)  # the bound calls read this packed copy
            if not immutable(weight):
                steps.append(partial(_repack, packed, _lanes_weights, wm))
            for img in range(n):
                args = _lanes_conv_args(packed, wm.shape, cols, out4, bias, img, epi)
                refs = (
                    (packed, cols, out4, bias) if epi is None else (packed, cols, out4, bias, epi[1], epi[2])
                )
                steps.append(NativeCall(lib, "opstrata_sgemm_lanes_f32", args, refs, _lanes_error))
            return BoundSteps(steps)
        if fma_gemm_available(lib):  # as conv2d_native: the FMA tiles with the bias folded in
            for img in range(n):
                args = _fma_conv_args(wm, cols, out4, bias, img)
                if epi is None:
                    steps.append(NativeCall(lib, "opstrata_sgemm_fma_f32", args, (wm, cols, out4, bias)))
                else:
                    refs = (wm, cols, out4, bias, epi[1], epi[2])
                    args = (*args, epi[0], _ptr(epi[1]), None if epi[2] is None else epi[2][img].ctypes.data)
                    steps.append(NativeCall(lib, "opstrata_sgemm_fma_epi_f32", args, refs))
            return BoundSteps(steps)
        steps.append(gemm_call(lib, wm, cols, out4) or partial(np.matmul, wm, cols, out=out4))
        if bias is not None:  # out += bias[:, None, None], one float add per element as numpy does
            args = (out.ctypes.data, bias.ctypes.data, o, ho * wo, n)
            steps.append(NativeCall(lib, "row_bias_add", args, (out, bias)))
        return BoundSteps(steps)
    args = (x.ctypes.data, weight.ctypes.data, _ptr(bias), out.ctypes.data,
            n, c, h, wd, kh, kw_, sh, sw, dh, dw, g.pads[0], g.pads[1], ho, wo, native_threads())  # fmt: skip
    if lanes:
        kind, params = (0, None) if epi is None else (epi[0], epi[1])
        refs = (x, weight, bias, out) if params is None else (x, weight, bias, out, params)
        return NativeCall(
            lib,
            "opstrata_depthwise_lanes_f32",
            (*args, kind, _ptr(params)),
            refs,
            lambda rc: _depthwise_lanes_error(rc, h, wd),
        )
    return NativeCall(
        lib,
        "opstrata_depthwise_conv2d_f32",
        args,
        (x, weight, bias, out),
        lambda rc: MemoryError(
            f"conv2d (depthwise, native): cannot allocate a padded {h}x{wd} plane scratch buffer"
        ),
    )


conv2d_native.binder = _bind_conv2d_native  # type: ignore[attr-defined]


@register("max_pool2d", device="cpu", dtypes=[np.float32], priority=1)
def max_pool2d_native(
    x: Any,
    *,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> np.ndarray:
    """2-D max pooling of C-contiguous float32 NCHW images in one C loop (no padded copy, no pass per tap);
    anything else on the numpy kernel."""
    x = nd(x)
    kw = {"kernel_size": kernel_size, "stride": stride, "padding": padding, "dilation": dilation,
          "ceil_mode": ceil_mode}  # fmt: skip
    lib = library() if x.dtype == _F32 and x.ndim == 4 and x.flags.c_contiguous and x.size else None
    if lib is None:
        count("max_pool2d", "numpy")
        return max_pool2d_cpu(x, **kw)
    g = _check_pool("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode)
    out = np.empty((*x.shape[:2], *g.out_hw), _F32)
    if lib.opstrata_max_pool2d_f32(*_pool_args(x, out, g)) != 0:
        raise MemoryError(
            f"max_pool2d (native): cannot allocate the pass buffers for a {x.shape[2]}x{x.shape[3]} plane"
        )
    count("max_pool2d", "native")
    return out


def _pool_args(x: np.ndarray, out: np.ndarray, g: Any) -> tuple[int, ...]:
    n, c, h, wd = x.shape
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = g.kernel, g.stride, g.dilation, g.out_hw
    return (
        x.ctypes.data, out.ctypes.data, n, c, h, wd, kh, kw, sh, sw, dh, dw, g.pads[0], g.pads[1], ho, wo,
        native_threads(),
    )  # fmt: skip


def _bind_max_pool2d_native(
    x: Any, *, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
    ceil_mode: bool = False, out: Any = None,
) -> Any:  # fmt: skip
    """``max_pool2d_native(...)`` into ``out`` (see ops.bind): the C call with its pointers resolved once."""
    if not all(type(t) is np.ndarray and t.dtype == _F32 and t.flags.c_contiguous for t in (x, out)):
        return None
    if x.ndim != 4 or not x.size or not out.flags.writeable or np.may_share_memory(x, out):
        return None
    try:
        g = _check_pool("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode)
    except Exception:
        return None
    lib = library()
    if lib is None or out.shape != (*x.shape[:2], *g.out_hw):
        return None
    return NativeCall(
        lib,
        "opstrata_max_pool2d_f32",
        _pool_args(x, out, g),
        (x, out),
        lambda rc: MemoryError(
            f"max_pool2d (native): cannot allocate the pass buffers for a {x.shape[2]}x{x.shape[3]} plane"
        ),
    )


max_pool2d_native.binder = _bind_max_pool2d_native  # type: ignore[attr-defined]


def _avg_geometry(x: Any, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool) -> Any:
    """The pooling geometry when the C loop takes it -- a C-contiguous float32 NCHW image and windows
    that never reach past it (no padding, no ceil_mode overflow): every divisor is kh * kw -- else None."""
    if type(x) is not np.ndarray or x.dtype != _F32 or x.ndim != 4 or not x.flags.c_contiguous or not x.size:
        return None
    g = _check_pool("avg_pool2d", x, kernel_size, stride, padding, 1, ceil_mode)
    return None if any(g.pads) or any(g.extra) else g


def _avg_args(x: np.ndarray, out: np.ndarray, g: Any) -> tuple[int, ...]:
    n, c, h, wd = x.shape
    (kh, kw), (sh, sw), (ho, wo) = g.kernel, g.stride, g.out_hw
    return (x.ctypes.data, out.ctypes.data, n, c, h, wd, kh, kw, sh, sw, ho, wo, native_threads())


@register("avg_pool2d", device="cpu", dtypes=[np.float32], priority=1)
def avg_pool2d_native(
    x: Any,
    *,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> np.ndarray:
    """2-D average pooling of C-contiguous float32 NCHW images in one C loop when no window reaches
    outside the image (DenseNet's 2x2 transitions); padded or ceil-mode windows on the numpy kernel.
    Same bits as the numpy kernel (taps summed in the same order, then one division)."""
    x = nd(x)
    kw = {"kernel_size": kernel_size, "stride": stride, "padding": padding, "ceil_mode": ceil_mode,
          "count_include_pad": count_include_pad}  # fmt: skip
    g = _avg_geometry(x, kernel_size, stride, padding, ceil_mode)
    lib = library() if g is not None else None
    if lib is None:
        count("avg_pool2d", "numpy")
        return avg_pool2d_cpu(x, **kw)
    out = np.empty((*x.shape[:2], *g.out_hw), _F32)
    lib.opstrata_avg_pool2d_f32(*_avg_args(x, out, g))
    count("avg_pool2d", "native")
    return out


def _bind_avg_pool2d_native(
    x: Any, *, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
    count_include_pad: bool = True, out: Any = None,
) -> Any:  # fmt: skip
    """``avg_pool2d_native(...)`` into ``out`` (see ops.bind): the C call with its pointers resolved once."""
    try:
        g = _avg_geometry(x, kernel_size, stride, padding, ceil_mode)
    except Exception:
        return None
    if g is None or type(out) is not np.ndarray or out.dtype != _F32 or not out.flags.c_contiguous:
        return None
    if not out.flags.writeable or np.may_share_memory(x, out) or out.shape != (*x.shape[:2], *g.out_hw):
        return None
    lib = library()
    if lib is None:
        return None
    return NativeCall(lib, "opstrata_avg_pool2d_f32", _avg_args(x, out, g), (x, out), result=out)


avg_pool2d_native.binder = _bind_avg_pool2d_native  # type: ignore[attr-defined]


def _bind_matmul_native(a: Any, b: Any, *, out: Any) -> Any:
    """The numpy matmul binder's BLAS call made from C (numpy's own sgemm with numpy's arguments: the same
    bits) so that it joins a native batch; the numpy binder's partial where it cannot."""
    stacked = _stacked_gemm(a, b, out)
    if stacked is not None:
        return stacked
    numpy_call = _bind_matmul_numpy(a, b, out=out)
    lib = library() if numpy_call is not None and a.dtype == _F32 else None
    if lib is None:
        return numpy_call
    a2, out2 = numpy_call.args[0], numpy_call.keywords["out"]
    if b.ndim == 2 and not b.flags.c_contiguous and b.T.flags.c_contiguous:  # a transposed weight (tied)
        return linear_call(lib, a2, b.T, out2) or numpy_call
    return gemm_call(lib, a2, b, out2) or numpy_call


def _stacked_gemm(a: Any, b: Any, out: Any) -> Any:
    """``(..., M, K) @ (..., K, N)`` with the same leading dims on both (attention's (B, H) stacks of
    scores and context) as numpy's own sgemm per (M, N) slice from C (the same calls, the same bits),
    joining a native batch; None for anything else."""
    arrays = (a, b, out)
    if not all(type(t) is np.ndarray and t.dtype == _F32 and t.flags.c_contiguous for t in arrays):
        return None
    if (
        a.ndim < 4
        or b.ndim != a.ndim
        or out.ndim != a.ndim
        or not (a.shape[:-2] == b.shape[:-2] == out.shape[:-2])
    ):
        return None
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if b.shape[-2] != k or out.shape[-2:] != (m, n):
        return None
    lib = library()
    if lib is None:
        return None
    return gemm_call(lib, a.reshape(-1, m, k), b.reshape(-1, k, n), out.reshape(-1, m, n))


def _linear_strips(n: int) -> list[tuple[int, int]]:
    """(first column, width) of each strip of an n-column product, as the native strip GEMM cuts them (32
    wide; a remainder of 1 to 16 columns joins the last strip)."""
    strips = (n + 31) // 32
    if n > 32 and 1 <= n % 32 <= 16:
        strips -= 1
    return [(32 * s, 32 if s < strips - 1 else n - 32 * s) for s in range(strips)]


def _linear_weights(weight: np.ndarray) -> np.ndarray:
    """A (n, k) linear weight as ``opstrata_linear_packed_f32`` reads it: W^T's strips one after another,
    each a contiguous (k, width) panel."""
    n, k = weight.shape
    packed = np.empty(n * k, _F32)
    for j, w in _linear_strips(n):
        packed[j * k : (j + w) * k] = weight[j : j + w].T.ravel()
    return packed


#: a read-only linear weight runs the strip tiles over its packed copy (``opstrata_linear_packed_f32``)
#: where that beat numpy's BLAS (OpenBLAS, plain or transposed B) here, one thread: up to this many rows
#: (at 512 rows the BLAS's cache blocking wins, 1.1x) and weights of at least this many values (a 128x128
#: weight for 32 rows: 10.5 vs 6.8 us). 64x512x2048: 0.84 vs 0.99 ms; 197x768x768 1.50 vs 1.62 ms;
#: 8x768x768 84 vs 190 us.
LINEAR_PACKED_MAX_ROWS = 256
LINEAR_PACKED_MIN_WEIGHT = 32768

#: packed copies by weight identity (a session binds a layer once per input shape): entries leave with
#: their weight
_linear_packs: dict[int, tuple[Any, np.ndarray]] = {}
_linear_packs_lock = threading.Lock()


def _packed_linear_weight(weight: np.ndarray) -> np.ndarray:
    """:func:`_linear_weights` of a read-only ``weight``, made once while the weight lives."""
    key = id(weight)
    with _linear_packs_lock:
        hit = _linear_packs.get(key)
        if hit is not None and hit[0]() is weight:
            return hit[1]
    packed = _linear_weights(weight)
    packed.flags.writeable = False
    ref = weakref.ref(weight, lambda _r, key=key: _linear_packs.pop(key, None))
    with _linear_packs_lock:
        _linear_packs[key] = (ref, packed)
    return packed


def _linear_packed_call(lib: Any, x2: np.ndarray, weight: np.ndarray, out2: np.ndarray) -> Any:
    """The strip tiles' call for ``out2 = x2 @ weight.T`` over the weight's packed copy, or None where the
    BLAS runs instead (a writeable weight, no AVX-512 tiles, shapes where the BLAS is faster)."""
    if not (x2.flags.c_contiguous and out2.flags.c_contiguous and weight.ndim == 2 and immutable(weight)):
        return None
    (m, k), n = x2.shape, weight.shape[0]
    if not (1 <= m <= LINEAR_PACKED_MAX_ROWS and n * k >= LINEAR_PACKED_MIN_WEIGHT) or not fma_gemm_available(
        lib
    ):
        return None
    if np.may_share_memory(out2, x2):
        return None
    packed = _packed_linear_weight(weight)
    return NativeCall(
        lib,
        "opstrata_linear_packed_f32",
        (x2.ctypes.data, packed.ctypes.data, out2.ctypes.data, m, n, k, k, n, native_threads()),
        (x2, packed, out2, weight),
        lambda rc: RuntimeError(
            f"linear (native, packed weight {n}x{k}): the library refused it (code {rc})"
        ),
    )


def _bind_linear_native(x: Any, weight: Any, bias: Any = None, *, out: Any) -> Any:
    """The numpy linear binder's GEMM and bias add made from C, joining a batch: the strip tiles over a
    read-only weight's packed copy where they beat the BLAS, else numpy's own sgemm (the same bits)."""
    numpy_call = _bind_linear_numpy(x, weight, bias, out=out)
    lib = library() if numpy_call is not None and x.dtype == _F32 else None
    if lib is None:
        return numpy_call
    x2 = x.reshape(-1, x.shape[-1])
    out2 = out.reshape(-1, weight.shape[0])
    packed_gemm = _linear_packed_call(lib, x2, weight, out2)
    if packed_gemm is not None:
        gemm = packed_gemm
    elif weight.flags.c_contiguous:  # (out, in): numpy's sgemm with B transposed
        gemm = linear_call(lib, x2, weight, out2)
    else:  # a transposed (in, out) array: numpy's plain sgemm on it
        gemm = gemm_call(lib, x2, weight.T, out2) if weight.T.flags.c_contiguous else None
    if gemm is None:
        return numpy_call
    if bias is None:
        return gemm
    if not bias.flags.c_contiguous:
        return numpy_call
    add = NativeCall(lib, "col_bias_add", (out2.ctypes.data, bias.ctypes.data, *out2.shape), (out2, bias))
    return BoundSteps([gemm, add])


def _per_row(small: np.ndarray, full: np.ndarray) -> tuple[int, int] | None:
    """(rows, cols) when ``small`` holds one value per row of ``full`` read as (rows, cols): its leading
    dims equal ``full``'s and the rest are 1 (a per-channel (N, C, 1, 1) against (N, C, H, W)); else None."""
    if small.ndim != full.ndim or small.size == full.size:
        return None
    k = small.ndim
    while k > 0 and small.shape[k - 1] == 1:
        k -= 1
    if small.shape[:k] != full.shape[:k]:
        return None
    rows = int(np.prod(full.shape[:k], dtype=np.int64))
    return rows, full.size // max(rows, 1)


def _binary_binder(kernel: Any, code: int) -> Any:
    """A binder for a cpu binary kernel (add / sub / mul / div): equal-shape C-contiguous float32 operands
    as one packed C loop (one rounding per element, as numpy's ufunc: the same bits; ``out`` may be an
    operand itself), and so one operand holding one value per row of the other (a per-channel scale:
    squeeze-excitation's gate); anything else the kernel bound with its arguments."""

    def bind(a: Any, b: Any, *, out: Any) -> Any:
        arrays = (a, b, out)
        plain = all(type(t) is np.ndarray and t.dtype == _F32 and t.flags.c_contiguous for t in arrays)
        lib = library() if plain and out.flags.writeable else None
        if lib is not None and a.shape == b.shape == out.shape:
            if all(not np.may_share_memory(out, t) or t.ctypes.data == out.ctypes.data for t in (a, b)):
                args = (a.ctypes.data, b.ctypes.data, out.ctypes.data, out.size, code)
                return NativeCall(lib, "binary_f32", args, (a, b, out))
        elif lib is not None and out.size:
            for small, full, row_is_x in ((a, b, 1), (b, a, 0)):
                split = _per_row(small, full) if full.shape == out.shape else None
                if split is None or np.may_share_memory(out, small):
                    continue
                if np.may_share_memory(out, full) and full.ctypes.data != out.ctypes.data:
                    continue
                args = (a.ctypes.data, b.ctypes.data, out.ctypes.data, *split, code, row_is_x)
                return NativeCall(lib, "row_binary_f32", args, (a, b, out))
        return partial(kernel, a, b, out=out)

    return bind


def _bind_relu(x: Any, *, out: Any) -> Any:
    """``relu`` into ``out`` for equal-shape C-contiguous float32 arrays (``out`` may be ``x``) as one packed C
    loop with ``np.maximum(x, 0)``'s bits (NaN kept, -0 to +0); None otherwise (the numpy kernel, per call)."""
    arrays = (x, out)
    if not all(type(t) is np.ndarray and t.dtype == _F32 and t.flags.c_contiguous for t in arrays):
        return None
    if x.shape != out.shape or not out.flags.writeable or x.size == 0:
        return None
    if np.may_share_memory(out, x) and x.ctypes.data != out.ctypes.data:
        return None
    lib = library()
    if lib is None:
        return None
    return NativeCall(lib, "relu_f32", (x.ctypes.data, out.ctypes.data, x.size), (x, out), result=out)


relu_cpu.binder = _bind_relu  # type: ignore[attr-defined]

for _code, _kernel in enumerate((add_cpu, sub_cpu, mul_cpu, div_cpu)):
    _kernel.binder = _binary_binder(_kernel, _code)  # type: ignore[attr-defined]
matmul_cpu.binder = _bind_matmul_native  # type: ignore[attr-defined]
linear_cpu.binder = _bind_linear_native  # type: ignore[attr-defined]


def _bind_mean_native(x: Any, *, axis: Any = None, keepdims: bool = False, out: Any = None) -> Any:
    """``mean`` over trailing axes of a C-contiguous float32 array (global average pooling, a last-axis
    mean) as one packed C loop summing each row in numpy's pairwise order: np.sum's bits, checked on the
    arrays' current values when bound (a numpy whose order differs keeps the numpy call)."""
    numpy_call = _bind_mean_numpy(x, axis=axis, keepdims=keepdims, out=out)
    if numpy_call is None or x.dtype != _F32 or not x.flags.c_contiguous or not out.flags.c_contiguous:
        return numpy_call
    try:
        axes = normalize_axes("mean", x, axis)
    except Exception:
        return numpy_call
    if not axes or axes != tuple(range(x.ndim - len(axes), x.ndim)):
        return numpy_call  # not a trailing block of axes
    lib = library()
    if lib is None:
        return numpy_call
    n = int(np.prod([x.shape[a] for a in axes]))
    call = NativeCall(lib, "mean_rows", (x.ctypes.data, out.ctypes.data, x.size // n, n), (x, out))
    saved = out.copy()
    numpy_call()
    want = out.copy()
    call()
    same = np.array_equal(out, want, equal_nan=True)
    out[...] = saved
    return call if same else numpy_call


mean_cpu.binder = _bind_mean_native  # type: ignore[attr-defined]
