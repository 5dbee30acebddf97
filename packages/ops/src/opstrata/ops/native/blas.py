"""The BLAS ``sgemm`` numpy's own matmul calls, handed to the native library so that a bound GEMM runs
inside a native batch with numpy's exact arguments (hence numpy's exact bits).

numpy's wheels bundle OpenBLAS under prefixed symbols (``scipy_cblas_sgemm64_`` with 64-bit integers
in numpy 2.x); the symbol is chosen from numpy's own build configuration, found in the library numpy
loaded, and checked once against ``np.matmul`` on a small product before it is used. Anything else (an
MKL or Accelerate build, an unknown configuration, a failed check) leaves GEMMs on numpy.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from typing import Any

import numpy as np

from .packed import NativeCall

__all__ = ["gemm_call", "linear_call", "numpy_sgemm", "sgemm_ready"]

_lock = threading.Lock()
_state: dict[str, Any] = {}


def _candidates() -> list[tuple[str, bool]]:
    """(sgemm symbol, takes 64-bit ints) numpy's build configuration names (sgemv: "gemm" -> "gemv")."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]  # type: ignore[index]
    except Exception:
        return []
    name = str(blas.get("name", "")).lower()
    ilp64 = "USE64BITINT" in str(blas.get("openblas configuration", ""))
    if name == "scipy-openblas":
        return [("scipy_cblas_sgemm64_", True)] if ilp64 else [("scipy_cblas_sgemm", False)]
    if name == "openblas64":
        return [("cblas_sgemm64_", True)]
    if name == "openblas":
        return [("cblas_sgemm", False)]
    return []


def _libraries() -> list[str]:
    root = os.path.dirname(os.path.dirname(np.__file__))
    pats = ("numpy.libs/*openblas*", "numpy/.dylibs/*openblas*")
    return sorted(p for pat in pats for p in glob.glob(os.path.join(root, pat)))


def numpy_sgemm() -> tuple[int, int, bool] | None:
    """(sgemm address, sgemv address, ilp64) of the BLAS numpy's matmul calls, or None when they cannot
    be found (cached)."""
    with _lock:
        if "sgemm" not in _state:
            _state["sgemm"] = _find()
        return _state["sgemm"]


def _find() -> tuple[int, bool] | None:
    for path in _libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol, ilp64 in _candidates():
            gemm, gemv = getattr(lib, symbol, None), getattr(lib, symbol.replace("gemm", "gemv"), None)
            if gemm is not None and gemv is not None:
                address = ctypes.cast(gemm, ctypes.c_void_p).value, ctypes.cast(gemv, ctypes.c_void_p).value
                return address[0], address[1], ilp64  # type: ignore[return-value]
    return None


def _verified(lib: Any) -> bool:
    """The library's GEMM / GEMV give np.matmul's bits on small products (once per loaded library: a
    rebuilt or reloaded library is set up and checked again)."""
    with _lock:
        done = _state.setdefault("checked", {}).get(id(lib))
        if done is not None and done[0] is lib:
            return done[1]
    found = numpy_sgemm()
    ok = False
    if found is not None:
        lib.opstrata_set_sgemm(found[0], found[1], int(found[2]))
        ok = _matches_numpy(lib)
        if not ok:
            lib.opstrata_set_sgemm(None, None, 0)
    with _lock:
        _state["checked"][id(lib)] = (lib, ok)
    return ok


def sgemm_ready(lib: Any) -> bool:
    """Whether ``lib``'s C code can call numpy's sgemm (found and checked once per loaded library)."""
    return _verified(lib)


def _matches_numpy(lib: Any) -> bool:
    rng = np.random.default_rng(0)
    a, b = (
        rng.standard_normal((2, 5, 7)).astype(np.float32),
        rng.standard_normal((2, 7, 6)).astype(np.float32),
    )
    c = np.empty((2, 5, 6), np.float32)
    try:
        NativeCall(lib, "batched_sgemm", (a.ctypes.data, b.ctypes.data, c.ctypes.data, 5, 6, 7, 7, 6, 6, 2,
                                          35, 42, 30, 0), (a, b, c))()  # fmt: skip
        ok = bool(np.array_equal(c, np.matmul(a, b)))
        w = rng.standard_normal((6, 7)).astype(np.float32)  # (out, in): the Linear form, B transposed
        c2 = np.empty((5, 6), np.float32)
        NativeCall(lib, "batched_sgemm", (a.ctypes.data, w.ctypes.data, c2.ctypes.data, 5, 6, 7, 7, 7, 6, 1,
                                          0, 0, 0, 1), (a, w, c2))()  # fmt: skip
        ok = ok and bool(np.array_equal(c2, np.matmul(a[0], w.T)))
        v, y = rng.standard_normal((7, 1)).astype(np.float32), np.empty((5, 1), np.float32)  # matrix @ vector
        NativeCall(lib, "batched_sgemv", (a.ctypes.data, v.ctypes.data, y.ctypes.data, 5, 7, 1, 0, 0, 0),
                   (a, v, y))()  # fmt: skip
        return ok and bool(np.array_equal(y, np.matmul(a[0], v)))
    except Exception:
        return False


