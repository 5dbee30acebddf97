"""GEMMs that a CUDA stream capture can record: cuBLAS called through ctypes on CuPy's own handle.

CuPy 14's cuBLAS wrappers refuse to run while a stream is capturing ("calling cuBLAS API during stream
capture is currently unsupported"); cuBLAS itself records fine. So while a device graph is recorded the
cuda matmul calls ``cublasGemmStridedBatchedEx`` directly. :func:`gemm_plan` turns row-major operands
(C-ordered, or with their last two axes transposed, batches with one stride or broadcast) into the
column-major call; it is plain arithmetic on shapes and strides, tested against numpy on the CPU.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["CublasCaptureGemm", "GemmPlan", "gemm_plan"]

OP_N, OP_T = 0, 1
#: cudaDataType and the cublasComputeType used for it (float32 accumulation below float64)
_TYPES: dict[str, tuple[int, int]] = {
    "float16": (2, 68),
    "bfloat16": (14, 68),
    "float32": (0, 68),
    "float64": (1, 70),
}
_ALGO_DEFAULT = -1
#: the workspace cuBLAS gets for recorded GEMMs (NVIDIA's advice for CUDA graphs: a user workspace, so
#: cuBLAS allocates nothing while a stream captures; 32 MiB covers Hopper's largest kernels, as torch's)
WORKSPACE_BYTES = 32 << 20


@dataclass(frozen=True)
class Operand:
    """One operand as cuBLAS reads it: transposed or not, leading dimension, batch stride (elements)."""

    op: int
    ld: int
    batch_stride: int


@dataclass(frozen=True)
class GemmPlan:
    """Row-major ``C[..., M, N] = A[..., M, K] @ B[..., K, N]`` as one column-major strided-batched call:
    ``C^T = B^T A^T``, so cuBLAS's first operand is B and its second is A."""

    m: int  # cuBLAS m = N
    n: int  # cuBLAS n = M
    k: int
    first: Operand  # B
    second: Operand  # A
    batch: tuple[int, ...]  # the output's batch shape
    count: int  # batchCount


def _matrix(rows: int, cols: int, r: int, c: int) -> tuple[int, int] | None:
    """(op, ld) for cuBLAS to read a row-major (rows, cols) matrix with element strides (r, c) as its
    transpose: op N stores the transpose itself (c == 1, ld = r), op T stores the matrix (r == 1, ld = c).
    A dimension of length 1 takes any stride; ld >= the stored matrix's row count, as cuBLAS requires."""
    if c == 1 or cols == 1:
        ld = r if rows > 1 else cols
        if ld >= max(1, cols):
            return OP_N, ld
    if r == 1 or rows == 1:
        ld = c if cols > 1 else rows
        if ld >= max(1, rows):
            return OP_T, ld
    return None


def _batch_stride(shape: tuple[int, ...], strides: tuple[int, ...], batch: tuple[int, ...]) -> int | None:
    """One element stride stepping through ``batch`` (broadcast dims stride 0), or None if there is none."""
    nb = len(batch)
    own = (1,) * (nb - (len(shape) - 2)) + tuple(shape[:-2])
    own_strides = (0,) * (nb - (len(shape) - 2)) + tuple(strides[:-2])
    live = [(d, s) for d, s, want in zip(own, own_strides, batch, strict=True) if want > 1]
    if not live:
        return 0
    if all(d == 1 for d, _ in live):
        return 0  # broadcast along every batch dim
    if any(d == 1 for d, _ in live):
        return None  # broadcast along some dims only: no single stride
    step = live[-1][1]
    expect = step
    for (_, s), (dn, _) in zip(reversed(live[:-1]), reversed(live[1:]), strict=True):
        expect *= dn
        if s != expect:
            return None
    return step


def gemm_plan(
    a_shape: tuple[int, ...],
    a_strides: tuple[int, ...],
    b_shape: tuple[int, ...],
    b_strides: tuple[int, ...],
) -> GemmPlan | None:
    """The strided-batched call for ``a @ b`` (both at least 2-D; strides in elements), or None when a
    layout needs a contiguous copy first."""
    if len(a_shape) < 2 or len(b_shape) < 2 or a_shape[-1] != b_shape[-2]:
        return None
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    batch = tuple(np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2])))
    ma, mb = _matrix(m, k, *a_strides[-2:]), _matrix(k, n, *b_strides[-2:])
    sa, sb = _batch_stride(a_shape, a_strides, batch), _batch_stride(b_shape, b_strides, batch)
    if ma is None or mb is None or sa is None or sb is None:
        return None
    return GemmPlan(n, m, k, Operand(*mb, sb), Operand(*ma, sa), batch, math.prod(batch))


