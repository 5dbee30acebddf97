"""Activation kernels — relu, sigmoid, silu, gelu (exact and tanh) — on ``ref`` and ``cpu``.

GELU follows Hendrycks & Gimpel (2016), "Gaussian Error Linear Units", both the exact form
``x Phi(x)`` and the tanh approximation; SiLU is Elfwing et al. (2017). Sigmoid is evaluated as
``exp(-|x|)``-based so no ``exp`` overflows for large ``|x|``. Low precision computes in float32
and rounds once; relu is exact in the input dtype.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._dtypes import compute_dtype
from .._errors import OpError
from .._registry import call, register, register_decomposition
from .elementwise import FLOATS, NUMERIC, buffer_op, cast_back, checked, const, ieee, nd, upcast
from .erf import erf_ref, erf_values

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715
GELU_APPROXIMATIONS: tuple[str, ...] = ("none", "tanh")


def relu(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise ``max(x, 0)``; floats and ints, exact in the input dtype; NaN stays NaN.

    >>> relu(np.array([-1.0, 2.0]))
    array([0., 2.])
    """
    return call("relu", checked("relu", "x", x, NUMERIC), device=device)


@register("relu", device="ref", dtypes=NUMERIC)
def relu_ref(x: Any) -> np.ndarray:
    x = nd(x)
    return nd(np.where(x < 0, x.dtype.type(0), x))


@register("relu", device="cpu", dtypes=NUMERIC)
def relu_cpu(x: Any) -> np.ndarray:
    x = nd(x)
    return nd(np.maximum(x, x.dtype.type(0)))


