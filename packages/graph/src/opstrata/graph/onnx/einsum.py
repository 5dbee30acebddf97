"""Einsum import: the common one- and two-operand equations as Transpose/ReduceSum/MatMul/(Un)Squeeze.

Two operands: letters split into batch (both + output), contracted (both, not output) and free
(one operand + output); at most one contracted and one free letter per operand (as attention and
linear layers use), no ellipsis, no repeated letters within an operand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .context import ImportContext

__all__ = ["import_einsum"]


def _parse(ctx: ImportContext) -> tuple[list[str], str]:
    eq = ctx.attrs["equation"].replace(" ", "")
    if "." in eq:
        raise ctx.unsupported(f"Einsum equation '{eq}' uses an ellipsis, which is not supported")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if "->" not in eq:
        letters = "".join(terms)
        rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    for t in [*terms, rhs]:
        if len(set(t)) != len(t) or (not t.isalpha() and t):
            raise ctx.unsupported(f"Einsum equation '{eq}' repeats a letter within a term (trace/diagonal)")
    if len(terms) != len(ctx.inputs):
        raise ctx.unsupported(f"Einsum equation '{eq}' has {len(terms)} terms for {len(ctx.inputs)} inputs")
    return terms, rhs


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
    if len(terms) == 1:
        x, have = _reduce(ctx, ctx.inputs[0], terms[0], "".join(c for c in terms[0] if c not in rhs))
        _transpose(ctx, x, have, rhs, out)
        return
    if len(terms) != 2:
        raise ctx.unsupported(f"Einsum with {len(terms)} operands is not supported (1 or 2)")
    ta, tb = terms
    a, ta = _reduce(ctx, ctx.inputs[0], ta, "".join(c for c in ta if c not in tb and c not in rhs))
    b, tb = _reduce(ctx, ctx.inputs[1], tb, "".join(c for c in tb if c not in ta and c not in rhs))
    batch = "".join(c for c in rhs if c in ta and c in tb)
    contract = "".join(c for c in ta if c in tb and c not in rhs)
    fa = "".join(c for c in ta if c not in tb)
    fb = "".join(c for c in tb if c not in ta)
    if len(contract) > 1 or len(fa) > 1 or len(fb) > 1:
        raise ctx.unsupported(
            f"Einsum '{ctx.attrs['equation']}' contracts or keeps more than one letter per operand; "
            "only matmul-shaped equations are supported"
        )
    a = _transpose(ctx, a, ta, batch + fa + contract)
    b = _transpose(ctx, b, tb, batch + contract + fb)
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
