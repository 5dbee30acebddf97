"""Symbolic dimensions: an int, a name such as ``"batch"``, a product such as ``"4*batch"``, or None.

Products are kept as a coefficient and a multiset of symbols, rendered ``"4*batch*seq"`` (sorted),
so that reshapes of ``(batch, seq, 64)`` into ``(batch, seq, 4, 16)`` infer exactly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

__all__ = ["Dim", "Shape", "broadcast_shapes", "dim_div", "dim_mul", "dim_prod", "dims_equal", "is_static"]

Dim = int | str | None
Shape = tuple[Dim, ...]


def _factor(d: int | str) -> tuple[int, Counter[str]]:
    if isinstance(d, int):
        return d, Counter()
    coef, syms = 1, Counter[str]()
    for part in d.split("*"):
        part = part.strip()
        if part.lstrip("-").isdigit():
            coef *= int(part)
        else:
            syms[part] += 1
    return coef, syms


def _render(coef: int, syms: Counter[str]) -> Dim:
    if not syms or coef == 0:
        return coef
    names = sorted(syms.elements())
    return "*".join(([str(coef)] if coef != 1 else []) + names)


def dim_mul(a: Dim, b: Dim) -> Dim:
    """Product of two dims (None when either is unknown, except that 0 times anything is 0)."""
    if a == 0 or b == 0:
        return 0
    if a is None or b is None:
        return None
    ca, sa = _factor(a)
    cb, sb = _factor(b)
    return _render(ca * cb, sa + sb)


def dim_prod(dims: Iterable[Dim]) -> Dim:
    """Product of dims; 1 for none."""
    out: Dim = 1
    for d in dims:
        out = dim_mul(out, d)
    return out


def dim_div(a: Dim, b: Dim) -> Dim:
    """Exact quotient ``a / b`` when it is known to divide, else None."""
    if a is None or b is None or b == 0:
        return None
    ca, sa = _factor(a)
    cb, sb = _factor(b)
    if any(sa[s] < n for s, n in sb.items()) or ca % cb:
        return None
    return _render(ca // cb, sa - sb)


def dims_equal(a: Dim, b: Dim) -> bool:
    """True when both dims are known and provably equal."""
    if a is None or b is None:
        return False
    return _factor(a) == _factor(b)


def is_static(shape: Sequence[Dim] | None) -> bool:
    """True when the rank and every dim are known integers."""
    return shape is not None and all(isinstance(d, int) for d in shape)


def _broadcast_dim(a: Dim, b: Dim) -> Dim | bool:
    if a == 1:
        return b
    if b == 1:
        return a
    if a is None or b is None:
        return a if isinstance(a, int) else b if isinstance(b, int) else None
    if isinstance(a, int) and isinstance(b, int):
        return a if a == b else False
    if isinstance(a, int):  # b symbolic: b is a or 1, the result is a either way
        return a
    if isinstance(b, int):
        return b
    return a if dims_equal(a, b) else None


def broadcast_shapes(*shapes: Sequence[Dim]) -> Shape:
    """Numpy/ONNX multidirectional broadcast over symbolic shapes; ValueError on a static clash."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = [1] * rank
    for s in shapes:
        padded = (1,) * (rank - len(s)) + tuple(s)
        for i, d in enumerate(padded):
            r = _broadcast_dim(out[i], d)
            if r is False:
                raise ValueError(f"dims {out[i]} and {d} at position {i - rank} cannot broadcast")
            out[i] = r  # type: ignore[assignment]
    return tuple(out)
