"""Exact int8 GEMM on the native library: pack a constant weight once, multiply many times.

``prepack_weight(b, zero_point)`` reorders a (K, N) int8/uint8 weight into the layout the vector
kernels read (64-column panels, K in groups of 4) with its column sums, so a repeated call with the
same weight pays no packing. ``qgemm(a, packed, ...)`` then returns, for ``a`` (..., K) int8/uint8:

* int32 ``(a - a_zp) @ (b - b_zp)`` (ONNX MatMulInteger; wrapped to int32 as ONNX's int64 sum cast);
* float32 ``acc * a_scale * b_scale[col] + bias[col]``, optionally ReLU'd (``a_scale=``: the
  dequantize epilogue of a QDQ MatMul or a dynamically quantized Linear; ``a_scale`` per tensor or
  per row, i.e. per token);
* int8/uint8 ``saturate(rint(acc * (a_scale * b_scale / y_scale)) + y_zp)`` (``y_scale=``: ONNX
  QLinearMatMul's requantization, bit-identical to opstrata.ops' reference).

``dynamic_qgemm(x, packed, b_scale, bias)`` takes float32 ``x`` and quantizes it in the same C call
(ONNX DynamicQuantizeLinear per tensor, or per row: per token), then runs the float epilogue.

Every code path (``path=``) is exact; ``threads`` (an upper bound: each thread gets at least ~2M
multiply-adds on VNNI / ~16M on AMX on ops' pool, 4M / 32M with threads started per call, so small products
stay on one) splits rows, or column panels when rows are few.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._errors import QuantError
from .native._library import count, library, path_id

__all__ = ["PackedWeight", "dynamic_qgemm", "prepack_weight", "qgemm", "qgemm_args"]

_U8, _S8, _I32, _F32 = np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.float32)
_INT8S = (_U8, _S8)
_OUT_I32, _OUT_F32, _OUT_U8, _OUT_S8 = 0, 1, 2, 3
_ERRORS = {
    -1: "the requested code path is not available on this CPU",
    -2: "bad arguments",
    -3: "out of memory",
}


class NativeUnavailableError(QuantError, RuntimeError):
    """The int8 library is not loaded (``OPSTRATA_NATIVE=off``, no compiler, or an old opstrata-ops)."""


def _lib(op: str) -> ctypes.CDLL:
    lib = library()
    if lib is None:
        from .native._library import native_status

        why = native_status().reason or "not built"
        raise NativeUnavailableError(
            op,
            f"the native int8 library is unavailable ({why})",
            "install a C compiler / unset OPSTRATA_NATIVE=off, or use opstrata.ops.matmul_integer (numpy)",
        )
    return lib


def _check_int8(op: str, name: str, x: np.ndarray) -> None:
    if x.dtype not in _INT8S:
        raise QuantError(op, f"{name} must be int8 or uint8, got {x.dtype}", "quantize it first")


def _zero_points(op: str, name: str, zp: Any, dtype: np.dtype, n: int, what: str) -> np.ndarray:
    """A zero point (None, a scalar or one per ``what``) as int32 of size 1 or n, range-checked."""
    if zp is None:
        return np.zeros(1, _I32)
    z = np.asarray(zp)
    if z.dtype.kind not in "iu":
        raise QuantError(op, f"{name} must be integer (the {dtype} operand's zero point), got {z.dtype}")
    if z.size != 1 and (z.ndim != 1 or z.size != n):
        raise QuantError(
            op,
            f"{name} must be a scalar or 1-D with one value per {what} ({n}), got shape {z.shape}",
            f"pass a per-tensor zero point or one per {what}",
        )
    info = np.iinfo(dtype)
    if z.size and (int(z.min()) < info.min or int(z.max()) > info.max):
        raise QuantError(
            op, f"{name} must lie in [{info.min}, {info.max}] ({dtype}), got {z.min()}..{z.max()}"
        )
    return np.ascontiguousarray(z.reshape(-1), dtype=_I32)


def _floats(op: str, name: str, v: Any, n: int, what: str) -> np.ndarray:
    s = np.asarray(v)
    if s.dtype.kind != "f":
        raise QuantError(op, f"{name} must be floating point, got {s.dtype}")
    if s.size != 1 and (s.ndim != 1 or s.size != n):
        raise QuantError(op, f"{name} must be a scalar or 1-D with one value per {what} ({n}), got {s.shape}")
    return np.ascontiguousarray(s.reshape(-1), dtype=_F32)


def _target(
    op: str, out: np.ndarray | None, shape: tuple[int, ...], rows: tuple[int, int], dt: np.dtype
) -> Any:
    """Where the kernel writes: a fresh (m, n) array, or ``out`` viewed as (m, n) rows of unit stride."""
    if out is None:
        return np.empty(rows, dt)
    if not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != dt or not out.flags.writeable:
        got = f"{out.dtype}{list(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__
        raise QuantError(
            op, f"out must be a writeable {dt} array of shape {shape}, got {got}", "pass a matching out"
        )
    view = out.reshape(rows) if out.ndim != 2 else out  # a copy when out's rows cannot be one (m, n) view
    size = view.itemsize
    copied = bool(view.size) and not np.may_share_memory(view, out)
    bad_rows = rows[0] > 1 and (view.strides[0] % size != 0 or view.strides[0] < rows[1] * size)
    if copied or bad_rows or (rows[1] > 1 and view.strides[1] != size):
        raise QuantError(op, "out's rows must be unit-stride and not overlap", "pass a C-contiguous out")
    return view


@dataclass(frozen=True, eq=False)
class PackedWeight:
    """A (K, N) int8/uint8 weight in the native kernels' layout, with its zero point folded in.

    Build with :func:`prepack_weight`; immutable (``data`` / ``colsum`` / ``zero_point`` are read-only).
    ``scale`` (float32, 1 or N values) is the default ``b_scale`` of :func:`qgemm`'s float epilogues.
    """

    data: np.ndarray  # packed bytes
    colsum: np.ndarray  # int32 (N,): column sums of B as int8
    zbe: np.ndarray  # int32 (N,): the zero point relative to the int8 form
    k: int
    n: int
    dtype: np.dtype  # of the original weight
    zero_point: np.ndarray  # int32 (1,) or (N,)
    scale: np.ndarray | None = None
    #: addresses of data, colsum, zbe (taken once, after checking the arrays fit k and n)
    ptrs: tuple[int, int, int] = field(init=False, repr=False, default=(0, 0, 0))

    def __post_init__(self) -> None:
        need = -(-self.n // 64) * -(-self.k // 4) * 4 * 64
        ok = (
            self.data.dtype == _S8 and self.data.flags.c_contiguous and self.data.size >= need
            and all(v.dtype == _I32 and v.flags.c_contiguous and v.size >= self.n for v in (self.colsum, self.zbe))
        )  # fmt: skip
        if not ok:
            raise QuantError(
                "PackedWeight",
                f"arrays that do not fit a packed ({self.k}, {self.n}) weight",
                "build it with prepack_weight(b, zero_point)",
            )
        object.__setattr__(
            self, "ptrs", (self.data.ctypes.data, self.colsum.ctypes.data, self.zbe.ctypes.data)
        )

    @property
    def shape(self) -> tuple[int, int]:
        return (self.k, self.n)


def prepack_weight(b: Any, zero_point: Any = None, *, scale: Any = None) -> PackedWeight:
    """Pack a (K, N) int8/uint8 weight (zero point: None, scalar or one per column) for :func:`qgemm`.

    >>> import numpy as np
    >>> w = prepack_weight(np.array([[1, -2], [3, 4]], np.int8))
    >>> qgemm(np.array([[1, 1]], np.uint8), w).tolist()
    [[4, 2]]
    """
    op = "prepack_weight"
    lib = _lib(op)
    b = np.asarray(b)
    _check_int8(op, "b", b)
    if b.ndim != 2:
        raise QuantError(op, f"b must be 2-D (K, N), got shape {b.shape}", "reshape the weight to (K, N)")
    k, n = b.shape
    if b.strides[1] != 1 or (k > 1 and b.strides[0] < n):
        b = np.ascontiguousarray(b)  # the packer reads rows of unit stride
    zp = _zero_points(op, "zero_point", zero_point, b.dtype, n, "column")
    sc = None if scale is None else _floats(op, "scale", scale, n, "column")
    size = int(lib.opstrata_qgemm_packed_size(k, n))
    raw = np.empty(max(size, 1) + 64, np.int8)
    off = -raw.ctypes.data % 64  # 64-byte aligned: the kernels' vector loads never straddle cache lines
    data, colsum, zbe = raw[off : off + max(size, 1)], np.empty(max(n, 1), _I32), np.empty(max(n, 1), _I32)
    ld = b.strides[0] if k else n
    rc = lib.opstrata_qgemm_pack_b(
        b.ctypes.data, ld, int(b.dtype == _S8), zp.ctypes.data, zp.size, k, n,
        data.ctypes.data, colsum.ctypes.data, zbe.ctypes.data,
    )  # fmt: skip
    if rc != 0:
        raise QuantError(
            op, f"the native packer failed ({_ERRORS.get(rc, rc)}) for b {b.dtype}{list(b.shape)}"
        )
    for arr in (data, colsum, zbe, zp, *(() if sc is None else (sc,))):
        arr.flags.writeable = False
    return PackedWeight(data, colsum, zbe, k, n, b.dtype, zp, sc)


def qgemm_args(
    path: int, m: int, b: PackedWeight, a: np.ndarray, lda: int, za: np.ndarray, kind: int, out_ptr: int,
    ldo: int, a_scale: np.ndarray | None, b_scale: np.ndarray | None, bias: np.ndarray | None, relu: bool,
    y_zp: int, threads: int,
) -> tuple[Any, ...]:  # fmt: skip
    """The arguments of one ``opstrata_qgemm`` C call, in its order, for checked operands (``a``: m rows
    of ``b.k`` bytes at stride ``lda``; ``za`` int32 zero points; the scales / bias contiguous float32 or
    None): what :func:`qgemm` passes, and what a bound call packs once."""

    def ptr(v: np.ndarray | None) -> int | None:
        return None if v is None else v.ctypes.data

    return (
        path, m, b.n, b.k, a.ctypes.data, lda, int(a.dtype == _S8), za.ctypes.data, za.size, *b.ptrs, kind,
        out_ptr, ldo, ptr(a_scale), 0 if a_scale is None else a_scale.size, ptr(b_scale),
        0 if b_scale is None else b_scale.size, ptr(bias), int(bool(relu)), y_zp, int(threads),
    )  # fmt: skip


def qgemm(
    a: Any,
    b: PackedWeight,
    a_zero_point: Any = None,
    *,
    a_scale: Any = None,
    b_scale: Any = None,
    bias: Any = None,
    relu: bool = False,
    y_scale: Any = None,
    y_zero_point: Any = None,
    threads: int = 1,
    path: str | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``a`` (..., K) int8/uint8 times a packed weight (see the module doc for the three epilogues).

    ``a_zero_point``: None, a scalar, or one per row of a 2-D ``a``. Without ``a_scale``: int32 out.
    With ``a_scale`` (scalar or one per row): float32 out, ``b_scale`` (scalar or per column; default
    the packed weight's ``scale``), optional float ``bias`` (N,) and ``relu``. With ``y_scale`` too:
    int8/uint8 out (``y_zero_point``'s dtype, default uint8). ``path``: ``"auto"`` (default, also
    ``$OPSTRATA_QGEMM_PATH``) or one of ``opstrata.quant.native_status().paths``. Non-contiguous ``a``
    is copied. ``out``: an array of the result's shape and dtype whose rows are unit-stride (an arena
    view; saves allocating, and page-faulting, a fresh result); otherwise a new C-contiguous array.
    """
    op = "qgemm"
    lib = _lib(op)
    if not isinstance(b, PackedWeight):
        raise QuantError(
            op,
            f"b must be a PackedWeight, got {type(b).__name__}",
            "pack it with prepack_weight(b, zero_point)",
        )
    a = np.asarray(a)
    _check_int8(op, "a", a)
    if a.ndim < 1 or a.shape[-1] != b.k:
        raise QuantError(
            op,
            f"a's last dim must equal the weight's K={b.k}, got a of shape {a.shape}",
            "pass a (..., K) activation matching the packed (K, N) weight",
        )
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise QuantError(op, f"threads must be an int >= 1, got {threads!r}")
    lead = a.shape[:-1]
    a2 = a.reshape(math.prod(lead), b.k) if a.ndim != 2 else a
    m = a2.shape[0]
    if a2.size and (a2.strides[1] != 1 or a2.strides[0] < b.k):
        a2 = np.ascontiguousarray(a2)
    za = _zero_points(op, "a_zero_point", a_zero_point, a.dtype, m, "row of a")
    kind, out_dt, y_zp = _OUT_I32, _I32, 0
    sa = sb = bi = None
    if y_scale is not None and a_scale is None:
        raise QuantError(op, "y_scale needs a_scale (and b_scale) to requantize", "pass a_scale=")
    if a_scale is not None:
        sa = _floats(op, "a_scale", a_scale, m, "row of a")
        sb_src = b.scale if b_scale is None else b_scale
        if sb_src is None:
            raise QuantError(op, "a_scale needs b_scale (or a weight packed with scale=)", "pass b_scale=")
        sb = _floats(op, "b_scale", sb_src, b.n, "column")
        kind, out_dt = _OUT_F32, _F32
        if bias is not None:
            bi = _floats(op, "bias", bias, b.n, "column")
            if bi.size != b.n:
                raise QuantError(op, f"bias must have one value per column ({b.n}), got {np.shape(bias)}")
    elif bias is not None or relu:
        raise QuantError(op, "bias / relu apply to the float32 epilogue", "pass a_scale= and b_scale= too")
    if y_scale is not None:
        if bias is not None or relu:
            raise QuantError(op, "bias / relu are not part of the requantizing epilogue (QLinearMatMul)")
        if sa is None or sa.size != 1:
            raise QuantError(op, f"requantization takes a per-tensor a_scale, got {np.shape(a_scale)}")
        sy = _floats(op, "y_scale", y_scale, 1, "tensor")
        yz = np.asarray(np.uint8(0) if y_zero_point is None else y_zero_point)
        if yz.dtype not in _INT8S or yz.size != 1:
            raise QuantError(
                op, f"y_zero_point must be one int8 or uint8 value, got {yz.dtype}{list(yz.shape)}"
            )
        assert sb is not None
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):  # checked just below
            sb = np.ascontiguousarray(sa * sb / sy, _F32)  # float32, as ONNX / ops' reference
        if not np.all(np.isfinite(sb)):
            raise QuantError(
                op, "a_scale * b_scale / y_scale is not finite", "pass finite scales and a non-zero y_scale"
            )
        kind, out_dt, y_zp = (_OUT_U8 if yz.dtype == _U8 else _OUT_S8), yz.dtype, int(yz.reshape(()))
    dst = _target(op, out, (*lead, b.n), (m, b.n), out_dt)
    lda = a2.strides[0] if a2.size else b.k
    ldo = dst.strides[0] // dst.itemsize if m > 1 else b.n
    rc = lib.opstrata_qgemm(
        *qgemm_args(
            path_id(path, lib), m, b, a2, lda, za, kind, dst.ctypes.data, ldo, sa, sb, bi, relu, y_zp, threads
        )
    )
    if rc != 0:
        raise QuantError(
            op, f"the native kernel failed ({_ERRORS.get(rc, rc)}) for a {a.dtype}{list(a.shape)}"
        )
    count("qgemm", "native")
    return out if out is not None else dst.reshape((*lead, b.n))


