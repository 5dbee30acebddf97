"""The error function: ``ref`` from :func:`math.erf`, ``cpu`` from Cephes' rational approximations.

The cpu kernel follows S. L. Moshier's Cephes ``ndtr.c`` (public domain; the same approximations
scipy's ``erf`` compiles): ``erf(x) = x T(x^2) / U(x^2)`` for ``|x| <= 1`` and
``erf(x) = sign(x) (1 - exp(-x^2) P(|x|) / Q(|x|))`` above, ~1e-16 relative in float64. Evaluated in
float32 for float32 and low-precision inputs (a few float32 ulp), in float64 for float64.

:data:`EIGEN_ERF_P` / :data:`EIGEN_ERF_Q` are the branch-free float32 approximation of Eigen / XLA
(``x P(x^2) / Q(x^2)`` on ``[-4, 4]``, ~4e-7 absolute): exact GELU in float32 evaluates it (its error
scaled by ``x / 2`` sits far inside float32's tolerance); ``erf`` itself keeps the few-ulp Cephes kernel.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._dtypes import compute_dtype
from .._registry import call, register
from .elementwise import FLOATS, cast_back, checked, ieee, nd

# Cephes ndtr.c: erf on |x| <= 1, numerator T (degree 4) over monic U (degree 5), in x^2.
_T = (9.60497373987051638749e0, 9.00260197203842689217e1, 2.23200534594684319226e3,
      7.00332514112805075473e3, 5.55923013010394962768e4)  # fmt: skip
_U = (3.35617141647503099647e1, 5.21357949780152679795e2, 4.59432382970980127987e3,
      2.26290000613890934246e4, 4.92673942608635921086e4)  # fmt: skip
# erfc on 1 < |x| < 8: exp(-x^2) P(x) / Q(x), Q monic (degree 8).
_P = (2.46196981473530512524e-10, 5.64189564831068821977e-1, 7.46321056442269912687e0,
      4.86371970985681366614e1, 1.96520832956077098242e2, 5.26445194995477358631e2,
      9.34528527171957607540e2, 1.02755188689515710272e3, 5.57535335369399327526e2)  # fmt: skip
_Q = (1.32281951154744992508e1, 8.67072140885989742329e1, 3.54937778887819891062e2,
      9.75708501743205489753e2, 1.82390916687909736289e3, 2.24633760818710981792e3,
      1.65666309194161350182e3, 5.57535340817727675546e2)  # fmt: skip
# Above |x| = 6, erfc < 2.2e-17: erf rounds to +-1 in float64, so P/Q never needs |x| >= 8.
_CLAMP = 6.0


def _polevl(z: np.ndarray, coefs: tuple[float, ...], *, monic: bool = False) -> np.ndarray:
    """Horner evaluation in z's dtype; ``monic`` prepends a leading coefficient 1 (Cephes p1evl)."""
    r = z + coefs[0] if monic else np.full_like(z, coefs[0])
    for c in coefs[1:]:
        r *= z
        r += c
    return r


# Eigen's generic_fast_erf_float (also XLA's): erf(x) = x P(x^2) / Q(x^2) on [-4, 4], highest degree first;
# ~4e-7 absolute in float32 arithmetic. GELU evaluates it with its constants folded (kernels/activation.py).
EIGEN_ERF_P = (
    -2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
    -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)  # fmt: skip
EIGEN_ERF_Q = (
    -1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
    -1.42647390514189e-02)  # fmt: skip


def erf_values(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erf of a float32/float64 array, vectorized; ``out`` may be ``x`` itself (in-place)."""
    out = np.empty_like(x) if out is None else out
    big = np.abs(x) > 1.0  # NaN compares False and goes through the small branch: NaN out
    xs, xb = x[~big], x[big]  # gather both before writing: safe when out is x
    z = xs * xs
    num = _polevl(z, _T)
    num *= xs
    num /= _polevl(z, _U, monic=True)
    out[~big] = num
    a = np.minimum(np.abs(xb), _CLAMP)
    tail = _polevl(a, _P)
    tail /= _polevl(a, _Q, monic=True)
    a *= a
    np.negative(a, out=a)
    tail *= np.exp(a, out=a)  # erfc(|x|)
    np.subtract(1.0, tail, out=tail)
    out[big] = np.copysign(tail, xb, out=tail)
    return out


def erf(x: Any, *, device: str | None = None) -> np.ndarray:
    """Elementwise Gauss error function ``2/sqrt(pi) * integral_0^x exp(-t^2) dt``; floats.

    Low precision computes in float32 and rounds once; ``cpu`` uses Cephes' rational approximation,
    ``ref`` Python's :func:`math.erf`.

    >>> float(erf(np.array([0.5]))[0])
    0.5204998778130465
    """
    return call("erf", checked("erf", "x", x, FLOATS), device=device)


_math_erf = np.frompyfunc(math.erf, 1, 1)


@register("erf", device="ref", dtypes=FLOATS)
def erf_ref(x: Any) -> np.ndarray:
    x = nd(x)
    return cast_back(nd(_math_erf(x.astype(np.float64))).astype(np.float64), x.dtype)


@register("erf", device="cpu", dtypes=FLOATS)
@ieee
def erf_cpu(x: Any) -> np.ndarray:
    x = nd(x)
    t = x.astype(compute_dtype(x.dtype))  # one fresh buffer in the compute dtype, then in place
    return cast_back(erf_values(t, out=t), x.dtype)
