"""Math kernels — trigonometric and hyperbolic functions, rounding, sign, mod, bitwise ops, IsNaN/IsInf,
determinant and running product — on ``ref`` and ``cpu``.

Semantics follow the ONNX operator specification (Sin ... Atanh, Ceil, Floor, Round, Sign, Mod,
BitShift, Bitwise*, IsNaN, IsInf, Det, CumProd) with numpy broadcasting. Float math on low-precision
dtypes computes in float32 and rounds once (module ``elementwise``'s rule); rounding, sign, bitwise and
classification ops are exact in the input dtype. Integer arithmetic wraps like the input dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._dtypes import INT_DTYPES, accumulation_dtype, bool_, float64
from .._errors import OpError, check_ndim
from .._registry import call, register
from .elementwise import FLOATS, NUMERIC, cast_back, checked, ieee, nd, operands, upcast

__all__ = [
    "acos", "acosh", "asin", "asinh", "atan", "atanh", "bit_shift", "bitwise_and", "bitwise_not",
    "bitwise_or", "bitwise_xor", "ceil", "cos", "cosh", "cumprod", "det", "floor", "isinf", "isnan",
    "mod", "round", "sign", "sin", "sinh", "tan",
]  # fmt: skip

INTS: tuple[np.dtype, ...] = INT_DTYPES
BIT_DTYPES: tuple[np.dtype, ...] = (*INT_DTYPES, bool_)
SHIFT_DIRECTIONS: tuple[str, ...] = ("LEFT", "RIGHT")

Unary = Callable[..., np.ndarray]


# --------------------------------------------------------------------------- float unary math


def _float_unary(name: str, ufunc: np.ufunc, what: str) -> Unary:
    """Register ``ufunc`` as op ``name`` on ref (float64, rounded once) and cpu; return the public function."""

    @register(name, device="ref", dtypes=FLOATS)
    @ieee
    def ref(x: Any) -> np.ndarray:
        x = nd(x)
        return cast_back(ufunc(x.astype(float64)), x.dtype)

    @register(name, device="cpu", dtypes=FLOATS)
    @ieee
    def cpu(x: Any) -> np.ndarray:
        x = nd(x)
        return cast_back(nd(ufunc(upcast(x))), x.dtype)

    def public(x: Any, *, device: str | None = None) -> np.ndarray:
        return call(name, checked(name, "x", x, FLOATS), device=device)

    public.__name__ = public.__qualname__ = name
    public.__doc__ = (
        f"Elementwise {what} (ONNX {name.capitalize()}); floats; low precision computes in float32."
    )
    return public


sin = _float_unary("sin", np.sin, "sine")
cos = _float_unary("cos", np.cos, "cosine")
tan = _float_unary("tan", np.tan, "tangent")
asin = _float_unary("asin", np.arcsin, "arcsine; NaN outside [-1, 1]")
acos = _float_unary("acos", np.arccos, "arccosine; NaN outside [-1, 1]")
atan = _float_unary("atan", np.arctan, "arctangent")
sinh = _float_unary("sinh", np.sinh, "hyperbolic sine")
cosh = _float_unary("cosh", np.cosh, "hyperbolic cosine")
asinh = _float_unary("asinh", np.arcsinh, "inverse hyperbolic sine")
acosh = _float_unary("acosh", np.arccosh, "inverse hyperbolic cosine; NaN below 1")
atanh = _float_unary("atanh", np.arctanh, "inverse hyperbolic tangent; +-inf at +-1, NaN outside")
ceil = _float_unary("ceil", np.ceil, "ceiling (exact)")
floor = _float_unary("floor", np.floor, "floor (exact)")
round = _float_unary("round", np.rint, "round to nearest, ties to even (exact)")


# --------------------------------------------------------------------------- sign


def sign(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise sign -1/0/1 in x's dtype (ONNX Sign); floats and ints; NaN stays NaN.

    >>> sign(np.array([-2.0, 0.0, 3.0]))
    array([-1.,  0.,  1.])
    """
    return call("sign", checked("sign", "x", x, NUMERIC), device=device)


@register("sign", device="ref", dtypes=NUMERIC)
def sign_ref(x: Any) -> np.ndarray:
    x = nd(x)
    t = upcast(x)
    one, zero = t.dtype.type(1), t.dtype.type(0)
    r = np.where(
        t > 0, one, np.where(t < 0, -one if t.dtype.kind != "u" else zero, np.where(t == 0, zero, t))
    )
    return cast_back(r.astype(t.dtype, copy=False), x.dtype)


