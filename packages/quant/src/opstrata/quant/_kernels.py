"""quant's native int8 kernels registered into opstrata.ops on ``cpu``: ``matmul_integer`` (ONNX
MatMulInteger), ``qlinear_matmul`` (ONNX QLinearMatMul), ``dynamic_quantize_linear`` (ONNX
DynamicQuantizeLinear), ``dynamic_qmatmul`` (the three fused, with the float epilogue), ``qmatmul`` and
``qconv`` (graph's fused QDQ MatMul / Conv), ``quantize_linear`` and ``dequant_matmul`` (weight-only).

Importing opstrata.quant registers them at :data:`KERNEL_PRIORITY`, above ops' numpy kernels (priority
0), which stay registered: each native kernel hands what it does not cover (a batched ``b``, per-row
activation scales, zero points of another dtype, errors) and everything when the library is
unavailable (``OPSTRATA_NATIVE=off``, no compiler under ``auto``) to the kernel it displaced, counting
both paths in :func:`opstrata.quant.native_status`. Under ``OPSTRATA_NATIVE=on`` a failed build raises
instead. Results are bit-identical to ops' reference kernels.

Weights: ``b`` is packed once and the packing reused while that array object lives (dropped with it).
A read-only ``b`` (``b.flags.writeable == False``, and so is every array it views, down to memory of
its own or a ``bytes`` object) is trusted not to change; any other is re-verified on every call by a
64-bit content fingerprint (one read of the weight, ~1/8 of packing it) and repacked when it changed. :func:`set_qgemm_threads` sets the threads these kernels use outside a session (default 1); inside a
session's run its intra-op thread count applies (``opstrata.ops.intra_op_threads``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

import opstrata.ops as ops

from ._conv import (
    conv_geometry,
    prepack_conv,
    qconv_call,
    qconv_native_call,
    qconv_quantize_native_call,
    run_qconv2d,
    run_qconv_call,
)
from ._errors import QuantError
from ._qgemm import _ERRORS, _OUT_F32, PackedWeight, dynamic_qgemm, prepack_weight, qgemm, qgemm_args
from ._wonly import dq_matmul, prepack_dq_weight
from .native._library import count, entry_address, library, path_id

__all__ = ["KERNEL_PRIORITY", "get_qgemm_threads", "install", "set_qgemm_threads", "uninstall"]

KERNEL_PRIORITY = 1
_U8, _S8, _F32 = np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.float32)
_INT8S = (_U8, _S8)
_state: dict[str, Any] = {"threads": 1}
_displaced: dict[str, Callable[..., Any]] = {}


def set_qgemm_threads(n: int) -> None:
    """Threads the registered int8 kernels split rows over outside a session (default 1); during an
    InferenceSession's run its ``intra_op_num_threads`` applies instead (``ops.intra_op_threads``)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"set_qgemm_threads: n must be an int >= 1, got {n!r}")
    _state["threads"] = int(n)


def get_qgemm_threads() -> int:
    """Threads the registered int8 kernels use outside a session (inside one: its intra-op count)."""
    return int(_state["threads"])


def _threads() -> int:
    """The enclosing ``ops.intra_op_threads`` limit (an InferenceSession's intra-op count during its runs),
    else :func:`set_qgemm_threads`' setting. The C kernel still gives each thread a minimum of work (the GEMM
    ~2M multiply-adds on VNNI, ~16M on AMX with ops' pool)."""
    limit = ops.intra_op_thread_limit()
    return int(limit) if limit is not None else int(_state["threads"])


# --------------------------------------------------------------------------- packed-weight cache

_cache_lock = threading.Lock()
#: id(b) -> (weakref to b, layout + zero-point key, content fingerprint or None if read-only, packed)
_packed: dict[int, tuple[weakref.ref[np.ndarray], tuple[Any, ...], int | None, Any]] = {}


def _layout_key(b: np.ndarray, zp: Any) -> tuple[Any, ...]:
    z = None if zp is None else (np.asarray(zp).dtype.str, np.shape(zp), np.asarray(zp).tobytes())
    return (b.ctypes.data, b.shape, b.strides, b.dtype.str, z)


def _fingerprint(b: np.ndarray) -> int:
    lib = library()
    assert lib is not None  # callers hold a loaded library
    if b.ndim != 2 or b.strides[1] != 1 or (b.shape[0] > 1 and b.strides[0] < b.shape[1]):
        b = np.ascontiguousarray(b)
    ld = b.strides[0] if b.shape[0] else b.shape[1]
    return int(lib.opstrata_qgemm_fingerprint(b.ctypes.data, ld, b.shape[0], b.shape[1]))


def _immutable_fallback(b: np.ndarray) -> bool:
    """Read-only all the way down: b and every array it views are read-only and the memory at the bottom
    is b's own or a ``bytes`` object (a read-only view of a writeable array can still change). What
    ``opstrata.ops.native.kernels.immutable`` decides, for an opstrata-ops without it (< 0.4.44)."""
    x: Any = b
    while isinstance(x, np.ndarray):
        if x.flags.writeable:
            return False
        x = x.base
    return x is None or isinstance(x, bytes)


