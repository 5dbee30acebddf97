"""Elementwise kernels — arithmetic, comparisons, unary math, clip, where, cast — on ``ref`` and ``cpu``.

Semantics follow numpy broadcasting and the ONNX/PyTorch operator definitions. This module also holds
the base helpers every kernel-a module uses: operand validation and promotion (the rule of promotion
is :func:`opstrata.ops._dtypes.result_dtype`; Python scalars are *weak* and take the array's dtype),
compute-dtype buffers and the single cast back.

Rule of computation: low-precision floats (float16, bfloat16, float8_*) are evaluated in float32 and
rounded to their own dtype once at the end; float32/float64 are evaluated in their own dtype.
Sign, magnitude, comparison and selection ops (neg, abs, clip, where, equal/less/greater) are exact
and run in the input dtype.
float8_e4m3fn has no infinities: a result that would be +-inf (overflow, x/0) is NaN in that dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from .._devices import STATE as _STATE, is_device_array
from .._dtypes import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    LOW_PRECISION_DTYPES,
    TENSOR_DTYPES,
    as_dtype,
    bool_,
    compute_dtype,
    float64,
    int64,
    result_dtype,
)
from .._errors import OpError, check_dtype
from .._registry import call, register, register_decomposition

FLOATS: tuple[np.dtype, ...] = FLOAT_DTYPES
NUMERIC: tuple[np.dtype, ...] = FLOAT_DTYPES + INT_DTYPES
SIGNED_NUMERIC: tuple[np.dtype, ...] = FLOAT_DTYPES + tuple(d for d in INT_DTYPES if d.kind == "i")
ANY: tuple[np.dtype, ...] = ALL_DTYPES
ANY_TENSOR: tuple[np.dtype, ...] = TENSOR_DTYPES  # select and equality also move/compare strings

F = TypeVar("F", bound=Callable[..., Any])


# --------------------------------------------------------------------------- base helpers


def ieee(fn: F) -> F:
    """Run a kernel with numpy FP warnings off: inf/NaN results are IEEE answers, not errors (as torch)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def nd(x: Any) -> np.ndarray:
    """``x`` as an ndarray without copying (ufuncs return numpy scalars for 0-d inputs); an array of a
    device memory (a CuPy array) passes as it is, for the device's kernels (or the audited fallback) to take."""
    if isinstance(x, np.ndarray):
        return x
    if _STATE.memories and is_device_array(x):
        return x  # type: ignore[no-any-return]
    return np.asarray(x)


def is_weak(v: Any) -> bool:
    """True for Python bool/int/float scalars, which adopt the dtype of the array they meet."""
    return isinstance(v, (bool, int, float)) and not isinstance(v, np.generic)


def promoted_dtype(*args: Any) -> np.dtype:
    """Result dtype of an elementwise op over ``args`` (arrays strong, Python scalars weak)."""
    strong = [nd(a).dtype for a in args if not is_weak(a)]
    if not strong:
        dt = np.result_type(*args)
    else:
        dt = strong[0] if all(d == strong[0] for d in strong) else result_dtype(*strong)
        for w in (a for a in args if is_weak(a)):
            if isinstance(w, float) and dt not in FLOAT_DTYPES:
                dt = result_dtype(dt, float64)  # int array * 2.5 -> float64, numpy's rule
            elif not isinstance(w, bool) and dt == bool_:
                dt = int64
    return np.dtype(dt)  # every numpy integer width is an opstrata dtype: no widening needed


def promote(*args: Any) -> list[np.ndarray]:
    """Operands as arrays of their common dtype (kernel side: no validation, fast when already equal)."""
    if all(isinstance(a, np.ndarray) for a in args) and all(a.dtype == args[0].dtype for a in args):
        return list(args)
    dt = promoted_dtype(*args)
    return [np.asarray(a, dtype=dt) if is_weak(a) else nd(a).astype(dt, copy=False) for a in args]


def dtype_names(allowed: Sequence[np.dtype]) -> str:
    return ", ".join(str(d) for d in allowed)


_SETS: dict[int, frozenset[np.dtype]] = {}