@register("sign", device="cpu", dtypes=NUMERIC)
def sign_cpu(x: Any) -> np.ndarray:
    x = nd(x)
    return cast_back(nd(np.sign(upcast(x))), x.dtype)


# --------------------------------------------------------------------------- mod


def mod(a: Any, b: Any, *, fmod: bool = False, device: str | None = None) -> np.ndarray:
    """Elementwise remainder (ONNX Mod): ``fmod=False`` floors (sign of b), ``fmod=True`` truncates (sign of a).

    Floats and ints with broadcasting. Float special cases follow the spec: x % 0, inf % y are NaN.
    An integer divisor of 0 gives 0 (numpy's answer; ONNX leaves it undefined).

    >>> mod(np.array([-7, 7]), 3).tolist(), mod(np.array([-7, 7]), 3, fmod=True).tolist()
    ([2, 1], [-1, 1])
    """
    a, b = operands("mod", ("a", "b"), (a, b), NUMERIC)
    return call("mod", a, b, fmod=bool(fmod), device=device)


def _mod_values(a: np.ndarray, b: np.ndarray, fmod: bool) -> np.ndarray:
    if fmod:
        return nd(np.fmod(a, b))
    r = nd(np.mod(a, b))
    if r.dtype.kind == "f":  # spec: a finite x with y = +-inf gives y when their signs differ (numpy agrees)
        r = np.where(np.isinf(b) & np.isfinite(a) & (a != 0) & (np.signbit(a) != np.signbit(b)), b, r)
    return nd(r)


@register("mod", device="ref", dtypes=NUMERIC)
@ieee
def mod_ref(a: Any, b: Any, *, fmod: bool = False) -> np.ndarray:
    a, b = nd(a), nd(b)
    if a.dtype.kind in "iu":  # exact integer definition: a - floor-or-trunc(a / b) * b, 0 for b == 0
        ai, bi = a.astype(object), b.astype(object)
        safe = np.where(bi == 0, 1, bi)
        q = ai // safe
        if fmod:  # truncate toward zero instead of flooring
            q = np.where((q < 0) & (q * safe != ai), q + 1, q)
        r = np.where(bi == 0, 0, ai - q * safe)
        return np.asarray(r).astype(a.dtype)
    t = np.fmod(upcast(a), upcast(b)) if fmod else _mod_values(upcast(a), upcast(b), False)
    return cast_back(t, a.dtype)


@register("mod", device="cpu", dtypes=NUMERIC)
@ieee
def mod_cpu(a: Any, b: Any, *, fmod: bool = False) -> np.ndarray:
    a, b = nd(a), nd(b)
    return cast_back(_mod_values(upcast(a), upcast(b), fmod), a.dtype)


# --------------------------------------------------------------------------- bitwise


def bit_shift(x: Any, y: Any, *, direction: str, device: str | None = None) -> np.ndarray:
    """Elementwise ``x << y`` (``direction="LEFT"``) or ``x >> y`` ("RIGHT") (ONNX BitShift); integers.

    Bits shifted past the width are lost (a shift by the width or more gives 0; signed right shifts
    are arithmetic, as numpy).

    >>> bit_shift(np.array([1, 8], np.uint8), np.array([2, 1], np.uint8), direction="RIGHT").tolist()
    [0, 4]
    """
    if direction not in SHIFT_DIRECTIONS:
        raise OpError("bit_shift", "direction", f"one of {SHIFT_DIRECTIONS}", repr(direction))
    x, y = operands("bit_shift", ("x", "y"), (x, y), INTS)
    return call("bit_shift", x, y, direction=direction, device=device)


def _shift_ref(x: Any, y: Any, *, direction: str) -> np.ndarray:
    x, y = nd(x), nd(y)
    bits = x.dtype.itemsize * 8
    xo, yo = np.broadcast_arrays(x.astype(object), y.astype(object))
    if direction == "LEFT":
        r = [v << s if 0 <= s < bits else 0 for v, s in zip(xo.ravel(), yo.ravel(), strict=True)]
        mask = (1 << bits) - 1
        r = [v & mask for v in r]
        return np.array(r, dtype=np.uint64 if bits == 64 else np.int64).astype(x.dtype).reshape(xo.shape)
    fill = [(-1 if v < 0 else 0) for v in xo.ravel()]
    r = [v >> s if 0 <= s < bits else f for v, s, f in zip(xo.ravel(), yo.ravel(), fill, strict=True)]
    return np.array(r, dtype=object).astype(x.dtype).reshape(xo.shape)