_immutable: Callable[[np.ndarray], bool] = (
    getattr(getattr(getattr(ops, "native", None), "kernels", None), "immutable", None) or _immutable_fallback
)


def _cached(b: np.ndarray, layout: tuple[Any, ...], build: Callable[[], Any]) -> Any:
    """``build()``'s packed form of ``b``, cached per array object and ``layout``: trusted when ``b`` is
    read-only, verified by its content fingerprint when writeable (a changed weight is packed again)."""
    key = id(b)
    fp = (
        None
        if _immutable(b)
        else _fingerprint(b if b.ndim == 2 else np.ascontiguousarray(b).reshape(b.shape[0], -1))
    )
    with _cache_lock:
        hit = _packed.get(key)
        if hit is not None and hit[0]() is b and hit[1] == layout and hit[2] == fp:
            return hit[3]
    w = build()
    with _cache_lock:
        _packed[key] = (weakref.ref(b, lambda _r, k=key: _packed.pop(k, None)), layout, fp, w)
    return w


def _pack(b: np.ndarray, zp: Any) -> PackedWeight:
    """The packed form of ``b`` (K, N) (see :func:`_cached`)."""
    return _cached(b, _layout_key(b, zp), lambda: prepack_weight(b, zp))  # type: ignore[no-any-return]


def packed_cache_size() -> int:
    """How many weights the registered kernels hold packed (tests, diagnostics)."""
    with _cache_lock:
        return len(_packed)


# --------------------------------------------------------------------------- the kernels


def _zp_fits(zp: Any, dtype: np.dtype, sizes: tuple[int, ...]) -> bool:
    """None, or a zero point of ``dtype`` with one of the sizes (1, or one per row / column), 0-D or 1-D."""
    if zp is None:
        return True
    z = np.asarray(zp)
    return z.dtype == dtype and z.ndim <= 1 and z.size in sizes


def _a_rows(a: np.ndarray) -> tuple[np.ndarray, int]:
    """``a`` as 2-D rows and its per-matrix row count (the per-row zero point's length)."""
    return (a.reshape(1, -1), 1) if a.ndim == 1 else (a, a.shape[-2])


