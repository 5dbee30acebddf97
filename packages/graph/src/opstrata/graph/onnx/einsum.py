"""Einsum import: the common one- and two-operand equations as Transpose/ReduceSum/MatMul/(Un)Squeeze.

Two operands: letters split into batch (both + output), contracted (both, not output) and free
(one operand + output); at most one contracted letter (as attention and linear layers use); extra
free letters become broadcast dims of the MatMul. An ellipsis becomes fresh letters when the
operands' ranks are known at import; a letter repeated within an operand (diagonal, trace) becomes
Where(eye mask) + ReduceSum when its dimension is known at import.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .context import ImportContext

__all__ = ["import_einsum"]


def _shape(ctx: ImportContext, x: str) -> tuple | None:
    v = ctx.graph.values.get(x)
    return None if v is None else v.shape


def _expand_ellipsis(ctx: ImportContext, eq: str) -> str:
    """``eq`` with each ``...`` replaced by fresh letters (right-aligned, as numpy broadcasts them)."""
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ctx.inputs):
        raise ctx.unsupported(f"Einsum equation '{eq}' has {len(terms)} terms for {len(ctx.inputs)} inputs")
    counts = []
    for t, x in zip(terms, ctx.inputs, strict=True):
        if "..." not in t:
            counts.append(0)
            continue
        shape = _shape(ctx, x)
        if shape is None:
            raise ctx.unsupported(
                f"Einsum equation '{eq}' uses an ellipsis on input '{x}' whose rank is unknown at import; "
                "give the input a shape (value_info) or rewrite the equation with letters"
            )
        counts.append(len(shape) - (len(t) - 3))
    free = [c for c in string.ascii_letters if c not in eq]
    n = max(counts)
    dots = "".join(free[:n])
    terms = [t.replace("...", dots[n - k :]) for t, k in zip(terms, counts, strict=True)]
    if arrow:
        return ",".join(terms) + "->" + rhs.replace("...", dots)
    letters = "".join(terms)
    rest = "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in dots))
    return ",".join(terms) + "->" + dots + rest


def _parse(ctx: ImportContext) -> tuple[list[str], str]:
    eq = ctx.attrs["equation"].replace(" ", "")
    if "." in eq:
        eq = _expand_ellipsis(ctx, eq)
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if "->" not in eq:
        letters = "".join(terms)
        rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    for t in [*terms, rhs]:
        if not t.isalpha() and t:
            raise ctx.unsupported(f"Einsum equation '{eq}' has a term that is not letters")
    if len(set(rhs)) != len(rhs):
        raise ctx.unsupported(f"Einsum equation '{eq}' repeats a letter in its output")
    if len(terms) != len(ctx.inputs):
        raise ctx.unsupported(f"Einsum equation '{eq}' has {len(terms)} terms for {len(ctx.inputs)} inputs")
    return terms, rhs


def _diagonal(ctx: ImportContext, x: str, term: str) -> tuple[str, str]:
    """Take the diagonal of every letter repeated in ``term`` (Where(eye) + ReduceSum over the repeat)."""
    shape = _shape(ctx, x)
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        p, q = term.index(c), term.index(c, term.index(c) + 1)
        v = ctx.graph.values.get(x)
        dims = [] if shape is None else [shape[p], shape[q]]
        n = next((d for d in dims if isinstance(d, int)), None)
        if n is None or v is None or v.dtype is None:
            raise ctx.unsupported(
                f"Einsum term '{term}' repeats '{c}' (diagonal/trace) on input '{x}' whose dimension or dtype "
                "is unknown at import; give the input a shape (value_info)"
            )
        mask_shape = [1] * len(term)
        mask_shape[p] = mask_shape[q] = n
        mask, zero = ctx.fresh("eye"), ctx.fresh("zero")
        ctx.graph.add_initializer(mask, np.eye(n, dtype=bool).reshape(mask_shape))
        ctx.graph.add_initializer(zero, np.zeros((), v.dtype))
        kept = ctx.fresh("diag_mask")
        ctx.emit("Where", [mask, x, zero], [kept])
        x = ctx.fresh("diag")
        ctx.emit("ReduceSum", [kept], [x], {"axes": [q], "keepdims": 0})
        ctx.graph.values[x].dtype = v.dtype
        shape = None if shape is None else (*shape[:q], *shape[q + 1 :])
        ctx.graph.values[x].shape = shape
        term = term[:q] + term[q + 1 :]
    return x, term


def _transpose(ctx: ImportContext, x: str, have: str, want: str, out: str | None = None) -> str:
    if have == want:
        if out is not None:
            ctx.emit("Identity", [x], [out])
            return out
        return x
    y = out or ctx.fresh("transpose")
    ctx.emit("Transpose", [x], [y], {"perm": [have.index(c) for c in want]})
    return y


def _reduce(ctx: ImportContext, x: str, have: str, drop: str) -> tuple[str, str]:
    if not drop:
        return x, have
    y = ctx.fresh("sum")
    ctx.emit("ReduceSum", [x], [y], {"axes": [have.index(c) for c in drop], "keepdims": 0})
    return y, "".join(c for c in have if c not in drop)


def import_einsum(ctx: ImportContext) -> None:
    """Emit IR nodes computing ``ctx``'s Einsum node."""
    terms, rhs = _parse(ctx)
    out = ctx.outputs[0]
    if len(terms) not in (1, 2):
        raise ctx.unsupported(f"Einsum with {len(terms)} operands is not supported (1 or 2)")
    ins = list(ctx.inputs)
    for i, t in enumerate(terms):
        if len(set(t)) != len(t):
            ins[i], terms[i] = _diagonal(ctx, ins[i], t)
    if len(terms) == 1:
        x, have = _reduce(ctx, ins[0], terms[0], "".join(c for c in terms[0] if c not in rhs))
        _transpose(ctx, x, have, rhs, out)
        return
    ta, tb = terms
    a, ta = _reduce(ctx, ins[0], ta, "".join(c for c in ta if c not in tb and c not in rhs))
    b, tb = _reduce(ctx, ins[1], tb, "".join(c for c in tb if c not in ta and c not in rhs))
    batch = "".join(c for c in rhs if c in ta and c in tb)
    contract = "".join(c for c in ta if c in tb and c not in rhs)
    fa = "".join(c for c in ta if c not in tb)
    fb = "".join(c for c in tb if c not in ta)
    if len(contract) > 1:
        raise ctx.unsupported(
            f"Einsum '{ctx.attrs['equation']}' contracts more than one letter; "
            "only matmul-shaped equations (one contracted letter) are supported"
        )
    # free letters beyond each operand's last one become broadcast dims: A (.., fa_x, 1.., fa_l, c) @
    # B (.., 1.., fb_x, c, fb_l) -> (.., fa_x, fb_x, fa_l, fb_l)
    xa, xb = fa[:-1], fb[:-1]
    a = _transpose(ctx, a, ta, batch + fa + contract)
    b = _transpose(ctx, b, tb, batch + xb + contract + fb[-1:])
    if xb:
        a = _unsqueeze(ctx, a, list(range(len(batch) + len(xa), len(batch) + len(xa) + len(xb))))
    if xa:
        b = _unsqueeze(ctx, b, list(range(len(batch), len(batch) + len(xa))))
    batch, fa, fb = batch + xa + xb, fa[-1:], fb[-1:]
    nb = len(batch)
    squeeze: list[int] = []
    if not contract:  # outer product: (.., a, 1) @ (.., 1, b)
        a = _unsqueeze(ctx, a, [nb + len(fa)])
        b = _unsqueeze(ctx, b, [nb])
    if not fa:
        a = _unsqueeze(ctx, a, [nb])
        squeeze.append(nb)
    if not fb:
        b = _unsqueeze(ctx, b, [nb + 1])
        squeeze.append(nb + 1)
    have = batch + fa + fb
    m = ctx.fresh("matmul") if squeeze or have != rhs else out
    ctx.emit("MatMul", [a, b], [m])
    if squeeze:
        s = ctx.fresh("squeeze") if have != rhs else out
        ctx.emit("Squeeze", [m], [s], {"axes": squeeze})
        m = s
    if have != rhs:
        _transpose(ctx, m, have, rhs, out)


def _unsqueeze(ctx: ImportContext, x: str, axes: list[int]) -> str:
    y = ctx.fresh("unsqueeze")
    ctx.emit("Unsqueeze", [x], [y], {"axes": axes})
    return y