register("bit_shift", device="ref", dtypes=INTS)(_shift_ref)


@register("bit_shift", device="cpu", dtypes=INTS)
def bit_shift_cpu(x: Any, y: Any, *, direction: str) -> np.ndarray:
    x, y = nd(x), nd(y)
    return nd(np.left_shift(x, y) if direction == "LEFT" else np.right_shift(x, y))


def _bitwise(name: str, ufunc: np.ufunc, symbol: str) -> Unary:
    """Register a binary bitwise op (one numpy ufunc, exact: one kernel on ref and cpu); return its public function."""

    def kernel(a: Any, b: Any) -> np.ndarray:
        return nd(ufunc(a, b))

    register(name, device="ref", dtypes=BIT_DTYPES)(kernel)
    register(name, device="cpu", dtypes=BIT_DTYPES)(kernel)

    def public(a: Any, b: Any, *, device: str | None = None) -> np.ndarray:
        a, b = operands(name, ("a", "b"), (a, b), BIT_DTYPES)
        return call(name, a, b, device=device)

    public.__name__ = public.__qualname__ = name
    public.__doc__ = (
        f"Elementwise bitwise ``a {symbol} b`` with broadcasting (ONNX Bitwise*); integers and bool."
    )
    return public


bitwise_and = _bitwise("bitwise_and", np.bitwise_and, "&")
bitwise_or = _bitwise("bitwise_or", np.bitwise_or, "|")
bitwise_xor = _bitwise("bitwise_xor", np.bitwise_xor, "^")