def gemm_call(lib: Any, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Any:
    """A NativeCall computing ``np.matmul(a, b, out=out)`` with numpy's own sgemm calls, or None when this
    product is not one numpy runs as plain row-major GEMMs (a dim of 1, strides, dtypes, batch layouts
    other than one shared or one per-entry left operand) or the BLAS is not usable from C.

    ``a`` is ``(M, K)`` or ``(G, M, K)``; ``b`` and ``out`` are ``(..., G, K, N)`` / ``(..., G, M, N)``."""
    arrays = (a, b, out)
    if not all(type(t) is np.ndarray and t.dtype == np.float32 and t.flags.c_contiguous for t in arrays):
        return None
    if a.ndim not in (2, 3) or b.ndim < 2 or out.ndim != b.ndim or not out.flags.writeable:
        return None
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if b.shape[-2] != k or out.shape[-2:] != (m, n) or min(m, k) < 2 or n < 1:
        return None
    if out.shape[:-2] != b.shape[:-2] or np.may_share_memory(out, a) or np.may_share_memory(out, b):
        return None
    lead = b.shape[:-2]
    batch = int(np.prod(lead)) if lead else 1
    groups = a.shape[0] if a.ndim == 3 else 1
    if a.ndim == 3 and (not lead or lead[-1] != groups):
        return None  # numpy would broadcast differently
    if groups == 1:
        sa = 0
    elif batch == groups:  # one left operand per batch entry, in order
        sa = m * k
    else:
        return None
    if not _verified(lib):
        return None
    if n == 1:  # numpy's matrix @ vector: sgemv
        args = (a.ctypes.data, b.ctypes.data, out.ctypes.data, m, k, batch, sa, k, m)
        return _native(lib, "batched_sgemv", args, (a, b, out))
    args = (a.ctypes.data, b.ctypes.data, out.ctypes.data, m, n, k, k, n, n, batch, sa, k * n, m * n, 0)
    return _Gemm(lib, args, (a, b, out))


def linear_call(lib: Any, x: np.ndarray, weight: np.ndarray, out: np.ndarray) -> Any:
    """A NativeCall computing ``np.matmul(x, weight.T, out=out)`` (x ``(rows, in)``, weight ``(out, in)``,
    all C-contiguous float32: numpy's one sgemm with B transposed), or None as :func:`gemm_call`."""
    arrays = (x, weight, out)
    if not all(type(t) is np.ndarray and t.dtype == np.float32 and t.flags.c_contiguous for t in arrays):
        return None
    if x.ndim != 2 or weight.ndim != 2 or out.ndim != 2 or not out.flags.writeable:
        return None
    (m, k), n = x.shape, weight.shape[0]
    if weight.shape[1] != k or out.shape != (m, n) or min(m, n, k) < 2:
        return None
    if np.may_share_memory(out, x) or np.may_share_memory(out, weight) or not _verified(lib):
        return None
    return _Gemm(lib, (x.ctypes.data, weight.ctypes.data, out.ctypes.data, m, n, k, k, k, n, 1, 0, 0, 0, 1),
                 (x, weight, out))  # fmt: skip


def _native(lib: Any, name: str, args: tuple, keep: tuple) -> Any:
    """A NativeCall of a BLAS entry (its error: the library has no routine set)."""
    return NativeCall(lib, name, args, keep, lambda rc: RuntimeError(
        f"{name}: the native library has no BLAS routine set (code {rc})"))  # fmt: skip


def _Gemm(lib: Any, args: tuple, keep: tuple) -> Any:
    return _native(lib, "batched_sgemm", args, keep)