def _allowed_set(allowed: Sequence[np.dtype]) -> frozenset[np.dtype]:
    """Hash set of a module-level dtype tuple, cached by identity: one dict hit per call, not 10 compares."""
    found = _SETS.get(id(allowed))
    if found is None:
        found = _SETS[id(allowed)] = frozenset(allowed)
    return found


def checked(op: str, name: str, x: Any, allowed: Sequence[np.dtype]) -> np.ndarray:
    """``x`` as an array whose dtype is in ``allowed``, else :class:`OpError` naming ``op`` and ``name``."""
    x = nd(x)
    if x.dtype not in _allowed_set(allowed):
        check_dtype(op, name, x, allowed)  # raises with the uniform message
    return x


def operands(
    op: str, names: Sequence[str], args: Sequence[Any], allowed: Sequence[np.dtype]
) -> list[np.ndarray]:
    """Validate, promote and broadcast-check the operands of a public elementwise op."""
    first = args[0]
    if type(first) is np.ndarray and all(type(a) is np.ndarray and a.dtype == first.dtype for a in args[1:]):
        if first.dtype in _allowed_set(allowed) and all(a.shape == first.shape for a in args[1:]):
            return list(args)  # fast path: same dtype and shape, nothing to promote or broadcast
    tensor_types = ANY_TENSOR if allowed is ANY_TENSOR else ANY  # strings only where the op moves them
    for name, a in zip(names, args, strict=True):
        if not is_weak(a):
            checked(op, name, a, tensor_types)
    dt = promoted_dtype(*args)
    if dt not in _allowed_set(allowed):
        for name, a in zip(names, args, strict=True):
            if not is_weak(a):
                checked(op, name, a, allowed)
        raise OpError(op, names[0], f"operands promoting to one of ({dtype_names(allowed)})", f"{dt}")
    shapes = [np.shape(a) for a in args]
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        got = ", ".join(f"{n}: {s}" for n, s in zip(names, shapes, strict=True))
        raise OpError(op, names[-1], "shapes that broadcast together (numpy rules)", got) from None
    out = []
    for name, a in zip(names, args, strict=True):
        try:
            out.append(np.asarray(a, dtype=dt) if is_weak(a) else nd(a).astype(dt, copy=False))
        except OverflowError:
            raise OpError(op, name, f"a value representable in {dt}", repr(a)) from None
    return out