def bitwise_not(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise bitwise complement ``~x`` (ONNX BitwiseNot); integers and bool.

    >>> bitwise_not(np.array([0, 5], np.uint8)).tolist()
    [255, 250]
    """
    return call("bitwise_not", checked("bitwise_not", "x", x, BIT_DTYPES), device=device)


@register("bitwise_not", device="ref", dtypes=BIT_DTYPES)
def bitwise_not_ref(x: Any) -> np.ndarray:
    x = nd(x)
    if x.dtype == bool_:
        return ~x
    return (x ^ np.array(-1).astype(x.dtype)).astype(x.dtype)  # xor with all ones


@register("bitwise_not", device="cpu", dtypes=BIT_DTYPES)
def bitwise_not_cpu(x: Any) -> np.ndarray:
    return nd(np.invert(x))


# --------------------------------------------------------------------------- classification


def isnan(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise ``x is NaN`` -> bool (ONNX IsNaN); floats.

    >>> isnan(np.array([1.0, np.nan])).tolist()
    [False, True]
    """
    return call("isnan", checked("isnan", "x", x, FLOATS), device=device)


@register("isnan", device="ref", dtypes=FLOATS)
def isnan_ref(x: Any) -> np.ndarray:
    t = upcast(nd(x))
    return nd(t != t)


@register("isnan", device="cpu", dtypes=FLOATS)
def isnan_cpu(x: Any) -> np.ndarray:
    return nd(np.isnan(upcast(nd(x))))


def isinf(
    x: Any, *, detect_positive: bool = True, detect_negative: bool = True, device: str | None = None
) -> np.ndarray:
    """Elementwise ``x is +inf`` / ``-inf`` -> bool (ONNX IsInf); each sign detected only when asked; floats.

    >>> isinf(np.array([np.inf, -np.inf, 1.0]), detect_negative=False).tolist()
    [True, False, False]
    """
    x = checked("isinf", "x", x, FLOATS)
    return call(
        "isinf",
        x,
        detect_positive=bool(detect_positive),
        detect_negative=bool(detect_negative),
        device=device,
    )


@register("isinf", device="ref", dtypes=FLOATS)
def isinf_ref(x: Any, *, detect_positive: bool = True, detect_negative: bool = True) -> np.ndarray:
    t = upcast(nd(x))
    return nd(((t == np.inf) & detect_positive) | ((t == -np.inf) & detect_negative))


@register("isinf", device="cpu", dtypes=FLOATS)
def isinf_cpu(x: Any, *, detect_positive: bool = True, detect_negative: bool = True) -> np.ndarray:
    t = upcast(nd(x))
    if detect_positive and detect_negative:
        return nd(np.isinf(t))
    if detect_positive:
        return nd(np.isposinf(t))
    if detect_negative:
        return nd(np.isneginf(t))
    return np.zeros(t.shape, bool)


# --------------------------------------------------------------------------- det


def det(x: Any, *, device: str | None = None) -> np.ndarray:
    """Determinant of the square matrices in the last two dims (ONNX Det): ``(..., M, M) -> (...)``; floats.

    LU with partial pivoting (LAPACK); low precision computes in float32 and rounds once.

    >>> det(np.array([[1.0, 2.0], [3.0, 4.0]])).round(6)
    np.float64(-2.0)
    """
    x = checked("det", "x", x, FLOATS)
    check_ndim("det", "x", x, (2, None), layout="(..., M, M)")
    if x.shape[-1] != x.shape[-2]:
        raise OpError("det", "x", "square matrices in the last two dims (..., M, M)", f"shape {x.shape}")
    return call("det", x, device=device)


@register("det", device="ref", dtypes=FLOATS)
@ieee
def det_ref(x: Any) -> np.ndarray:
    x = nd(x)
    return cast_back(np.asarray(np.linalg.det(x.astype(float64))), x.dtype)


@register("det", device="cpu", dtypes=FLOATS)
@ieee
def det_cpu(x: Any) -> np.ndarray:
    x = nd(x)
    return cast_back(np.asarray(np.linalg.det(upcast(x))), x.dtype)


# --------------------------------------------------------------------------- cumprod


def cumprod(
    x: Any, *, axis: int, exclusive: bool = False, reverse: bool = False, device: str | None = None
) -> np.ndarray:
    """Running product along ``axis`` (ONNX CumProd): ``exclusive`` leaves out the current entry (starts at 1),
    ``reverse`` runs from the end.

    Low-precision floats accumulate in float32, ints in int64 (wrapping like x's dtype); the result has x's
    dtype.

    >>> cumprod(np.array([1, 2, 3]), axis=0, exclusive=True).tolist()
    [1, 1, 2]
    """
    x = checked("cumprod", "x", x, NUMERIC)
    check_ndim("cumprod", "x", x, (1, None))
    if not -x.ndim <= int(axis) < x.ndim:
        raise OpError("cumprod", "axis", f"an axis in [{-x.ndim}, {x.ndim})", str(axis))
    return call(
        "cumprod", x, axis=int(axis) % x.ndim, exclusive=bool(exclusive), reverse=bool(reverse), device=device
    )


@register("cumprod", device="ref", dtypes=NUMERIC)
@ieee
def cumprod_ref(x: Any, *, axis: int, exclusive: bool = False, reverse: bool = False) -> np.ndarray:
    x = nd(x)
    xs = np.moveaxis(x.astype(accumulation_dtype(x.dtype)), axis, 0)
    out = np.empty_like(xs)
    running = np.ones_like(xs[0]) if len(xs) else None
    for i in reversed(range(len(xs))) if reverse else range(len(xs)):
        if exclusive:
            out[i], running = running, running * xs[i]
        else:
            running = running * xs[i]
            out[i] = running
    return np.moveaxis(out, 0, axis).astype(x.dtype)


@register("cumprod", device="cpu", dtypes=NUMERIC)
@ieee
def cumprod_cpu(x: Any, *, axis: int, exclusive: bool = False, reverse: bool = False) -> np.ndarray:
    x = nd(x)
    acc = accumulation_dtype(x.dtype)
    xs = np.flip(x, axis) if reverse else x
    if exclusive:
        out = np.ones(x.shape, acc)
        head, tail = [slice(None)] * x.ndim, [slice(None)] * x.ndim
        head[axis], tail[axis] = slice(None, -1), slice(1, None)
        np.cumprod(xs[tuple(head)], axis=axis, dtype=acc, out=out[tuple(tail)])
    else:
        out = np.cumprod(xs, axis=axis, dtype=acc)
    out = np.flip(out, axis) if reverse else out
    return out.astype(x.dtype)
