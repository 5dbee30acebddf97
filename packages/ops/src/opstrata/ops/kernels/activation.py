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


# --------------------------------------------------------------------------- ONNX activations
# HardSigmoid, HardSwish, Elu, Selu, Celu, LeakyRelu, PRelu, ThresholdedRelu, Softplus, Softsign,
# Mish, Swish, Shrink and Hardmax as the ONNX operator specification defines them. Float activations
# compute in x's compute dtype (float32 for low precision) and round once; ``ref`` spells out the
# spec's formula with ``np.where``, ``cpu`` evaluates a branch-free numpy form.

#: ONNX Selu defaults (Klambauer et al. 2017, "Self-Normalizing Neural Networks"), as float32 constants
SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875


def _float_act(op: str, x: Any, device: str | None, **attrs: Any) -> np.ndarray:
    """Validate a float activation's input and float attributes, then dispatch."""
    x = checked(op, "x", x, FLOATS)
    for name, v in attrs.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
            raise OpError(op, name, "a real number", f"{type(v).__name__} {v!r}")
    return call(op, x, device=device, **{k: float(v) for k, v in attrs.items()})


def _act_kernels(op: str, ref_fn: Any, cpu_fn: Any, dtypes: Any = FLOATS) -> None:
    """Register ``ref_fn(t, **attrs)``/``cpu_fn(t, **attrs)`` (on x in its compute dtype) as op's kernels."""

    def wrap(fn: Any) -> Any:
        @ieee
        def kernel(x: Any, **attrs: Any) -> np.ndarray:
            x = nd(x)
            return cast_back(fn(upcast(x), **attrs), x.dtype)

        kernel.__name__ = kernel.__qualname__ = f"{op}_{fn.__name__.rsplit('_', 1)[-1]}"
        return kernel

    register(op, device="ref", dtypes=dtypes)(wrap(ref_fn))
    register(op, device="cpu", dtypes=dtypes)(wrap(cpu_fn))


def hard_sigmoid(x: Any, *, alpha: float = 0.2, beta: float = 0.5, device: str | None = None) -> np.ndarray:
    """Elementwise ``max(0, min(1, alpha x + beta))`` (ONNX HardSigmoid); floats.

    >>> hard_sigmoid(np.array([-5.0, 0.0, 5.0]))
    array([0. , 0.5, 1. ])
    """
    return _float_act("hard_sigmoid", x, device, alpha=alpha, beta=beta)


def _hard_sigmoid_ref(t: np.ndarray, *, alpha: float = 0.2, beta: float = 0.5) -> np.ndarray:
    y = alpha * t + beta
    return np.where(y < 0, 0, np.where(y > 1, 1, y)).astype(t.dtype)


def _hard_sigmoid_cpu(t: np.ndarray, *, alpha: float = 0.2, beta: float = 0.5) -> np.ndarray:
    y = nd(t * t.dtype.type(alpha))  # nd: a 0-d input gives a numpy scalar, which has no out=
    y += t.dtype.type(beta)
    return np.clip(y, 0, 1, out=y)


_act_kernels("hard_sigmoid", _hard_sigmoid_ref, _hard_sigmoid_cpu)