def check_out(op: str, out: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """Validate an ``out=`` buffer: an ndarray of exactly the result shape and dtype."""
    if out is None:
        return
    if not isinstance(out, np.ndarray) or out.shape != tuple(shape) or out.dtype != dtype:
        got = f"shape {getattr(out, 'shape', None)}, dtype {getattr(out, 'dtype', type(out).__name__)}"
        raise OpError(op, "out", f"an ndarray of shape {tuple(shape)} and dtype {dtype}", got)


def same_view(a: np.ndarray, b: np.ndarray) -> bool:
    """True when ``a`` and ``b`` are the same elements in the same layout (an elementwise op may run in place)."""
    ia, ib = a.__array_interface__, b.__array_interface__
    return ia["data"] == ib["data"] and a.shape == b.shape and a.strides == b.strides


def check_out_overlap(op: str, out: np.ndarray, x: np.ndarray, **others: Any) -> None:
    """``out`` is x itself (in place) or overlaps neither x nor any of ``others`` (None skipped)."""
    for name, a in (("x", x), *others.items()):
        if a is None or (name == "x" and same_view(a, out)):
            continue
        if np.shares_memory(a, out):
            raise OpError(
                op, "out", f"a buffer that is x itself or does not overlap {name}", "an overlapping view"
            )


def upcast(x: np.ndarray) -> np.ndarray:
    """``x`` in its compute dtype (float32 for low precision; no copy otherwise)."""
    return x.astype(compute_dtype(x.dtype), copy=False)


def cast_back(t: Any, dtype: np.dtype, out: np.ndarray | None = None) -> np.ndarray:
    """Round a compute-dtype result to ``dtype`` once; write into ``out`` when given."""
    if out is not None:
        np.copyto(out, t, casting="unsafe")
        return out
    t = nd(t)
    return t if t.dtype == dtype else t.astype(dtype)


def const(value: float, dtype: np.dtype) -> np.ndarray:
    """A 0-d constant of ``dtype`` for decompositions: same dtype as the data, so it dispatches alike."""
    return np.asarray(value, dtype=dtype)


def buffer_op(ufunc: np.ufunc, x: np.ndarray, *more: Any) -> np.ndarray:
    """``ufunc(x, *more)`` evaluated in x's compute dtype into a fresh buffer that later steps may reuse."""
    cdt = compute_dtype(x.dtype)
    shape = np.broadcast_shapes(np.shape(x), *(np.shape(m) for m in more))
    return ufunc(x, *more, out=np.empty(shape, cdt), dtype=cdt)


# --------------------------------------------------------------------------- binary arithmetic


def _public_binary(op: str, a: Any, b: Any, out: np.ndarray | None, device: str | None, allowed: Any) -> Any:
    a, b = operands(op, ("a", "b"), (a, b), allowed)
    if out is not None:
        check_out(op, out, np.broadcast_shapes(a.shape, b.shape), a.dtype)
    return call(op, a, b, out=out, device=device)


def add(a: Any, b: Any, *, out: np.ndarray | None = None, device: str | None = None) -> np.ndarray:
    """Elementwise ``a + b`` with broadcasting.

    Floats and ints; low precision computes in float32 and rounds once; ints wrap on overflow.

    >>> add(np.array([1.0, 2.0]), 3.0)
    array([4., 5.])
    """
    return _public_binary("add", a, b, out, device, NUMERIC)


def sub(a: Any, b: Any, *, out: np.ndarray | None = None, device: str | None = None) -> np.ndarray:
    """Elementwise ``a - b`` with broadcasting (floats and ints, as :func:`add`).

    >>> sub(np.array([1, 2]), 1)
    array([0, 1])
    """
    return _public_binary("sub", a, b, out, device, NUMERIC)


def mul(a: Any, b: Any, *, out: np.ndarray | None = None, device: str | None = None) -> np.ndarray:
    """Elementwise ``a * b`` with broadcasting (floats and ints, as :func:`add`).

    >>> mul(np.array([1.5, 2.0]), 2.0)
    array([3., 4.])
    """
    return _public_binary("mul", a, b, out, device, NUMERIC)


def div(a: Any, b: Any, *, out: np.ndarray | None = None, device: str | None = None) -> np.ndarray:
    """Elementwise true division ``a / b``; floats only (cast integer inputs first); x/0 is ±inf or NaN.

    Low precision computes in float32 and rounds once.

    >>> div(np.array([1.0, 3.0]), 2.0)
    array([0.5, 1.5])
    """
    return _public_binary("div", a, b, out, device, FLOATS)


def pow(a: Any, b: Any, *, out: np.ndarray | None = None, device: str | None = None) -> np.ndarray:
    """Elementwise ``a ** b``; floats and ints; a negative float base with a fractional exponent gives NaN.

    Low precision computes in float32 and rounds once. Integers: exact and wrapping for ``b >= 0``;
    a negative exponent gives ``trunc(a ** b)`` (1 or -1 for ``|a| == 1``, else 0; ``0 ** -n`` is 0).

    >>> pow(np.array([2.0, 3.0]), 2.0)
    array([4., 9.])
    """
    return _public_binary("pow", a, b, out, device, NUMERIC)


def _ref_binary(
    fn: Callable[[np.ndarray, np.ndarray], Any], a: Any, b: Any, out: np.ndarray | None
) -> np.ndarray:
    a, b = promote(a, b)
    return cast_back(fn(upcast(a), upcast(b)), a.dtype, out)


def _cpu_binary(ufunc: np.ufunc, a: Any, b: Any, out: np.ndarray | None) -> np.ndarray:
    a, b = promote(a, b)
    if a.dtype in LOW_PRECISION_DTYPES:  # inputs upcast chunk-wise inside the ufunc, one f32 buffer
        return cast_back(ufunc(a, b, dtype=np.float32), a.dtype, out)
    return nd(ufunc(a, b, out=out))


@register("add", device="ref", dtypes=NUMERIC)
@ieee
def add_ref(a: Any, b: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    return _ref_binary(lambda x, y: x + y, a, b, out)


@register("add", device="cpu", dtypes=NUMERIC)
@ieee
def add_cpu(a: Any, b: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    return _cpu_binary(np.add, a, b, out)


@register("sub", device="ref", dtypes=NUMERIC)
@ieee
def sub_ref(a: Any, b: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    return _ref_binary(lambda x, y: x - y, a, b, out)


@register("sub", device="cpu", dtypes=NUMERIC)
@ieee
def sub_cpu(a: Any, b: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    return _cpu_binary(np.subtract, a, b, out)


@register("mul", device="ref", dtypes=NUMERIC)
@ieee
def mul_ref(a: Any, b: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    return _ref_binary(lambda x, y: x * y, a, b, out)


@register("mul", device="cpu", dtypes=NUMERIC)
@ieee
def mul_cpu(a: Any, b: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    return _cpu_binary(np.multiply, a, b, out)


@register("div", device="ref", dtypes=FLOATS)
@ieee
def div_ref(a: Any, b: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    return _ref_binary(lambda x, y: x / y, a, b, out)


@register("div", device="cpu", dtypes=FLOATS)
@ieee
def div_cpu(a: Any, b: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    return _cpu_binary(np.true_divide, a, b, out)


def _int_pow(a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """Integer ``a ** b``: numpy's wrapping power for ``b >= 0``; ``trunc(a ** b)`` for ``b < 0``."""
    neg = b < 0
    r = np.power(a, np.where(neg, b.dtype.type(0), b))
    if neg.any():  # |a| > 1 and a == 0 give 0; a == 1 gives 1; a == -1 gives +-1 by the exponent's parity
        odd = (b % 2) != 0
        tiny = (
            np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0)) if a.dtype.kind == "i" else a == 1
        )
        r = np.where(neg, tiny, r).astype(a.dtype, copy=False)
    return cast_back(r, a.dtype, out)


@register("pow", device="ref", dtypes=NUMERIC)
@ieee
def pow_ref(a: Any, b: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    a, b = promote(a, b)
    if a.dtype.kind in "iu":
        return _int_pow(a, b, out)
    return _ref_binary(lambda x, y: x**y, a, b, out)


@register("pow", device="cpu", dtypes=NUMERIC)
@ieee
def pow_cpu(a: Any, b: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    a, b = promote(a, b)
    if a.dtype.kind in "iu":
        return _int_pow(a, b, out)
    if b.ndim == 0 and b == 2:  # x**2 is the common case (variance, MSE): a multiply, not a pow call
        if a.dtype in LOW_PRECISION_DTYPES:
            return cast_back(np.square(a, dtype=np.float32), a.dtype, out)
        return nd(np.square(a, out=out))
    return _cpu_binary(np.power, a, b, out)


# --------------------------------------------------------------------------- comparisons


def _public_compare(op: str, a: Any, b: Any, device: str | None) -> Any:
    a, b = operands(op, ("a", "b"), (a, b), ANY_TENSOR if op == "equal" else ANY)  # strings: equality only
    return call(op, a, b, device=device)


def equal(a: Any, b: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise ``a == b`` -> bool, after promotion to the common dtype; NaN != NaN.

    >>> equal(np.array([1, 2]), 2)
    array([False,  True])
    """
    return _public_compare("equal", a, b, device)


def less(a: Any, b: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise ``a < b`` -> bool, after promotion; comparisons with NaN are False.

    >>> less(np.array([1.0, 3.0]), 2.0)
    array([ True, False])
    """
    return _public_compare("less", a, b, device)


def greater(a: Any, b: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise ``a > b`` -> bool, after promotion; comparisons with NaN are False.

    >>> greater(np.array([1.0, 3.0]), 2.0)
    array([False,  True])
    """
    return _public_compare("greater", a, b, device)


def _ref_compare(fn: Callable[[np.ndarray, np.ndarray], Any], a: Any, b: Any) -> np.ndarray:
    a, b = promote(a, b)
    return nd(fn(upcast(a), upcast(b)))  # low-precision values are exact in float32


@register("equal", device="ref", dtypes=ANY_TENSOR)
def equal_ref(a: Any, b: Any) -> np.ndarray:
    return _ref_compare(lambda x, y: x == y, a, b)


@register("equal", device="cpu", dtypes=ANY_TENSOR)
def equal_cpu(a: Any, b: Any) -> np.ndarray:
    return nd(np.equal(*promote(a, b)))


@register("less", device="ref", dtypes=ANY)
def less_ref(a: Any, b: Any) -> np.ndarray:
    return _ref_compare(lambda x, y: x < y, a, b)


@register("less", device="cpu", dtypes=ANY)
def less_cpu(a: Any, b: Any) -> np.ndarray:
    return nd(np.less(*promote(a, b)))


@register("greater", device="ref", dtypes=ANY)
def greater_ref(a: Any, b: Any) -> np.ndarray:
    return _ref_compare(lambda x, y: x > y, a, b)


@register("greater", device="cpu", dtypes=ANY)
def greater_cpu(a: Any, b: Any) -> np.ndarray:
    return nd(np.greater(*promote(a, b)))


# --------------------------------------------------------------------------- unary math


def neg(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise ``-x``; floats and signed ints (exact, in the input dtype; int min wraps to itself).

    >>> neg(np.array([1, -2]))
    array([-1,  2])
    """
    return call("neg", checked("neg", "x", x, SIGNED_NUMERIC), device=device)


def abs(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise ``|x|``; floats and ints (exact, in the input dtype; abs(int8 -128) is -128 as numpy).

    >>> abs(np.array([-1.5, 2.0]))
    array([1.5, 2. ])
    """
    return call("abs", checked("abs", "x", x, NUMERIC), device=device)


def exp(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise ``e**x``; floats; low precision computes in float32, overflow gives inf.

    >>> exp(np.array([0.0]))
    array([1.])
    """
    return call("exp", checked("exp", "x", x, FLOATS), device=device)


def log(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise natural log; floats; log(0) = -inf, log(x<0) = NaN; low precision in float32.

    >>> log(np.array([1.0]))
    array([0.])
    """
    return call("log", checked("log", "x", x, FLOATS), device=device)


def sqrt(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise square root; floats; sqrt(x<0) = NaN; low precision in float32.

    >>> sqrt(np.array([4.0]))
    array([2.])
    """
    return call("sqrt", checked("sqrt", "x", x, FLOATS), device=device)


def rsqrt(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise ``1 / sqrt(x)``; floats; rsqrt(0) = inf; low precision in float32.

    >>> rsqrt(np.array([4.0]))
    array([0.5])
    """
    return call("rsqrt", checked("rsqrt", "x", x, FLOATS), device=device)


def tanh(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise hyperbolic tangent; floats; low precision in float32.

    >>> tanh(np.array([0.0]))
    array([0.])
    """
    return call("tanh", checked("tanh", "x", x, FLOATS), device=device)


def _ref_unary(fn: Callable[[np.ndarray], Any], x: Any) -> np.ndarray:
    x = nd(x)
    return cast_back(fn(upcast(x)), x.dtype)


def _cpu_unary(ufunc: np.ufunc, x: Any) -> np.ndarray:
    x = nd(x)
    if x.dtype in LOW_PRECISION_DTYPES:
        return cast_back(ufunc(x, dtype=np.float32), x.dtype)
    return nd(ufunc(x))


@register("neg", device="ref", dtypes=SIGNED_NUMERIC)
def neg_ref(x: Any) -> np.ndarray:
    return nd(-nd(x))


@register("neg", device="cpu", dtypes=SIGNED_NUMERIC)
def neg_cpu(x: Any) -> np.ndarray:
    return nd(np.negative(x))


@register("abs", device="ref", dtypes=NUMERIC)
def abs_ref(x: Any) -> np.ndarray:
    x = nd(x)
    return nd(np.where(x < 0, -x, x)) if x.dtype.kind != "u" else x.copy()


@register("abs", device="cpu", dtypes=NUMERIC)
def abs_cpu(x: Any) -> np.ndarray:
    return nd(np.absolute(x))


@register("exp", device="ref", dtypes=FLOATS)
@ieee
def exp_ref(x: Any) -> np.ndarray:
    return _ref_unary(np.exp, x)


@register("exp", device="cpu", dtypes=FLOATS)
@ieee
def exp_cpu(x: Any) -> np.ndarray:
    return _cpu_unary(np.exp, x)


@register("log", device="ref", dtypes=FLOATS)
@ieee
def log_ref(x: Any) -> np.ndarray:
    return _ref_unary(np.log, x)


@register("log", device="cpu", dtypes=FLOATS)
@ieee
def log_cpu(x: Any) -> np.ndarray:
    return _cpu_unary(np.log, x)


@register("sqrt", device="ref", dtypes=FLOATS)
@ieee
def sqrt_ref(x: Any) -> np.ndarray:
    return _ref_unary(np.sqrt, x)


@register("sqrt", device="cpu", dtypes=FLOATS)
@ieee
def sqrt_cpu(x: Any) -> np.ndarray:
    return _cpu_unary(np.sqrt, x)


@register("rsqrt", device="ref", dtypes=FLOATS)
@ieee
def rsqrt_ref(x: Any) -> np.ndarray:
    return _ref_unary(lambda t: 1 / np.sqrt(t), x)


@register("rsqrt", device="cpu", dtypes=FLOATS)
@ieee
def rsqrt_cpu(x: Any) -> np.ndarray:
    x = nd(x)
    t = buffer_op(np.sqrt, x)
    return cast_back(np.reciprocal(t, out=t), x.dtype)


@register_decomposition("rsqrt", dtypes=FLOATS)
def rsqrt_decomposition(x: Any) -> np.ndarray:
    """rsqrt = div(1, sqrt(x)) — the definition a device without an rsqrt kernel falls back to."""
    x = nd(x)
    return call("div", const(1, x.dtype), call("sqrt", x))


@register("tanh", device="ref", dtypes=FLOATS)
@ieee
def tanh_ref(x: Any) -> np.ndarray:
    return _ref_unary(np.tanh, x)


@register("tanh", device="cpu", dtypes=FLOATS)
@ieee
def tanh_cpu(x: Any) -> np.ndarray:
    return _cpu_unary(np.tanh, x)


# --------------------------------------------------------------------------- clip, where, cast


def _bound(op: str, name: str, v: Any, dtype: np.dtype) -> np.ndarray | None:
    """A clip bound in ``x``'s dtype; integer bounds saturate to the dtype's range."""
    if v is None:
        return None
    arr = nd(v)
    if dtype.kind in "iu":
        if arr.dtype.kind not in "iub":
            raise OpError(op, name, f"an integer bound for integer x ({dtype})", f"{arr.dtype} {v!r}")
        info = np.iinfo(dtype)
        arr = np.clip(arr.astype(np.int64), max(info.min, -(2**63)), min(info.max, 2**63 - 1))
    return arr.astype(dtype)


def clip(x: Any, *, min: Any = None, max: Any = None, device: str | None = None) -> np.ndarray:
    """Clamp ``x`` into ``[min, max]`` (torch.clamp); bounds are scalars or arrays broadcastable to x.

    Exact, in x's dtype; at least one bound must be given; if min > max every element becomes max;
    NaN in x stays NaN. Integer x needs integer bounds (they saturate to x's range).

    >>> clip(np.array([-2.0, 0.5, 3.0]), min=0.0, max=1.0)
    array([0. , 0.5, 1. ])
    """
    x = checked("clip", "x", x, NUMERIC)
    if min is None and max is None:
        raise OpError("clip", "min", "at least one of 'min' or 'max'", "both None")
    lo, hi = _bound("clip", "min", min, x.dtype), _bound("clip", "max", max, x.dtype)
    for name, bound in (("min", lo), ("max", hi)):
        if bound is not None and np.broadcast_shapes(x.shape, bound.shape) != x.shape:
            raise OpError("clip", name, f"a shape broadcastable to x's shape {x.shape}", str(bound.shape))
    return call("clip", x, min=lo, max=hi, device=device)


@register("clip", device="ref", dtypes=NUMERIC)
def clip_ref(x: Any, *, min: Any = None, max: Any = None) -> np.ndarray:
    r = nd(x)
    if min is not None:
        r = np.where(r < min, min, r)  # NaN < min is False: NaN survives
    if max is not None:
        r = np.where(r > max, max, r)
    return nd(r).astype(nd(x).dtype, copy=False)


@register("clip", device="cpu", dtypes=NUMERIC)
def clip_cpu(x: Any, *, min: Any = None, max: Any = None) -> np.ndarray:
    x = nd(x)
    if min is None:
        return nd(np.minimum(x, max))
    if max is None:
        return nd(np.maximum(x, min))
    return nd(np.minimum(np.maximum(x, min), max))  # torch order: min > max yields max


def where(cond: Any, a: Any, b: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise select: ``a`` where ``cond`` is True else ``b``; cond must be bool; any dtype.

    ``a`` and ``b`` are promoted to their common dtype; all three broadcast together.

    >>> where(np.array([True, False]), np.array([1, 2]), 0)
    array([1, 0])
    """
    cond = checked("where", "cond", cond, (bool_,))
    a, b = operands("where", ("a", "b"), (a, b), ANY_TENSOR)
    try:
        np.broadcast_shapes(cond.shape, a.shape, b.shape)
    except ValueError:
        got = f"cond: {cond.shape}, a: {a.shape}, b: {b.shape}"
        raise OpError("where", "cond", "a shape that broadcasts with a and b", got) from None
    return call("where", cond, a, b, device=device)


@register("where", device="ref", dtypes=ANY_TENSOR, dtype_arg=1)
def where_ref(cond: Any, a: Any, b: Any) -> np.ndarray:
    a, b = promote(a, b)
    c, a, b = np.broadcast_arrays(nd(cond), a, b)
    r = b.copy()
    r[c] = a[c]
    return r


@register("where", device="cpu", dtypes=ANY_TENSOR, dtype_arg=1)
def where_cpu(cond: Any, a: Any, b: Any) -> np.ndarray:
    return nd(np.where(cond, *promote(a, b)))


def cast(x: Any, *, dtype: Any, device: str | None = None) -> np.ndarray:
    """Convert ``x`` to ``dtype`` (a name such as ``"bfloat16"`` or a numpy dtype); always a new array.

    Float -> float rounds to nearest-even and is *not* saturating: out-of-range values become ±inf,
    except float8_e4m3fn (no inf) where they become NaN — ml_dtypes' and torch's ``.to()`` behaviour;
    clip first for saturation. Float -> int truncates toward zero like numpy; NaN, ±inf and out-of-range
    values have no defined result (platform-dependent, as in numpy and C). To bool: nonzero -> True.
    Int -> int wraps modulo 2**bits.

    >>> cast(np.array([1.7, -1.7]), dtype="int32")
    array([ 1, -1], dtype=int32)
    """
    x = checked("cast", "x", x, ANY)
    try:
        dt = as_dtype(dtype)
    except TypeError as e:
        raise OpError("cast", "dtype", "a supported dtype", f"{dtype!r} ({e})") from None
    return call("cast", x, dtype=dt, device=device)


@register("cast", device="ref", dtypes=ANY)
@ieee
def cast_ref(x: Any, *, dtype: Any) -> np.ndarray:
    x, dt = nd(x), np.dtype(dtype)
    if x.dtype in FLOAT_DTYPES and dt.kind in "iu":  # spell out the truncation the C cast performs
        return np.trunc(upcast(x)).astype(dt)
    return x.astype(dt)


@register("cast", device="cpu", dtypes=ANY)
@ieee
def cast_cpu(x: Any, *, dtype: Any) -> np.ndarray:
    return nd(x).astype(dtype)
