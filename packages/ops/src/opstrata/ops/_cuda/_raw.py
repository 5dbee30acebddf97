"""The NVRTC kernels of ``_sources`` compiled once through CuPy and launched on CuPy arrays.

One :class:`RawKernels` per process: ``cupy.RawModule`` compiles ``SOURCE`` for the visible GPU on
first use (CuPy caches the binary on disk); each method checks nothing the caller has not (contiguous
arrays of a supported dtype) and launches on CuPy's current stream.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np

from . import _sources as src

__all__ = ["RawKernels"]

_NULL = np.uint64(0)  # a null pointer argument (optional residual / weight / bias / output)


class RawKernels:
    """Launchers for the row kernels (softmax, layer/RMS norm), bias + activation, and flash attention."""

    dtypes = frozenset(src.DTYPE_SUFFIX)

    def __init__(self, cp: ModuleType) -> None:
        self.cp = cp
        self._module: Any = None
        self._fns: dict[str, Any] = {}
        cc = int(cp.cuda.Device().compute_capability)  # "90" on Hopper
        #: Tensor-core flash attention for float16/bfloat16 from sm_80; OPSTRATA_CUDA_FLASH=plain turns it off.
        self.flash_mma = cc >= src.FLASH_MMA_MIN_CC and os.environ.get("OPSTRATA_CUDA_FLASH", "") != "plain"

    def function(self, name: str) -> Any:
        """The compiled kernel ``name`` (compiling the module on the first call)."""
        fn = self._fns.get(name)
        if fn is None:
            if self._module is None:
                self._module = self.cp.RawModule(code=src.SOURCE, options=("-std=c++17",))
            fn = self._fns[name] = self._module.get_function(name)
        return fn

    def _ptr(self, a: Any) -> Any:
        return _NULL if a is None else a

    def softmax(self, x2: Any, log: bool) -> Any:
        rows, cols = x2.shape
        y = self.cp.empty_like(x2)
        fn = self.function(src.kernel_name("softmax", x2.dtype.name))
        fn((rows,), (src.ROW_THREADS,), (x2, y, np.int32(rows), np.int32(cols), np.int32(int(log))))
        return y

    def norm(
        self, kind: str, x2: Any, r2: Any, w: Any, b: Any, eps: float, want_sum: bool
    ) -> tuple[Any, Any]:
        rows, cols = x2.shape
        y = self.cp.empty_like(x2)
        s = self.cp.empty_like(x2) if want_sum else None
        fn = self.function(src.kernel_name(kind, x2.dtype.name))
        w = None if w is None else w.reshape(-1)
        dims = (np.int32(rows), np.int32(cols), np.float32(eps))
        if kind == "layer_norm":
            b = None if b is None else b.reshape(-1)
            args = (x2, self._ptr(r2), self._ptr(w), self._ptr(b), y, self._ptr(s), *dims)
        else:
            args = (x2, self._ptr(r2), self._ptr(w), y, self._ptr(s), *dims)
        fn((rows,), (src.ROW_THREADS,), args)
        return y, s

    def bias_act(self, x: Any, bias: Any, residual: Any, act: str, out: Any = None) -> Any:
        y = self.cp.empty_like(x) if out is None else out
        n = x.size
        if n == 0:
            return y
        cols = x.shape[-1] if x.ndim else 1
        if bias is not None and bias.size != cols:
            bias = self.cp.ascontiguousarray(self.cp.broadcast_to(bias, x.shape))
            cols = n
        grid, block = src.elementwise_launch(n)
        fn = self.function(src.kernel_name("bias_act", x.dtype.name))
        args = (
            x,
            self._ptr(bias),
            self._ptr(residual),
            y,
            np.int64(n),
            np.int32(cols),
            np.int32(src.ACTIVATIONS[act]),
        )
        fn(grid, block, args)
        return y

    def flash_supports(self, head_dim: int) -> bool:
        return head_dim in src.FLASH_HEAD_DIMS

    def flash(self, q: Any, k: Any, v: Any, scale: float, causal: bool, want_lse: bool) -> tuple[Any, Any]:
        b, h, n, d = q.shape
        hkv, m = k.shape[1], k.shape[2]
        o = self.cp.empty_like(q)
        lse = self.cp.empty((b, h, n), self.cp.float32) if want_lse else None
        if o.size == 0:
            return o, lse
        if self.flash_mma and q.dtype.name in src.FLASH_MMA_DTYPES:
            grid, block, shared = src.flash_launch_mma(q.dtype.name, b, h, n, d)
            fn = self.function(src.kernel_name("flash_attn_mma", q.dtype.name, d))
        else:
            grid, block, shared = src.flash_launch(q.dtype.name, b, h, n, d)
            fn = self.function(src.kernel_name("flash_attn", q.dtype.name, d))
        args = (
            q,
            k,
            v,
            o,
            self._ptr(lse),
            *(np.int32(t) for t in (b, h, hkv, n, m)),
            np.float32(scale),
            np.int32(int(causal)),
        )
        fn(grid, block, args, shared_mem=shared)
        return o, lse
