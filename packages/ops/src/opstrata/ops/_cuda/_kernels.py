"""The cuda kernels: cuBLAS GEMMs and CuPy array math, NVRTC row kernels and flash attention where compiled.

Written against the array API that CuPy and numpy share (``xp``), so the same code registers on the
GPU with CuPy and runs under test on the CPU with numpy (``CudaOps(numpy)``): the composed paths are
checked against ``ref`` everywhere, the NVRTC paths (``raw``) on the GPU machine. Low precision
(float16, bfloat16) computes in float32 and rounds once, as the cpu kernels do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from .._capture import DeferredCheck, capture_checks
from .._dtypes import FLOAT_DTYPES, accumulation_dtype, compute_dtype
from .._errors import OpError
from ..kernels.attention import _check_attention
from ..kernels.conv import _check_conv
from ..kernels.pool import _check_pool
from ..kernels.reduce import normalize_axes, normalize_axis

__all__ = ["DEVICE_FLOATS", "CudaOps", "op_table"]

#: The float dtypes the cuda kernels take: float8 has no CuPy arrays (it falls back, audited).
DEVICE_FLOATS: tuple[np.dtype, ...] = tuple(d for d in FLOAT_DTYPES if d.itemsize >= 2)

_ACTS = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}
_SQRT_HALF = 0.7071067811865476
_TANH_C = 0.7978845608028654


def _scalar(v: Any) -> float | int | None:
    """``v`` as a Python number when it is a scalar (a numpy scalar keeps its dtype's rounding), else None."""
    if isinstance(v, (np.generic, int, float)) and not isinstance(v, bool):
        return v.item() if isinstance(v, np.generic) else v
    return None


class CudaOps:
    """Kernels over array module ``xp``; ``raw`` (NVRTC kernels) handles contiguous rows and attention."""

    def __init__(self, xp: ModuleType, raw: Any = None, erf: Callable[[Any], Any] | None = None) -> None:
        self.xp, self.raw = xp, raw
        self._erf = erf
        self.gpu = xp.__name__.split(".")[0] == "cupy"  # cuBLAS accumulates f16/bf16 GEMMs in float32
        self._capture_gemm: Any = None  # cuBLAS through ctypes, made on the first GEMM a capture records

    # ------------------------------------------------------------------ helpers

    def _up(self, x: Any) -> Any:
        return x.astype(compute_dtype(x.dtype), copy=False)

    def _back(self, t: Any, dtype: Any, out: Any = None) -> Any:
        if out is not None:
            out[...] = t.astype(out.dtype, copy=False)
            return out
        return t if t.dtype == dtype else t.astype(dtype)

    def contiguous(self, x: Any) -> Any:
        """``x`` in C order with its shape kept (``ascontiguousarray`` makes a 0-d array 1-d)."""
        return x if x.flags.c_contiguous else self.xp.ascontiguousarray(x).reshape(x.shape)

    def _raw_ok(self, *xs: Any) -> bool:
        return self.raw is not None and all(
            x is None or (x.dtype.name in self.raw.dtypes and x.flags.c_contiguous) for x in xs
        )

    def erf(self, x: Any) -> Any:
        if self._erf is None:
            raise OpError("erf", "x", "an erf implementation for this array module", "none configured")
        return self._erf(x)

    # ------------------------------------------------------------------ elementwise

    def _operands(self, a: Any, b: Any) -> tuple[Any, Any, Any]:
        """(a, b, dtype) for an elementwise kernel, upcast; a scalar operand (a fused constant) stays a Python
        number, a kernel argument: ``asarray`` would copy it to the device, which a recorded graph would not
        repeat while the pool reuses that memory."""
        xp = self.xp
        sa, sb = _scalar(a), _scalar(b)
        if sa is not None and sb is not None:
            a, sa = xp.asarray(a), None
        dt = (b if sa is not None else a).dtype
        ua = sa if sa is not None else self._up(xp.asarray(a))
        ub = sb if sb is not None else self._up(xp.asarray(b).astype(dt, copy=False))
        return ua, ub, dt

    def binary(self, ufunc: str) -> Callable[..., Any]:
        def kernel(a: Any, b: Any, *, out: Any = None) -> Any:
            ua, ub, dt = self._operands(a, b)
            return self._back(getattr(self.xp, ufunc)(ua, ub), dt, out)

        kernel.__name__ = f"{ufunc}_cuda"
        return kernel

    def unary(self, fn: Callable[[Any], Any], name: str) -> Callable[..., Any]:
        def kernel(x: Any) -> Any:
            x = self.xp.asarray(x)
            return self._back(fn(self._up(x)), x.dtype)

        kernel.__name__ = f"{name}_cuda"
        return kernel

    def sigmoid(self, t: Any) -> Any:
        return 1 / (1 + self.xp.exp(-t))

    def relu(self, t: Any) -> Any:
        return self.xp.maximum(
            t, 0
        )  # NaN stays NaN, -inf -> 0 (found by the conformance matrix: t * 0 was NaN)

    def gelu_f(self, t: Any, approximate: str = "none") -> Any:
        if approximate == "tanh":
            return 0.5 * t * (1 + self.xp.tanh(_TANH_C * (t + 0.044715 * t * t * t)))
        return 0.5 * t * (1 + self.erf(t * _SQRT_HALF))

    def gelu(self, x: Any, *, approximate: str = "none") -> Any:
        if approximate not in ("none", "tanh"):
            raise OpError("gelu", "approximate", "'none' or 'tanh'", repr(approximate))
        if self._raw_ok(x):
            return self.raw.bias_act(x, None, None, "gelu_tanh" if approximate == "tanh" else "gelu")
        return self._back(self.gelu_f(self._up(x), approximate), x.dtype)

    def silu(self, x: Any) -> Any:
        if self._raw_ok(x):
            return self.raw.bias_act(x, None, None, "silu")
        t = self._up(x)
        return self._back(t * self.sigmoid(t), x.dtype)

    def bias_act(
        self, x: Any, bias: Any = None, residual: Any = None, *, act: str = "gelu", out: Any = None
    ) -> Any:
        if act not in _ACTS or act == "none":
            raise OpError("bias_act", "act", f"one of {sorted(a for a in _ACTS if a != 'none')}", repr(act))
        if bias is not None:
            bias = bias.astype(x.dtype, copy=False)
        if residual is not None:
            residual = residual.astype(x.dtype, copy=False)
        if self._raw_ok(x, bias, residual, out) and (residual is None or residual.shape == x.shape):
            return self.raw.bias_act(x, bias, residual, act, out=out)
        t = self._up(x)
        if bias is not None:
            t = t + self._up(bias)
        if act == "relu":
            y = self.relu(t)
        elif act == "silu":
            y = t * self.sigmoid(t)
        else:
            y = self.gelu_f(t, "tanh" if act == "gelu_tanh" else "none")
        if residual is not None:
            y = y + self._up(residual)
        return self._back(y, x.dtype, out)

    # ------------------------------------------------------------------ reductions

    def reduction(self, name: str) -> Callable[..., Any]:
        def kernel(x: Any, *, axis: Any = None, keepdims: bool = False) -> Any:
            axes = normalize_axes(name, x, axis)
            if name in ("max", "min"):
                if any(x.shape[a] == 0 for a in axes):
                    raise OpError(name, "x", "non-empty reduced dims", f"shape {x.shape}, axes {axes}")
                return self.xp.asarray(getattr(x, name)(axis=axes, keepdims=keepdims))
            t = x.astype(accumulation_dtype(x.dtype), copy=False)
            r = t.sum(axis=axes, keepdims=keepdims)
            if name == "mean":
                count = math.prod(x.shape[a] for a in axes)
                r = r / count if count else r * float("nan")
            return self._back(self.xp.asarray(r), x.dtype)

        kernel.__name__ = f"{name}_cuda"
        return kernel

    # ------------------------------------------------------------------ softmax and norms

    def _rows(self, x: Any, axis: int) -> Any:
        """``x`` with ``axis`` moved last, contiguous, as (rows, cols)."""
        return self.contiguous(self.xp.moveaxis(x, axis, -1))

    def _softmax(self, x: Any, axis: int, log: bool) -> Any:
        op = "log_softmax" if log else "softmax"
        ax = normalize_axis(op, x, axis)
        if x.size and self._raw_ok(x):
            moved = self._rows(x, ax)
            y = self.raw.softmax(moved.reshape(-1, moved.shape[-1]), log).reshape(moved.shape)
            return self.xp.moveaxis(y, -1, ax)
        xp, t = self.xp, self._up(x)
        m = (
            xp.max(t, axis=ax, keepdims=True)
            if x.shape[ax]
            else xp.zeros_like(xp.sum(t, axis=ax, keepdims=True))
        )
        m = xp.where(xp.isneginf(m), 0, m)
        e = xp.exp(t - m)
        s = xp.sum(e, axis=ax, keepdims=True)
        if log:
            return self._back(t - m - xp.log(xp.where(s == 0, 1, s)) + xp.where(s == 0, -xp.inf, 0), x.dtype)
        return self._back(e / xp.where(s == 0, 1, s), x.dtype)

    def softmax(self, x: Any, *, axis: int = -1) -> Any:
        return self._softmax(x, axis, False)

    def log_softmax(self, x: Any, *, axis: int = -1) -> Any:
        return self._softmax(x, axis, True)

    def _norm_params(self, op: str, x: Any, axis: int, **params: Any) -> tuple[int, list[Any]]:
        a = normalize_axis(op, x, axis)
        shape = tuple(x.shape[a:])
        out = []
        for name, p in params.items():
            if p is not None and tuple(p.shape) != shape:
                raise OpError(op, name, f"shape x.shape[axis:] = {shape}", str(tuple(p.shape)))
            out.append(None if p is None else self.contiguous(p.astype(x.dtype, copy=False)))
        return a, out

    def _norm(
        self, kind: str, x: Any, residual: Any, w: Any, b: Any, a: int, eps: float, want_sum: bool
    ) -> Any:
        """(y, sum) of layer/rms norm over dims a..end of x (+ residual); sum only when asked."""
        xp = self.xp
        if x.size and self._raw_ok(x, residual):
            cols = math.prod(x.shape[a:])
            x2 = self.contiguous(x).reshape(-1, cols)
            r2 = None if residual is None else self.contiguous(residual).reshape(-1, cols)
            y, s = self.raw.norm(kind, x2, r2, w, b, eps, want_sum)
            return y.reshape(x.shape), None if s is None else s.reshape(x.shape)
        t = self._up(x) if residual is None else self._up(x) + self._up(residual)
        dims = tuple(range(a, x.ndim))
        if kind == "layer_norm":
            mu = t.mean(axis=dims, keepdims=True)
            var = ((t - mu) * (t - mu)).mean(axis=dims, keepdims=True)
            y = (t - mu) / xp.sqrt(var + eps)
        else:
            y = t / xp.sqrt((t * t).mean(axis=dims, keepdims=True) + eps)
        if w is not None:
            y = y * self._up(w)
        if b is not None:
            y = y + self._up(b)
        return self._back(y, x.dtype), (self._back(t, x.dtype) if want_sum else None)

    def layer_norm(
        self,
        x: Any,
        weight: Any = None,
        bias: Any = None,
        *,
        axis: int = -1,
        eps: float = 1e-5,
        out: Any = None,
    ) -> Any:
        a, (w, b) = self._norm_params("layer_norm", x, axis, weight=weight, bias=bias)
        y, _ = self._norm("layer_norm", x, None, w, b, a, eps, False)
        return self._back(y, x.dtype, out)

    def rms_norm(self, x: Any, weight: Any = None, *, axis: int = -1, eps: float = 1e-6) -> Any:
        a, (w,) = self._norm_params("rms_norm", x, axis, weight=weight)
        return self._norm("rms_norm", x, None, w, None, a, eps, False)[0]

    def add_layer_norm(
        self,
        x: Any,
        residual: Any,
        weight: Any = None,
        bias: Any = None,
        *,
        eps: float = 1e-5,
        return_sum: bool = False,
    ) -> Any:
        a, (w, b) = self._norm_params("add_layer_norm", x, -1, weight=weight, bias=bias)
        y, s = self._norm("layer_norm", x, self._same(x, residual), w, b, a, eps, return_sum)
        return (y, s) if return_sum else y

    def add_rms_norm(
        self, x: Any, residual: Any, weight: Any = None, *, eps: float = 1e-6, return_sum: bool = False
    ) -> Any:
        a, (w,) = self._norm_params("add_rms_norm", x, -1, weight=weight)
        y, s = self._norm("rms_norm", x, self._same(x, residual), w, None, a, eps, return_sum)
        return (y, s) if return_sum else y

    def _same(self, x: Any, r: Any) -> Any:
        return self.xp.broadcast_to(self.xp.asarray(r), x.shape).astype(x.dtype, copy=False)

    # ------------------------------------------------------------------ GEMMs

    def _mm(self, a: Any, b: Any) -> Any:
        """a @ b accumulating in float32 for low precision (cuBLAS does so natively on the GPU). While a device
        graph is recorded, cuBLAS is called directly: CuPy's wrappers refuse to run during stream capture."""
        if self.gpu and capture_checks() is not None:
            if self._capture_gemm is None:
                from ._cublas import CublasCaptureGemm

                self._capture_gemm = CublasCaptureGemm(self.xp)
            return self._capture_gemm(a, b)
        if self.gpu or compute_dtype(a.dtype) == a.dtype:
            return self.xp.matmul(a, b)
        return self.xp.matmul(self._up(a), self._up(b)).astype(a.dtype)

    def matmul(self, a: Any, b: Any, *, out: Any = None) -> Any:
        if a.dtype != b.dtype:
            raise OpError("matmul", "b", f"dtype {a.dtype} (same as a)", str(b.dtype))
        return self._back(self._mm(a, b), a.dtype, out)

    def linear(self, x: Any, weight: Any, bias: Any = None, *, out: Any = None) -> Any:
        if weight.ndim != 2 or x.shape[-1] != weight.shape[1]:
            raise OpError("linear", "weight", f"shape (out, {x.shape[-1]})", str(tuple(weight.shape)))
        y = self._mm(x, weight.T)
        if bias is not None:
            y = self._back(self._up(y) + self._up(bias), x.dtype)
        return self._back(y, x.dtype, out)

    def gemm(
        self,
        a: Any,
        b: Any,
        c: Any = None,
        *,
        alpha: float = 1.0,
        beta: float = 1.0,
        trans_a: bool = False,
        trans_b: bool = False,
    ) -> Any:
        at, bt = (a.T if trans_a else a), (b.T if trans_b else b)
        if at.ndim != 2 or bt.ndim != 2 or at.shape[1] != bt.shape[0]:
            raise OpError(
                "gemm", "b", f"a (M, K) and b (K, N) after transposes; a is {at.shape}", str(bt.shape)
            )
        y = self._up(self._mm(at, bt)) * alpha
        if c is not None:
            y = y + beta * self._up(c)
        return self._back(y, a.dtype)

    # ------------------------------------------------------------------ embedding, conv, attention

    def embedding(self, indices: Any, weight: Any) -> Any:
        xp = self.xp
        idx = xp.asarray(indices)
        if weight.ndim != 2:
            raise OpError("embedding", "weight", "2-D [num_embeddings, embedding_dim]", f"{weight.ndim}-D")
        idx = self._checked_indices("embedding", idx, 0, weight.shape[0])
        return xp.take(weight, idx, axis=0)

    def _checked_indices(self, op: str, idx: Any, lo: int, hi: int) -> Any:
        """``idx`` known to lie in [lo, hi): checked eagerly (min and max read back together: one sync), or,
        while a device graph is recorded, clamped on the device with the check deferred to after each
        replay (no read back)."""
        if not idx.size:
            return idx
        checks = capture_checks()
        xp = self.xp
        if checks is None:
            least, most = (int(v) for v in xp.stack((idx.min(), idx.max())).tolist())
            if least < lo or most >= hi:
                raise OpError(op, "indices", f"values in [{lo}, {hi})", f"[{least}, {most}]")
            return idx
        flag = xp.asarray(xp.logical_or(idx.min() < lo, idx.max() >= hi))  # a 0-d device array
        checks.append(DeferredCheck(op, "indices", f"values in [{lo}, {hi})", flag))
        return xp.clip(idx, lo, hi - 1)

    def _windows(self, xpad: Any, kernel: Any, stride: Any, dilation: Any, out_hw: Any) -> Any:
        """A (N, C, Ho, Wo, kh, kw) strided view of padded NCHW ``xpad``: every window, no copy."""
        (kh, kw), (sh, sw), (dh, dw), (ho, wo) = kernel, stride, dilation, out_hw
        s = xpad.strides
        shape = (*xpad.shape[:2], ho, wo, kh, kw)
        return self.xp.lib.stride_tricks.as_strided(
            xpad, shape, (s[0], s[1], s[2] * sh, s[3] * sw, s[2] * dh, s[3] * dw)
        )

    def conv2d(
        self,
        x: Any,
        weight: Any,
        bias: Any = None,
        *,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
    ) -> Any:
        """im2col by strided windows, then one batched GEMM per group (cuBLAS on the GPU)."""
        xp = self.xp
        g = _check_conv(x, weight, bias, stride, padding, dilation, groups)
        top, left, bottom, right = g.pads
        xpad = xp.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
        n = x.shape[0]
        o, cg, kh, kw = weight.shape
        ho, wo = g.out_hw
        win = self._windows(xpad, (kh, kw), g.stride, g.dilation, (ho, wo))  # (N, C, Ho, Wo, kh, kw)
        cols = xp.moveaxis(win, (4, 5), (2, 3))  # (N, C, kh, kw, Ho, Wo): the GEMM's K before L
        cols = xp.ascontiguousarray(cols).reshape(n, g.groups, cg * kh * kw, ho * wo)
        w = weight.reshape(g.groups, o // g.groups, cg * kh * kw)
        y = self._mm(w[None], cols).reshape(n, o, ho, wo)  # (N, G, Og, L) -> (N, O, Ho, Wo)
        if bias is not None:
            y = self._back(self._up(y) + self._up(bias)[:, None, None], x.dtype)
        return y

    def max_pool2d(
        self,
        x: Any,
        *,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        ceil_mode: bool = False,
    ) -> Any:
        """Windows by strides over the -inf-padded input, then one max over the window axes."""
        xp = self.xp
        g = _check_pool("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode)
        top, left, bottom, right = g.pads
        pad = ((0, 0), (0, 0), (top, bottom + g.extra[0]), (left, right + g.extra[1]))
        xpad = xp.pad(x, pad, constant_values=-xp.inf)
        win = self._windows(xpad, g.kernel, g.stride, g.dilation, g.out_hw)
        return self.contiguous(win.max(axis=(-2, -1)))

    def avg_pool2d(
        self,
        x: Any,
        *,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ) -> Any:
        """Windows by strides over the zero-padded input summed in the compute dtype, over torch's divisors."""
        xp = self.xp
        g = _check_pool("avg_pool2d", x, kernel_size, stride, padding, 1, ceil_mode)
        top, left, bottom, right = g.pads
        pad = ((0, 0), (0, 0), (top, bottom + g.extra[0]), (left, right + g.extra[1]))
        xpad = xp.pad(self._up(x), pad)
        total = self._windows(xpad, g.kernel, g.stride, (1, 1), g.out_hw).sum(axis=(-2, -1))
        return self.contiguous(
            self._back(total / self._avg_divisor(g, x.shape[2:], count_include_pad, total.dtype), x.dtype)
        )

    def _avg_divisor(self, g: Any, hw: Any, count_include_pad: bool, dtype: Any) -> Any:
        """torch's (Ho, Wo) divisors built on the device (no host upload, so a device graph can record it)."""
        xp = self.xp
        per_axis = []
        for ax in (0, 1):
            start = xp.arange(g.out_hw[ax]) * g.stride[ax] - g.pads[ax]
            end = xp.minimum(start + g.kernel[ax], hw[ax] + g.pads[ax + 2])
            if not count_include_pad:
                start, end = xp.maximum(start, 0), xp.minimum(end, hw[ax])
            per_axis.append((end - start).astype(dtype))
        return per_axis[0][:, None] * per_axis[1][None, :]

    def attention(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        causal: bool = False,
        mask: Any = None,
        scale: float | None = None,
        return_lse: bool = False,
    ) -> Any:
        s = _check_attention(q, k, v, mask)
        sc = 1.0 / math.sqrt(s.d) if scale is None else float(scale)
        if mask is None and s.d == s.dv and self._raw_ok(q, k, v) and self.raw.flash_supports(s.d):
            out, lse = self.raw.flash(q, k, v, sc, causal, return_lse)
            return (out, lse) if return_lse else out
        return self._attention_composed(q, k, v, s, causal, mask, sc, return_lse)

    def _attention_composed(self, q, k, v, s, causal, mask, sc, return_lse):  # type: ignore[no-untyped-def]
        xp = self.xp
        acc = accumulation_dtype(q.dtype)
        group = s.h // s.hkv
        kk = xp.repeat(k.astype(acc), group, axis=1)
        vv = xp.repeat(v.astype(acc), group, axis=1)
        scores = xp.matmul(q.astype(acc), xp.swapaxes(kk, -1, -2)) * acc.type(sc)  # (B, H, N, M)
        keep = xp.ones((s.n, s.m), bool)
        if causal:
            keep = xp.arange(s.m)[None, :] <= xp.arange(s.n)[:, None] + (s.m - s.n)
        if mask is not None and mask.dtype == np.bool_:
            keep = keep & mask
        elif mask is not None:
            scores = scores + mask.astype(acc)
        scores = xp.where(keep, scores, -xp.inf)
        row_max = (
            scores.max(axis=-1, keepdims=True) if s.m else xp.full((*scores.shape[:-1], 1), -xp.inf, acc)
        )
        empty = xp.isneginf(row_max)
        w = xp.exp(scores - xp.where(empty, 0, row_max))
        total = w.sum(axis=-1, keepdims=True)
        probs = xp.where(empty, 0, w / xp.where(empty, 1, total))
        out = xp.matmul(probs, vv).astype(q.dtype)
        if not return_lse:
            return out
        lse = xp.where(empty, -xp.inf, row_max + xp.log(xp.where(empty, 1, total)))[..., 0]
        return out, lse

    def compare(self, ufunc: str) -> Callable[..., Any]:
        def kernel(a: Any, b: Any) -> Any:
            ua, ub, _ = self._operands(a, b)
            return getattr(self.xp, ufunc)(ua, ub)

        kernel.__name__ = f"{ufunc}_cuda"
        return kernel

    def rope_rotate_half(self, x: Any, cos: Any, sin: Any, *, out: Any = None) -> Any:
        """``x cos + rotate_half(x) sin`` with rotate_half(x) = [-x2, x1] over the last dim."""
        xp, t = self.xp, self._up(x)
        h = x.shape[-1] // 2
        rot = xp.concatenate([-t[..., h:], t[..., :h]], axis=-1)
        return self._back(t * self._up(cos) + rot * self._up(sin), x.dtype, out)

    # ------------------------------------------------------------------ layout

    def gather(self, x: Any, indices: Any, *, axis: int = 0) -> Any:
        xp = self.xp
        ax = normalize_axis("gather", x, axis)
        idx = xp.asarray(indices)
        dim = x.shape[ax]
        idx = self._checked_indices("gather", idx, -dim, dim)
        return xp.take(x, xp.where(idx < 0, idx + dim, idx), axis=ax)

    def expand(self, x: Any, *, shape: Any) -> Any:
        target = np.broadcast_shapes(tuple(x.shape), tuple(int(d) for d in shape))
        return self.contiguous(self.xp.broadcast_to(x, target))

    def transpose(self, x: Any, *, perm: Any = None) -> Any:
        return self.contiguous(self.xp.transpose(x, None if perm is None else tuple(perm)))

    def reshape(self, x: Any, *, shape: Any) -> Any:
        return self.xp.reshape(x, tuple(int(d) for d in shape))

    def concat(self, arrays: Any, *, axis: int = 0) -> Any:
        return self.xp.concatenate(list(arrays), axis=axis)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        return self.xp.where(cond, a, b)

    def cast(self, x: Any, *, dtype: Any) -> Any:
        return x.astype(np.dtype(dtype))


def op_table(k: CudaOps) -> dict[str, tuple[Callable[..., Any], tuple[Any, ...], int]]:
    """The cuda device's coverage: ``{op: (kernel, dtypes of the primary argument, its position)}``."""
    f = DEVICE_FLOATS
    xp = k.xp
    t: dict[str, tuple[Callable[..., Any], tuple[Any, ...], int]] = {}  # op -> (kernel, dtypes, dtype_arg)
    for name, ufunc in (
        ("add", "add"),
        ("sub", "subtract"),
        ("mul", "multiply"),
        ("div", "divide"),
        ("pow", "power"),
    ):
        t[name] = (k.binary(ufunc), f, 0)
    unary = {
        "neg": lambda u: -u,
        "abs": xp.abs,
        "exp": xp.exp,
        "log": xp.log,
        "sqrt": xp.sqrt,
        "rsqrt": lambda u: 1 / xp.sqrt(u),
        "tanh": xp.tanh,
        "sin": xp.sin,
        "cos": xp.cos,
        "sigmoid": k.sigmoid,
        "relu": k.relu,
    }
    for name, fn in unary.items():
        t[name] = (k.unary(fn, name), f, 0)
    if k._erf is not None:
        t["erf"] = (k.unary(k._erf, "erf"), f, 0)
        t["gelu"] = (k.gelu, f, 0)
        t["bias_act"] = (k.bias_act, f, 0)
    elif k.raw is not None:
        t["gelu"] = (k.gelu, f, 0)
        t["bias_act"] = (k.bias_act, f, 0)
    for name in ("sum", "mean", "max", "min"):
        t[name] = (k.reduction(name), f, 0)
    for name in (
        "silu", "softmax", "log_softmax", "layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm",
        "matmul", "linear", "gemm", "conv2d", "max_pool2d", "avg_pool2d", "attention", "transpose",
        "reshape", "cast",
    ):  # fmt: skip
        t[name] = (getattr(k, name), f, 0)
    for name, ufunc in (("greater", "greater"), ("less", "less"), ("equal", "equal")):
        t[name] = (k.compare(ufunc), f, 0)
    t["concat"] = (k.concat, f, 0)
    t["gather"] = (k.gather, f, 0)
    t["expand"] = (k.expand, f, 0)
    t["rope_rotate_half"] = (k.rope_rotate_half, f, 0)
    t["embedding"] = (k.embedding, f, 1)
    t["where"] = (k.where, f, 1)
    return t