def dynamic_qgemm(
    x: np.ndarray,
    b: PackedWeight,
    b_scale: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    per_row: bool = False,
    symmetric: bool = False,
    relu: bool = False,
    threads: int = 1,
    path: str | None = None,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """float32 ``x`` (..., K) quantized to uint8 as ONNX DynamicQuantizeLinear does (one scale and zero
    point for all of ``x``, or with ``per_row`` one per row: per token), times the packed weight, scaled
    by ``x_scale * b_scale`` (+ ``bias``, ReLU): one C call, no intermediate arrays. Returns ``(y, scales,
    zero_points)``; None when ``x`` holds a NaN (nothing written: the caller's reference path decides).
    ``per_row=True, symmetric=True``: per-token symmetric int8 (``opstrata.ops.token_quantize``); the
    returned zero points are then 128 (the int8 values are held as uint8 + 128).

    ``b_scale`` / ``bias`` must be float32 and contiguous (1 or N values / N values); ``out`` as in
    :func:`qgemm`. The hot path of the registered ``dynamic_qmatmul`` kernel: checks are kept to what
    the C code needs.
    """
    op = "dynamic_qgemm"
    lib = _lib(op)
    if not isinstance(b, PackedWeight):
        raise QuantError(
            op, f"b must be a PackedWeight, got {type(b).__name__}", "pack it with prepack_weight"
        )
    x = np.asarray(x)
    if x.dtype != _F32 or x.ndim < 1 or x.shape[-1] != b.k:
        raise QuantError(
            op, f"x must be float32 (..., K={b.k}), got {x.dtype}{list(x.shape)}", "match the weight"
        )
    for name, v, sizes in (("b_scale", b_scale, (1, b.n)), ("bias", bias, (b.n,))):
        if v is not None and not (
            isinstance(v, np.ndarray)
            and v.dtype == _F32
            and v.ndim <= 1
            and v.size in sizes
            and v.flags.c_contiguous
        ):
            raise QuantError(op, f"{name} must be a contiguous float32 array of {sizes} values", "convert it")
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise QuantError(op, f"threads must be an int >= 1, got {threads!r}")
    if symmetric and not per_row:
        raise QuantError(op, "symmetric quantization is per row (per token) here", "pass per_row=True too")
    lead = x.shape[:-1]
    m = math.prod(lead)
    x2 = x.reshape(m, b.k) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(m, b.k)
    groups = m if per_row else 1
    scales, zps = np.empty(max(groups, 1), _F32), np.empty(max(groups, 1), _U8)
    dst = _target(op, out, (*lead, b.n), (m, b.n), _F32)
    rc = lib.opstrata_dynamic_qgemm(
        path_id(path, lib), m, b.n, b.k, x2.ctypes.data, (2 if symmetric else 1) if per_row else 0, *b.ptrs,
        b_scale.ctypes.data, b_scale.size, None if bias is None else bias.ctypes.data, int(bool(relu)),
        dst.ctypes.data, dst.strides[0] // dst.itemsize if m > 1 else b.n, scales.ctypes.data,
        zps.ctypes.data, int(threads),
    )  # fmt: skip
    if rc == -2 and m * b.k and bool(np.isnan(x2).any()):
        return None
    if rc != 0:
        raise QuantError(
            op, f"the native kernel failed ({_ERRORS.get(rc, rc)}) for x {x.dtype}{list(x.shape)}"
        )
    y = out if out is not None else dst.reshape((*lead, b.n))
    return y, scales[:groups], zps[:groups]