def hard_swish(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise ``x * max(0, min(1, x / 6 + 1/2))`` (ONNX HardSwish, MobileNetV3); floats.

    >>> hard_swish(np.array([-4.0, 0.0, 1.0, 4.0])).round(4)
    array([-0.    ,  0.    ,  0.6667,  4.    ])
    """
    return _float_act("hard_swish", x, device)


def _hard_swish_ref(t: np.ndarray) -> np.ndarray:
    return t * _hard_sigmoid_ref(t, alpha=1 / 6, beta=0.5)


def _hard_swish_cpu(t: np.ndarray) -> np.ndarray:
    y = _hard_sigmoid_cpu(t, alpha=1 / 6, beta=0.5)
    y *= t
    return y


_act_kernels("hard_swish", _hard_swish_ref, _hard_swish_cpu)


def elu(x: Any, *, alpha: float = 1.0, device: str | None = None) -> np.ndarray:
    """Elementwise ``x`` for ``x >= 0``, ``alpha (exp(x) - 1)`` below (ONNX Elu); floats.

    >>> elu(np.array([-1.0, 2.0])).round(4)
    array([-0.6321,  2.    ])
    """
    return _float_act("elu", x, device, alpha=alpha)


def _elu_ref(t: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    return np.where(t < 0, alpha * (np.exp(t) - 1), t).astype(t.dtype)


def _elu_cpu(t: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    y = np.expm1(np.minimum(t, 0))  # no overflow for large x; expm1 keeps small |x| accurate
    y *= t.dtype.type(alpha)
    return np.where(t > 0, t, y)


_act_kernels("elu", _elu_ref, _elu_cpu)


def selu(
    x: Any, *, alpha: float = SELU_ALPHA, gamma: float = SELU_GAMMA, device: str | None = None
) -> np.ndarray:
    """Elementwise ``gamma x`` for ``x > 0``, ``gamma alpha (exp(x) - 1)`` otherwise (ONNX Selu); floats.

    >>> selu(np.array([1.0])).round(4)
    array([1.0507])
    """
    return _float_act("selu", x, device, alpha=alpha, gamma=gamma)


def _selu_ref(t: np.ndarray, *, alpha: float = SELU_ALPHA, gamma: float = SELU_GAMMA) -> np.ndarray:
    return np.where(t > 0, gamma * t, gamma * (alpha * np.exp(t) - alpha)).astype(t.dtype)


def _selu_cpu(t: np.ndarray, *, alpha: float = SELU_ALPHA, gamma: float = SELU_GAMMA) -> np.ndarray:
    y = _elu_cpu(t, alpha=alpha)
    y *= t.dtype.type(gamma)
    return y


_act_kernels("selu", _selu_ref, _selu_cpu)


def celu(x: Any, *, alpha: float = 1.0, device: str | None = None) -> np.ndarray:
    """Elementwise ``max(0, x) + min(0, alpha (exp(x / alpha) - 1))`` (ONNX Celu); floats; alpha != 0.

    >>> celu(np.array([-1.0, 2.0])).round(4)
    array([-0.6321,  2.    ])
    """
    if alpha == 0:
        raise OpError("celu", "alpha", "a nonzero alpha (the formula divides by it)", "0")
    return _float_act("celu", x, device, alpha=alpha)


def _celu_ref(t: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    return (np.maximum(t, 0) + np.minimum(0, alpha * (np.exp(t / alpha) - 1))).astype(t.dtype)


def _celu_cpu(t: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    y = np.expm1(np.minimum(t / t.dtype.type(alpha), 0))
    y *= t.dtype.type(alpha)
    return np.where(t > 0, t, np.minimum(y, 0))


_act_kernels("celu", _celu_ref, _celu_cpu)


def leaky_relu(x: Any, *, alpha: float = 0.01, device: str | None = None) -> np.ndarray:
    """Elementwise ``x`` for ``x >= 0``, ``alpha x`` below (ONNX LeakyRelu); floats.

    >>> leaky_relu(np.array([-2.0, 3.0]))
    array([-0.02,  3.  ])
    """
    return _float_act("leaky_relu", x, device, alpha=alpha)


def _leaky_relu_ref(t: np.ndarray, *, alpha: float = 0.01) -> np.ndarray:
    return np.where(t < 0, alpha * t, t).astype(t.dtype)


def _leaky_relu_cpu(t: np.ndarray, *, alpha: float = 0.01) -> np.ndarray:
    return np.where(t < 0, t * t.dtype.type(alpha), t)


_act_kernels("leaky_relu", _leaky_relu_ref, _leaky_relu_cpu)


def thresholded_relu(x: Any, *, alpha: float = 1.0, device: str | None = None) -> np.ndarray:
    """Elementwise ``x`` for ``x > alpha``, 0 otherwise (ONNX ThresholdedRelu); floats.

    >>> thresholded_relu(np.array([0.5, 2.0]))
    array([0., 2.])
    """
    return _float_act("thresholded_relu", x, device, alpha=alpha)


def _thresholded_relu_ref(t: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    return np.where(t > alpha, t, 0).astype(t.dtype)


def _thresholded_relu_cpu(t: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    return np.where(t > t.dtype.type(alpha), t, t.dtype.type(0))


_act_kernels("thresholded_relu", _thresholded_relu_ref, _thresholded_relu_cpu)


def softplus(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise ``log(1 + exp(x))`` (ONNX Softplus), stable for large ``|x|``; floats.

    >>> softplus(np.array([0.0])).round(4)
    array([0.6931])
    """
    return _float_act("softplus", x, device)


def _softplus_ref(t: np.ndarray) -> np.ndarray:
    return (np.maximum(t, 0) + np.log1p(np.exp(-np.abs(t)))).astype(t.dtype)


def _softplus_cpu(t: np.ndarray) -> np.ndarray:
    return np.logaddexp(t.dtype.type(0), t)


_act_kernels("softplus", _softplus_ref, _softplus_cpu)


def softsign(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise ``x / (1 + |x|)`` (ONNX Softsign); floats.

    >>> softsign(np.array([-1.0, 3.0]))
    array([-0.5 ,  0.75])
    """
    return _float_act("softsign", x, device)


def _softsign_ref(t: np.ndarray) -> np.ndarray:
    return (t / (1 + np.abs(t))).astype(t.dtype)


def _softsign_cpu(t: np.ndarray) -> np.ndarray:
    d = nd(np.abs(t))
    d += t.dtype.type(1)
    return np.divide(t, d, out=d)


_act_kernels("softsign", _softsign_ref, _softsign_cpu)


def mish(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise ``x tanh(softplus(x))`` (ONNX Mish, Misra 2019); floats.

    >>> mish(np.array([1.0])).round(4)
    array([0.8651])
    """
    return _float_act("mish", x, device)


def _mish_ref(t: np.ndarray) -> np.ndarray:
    return (t * np.tanh(_softplus_ref(t))).astype(t.dtype)


def _mish_cpu(t: np.ndarray) -> np.ndarray:
    y = nd(_softplus_cpu(t))
    np.tanh(y, out=y)
    y *= t
    return y


_act_kernels("mish", _mish_ref, _mish_cpu)


def swish(x: Any, *, alpha: float = 1.0, device: str | None = None) -> np.ndarray:
    """Elementwise ``x sigmoid(alpha x)`` (ONNX Swish; alpha = 1 is SiLU), stable for large ``|x|``; floats.

    >>> swish(np.array([0.0, 1.0])).round(4)
    array([0.    , 0.7311])
    """
    return _float_act("swish", x, device, alpha=alpha)


def _swish_ref(t: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    return (t * _sigmoid_ref_values(alpha * t)).astype(t.dtype)


def _swish_cpu(t: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    y = _sigmoid_cpu_buffer(t * t.dtype.type(alpha))
    y *= t
    return y


_act_kernels("swish", _swish_ref, _swish_cpu)


def shrink(x: Any, *, bias: float = 0.0, lambd: float = 0.5, device: str | None = None) -> np.ndarray:
    """Elementwise ``x + bias`` for ``x < -lambd``, ``x - bias`` for ``x > lambd``, else 0 (ONNX Shrink).

    Floats and ints (int results wrap to x's dtype after the float arithmetic, as ONNX Runtime).

    >>> shrink(np.array([-2.0, 0.1, 2.0]), bias=0.5)
    array([-1.5,  0. ,  1.5])
    """
    x = checked("shrink", "x", x, NUMERIC)
    return call("shrink", x, bias=float(bias), lambd=float(lambd), device=device)


def _shrink_values(t: np.ndarray, bias: float, lambd: float) -> np.ndarray:
    return np.where(t < -lambd, t + bias, np.where(t > lambd, t - bias, 0))


@register("shrink", device="ref", dtypes=NUMERIC)
@ieee
def shrink_ref(x: Any, *, bias: float = 0.0, lambd: float = 0.5) -> np.ndarray:
    x = nd(x)
    t = upcast(x) if x.dtype.kind == "f" or x.dtype.kind == "V" else x.astype(np.float64)
    return cast_back(_shrink_values(t, bias, lambd).astype(t.dtype, copy=False), x.dtype)


@register("shrink", device="cpu", dtypes=NUMERIC)
@ieee
def shrink_cpu(x: Any, *, bias: float = 0.0, lambd: float = 0.5) -> np.ndarray:
    x = nd(x)
    if x.dtype.kind in "iu":  # compare and shift in float64, wrap back like a C cast
        return _shrink_values(x.astype(np.float64), bias, lambd).astype(np.int64).astype(x.dtype)
    t = upcast(x)
    c = t.dtype.type
    return cast_back(np.where(t < c(-lambd), t + c(bias), np.where(t > c(lambd), t - c(bias), c(0))), x.dtype)


def prelu(x: Any, slope: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise ``x`` for ``x >= 0``, ``slope * x`` below (ONNX PRelu); ``slope`` broadcasts to x.

    Floats and ints; slope is cast to x's dtype; the result has x's shape.

    >>> prelu(np.array([-2.0, 3.0]), np.array([0.5]))
    array([-1.,  3.])
    """
    x = checked("prelu", "x", x, NUMERIC)
    slope = checked("prelu", "slope", slope, NUMERIC)
    try:
        shape = np.broadcast_shapes(x.shape, slope.shape)
    except ValueError:
        shape = None
    if shape != x.shape:
        raise OpError("prelu", "slope", f"a shape that broadcasts to x's shape {x.shape}", str(slope.shape))
    return call("prelu", x, slope.astype(x.dtype, copy=False), device=device)


@register("prelu", device="ref", dtypes=NUMERIC)
@ieee
def prelu_ref(x: Any, slope: Any) -> np.ndarray:
    x = nd(x)
    t, s = upcast(x), upcast(nd(slope))
    return cast_back(np.where(t < 0, s * t, t), x.dtype)


@register("prelu", device="cpu", dtypes=NUMERIC)
@ieee
def prelu_cpu(x: Any, slope: Any) -> np.ndarray:
    x = nd(x)
    t = upcast(x)
    return cast_back(np.where(t < 0, t * upcast(nd(slope)), t), x.dtype)


def hardmax(x: Any, *, axis: int = -1, device: str | None = None) -> np.ndarray:
    """One-hot of the first maximum along ``axis`` (ONNX Hardmax, opset 13+), in x's dtype; floats.

    >>> hardmax(np.array([[1.0, 3.0, 3.0]]))
    array([[0., 1., 0.]])
    """
    x = checked("hardmax", "x", x, FLOATS)
    if x.ndim == 0 or not -x.ndim <= int(axis) < x.ndim:
        raise OpError("hardmax", "axis", f"an axis in [{-x.ndim}, {x.ndim}) of a rank >= 1 x", str(axis))
    return call("hardmax", x, axis=int(axis) % x.ndim, device=device)


@register("hardmax", device="ref", dtypes=FLOATS)
def hardmax_ref(x: Any, *, axis: int = -1) -> np.ndarray:
    x = nd(x)
    xs = np.moveaxis(upcast(x), axis, -1)
    out = np.zeros(xs.shape, x.dtype)
    for idx in np.ndindex(*xs.shape[:-1]):
        if xs.shape[-1]:
            out[idx][int(np.argmax(xs[idx]))] = 1
    return np.moveaxis(out, -1, axis)


@register("hardmax", device="cpu", dtypes=FLOATS)
def hardmax_cpu(x: Any, *, axis: int = -1) -> np.ndarray:
    x = nd(x)
    out = np.zeros(x.shape, x.dtype)
    if x.size:
        np.put_along_axis(out, np.expand_dims(np.argmax(upcast(x), axis=axis), axis), 1, axis=axis)
    return out