def sigmoid(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise logistic ``1 / (1 + exp(-x))``, stable for large ``|x|``; floats.

    Computed from ``z = exp(-|x|)`` as ``1/(1+z)`` or ``z/(1+z)``, so nothing overflows and tiny
    results keep their relative accuracy. Low precision computes in float32.

    >>> sigmoid(np.array([0.0]))
    array([0.5])
    """
    return call("sigmoid", checked("sigmoid", "x", x, FLOATS), device=device)


def _sigmoid_ref_values(t: np.ndarray) -> np.ndarray:
    z = np.exp(-np.abs(t))
    return np.where(t >= 0, 1 / (1 + z), z / (1 + z))


def _sigmoid_cpu_buffer(x: np.ndarray) -> np.ndarray:
    """sigmoid(x) into a fresh compute-dtype buffer: 2 full-size temporaries (z, 1+z)."""
    t = buffer_op(np.absolute, x)
    np.negative(t, out=t)
    np.exp(t, out=t)  # z = exp(-|x|) in (0, 1]
    den = t + 1.0
    np.copyto(t, 1.0, where=x >= 0)  # numerator: 1 for x >= 0, z below
    t /= den
    return t


@register("sigmoid", device="ref", dtypes=FLOATS)
@ieee
def sigmoid_ref(x: Any) -> np.ndarray:
    x = nd(x)
    return cast_back(_sigmoid_ref_values(upcast(x)), x.dtype)


@register("sigmoid", device="cpu", dtypes=FLOATS)
@ieee
def sigmoid_cpu(x: Any) -> np.ndarray:
    x = nd(x)
    return cast_back(_sigmoid_cpu_buffer(x), x.dtype)


@register_decomposition("sigmoid", dtypes=FLOATS)
def sigmoid_decomposition(x: Any) -> np.ndarray:
    """sigmoid = where(x < 0, z, 1) / (1 + z) with z = exp(-|x|): the stable form, in primitives."""
    x = nd(x)
    one = const(1, x.dtype)
    z = call("exp", call("neg", call("abs", x)))
    return call("div", call("where", call("less", x, const(0, x.dtype)), z, one), call("add", one, z))


def silu(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise SiLU / swish ``x * sigmoid(x)``; floats; stable for large ``|x|``; low precision in float32.

    >>> silu(np.array([0.0]))
    array([0.])
    """
    return call("silu", checked("silu", "x", x, FLOATS), device=device)


@register("silu", device="ref", dtypes=FLOATS)
@ieee
def silu_ref(x: Any) -> np.ndarray:
    x = nd(x)
    t = upcast(x)
    return cast_back(t * _sigmoid_ref_values(t), x.dtype)


@register("silu", device="cpu", dtypes=FLOATS)
@ieee
def silu_cpu(x: Any) -> np.ndarray:
    x = nd(x)
    t = _sigmoid_cpu_buffer(x)
    np.multiply(t, x, out=t)
    return cast_back(t, x.dtype)


@register_decomposition("silu", dtypes=FLOATS)
def silu_decomposition(x: Any) -> np.ndarray:
    """silu = x * sigmoid(x)."""
    return call("mul", x, call("sigmoid", x))


def gelu(x: Any, *, approximate: str = "none", device: str | None = None) -> np.ndarray:
    """Elementwise GELU: ``x * Phi(x)`` (``approximate="none"``) or its tanh form (``"tanh"``), as torch.

    exact: ``0.5 x (1 + erf(x / sqrt 2))``; tanh: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.
    Floats; low precision computes in float32 and rounds once.

    >>> gelu(np.array([0.0, 1.0])).round(4)
    array([0.    , 0.8413])
    """
    x = checked("gelu", "x", x, FLOATS)
    _check_approximate(approximate)
    return call("gelu", x, approximate=approximate, device=device)


def _check_approximate(approximate: str) -> None:
    if approximate not in GELU_APPROXIMATIONS:
        raise OpError("gelu", "approximate", f"one of {GELU_APPROXIMATIONS}", repr(approximate))


@register("gelu", device="ref", dtypes=FLOATS)
@ieee
def gelu_ref(x: Any, *, approximate: str = "none") -> np.ndarray:
    _check_approximate(approximate)
    x = nd(x)
    t = upcast(x)
    if approximate == "tanh":
        inner = _SQRT_2_PI * (t + _GELU_C * t**3)
        return cast_back(0.5 * t * (1 + np.tanh(inner)), x.dtype)
    phi = 0.5 * (1 + erf_ref(t * _SQRT1_2))  # standard normal CDF
    return cast_back(t * phi, x.dtype)


@register_decomposition("gelu", dtypes=FLOATS)
def gelu_decomposition(x: Any, *, approximate: str = "none") -> np.ndarray:
    """gelu = 0.5 x (1 + erf(x / sqrt 2)), or with tanh(sqrt(2/pi) (x + 0.044715 x^3)) for "tanh"."""
    _check_approximate(approximate)
    x = nd(x)
    c = lambda v: const(v, x.dtype)  # noqa: E731
    if approximate == "tanh":
        cube = call("mul", call("mul", x, x), x)
        inner = call("mul", c(_SQRT_2_PI), call("add", x, call("mul", c(_GELU_C), cube)))
        s = call("tanh", inner)
    else:
        s = call("erf", call("mul", x, c(_SQRT1_2)))
    return call("mul", call("mul", c(0.5), x), call("add", c(1), s))


#: ``atanh(erf(u)) / u`` as a degree-6 polynomial in ``u^2`` (float64 weighted least squares on
#: ``0 <= u <= 4``, weights ``u (1 - erf(u)^2)`` -- the sensitivity of ``tanh`` to its argument -- refined
#: toward minimax by Lawson reweighting). ``tanh(u P(u^2))`` is within 6e-8 of ``erf(u)``; the leading
#: coefficient is positive and ``u P(u^2) > 9`` for every ``u >= 3.9``, so tanh saturates to exactly +-1
#: there (erf is +-1 in float32 beyond ~3.9 as well).
ERF_ATANH_POLY: tuple[float, ...] = (
    1.1283797055096885, 0.10276548108091586, -0.00018438286853575124, -0.0006257201995702408,
    8.971276089925014e-05, -5.985702091165572e-06, 1.5895934890485582e-07,
)  # fmt: skip
#: the same polynomial for ``g = x / 2``: ``erf(x / sqrt 2) ~= tanh(g Q(g^2))`` with ``Q(w) = sqrt 2 P(2 w)``
_GELU_Q = tuple(np.float32(math.sqrt(2.0) * c * 2.0**k) for k, c in enumerate(ERF_ATANH_POLY))
#: elements per tile: the in-place epilogue (tile, two scratch, a bias tile: 4 x 256 KiB) was fastest at
#: 64 Ki elements on the 512x1024 BERT FFN activation (32 Ki: ~8% slower; 128 Ki: tied or slower)
GELU_TILE = 65536


def gelu_half_tile_f32(g: np.ndarray, t: np.ndarray, q: np.ndarray, o: np.ndarray) -> None:
    """``o = x Phi(x)`` on one float32 tile from ``g = x / 2`` (``t``, ``q`` scratch; ``o`` may be ``g``).

    ``x Phi(x) = g (1 + erf(x / sqrt 2)) = g + g tanh(g Q(g^2))``: 16 arithmetic passes and one tanh,
    no clamp or divide. ~5e-7 absolute for |x| <= 12 (float32 rounding of x itself is ~1e-6 there),
    0 far left (tanh is exactly -1), x far right; NaN propagates; -inf gives NaN as ``x * 0`` does.
    """
    c = _GELU_Q
    np.multiply(g, g, out=t)
    np.multiply(t, c[6], out=q)
    for k in range(5, 0, -1):  # Horner in w = g^2
        q += c[k]
        q *= t
    q += c[0]
    q *= g
    np.tanh(q, out=q)
    q *= g
    np.add(q, g, out=o)


def gelu_tanh_tile(h: np.ndarray, t: np.ndarray, o: np.ndarray) -> None:
    """``o = 0.5 h (1 + tanh(K (h + C h^3)))`` on one tile as ``g + g tanh(g (2K + 8KC g^2))``, ``g = h/2``.

    ``h`` is clobbered (it becomes g) and ``t`` is scratch; ``o`` may be ``h``. Eight passes; the cpu
    ``gelu(approximate="tanh")`` and ``bias_act(act="gelu_tanh")`` share it, so they agree bit for bit.
    """
    h *= 0.5
    np.multiply(h, h, out=t)
    t *= 8.0 * _SQRT_2_PI * _GELU_C
    t += 2.0 * _SQRT_2_PI
    t *= h
    np.tanh(t, out=t)
    t *= h
    np.add(t, h, out=o)


def _gelu_tanh_tiled(x: np.ndarray) -> np.ndarray:
    """Tanh-form GELU in x's compute dtype over L2-sized 1-D tiles (x is read once, into the tile)."""
    cdt = compute_dtype(x.dtype)
    xf = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(xf.size, cdt)
    step = min(GELU_TILE, max(xf.size, 1))
    t = np.empty(step, cdt)
    for s in range(0, xf.size, step):
        e = min(xf.size, s + step)
        o = out[s:e]
        np.copyto(o, xf[s:e], casting="unsafe")
        gelu_tanh_tile(o, t[: e - s], o)
    return out.reshape(np.shape(x))


def gelu_exact_f32(x: np.ndarray) -> np.ndarray:
    """Exact-form GELU ``x Phi(x)`` in float32 (any float input), branch-free and cache-tiled.

    erf as ``tanh`` of an odd polynomial (:data:`ERF_ATANH_POLY`), evaluated by
    :func:`gelu_half_tile_f32` over L2-sized tiles; ~5e-7 absolute for |x| <= 12.
    """
    xf = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(xf.size, np.float32)
    n = xf.size
    step = min(GELU_TILE, max(n, 1))
    t, q = np.empty(step, np.float32), np.empty(step, np.float32)
    for s in range(0, n, step):
        e = min(n, s + step)
        o = out[s:e]
        np.multiply(xf[s:e], 0.5, out=o, dtype=np.float32, casting="unsafe")  # g = x / 2, exact
        gelu_half_tile_f32(o, t[: e - s], q[: e - s], o)
    return out.reshape(np.shape(x))


@register("gelu", device="cpu", dtypes=FLOATS)
@ieee
def gelu_cpu(x: Any, *, approximate: str = "none") -> np.ndarray:
    _check_approximate(approximate)
    x = nd(x)
    if approximate == "tanh":
        return cast_back(_gelu_tanh_tiled(x), x.dtype)
    if compute_dtype(x.dtype) == np.float32:  # float32 and low precision: erf as tanh of a polynomial
        return cast_back(gelu_exact_f32(x), x.dtype)
    t = buffer_op(np.multiply, x, _SQRT1_2)
    erf_values(t, out=t)
    t += 1.0
    t *= x
    t *= 0.5
    return cast_back(t, x.dtype)
