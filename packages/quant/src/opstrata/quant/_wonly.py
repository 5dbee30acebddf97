"""Weight-only GEMM on the native library: ``x @ dequantize_linear(w)`` with w kept as int4/int8 codes.

``prepack_dq_weight(w, scale, zero_point, axis, block_size)`` lays a (K, N) int4/uint4/int8/uint8 weight
out once in panels of 16 columns (int4: two codes per byte), with per (scale group, column) float32
factors ``s`` and ``t`` so that ``w = code * s + t``; ``dq_matmul(x, packed)`` then dequantizes 256-row
tiles of each panel on the fly into a small float buffer and runs every row of x against it (AVX-512,
or portable C). The weights stay 4 or 8 bits in memory; results equal the dequantize-then-matmul
reference to float32 rounding (the sums are ordered differently).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from ._errors import QuantError
from ._qgemm import _ERRORS, _lib
from .native._library import count

__all__ = ["PackedDQWeight", "dq_matmul", "prepack_dq_weight"]

_F32 = np.dtype(np.float32)
#: weight dtype -> (bits, offset making the codes unsigned)
_CODES = {
    np.dtype(ml_dtypes.int4): (4, 8), np.dtype(ml_dtypes.uint4): (4, 0),
    np.dtype(np.int8): (8, 128), np.dtype(np.uint8): (8, 0),
}  # fmt: skip


@dataclass(frozen=True, eq=False)
class PackedDQWeight:
    """A weight-only quantized (K, N) weight in the native layout (build with :func:`prepack_dq_weight`)."""

    k: int
    n: int
    bits: int
    group: int  # rows of K per scale group
    data: np.ndarray  # uint8 panels
    scale: np.ndarray  # float32 (G, N)
    shift: np.ndarray  # float32 (G, N)
    ptrs: tuple[int, int, int] = field(init=False, repr=False, default=(0, 0, 0))

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "ptrs", (self.data.ctypes.data, self.scale.ctypes.data, self.shift.ctypes.data)
        )


def _groups(op: str, w: np.ndarray, s: np.ndarray, axis: int, block_size: int) -> tuple[int, tuple[int, int]]:
    """(rows of K per scale group, the (groups, N) shape of the per-(group, column) factors) for a
    DequantizeLinear layout of a (K, N) w: per tensor, per column (axis 1) or blocks along K (axis 0)."""
    k, n = w.shape
    if s.size == 1:
        return max(k, 1), (1, n)
    ax = axis % 2
    if block_size:
        g = -(-k // block_size)
        if ax != 0 or s.shape != (g, n):
            raise QuantError(op, f"blocked scales must be (ceil(K / {block_size}) = {g}, N = {n}) along axis 0, got "
                             f"{s.shape} on axis {axis}", "quantize with blocks along K (axis 0)")  # fmt: skip
        return block_size, (g, n)
    if ax != 1 or s.shape != (n,):
        raise QuantError(op, f"per-channel scales must be (N = {n},) on axis 1, got {s.shape} on axis {axis}",
                         "use one scale per output column, or blocks along K")  # fmt: skip
    return max(k, 1), (1, n)


def _per_group(a: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """A scale or zero point (one value, (N,) or (groups, N)) as float64 of the (groups, N) shape."""
    a = a.astype(np.float64)
    return np.broadcast_to(a.reshape(1, 1) if a.size == 1 else a.reshape(-1, shape[1]), shape)


def prepack_dq_weight(
    w: Any, scale: Any, zero_point: Any = None, *, axis: int = 1, block_size: int = 0
) -> PackedDQWeight:
    """Pack a (K, N) int4/uint4/int8/uint8 weight with its DequantizeLinear scale / zero point (per tensor,
    per column on axis 1, or per block of ``block_size`` rows on axis 0) for :func:`dq_matmul`."""
    op = "prepack_dq_weight"
    _lib(op)
    w = np.asarray(w)
    if w.dtype not in _CODES or w.ndim != 2:
        raise QuantError(
            op, f"w must be a 2-D int4/uint4/int8/uint8 (K, N) weight, got {w.dtype}{list(w.shape)}"
        )
    s = np.asarray(scale)
    if s.dtype.kind != "f":
        raise QuantError(op, f"scale must be floating point, got {s.dtype}")
    group, shape = _groups(op, w, s, axis, block_size)
    bits, offset = _CODES[w.dtype]
    k, n = w.shape
    zp = np.zeros(1) if zero_point is None else np.asarray(zero_point)
    if zp.size not in (1, shape[0] * shape[1]):
        raise QuantError(op, f"zero_point must match the scale's layout {s.shape}, got {zp.shape}")
    s2 = _per_group(s, shape)
    sc = np.ascontiguousarray(s2, dtype=_F32)
    sh = np.ascontiguousarray(
        -(offset + _per_group(zp, shape)) * s2, dtype=_F32
    )  # w = (code - offset - zp) * s
    codes = (w.astype(np.int16) + offset).astype(np.uint8)  # (K, N), 0..15 or 0..255
    panels = -(-n // 16)
    rows = k + (k % 2 if bits == 4 else 0)  # int4: pairs of rows share bytes (K padded to even)
    padded = np.zeros((rows, panels * 16), np.uint8)
    padded[:k, :n] = codes
    tiles = padded.reshape(rows, panels, 16).transpose(1, 0, 2)  # (P, K, 16)
    data = np.ascontiguousarray(tiles[:, 0::2] | (tiles[:, 1::2] << 4) if bits == 4 else tiles)
    for a in (data, sc, sh):
        a.flags.writeable = False
    return PackedDQWeight(k, n, bits, group, data, sc, sh)


def dq_matmul(
    x: Any, packed: PackedDQWeight, bias: Any = None, *, threads: int = 1, out: np.ndarray | None = None
) -> np.ndarray:
    """``x`` (..., K) float32 times the packed weight-only quantized weight (+ ``bias`` (N,)), float32."""
    op = "dq_matmul"
    lib = _lib(op)
    x = np.asarray(x)
    if x.dtype != _F32 or x.ndim < 1 or x.shape[-1] != packed.k:
        raise QuantError(
            op, f"x must be float32 (..., K={packed.k}), got {x.dtype}{list(x.shape)}", "match the weight"
        )
    lead = x.shape[:-1]
    m = int(np.prod(lead)) if lead else 1
    x2 = np.ascontiguousarray(x).reshape(m, packed.k)
    bi = None if bias is None else np.ascontiguousarray(np.asarray(bias, _F32).reshape(-1))
    if bi is not None and bi.size != packed.n:
        raise QuantError(op, f"bias must have N = {packed.n} values, got {bi.size}")
    shape = (*lead, packed.n)
    if out is not None and not (isinstance(out, np.ndarray) and out.shape == shape and out.dtype == _F32
                                and out.flags.c_contiguous and out.flags.writeable):  # fmt: skip
        raise QuantError(
            op, f"out must be a writeable C-contiguous float32 array of shape {shape}", "pass one"
        )
    dst = np.empty(shape, _F32) if out is None else out
    rc = lib.opstrata_dqgemm(
        m, packed.n, packed.k, x2.ctypes.data, packed.k, packed.ptrs[0], packed.bits, packed.ptrs[1],
        packed.ptrs[2], packed.group, None if bi is None else bi.ctypes.data, dst.ctypes.data, packed.n, int(threads),
    )  # fmt: skip
    if rc != 0:
        raise QuantError(
            op, f"the native kernel failed ({_ERRORS.get(rc, rc)}) for x {x.dtype}{list(x.shape)}"
        )
    count("dequant_matmul", "native")
    return dst