def _native_zp_a(zp: Any, a: np.ndarray, rows: int) -> Any:
    """The per-row zero point of an N-D ``a`` repeated over its batch (ONNX broadcasts it)."""
    if zp is None or np.asarray(zp).size == 1 or a.ndim <= 2:
        return zp
    return np.tile(np.asarray(zp).reshape(-1), a.size // (rows * a.shape[-1]))


def _mm_fits(a: np.ndarray, b: np.ndarray, a_zp: Any, b_zp: Any) -> bool:
    if a.dtype not in _INT8S or b.dtype not in _INT8S or b.ndim != 2 or a.ndim < 1:
        return False
    if a.shape[-1] != b.shape[0]:
        return False
    rows = 1 if a.ndim == 1 else a.shape[-2]
    return _zp_fits(a_zp, a.dtype, (1, rows)) and _zp_fits(b_zp, b.dtype, (1, b.shape[1]))


def _matmul_integer_native(a: Any, b: Any, a_zero_point: Any = None, b_zero_point: Any = None) -> np.ndarray:
    """ONNX MatMulInteger on the native int8 GEMM: a (..., K) or (K,), b (K, N), zero points per tensor,
    per row (a) or per column (b); anything else goes to ops' numpy kernel."""
    a, b = np.asarray(a), np.asarray(b)
    lib = library() if _mm_fits(a, b, a_zero_point, b_zero_point) else None
    if lib is None:
        count("matmul_integer", "numpy")
        return _displaced["matmul_integer"](a, b, a_zero_point, b_zero_point)
    a2, rows = _a_rows(a)
    w = _pack(b, b_zero_point)
    out = qgemm(a2, w, _native_zp_a(a_zero_point, a2, rows), threads=_threads())
    count("matmul_integer", "native")
    return out.reshape(b.shape[1]) if a.ndim == 1 else out


def _float_scale(s: Any, sizes: tuple[int, ...]) -> bool:
    v = np.asarray(s)
    return v.dtype.kind == "f" and v.ndim <= 1 and v.size in sizes and bool(np.all(np.isfinite(v)))


def _qlinear_matmul_native(
    a: Any,
    a_scale: Any,
    a_zero_point: Any,
    b: Any,
    b_scale: Any,
    b_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any,
) -> np.ndarray:
    """ONNX QLinearMatMul on the native int8 GEMM with the requantizing epilogue fused (per-tensor
    a/y scales, b's per tensor or per column); anything else goes to ops' numpy kernel."""
    a, b = np.asarray(a), np.asarray(b)
    fits = _mm_fits(a, b, a_zero_point, b_zero_point)
    if fits:
        n = b.shape[1]
        yz = None if y_zero_point is None else np.asarray(y_zero_point)
        fits = (
            _float_scale(a_scale, (1,))
            and _float_scale(b_scale, (1, n))
            and _float_scale(y_scale, (1,))
            and (yz is None or (yz.dtype in _INT8S and yz.size == 1))
        )
    lib = library() if fits else None
    if lib is None:
        count("qlinear_matmul", "numpy")
        return _displaced["qlinear_matmul"](
            a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point
        )
    a2, rows = _a_rows(a)
    yzp = np.asarray(y_zero_point) if y_zero_point is not None else np.zeros((), a.dtype)  # ONNX: a's dtype
    sa, sb, sy = (np.asarray(v).astype(np.float32) for v in (a_scale, b_scale, y_scale))
    out = qgemm(
        a2, _pack(b, b_zero_point), _native_zp_a(a_zero_point, a2, rows), a_scale=sa, b_scale=sb,
        y_scale=sy, y_zero_point=yzp, threads=_threads(),
    )  # fmt: skip
    count("qlinear_matmul", "native")
    return out.reshape(b.shape[1]) if a.ndim == 1 else out


def _quantize_dynamic(x: np.ndarray) -> tuple[np.ndarray, np.float32, np.uint8] | None:
    """ONNX DynamicQuantizeLinear of a float32 array in C (uint8 values, scale, zero point); None when
    the library is missing or x holds a NaN (the reference kernel then decides)."""
    lib = library()
    if lib is None:
        return None
    x = np.ascontiguousarray(x)
    y = np.empty(x.shape, np.uint8)
    scale, zp = np.empty((), np.float32), np.empty((), np.uint8)
    if lib.opstrata_dynamic_quantize(x.ctypes.data, x.size, y.ctypes.data, scale.ctypes.data, zp.ctypes.data):
        return None
    return y, scale, zp


def _dynamic_quantize_linear_native(x: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX DynamicQuantizeLinear in C (bit-identical to ops' kernel); NaN inputs go to ops' kernel."""
    x = np.asarray(x)
    got = _quantize_dynamic(x) if x.dtype == _F32 else None
    if got is None:
        count("dynamic_quantize_linear", "numpy")
        return _displaced["dynamic_quantize_linear"](x)
    count("dynamic_quantize_linear", "native")
    return got


def _hand_off(op: str, *args: Any, out: Any = None, **kw: Any) -> np.ndarray:
    """ops' own kernel for a call the native one does not cover (counted); ``out=`` passed only when given,
    so a kernel without the option still takes the call."""
    count(op, "numpy")
    if out is not None:
        kw["out"] = out
    return _displaced[op](*args, **kw)  # type: ignore[no-any-return]


def _c_target(out: Any) -> np.ndarray | None:
    """``out`` when the C kernels can write it directly (C-contiguous), else None (they write a new array)."""
    return out if out is not None and out.flags.c_contiguous else None


def _into(out: Any, y: np.ndarray) -> np.ndarray:
    """The result as the caller asked for it: ``y`` itself, or copied into ``out`` when it went elsewhere."""
    if out is None or y is out:
        return y
    np.copyto(out, y)
    return out  # type: ignore[no-any-return]


def _dynamic_qmatmul_native(
    x: Any, b: Any, b_scale: Any, b_zero_point: Any = None, bias: Any = None, *, per_token: bool = False,
    out: Any = None,
) -> np.ndarray:  # fmt: skip
    """x quantized, the int8 GEMM and its float epilogue (x_scale * b_scale, bias) in one C call, into
    ``out`` when given (an arena view); anything the native GEMM does not cover goes to ops' kernel."""
    x, b = np.asarray(x), np.asarray(b)
    n = b.shape[1] if b.ndim == 2 else 0
    fits = (
        x.dtype == _F32 and x.ndim >= 1 and b.dtype in _INT8S and b.ndim == 2 and x.shape[-1] == b.shape[0]
        and _zp_fits(b_zero_point, b.dtype, (1, n)) and _float_scale(b_scale, (1, n))
        and (bias is None or np.shape(bias) == (n,)) and library() is not None
    )  # fmt: skip
    got = None
    if fits:
        sb = np.ascontiguousarray(np.asarray(b_scale, _F32).reshape(-1))
        bi = None if bias is None else np.ascontiguousarray(np.asarray(bias, _F32))
        got = dynamic_qgemm(x, _pack(b, b_zero_point), sb, bi, per_row=per_token, symmetric=per_token,
                            threads=_threads(), out=out)  # fmt: skip
    if got is None:  # not covered, or x holds a NaN: ops' kernel decides
        kw: dict[str, Any] = {"per_token": True} if per_token else {}
        return _hand_off("dynamic_qmatmul", x, b, b_scale, b_zero_point, bias, out=out, **kw)
    count("dynamic_qmatmul", "native")
    return got[0]


def _packed_conv(w: np.ndarray, w_zero_point: Any, groups: Any) -> Any:
    """The packed form of the conv weight ``w`` (see :func:`_cached`)."""
    zk = None if w_zero_point is None else _bytes_key(np.asarray(w_zero_point))
    layout = (w.ctypes.data, w.shape, w.strides, w.dtype.str, zk, int(groups))
    return _cached(w, layout, lambda: prepack_conv(w, w_zero_point, int(groups)))


def _qconv_fits(
    x: np.ndarray, w: np.ndarray, x_zp: Any, w_zp: Any, scale: Any, bias: Any, groups: Any
) -> bool:
    if x.ndim != 4 or w.ndim != 4 or x.dtype not in _INT8S or w.dtype not in _INT8S:
        return False
    g = int(groups)
    oc = w.shape[0]
    if g < 1 or x.shape[1] != w.shape[1] * g or oc % g:
        return False
    return (
        _zp_fits(x_zp, x.dtype, (1,)) and _zp_fits(w_zp, w.dtype, (1, oc)) and _float_scale(scale, (1, oc))
        and (bias is None or np.shape(bias) == (oc,))
    )  # fmt: skip


def _qmatmul_fits(a: np.ndarray, w: np.ndarray, a_zp: Any, w_zp: Any, scale: Any, bias: Any) -> bool:
    """What the native ``qmatmul`` covers: ``matmul_integer``'s operands with a per-tensor activation zero
    point, finite float scales (one or per column) and a finite float bias per column."""
    if not _mm_fits(a, w, a_zp, w_zp) or (a_zp is not None and np.asarray(a_zp).size != 1):
        return False
    n = w.shape[1]
    return _float_scale(scale, (1, n)) and (
        bias is None or (np.shape(bias) == (n,) and _float_scale(bias, (n,)))
    )


def _qmatmul_native(
    a: Any, a_zero_point: Any, w: Any, w_zero_point: Any, scale: Any, bias: Any = None, *, out: Any = None
) -> np.ndarray:
    """ops' ``qmatmul`` on the native int8 GEMM with its float32 epilogue (``(float)acc * scale + bias``,
    rounded as ops' reference); what it does not cover goes to ops' kernel."""
    a, w = np.asarray(a), np.asarray(w)
    lib = library() if _qmatmul_fits(a, w, a_zero_point, w_zero_point, scale, bias) else None
    if lib is None:
        count("qmatmul", "numpy")
        return _displaced["qmatmul"](a, a_zero_point, w, w_zero_point, scale, bias, out=out)
    a2 = a.reshape(-1, a.shape[-1])
    dst = None if out is None or not out.flags.c_contiguous else out.reshape(-1, w.shape[1])
    y = qgemm(a2, _pack(w, w_zero_point), a_zero_point, a_scale=np.float32(1.0), b_scale=scale, bias=bias,
              threads=_threads(), out=dst)  # fmt: skip
    count("qmatmul", "native")
    if out is None:
        return y.reshape(*a.shape[:-1], w.shape[1])
    if dst is None:
        np.copyto(out, y.reshape(out.shape))
    return out


def _bind_qmatmul_native(
    a: Any, a_zero_point: Any, w: Any, w_zero_point: Any, scale: Any, bias: Any = None, *, out: Any
) -> Any:
    """``_qmatmul_native(..., out=out)`` as one packed C call (``opstrata_qgemm_packed`` through
    ``ops.foreign_call``) for a session's operands: the weight and both zero points read-only (the
    weight packed once, the activation's zero point widened once), ``a`` and ``out`` C-contiguous. None
    otherwise (the eager kernel then runs, per call)."""
    foreign, lib = getattr(ops, "foreign_call", None), library()
    if foreign is None or lib is None or not all(type(v) is np.ndarray for v in (a, w, out)):
        return None
    if not (a.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable and out.dtype == _F32):
        return None
    if not _qmatmul_fits(a, w, a_zero_point, w_zero_point, scale, bias) or a.size == 0:
        return None
    zps = [np.asarray(z) for z in (a_zero_point, w_zero_point) if z is not None]
    if not (_immutable(w) and all(type(z) is np.ndarray and _immutable(z) for z in zps)):
        return None
    n, k = w.shape[1], w.shape[0]
    m = a.size // k
    if out.shape != (*a.shape[:-1], n) or np.may_share_memory(out, a):
        return None
    packed = _pack(w, w_zero_point)
    za = np.asarray([0 if a_zero_point is None else int(np.asarray(a_zero_point).reshape(()))], np.int32)
    sa = np.ones(1, _F32)
    sb = np.ascontiguousarray(np.asarray(scale, _F32).reshape(-1))
    bi = None if bias is None else np.ascontiguousarray(np.asarray(bias, _F32).reshape(-1))
    args = qgemm_args(path_id(None, lib), m, packed, a, k, za, _OUT_F32, out.ctypes.data, n, sa, sb, bi, False, 0,
                      _threads())  # fmt: skip
    shape = f"{a.dtype}{list(a.shape)}"
    return foreign(
        entry_address(lib, "opstrata_qgemm_packed"), args, (a, packed, za, sa, sb, bi, out),
        lambda rc: QuantError("qmatmul", f"the native kernel failed ({_ERRORS.get(rc, rc)}) for a {shape}"),
        out, name="opstrata_qgemm_packed",
    )  # fmt: skip


def _qconv_native(
    x: Any, x_zero_point: Any, w: Any, w_zero_point: Any, scale: Any, bias: Any = None, *,
    stride: Any = 1, pads: Any = 0, dilation: Any = 1, groups: int = 1, out: Any = None,
) -> np.ndarray:  # fmt: skip
    """ops' ``qconv`` (a fused QDQ Conv) on the native int8 kernels for 2-D NCHW convolutions: im2col of
    channels-last patches into the int8 GEMM, or the direct depthwise kernel; anything else (1-D/3-D,
    negative pads, zero points of another dtype) goes to ops' kernel."""
    x, w = np.asarray(x), np.asarray(w)
    geometry = None
    if _qconv_fits(x, w, x_zero_point, w_zero_point, scale, bias, groups) and library() is not None:
        packed = _packed_conv(w, w_zero_point, groups)
        try:
            geometry = conv_geometry(x.shape, packed, stride, pads, dilation)
        except (QuantError, ValueError, TypeError):  # what the C code does not take: ops' kernel decides
            geometry = None
    if geometry is None:
        return _hand_off("qconv", x, x_zero_point, w, w_zero_point, scale, bias, out=out, stride=stride,
                         pads=pads, dilation=dilation, groups=groups)  # fmt: skip
    sc = np.ascontiguousarray(np.asarray(scale, _F32).reshape(-1))
    bi = None if bias is None else np.ascontiguousarray(np.asarray(bias, _F32).reshape(-1))
    zx = 0 if x_zero_point is None else int(np.asarray(x_zero_point).reshape(()))
    y = run_qconv2d(np.ascontiguousarray(x), packed, zx, sc, bi, geometry, _threads(), None, _c_target(out))
    return _into(out, y)


def _bind_qconv_native(
    x: Any, x_zero_point: Any, w: Any, w_zero_point: Any, scale: Any, bias: Any = None, *,
    stride: Any = 1, pads: Any = 0, dilation: Any = 1, groups: int = 1, out: Any,
) -> Callable[[], np.ndarray] | None:  # fmt: skip
    """``_qconv_native(...)`` into ``out`` with its checks and the geometry done once (ops.bind: the
    runtime's arena views are fixed per input shape): each call looks the packed weight up (repacked if a
    writeable weight changed), reads the activation zero point and makes the C call; for a read-only weight
    (a session's) the packed form and the C arguments are made once. None where the kernel would hand the
    call to ops' kernel, or ``x`` / ``out`` are not C-contiguous arrays of their own."""
    if not all(type(a) is np.ndarray for a in (x, w, out)):
        return None
    if not (x.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable and out.dtype == _F32):
        return None
    if not _qconv_fits(x, w, x_zero_point, w_zero_point, scale, bias, groups) or library() is None:
        return None
    try:
        geometry = conv_geometry(x.shape, _packed_conv(w, w_zero_point, groups), stride, pads, dilation)
    except (QuantError, ValueError, TypeError):
        return None
    if out.shape != (x.shape[0], w.shape[0], *geometry[3]) or np.may_share_memory(out, x):
        return None
    sc = np.ascontiguousarray(np.asarray(scale, _F32).reshape(-1))
    bi = None if bias is None else np.ascontiguousarray(np.asarray(bias, _F32).reshape(-1))
    zp = None if x_zero_point is None else np.asarray(x_zero_point)
    threads = _threads()

    def call() -> np.ndarray:
        zx = 0 if zp is None else int(zp.reshape(()))
        return run_qconv2d(x, _packed_conv(w, w_zero_point, groups), zx, sc, bi, geometry, threads, None, out)

    if _immutable(w):
        # a session's weight: packed once, its C arguments made once; each run passes the activation zero
        # point (and checks that the weight's, a small array a session may leave writeable, is unchanged)
        packed = _packed_conv(w, w_zero_point, groups)
        prepared = qconv_call(x, packed, sc, bi, geometry, threads, None, out)
        wzp = None if w_zero_point is None else np.asarray(w_zero_point)
        if wzp is None or _immutable(wzp):  # nothing that can change: one C call from ops' native batch
            native = qconv_native_call(prepared, zp, x, (packed, sc, bi, x, out, wzp), out)
            if native is not None:
                return native
        wzp_bytes = None if wzp is None else wzp.tobytes()

        def fixed() -> np.ndarray:
            if wzp is not None and wzp.tobytes() != wzp_bytes:
                return call()  # the weight's zero point changed: packed again
            return run_qconv_call(prepared, 0 if zp is None else int(zp.reshape(())), x, out)

        fixed.keep = (packed, sc, bi, x, out)  # type: ignore[attr-defined]
        return fixed
    return call


#: qconv_quantize's activations -> the C library's ids (QG_ACT_*)
_ACTIVATION_IDS = {"none": 0, "relu": 1, "hardswish": 2, "clip": 3}


def _act_params_fit(activation: str, alpha: Any, beta: Any) -> bool:
    """alpha / beta the C activation takes: finite, or for clip's bounds not NaN (infinite: one-sided)."""
    ab = np.array([alpha, beta], np.float64)
    return not np.isnan(ab).any() and (activation == "clip" or bool(np.isfinite(ab).all()))


def _requant_fits(y_scale: Any, y_zero_point: Any, activation: Any, alpha: Any, beta: Any) -> bool:
    """What the C requantization covers: a finite float32 scalar scale, an int8/uint8 scalar zero point and
    one of its activations with finite parameters."""
    ys, yz = np.asarray(y_scale), np.asarray(y_zero_point)
    return (
        ys.dtype == _F32 and ys.size == 1 and bool(np.isfinite(ys).all()) and yz.dtype in _INT8S and yz.size == 1
        and activation in _ACTIVATION_IDS and _act_params_fit(activation, alpha, beta)
    )  # fmt: skip


def _qconv_quantize_native(
    x: Any, x_zero_point: Any, w: Any, w_zero_point: Any, scale: Any, bias: Any, y_scale: Any, y_zero_point: Any,
    *, activation: str = "none", alpha: float = 1.0 / 6.0, beta: float = 0.5, residual: Any = None,
    stride: Any = 1, pads: Any = 0, dilation: Any = 1, groups: int = 1, out: Any = None,
) -> np.ndarray:  # fmt: skip
    """ops' ``qconv_quantize``: the native int8 convolution (:func:`_qconv_native`), then the residual add,
    the activation and QuantizeLinear in one C pass (same bytes as ops' kernel); what either does not
    cover goes to ops' kernel (which also names a residual of the wrong shape)."""
    window = {"stride": stride, "pads": pads, "dilation": dilation, "groups": groups}
    epilogue = {"activation": activation, "alpha": alpha, "beta": beta}
    if residual is not None:
        epilogue["residual"] = residual

    def hand_off() -> np.ndarray:
        return _hand_off("qconv_quantize", x, x_zero_point, w, w_zero_point, scale, bias, y_scale, y_zero_point,
                         out=out, **epilogue, **window)  # fmt: skip

    x, w = np.asarray(x), np.asarray(w)
    fits = _requant_fits(y_scale, y_zero_point, activation, alpha, beta) and _qconv_fits(
        x, w, x_zero_point, w_zero_point, scale, bias, groups
    )
    if not fits or library() is None:
        return hand_off()
    y = np.ascontiguousarray(_qconv_native(x, x_zero_point, w, w_zero_point, scale, bias, **window))
    res = None if residual is None else np.ascontiguousarray(residual)
    if res is not None and (res.dtype != _F32 or res.shape != y.shape):
        return hand_off()
    yz = np.asarray(y_zero_point)
    dst = _c_target(out) if out is not None and out.dtype == yz.dtype else None
    q = np.empty(y.shape, yz.dtype) if dst is None else dst
    rc = library().opstrata_requantize_f32(
        y.ctypes.data, None if res is None else res.ctypes.data, y.size, _ACTIVATION_IDS[activation], alpha,
        beta, float(np.asarray(y_scale).reshape(())), int(yz.reshape(())), int(yz.dtype == _S8), q.ctypes.data,
        _threads(),
    )  # fmt: skip
    if rc:
        raise QuantError("qconv_quantize", f"the native requantization failed with code {rc} for {y.shape}")
    count("qconv_quantize", "native")
    return _into(out, q)


def _bind_qconv_quantize_native(
    x: Any, x_zero_point: Any, w: Any, w_zero_point: Any, scale: Any, bias: Any, y_scale: Any, y_zero_point: Any,
    *, activation: str = "none", alpha: float = 1.0 / 6.0, beta: float = 0.5, residual: Any = None,
    stride: Any = 1, pads: Any = 0, dilation: Any = 1, groups: int = 1, out: Any,
) -> Callable[[], np.ndarray] | None:  # fmt: skip
    """``_qconv_quantize_native(...)`` into ``out`` as one native call (ops' foreign call: the convolution
    into a per-thread float scratch, then the requantization) for a session's read-only weight and
    zero points and array scale / zero point operands (read when it runs); None otherwise (the per-node
    path)."""
    if not all(type(a) is np.ndarray for a in (x, w, out, y_scale, y_zero_point)) or library() is None:
        return None
    if not (x.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable):
        return None
    if (
        out.dtype != y_zero_point.dtype
        or y_scale.dtype != _F32
        or y_scale.size != 1
        or y_zero_point.size != 1
    ):
        return None
    if activation not in _ACTIVATION_IDS or not _act_params_fit(activation, alpha, beta):
        return None
    if not _qconv_fits(x, w, x_zero_point, w_zero_point, scale, bias, groups) or not _immutable(w):
        return None
    wzp = None if w_zero_point is None else np.asarray(w_zero_point)
    if wzp is not None and not _immutable(wzp):
        return None
    try:
        packed = _packed_conv(w, w_zero_point, groups)
        geometry = conv_geometry(x.shape, packed, stride, pads, dilation)
    except (QuantError, ValueError, TypeError):
        return None
    if out.shape != (x.shape[0], w.shape[0], *geometry[3]) or np.may_share_memory(out, x):
        return None
    if residual is not None and not (
        type(residual) is np.ndarray and residual.dtype == _F32 and residual.shape == out.shape
        and residual.flags.c_contiguous and not np.may_share_memory(residual, out)
    ):  # fmt: skip
        return None
    sc = np.ascontiguousarray(np.asarray(scale, _F32).reshape(-1))
    bi = None if bias is None else np.ascontiguousarray(np.asarray(bias, _F32).reshape(-1))
    zp = None if x_zero_point is None else np.asarray(x_zero_point)
    threads = _threads()
    placeholder = np.empty(1, _F32)  # the C entry points the convolution at its per-thread scratch instead
    prepared = qconv_call(x, packed, sc, bi, geometry, threads, None, placeholder)
    ab = np.array([alpha, beta], _F32)
    requant = (
        _ACTIVATION_IDS[activation],
        ab,
        y_scale,
        y_zero_point,
        int(out.dtype == _S8),
        threads,
        residual,
    )
    return qconv_quantize_native_call(prepared, zp, x, (packed, sc, bi, x, wzp, placeholder), requant, out)  # type: ignore[no-any-return]


def _quantize_linear_native(
    x: Any, scale: Any, zero_point: Any = None, *, axis: int = 1, block_size: int = 0, saturate: bool = True,
    output_dtype: Any = None, precision: Any = None,
) -> np.ndarray:  # fmt: skip
    """ONNX QuantizeLinear of float32 x to int8/uint8 with one scale and zero point, in C (bit-identical to
    ops' kernel: float32 division, round half to even, saturation, NaN -> 0); per-axis, blocked, float8,
    other dtypes and precisions go to ops' kernel."""
    x, s = np.asarray(x), np.asarray(scale)
    zp = None if zero_point is None else np.asarray(zero_point)
    dtype = zp.dtype if zp is not None else (np.dtype(output_dtype) if output_dtype is not None else _U8)
    fits = (
        x.dtype == _F32 and s.dtype == _F32 and s.size == 1 and dtype in _INT8S and not block_size
        and precision is None and (zp is None or zp.size == 1)
        and (output_dtype is None or np.dtype(output_dtype) == dtype) and library() is not None
    )  # fmt: skip
    if fits:
        lib = library()
        xc = np.ascontiguousarray(x)
        y = np.empty(x.shape, dtype)
        z = 0 if zp is None else int(zp.reshape(()))
        if (
            lib.opstrata_quantize_linear_mt(
                xc.ctypes.data, xc.size, float(s.reshape(())), z, int(dtype == _S8), y.ctypes.data, _threads()
            )
            == 0
        ):
            count("quantize_linear", "native")
            return y
    return _hand_off("quantize_linear", x, scale, zero_point, axis=axis, block_size=block_size, saturate=saturate,
                     output_dtype=output_dtype, precision=precision)  # fmt: skip


def _bind_quantize_linear_native(
    x: Any, scale: Any, zero_point: Any = None, *, axis: int = 1, block_size: int = 0, saturate: bool = True,
    output_dtype: Any = None, precision: Any = None, out: Any,
) -> Callable[[], np.ndarray] | None:  # fmt: skip
    """``_quantize_linear_native(...)`` into ``out`` as one C call per run (ops.bind), the scale and zero
    point read when it runs; None for what the kernel hands to ops' kernel or arrays that are not
    C-contiguous."""
    if not all(type(a) is np.ndarray for a in (x, scale, out)) or library() is None:
        return None
    zp = zero_point
    if zp is not None and type(zp) is not np.ndarray:
        return None
    dtype = zp.dtype if zp is not None else (np.dtype(output_dtype) if output_dtype is not None else _U8)
    fits = (
        x.dtype == _F32 and scale.dtype == _F32 and scale.size == 1 and dtype in _INT8S and not block_size
        and precision is None and (zp is None or zp.size == 1)
        and (output_dtype is None or np.dtype(output_dtype) == dtype)
        and x.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable
        and out.dtype == dtype and out.shape == x.shape and not np.may_share_memory(out, x)
    )  # fmt: skip
    if not fits:
        return None
    lib, signed, threads = library(), int(dtype == _S8), _threads()
    foreign = getattr(ops, "foreign_call", None)  # opstrata-ops >= 0.4.56
    if foreign is not None and (zp is None or zp.dtype == dtype):
        # one packed C call that reads the scale and zero point when it runs: ops' native batches merge it
        args = [
            x.ctypes.data,
            x.size,
            scale.ctypes.data,
            0 if zp is None else zp.ctypes.data,
            signed,
            out.ctypes.data,
            threads,
        ]
        native = foreign(
            entry_address(lib, "opstrata_quantize_linear_packed"), args, (x, scale, zp, out),
            lambda rc: QuantError("quantize_linear", f"the native kernel failed with code {rc} for x {x.dtype}{list(x.shape)}"),
            out, name="opstrata_quantize_linear_packed",
        )  # fmt: skip
        if native is not None:
            return native

    def call() -> np.ndarray:
        z = 0 if zp is None else int(zp.reshape(()))
        if lib.opstrata_quantize_linear_mt(
            x.ctypes.data, x.size, float(scale.reshape(())), z, signed, out.ctypes.data, threads
        ):
            np.copyto(out, _hand_off("quantize_linear", x, scale, zero_point, axis=axis, saturate=saturate))
            return out  # what the C code refused: ops' kernel decides, as in the eager kernel
        count("quantize_linear", "native")
        return out

    return call


def _bytes_key(a: np.ndarray) -> tuple[Any, ...]:
    """A small array's identity for a cache key: dtype, shape and a 64-bit fingerprint of its bytes."""
    flat = np.ascontiguousarray(a).reshape(1, -1).view(np.uint8)
    return (a.dtype.str, a.shape, _fingerprint(flat) if flat.size else 0)


def _dequant_matmul_native(
    x: Any,
    w: Any,
    w_scale: Any,
    w_zero_point: Any = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    out: Any = None,
) -> np.ndarray:
    """ops' ``dequant_matmul`` (a weight-only quantized MatMul) with the weight kept as int4/int8 codes and
    dequantized tile by tile in C; layouts the packer refuses go to ops' kernel."""
    x, w = np.asarray(x), np.asarray(w)
    packed = None
    if (
        x.dtype == _F32
        and w.ndim == 2
        and x.ndim >= 1
        and x.shape[-1] == w.shape[0]
        and library() is not None
    ):
        s = np.asarray(w_scale)
        z = None if w_zero_point is None else np.asarray(w_zero_point)
        layout = (w.ctypes.data, w.shape, w.strides, w.dtype.str, _bytes_key(s),
                  None if z is None else _bytes_key(z), int(axis), int(block_size))  # fmt: skip
        try:
            packed = _cached(w, layout, lambda: prepack_dq_weight(w, s, z, axis=axis, block_size=block_size))
        except QuantError:
            packed = None
    if packed is None:
        return _hand_off(
            "dequant_matmul", x, w, w_scale, w_zero_point, out=out, axis=axis, block_size=block_size
        )
    return _into(out, dq_matmul(x, packed, threads=_threads(), out=_c_target(out)))


#: op -> (native kernel, the dtypes it registers for: those of the op's first argument)
_qconv_native.binder = _bind_qconv_native  # type: ignore[attr-defined]  # ops.bind: checks once
_qmatmul_native.binder = _bind_qmatmul_native  # type: ignore[attr-defined]
_quantize_linear_native.binder = _bind_quantize_linear_native  # type: ignore[attr-defined]
_qconv_quantize_native.binder = _bind_qconv_quantize_native  # type: ignore[attr-defined]

_KERNELS: dict[str, tuple[Callable[..., Any], tuple[np.dtype, ...]]] = {
    "matmul_integer": (_matmul_integer_native, _INT8S),
    "qlinear_matmul": (_qlinear_matmul_native, _INT8S),
    "dynamic_quantize_linear": (_dynamic_quantize_linear_native, (_F32,)),
    "dynamic_qmatmul": (_dynamic_qmatmul_native, (_F32,)),
    "qconv": (_qconv_native, _INT8S),
    "qconv_quantize": (_qconv_quantize_native, _INT8S),
    "qmatmul": (_qmatmul_native, _INT8S),
    "quantize_linear": (_quantize_linear_native, (_F32,)),
    "dequant_matmul": (_dequant_matmul_native, (_F32,)),
}


def _current_cpu_kernel(op: str) -> Callable[..., Any] | None:
    """The kernel ``cpu`` dispatches ``op`` to for our dtypes now (the one ours displaces)."""
    ours = {fn for fn, _ in _KERNELS.values()}
    dtype = _KERNELS[op][1][0]
    for e in ops.kernels(op):
        if e.device == "cpu" and e.fn not in ours and (e.dtypes is None or dtype in e.dtypes):
            return e.fn
    return None


def install() -> list[str]:
    """Register the native kernels on ``cpu`` above ops' own (done on import); the ops they cover."""
    done = []
    for op, (fn, dtypes) in _KERNELS.items():
        if op not in ops.list_ops():  # an opstrata-ops without the op: nothing to accelerate
            continue
        prev = _current_cpu_kernel(op)
        if prev is None:
            continue
        _displaced[op] = prev
        if not any(e.fn is fn for e in ops.kernels(op)):  # idempotent
            ops.register(op, device="cpu", dtypes=dtypes, priority=KERNEL_PRIORITY)(fn)
        done.append(op)
    return done


def uninstall() -> None:
    """Remove quant's kernels again, leaving ops' own (tests; a user who wants the numpy path back)."""
    for op, (fn, _) in _KERNELS.items():
        if op in _displaced:
            ops.unregister(op, device="cpu", kernel=fn)