def _cublas_path() -> str:
    """The libcublas this process already loaded (CuPy's), from /proc/self/maps; else the soname."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            for line in f:
                path = line.split()[-1]
                if "/libcublas.so" in path:
                    return path
    except OSError:
        pass
    return "libcublas.so.13"


class CublasCaptureGemm:
    """``a @ b`` on CuPy arrays through cuBLAS via ctypes, on CuPy's handle and the current stream, with a
    workspace of its own (one ``cudaMalloc`` outside any pool, made before the first capture records)."""

    def __init__(self, cp: ModuleType) -> None:
        self.cp = cp
        self.handle = cp.cuda.device.get_cublas_handle()  # loads libcublas and makes the handle first
        self.workspace = cp.cuda.Memory(WORKSPACE_BYTES)
        lib = ctypes.CDLL(_cublas_path())
        lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cublasSetWorkspace_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        i, ll, vp = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
        lib.cublasGemmStridedBatchedEx.argtypes = [
            vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll, i, i, i,
        ]  # fmt: skip
        self.lib = lib

    def __call__(self, a: Any, b: Any) -> Any:
        cp = self.cp
        if a.dtype != b.dtype or a.dtype.name not in _TYPES:
            raise TypeError(
                f"capture GEMM takes {sorted(_TYPES)} operands of one dtype, got {a.dtype}, {b.dtype}"
            )
        squeeze = [a.ndim == 1, b.ndim == 1]
        a = a[None, :] if squeeze[0] else a
        b = b[:, None] if squeeze[1] else b
        item = a.dtype.itemsize
        plan = gemm_plan(
            a.shape, tuple(s // item for s in a.strides), b.shape, tuple(s // item for s in b.strides)
        )
        if plan is None:  # a copy kernel records fine: make both plain row-major and broadcast-free
            batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
            a = cp.ascontiguousarray(cp.broadcast_to(a, (*batch, *a.shape[-2:])))
            b = cp.ascontiguousarray(cp.broadcast_to(b, (*batch, *b.shape[-2:])))
            plan = gemm_plan(
                a.shape, tuple(s // item for s in a.strides), b.shape, tuple(s // item for s in b.strides)
            )
            assert plan is not None
        out = cp.empty((*plan.batch, plan.n, plan.m), a.dtype)
        dtype, compute = _TYPES[a.dtype.name]
        scalar = np.float64 if a.dtype.name == "float64" else np.float32
        alpha, beta = np.array(1, scalar), np.array(0, scalar)
        if plan.count and plan.m and plan.n:
            if plan.k == 0:
                out.fill(0)
            else:
                self._gemm(plan, b, a, out, dtype, compute, alpha, beta)
        if squeeze[0]:
            out = out[..., 0, :]
        if squeeze[1]:
            out = out[..., 0]
        return out

    def _gemm(
        self, p: GemmPlan, b: Any, a: Any, out: Any, dtype: int, compute: int, alpha: Any, beta: Any
    ) -> None:
        lib = self.lib
        status = lib.cublasSetStream_v2(self.handle, self.cp.cuda.get_current_stream().ptr)
        if status == 0:  # setting the stream resets the workspace to cuBLAS's own pool: set ours again
            status = lib.cublasSetWorkspace_v2(self.handle, self.workspace.ptr, WORKSPACE_BYTES)
        if status == 0:
            status = lib.cublasGemmStridedBatchedEx(
                self.handle, p.first.op, p.second.op, p.m, p.n, p.k, alpha.ctypes.data,
                b.data.ptr, dtype, p.first.ld, p.first.batch_stride,
                a.data.ptr, dtype, p.second.ld, p.second.batch_stride,
                beta.ctypes.data, out.data.ptr, dtype, p.m, p.m * p.n, p.count, compute, _ALGO_DEFAULT,
            )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"cublasGemmStridedBatchedEx failed with cuBLAS status {status} for {p}")
