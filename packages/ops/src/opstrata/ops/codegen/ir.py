"""The expression IR for generated elementwise kernels: hash-consed nodes, builders and the simplifier.

A tree of :class:`Expr` nodes — inputs (``var``), constants, elementwise ops and at most one final
reduction — with *structural* equality and hashing, so equal subtrees are one value: the generator's
common-subexpression elimination and its kernel cache both key on structure, never object identity
(the approach of tinygrad's UOps and of a compiler's value numbering). The simplifier does what a
compiler would: constant folding, integer powers to multiplications (numpy's float32 ``x ** 3`` goes
through libm ``pow``, ~100x slower on negative bases than ``x * x * x``), ``x ** 0.5`` to sqrt,
division by a constant to multiplication by its reciprocal, and the identities ``x * 1``, ``x + 0``,
``--x``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["OPS", "CodegenError", "Expr", "apply", "const", "simplify", "var"]


class CodegenError(ValueError):
    """A malformed expression or kernel call; the message names the op/argument, expected and actual."""


@dataclass(frozen=True)
class OpSpec:
    """One IR op: arity, result kind (``f`` float / ``b`` bool / ``r`` reduction) and a float64 folder."""

    arity: int
    kind: str
    fold: Callable[..., float] | None


def _sigmoid(a: float) -> float:
    return 1.0 / (1.0 + math.exp(-a)) if a > -700 else 0.0


def _gelu(a: float) -> float:
    return 0.5 * a * (1.0 + math.erf(a / math.sqrt(2.0)))


def _gelu_tanh(a: float) -> float:
    return 0.5 * a * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a * a * a)))


def _np1(f: Callable[[Any], Any]) -> Callable[[float], float]:
    return lambda a: float(f(np.float64(a)))


def _np2(f: Callable[[Any, Any], Any]) -> Callable[[float, float], float]:
    return lambda a, b: float(f(np.float64(a), np.float64(b)))


#: Every op the IR knows. Elementwise ops are arity 1-3; reductions (``reduce_*``) only at the root.
OPS: dict[str, OpSpec] = {
    "add": OpSpec(2, "f", _np2(np.add)),
    "sub": OpSpec(2, "f", _np2(np.subtract)),
    "mul": OpSpec(2, "f", _np2(np.multiply)),
    "div": OpSpec(2, "f", _np2(np.true_divide)),
    "pow": OpSpec(2, "f", _np2(np.power)),
    "maximum": OpSpec(2, "f", _np2(np.maximum)),
    "minimum": OpSpec(2, "f", _np2(np.minimum)),
    "neg": OpSpec(1, "f", _np1(np.negative)),
    "abs": OpSpec(1, "f", _np1(np.absolute)),
    "exp": OpSpec(1, "f", _np1(np.exp)),
    "log": OpSpec(1, "f", _np1(np.log)),
    "sqrt": OpSpec(1, "f", _np1(np.sqrt)),
    "rsqrt": OpSpec(1, "f", _np1(lambda a: 1.0 / np.sqrt(a))),
    "tanh": OpSpec(1, "f", _np1(np.tanh)),
    "erf": OpSpec(1, "f", math.erf),
    "sigmoid": OpSpec(1, "f", _sigmoid),
    "relu": OpSpec(1, "f", _np1(lambda a: np.maximum(a, 0.0))),
    "gelu": OpSpec(1, "f", _gelu),
    "gelu_tanh": OpSpec(1, "f", _gelu_tanh),
    "silu": OpSpec(1, "f", lambda a: a * _sigmoid(a)),
    "lt": OpSpec(2, "b", None),
    "le": OpSpec(2, "b", None),
    "gt": OpSpec(2, "b", None),
    "ge": OpSpec(2, "b", None),
    "eq": OpSpec(2, "b", None),
    "ne": OpSpec(2, "b", None),
    "where": OpSpec(3, "f", None),
    "to_float": OpSpec(1, "f", float),  # inserted by simplify: a comparison used as a number (0/1)
    "reduce_sum": OpSpec(1, "r", None),
    "reduce_mean": OpSpec(1, "r", None),
    "reduce_max": OpSpec(1, "r", None),
}
COMMUTATIVE = frozenset({"add", "mul", "maximum", "minimum", "eq", "ne"})


class Expr:
    """A node: ``op`` in :data:`OPS` or ``var``/``const``; ``args`` child nodes; ``attr`` name/value/axis.

    ``==`` and ``hash`` are structural (use :func:`eq` for an elementwise comparison); arithmetic and
    ``<``/``<=``/``>``/``>=`` operators build nodes.
    """

    __slots__ = ("_hash", "args", "attr", "digest", "op")

    def __init__(self, op: str, args: tuple[Expr, ...] = (), attr: Any = None) -> None:
        self.op, self.args, self.attr = op, args, attr
        # A content digest, stable across processes (str hashes are salted): it orders commutative
        # operands, so the generated source is the same in every run.
        text = "|".join([op, repr(attr), *(a.digest for a in args)])
        self.digest = hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
        self._hash = hash(self.digest)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return isinstance(other, Expr) and self.digest == other.digest

    def __bool__(self) -> bool:
        raise TypeError("an Expr has no truth value (did you mean where(cond, a, b)?)")

    def __repr__(self) -> str:
        text: dict[Expr, str] = {}
        stack: list[tuple[Expr, bool]] = [(self, False)]
        while stack:  # iterative post-order: deep chains print without hitting the recursion limit
            n, ready = stack.pop()
            if n in text:
                continue
            if not ready and n.args:
                stack.append((n, True))
                stack.extend((a, False) for a in n.args)
                continue
            text[n] = n._label(tuple(text[a] for a in n.args))
        return text[self]

    def _label(self, args: tuple[str, ...]) -> str:
        if self.op == "var":
            return str(self.attr)
        if self.op == "const":
            return repr(self.value)
        return f"{self.op}({', '.join(args)}{'' if self.attr is None else f', axis={self.attr}'})"

    @property
    def value(self) -> float:
        """A constant's value."""
        return float.fromhex(self.attr)

    # arithmetic ---------------------------------------------------------------------------
    def __add__(self, o: Any) -> Expr:
        return apply("add", self, o)

    def __radd__(self, o: Any) -> Expr:
        return apply("add", o, self)

    def __sub__(self, o: Any) -> Expr:
        return apply("sub", self, o)

    def __rsub__(self, o: Any) -> Expr:
        return apply("sub", o, self)

    def __mul__(self, o: Any) -> Expr:
        return apply("mul", self, o)

    def __rmul__(self, o: Any) -> Expr:
        return apply("mul", o, self)

    def __truediv__(self, o: Any) -> Expr:
        return apply("div", self, o)

    def __rtruediv__(self, o: Any) -> Expr:
        return apply("div", o, self)

    def __pow__(self, o: Any) -> Expr:
        return apply("pow", self, o)

    def __rpow__(self, o: Any) -> Expr:
        return apply("pow", o, self)

    def __neg__(self) -> Expr:
        return apply("neg", self)

    def __abs__(self) -> Expr:
        return apply("abs", self)

    def __lt__(self, o: Any) -> Expr:
        return apply("lt", self, o)

    def __le__(self, o: Any) -> Expr:
        return apply("le", self, o)

    def __gt__(self, o: Any) -> Expr:
        return apply("gt", self, o)

    def __ge__(self, o: Any) -> Expr:
        return apply("ge", self, o)


def var(name: str) -> Expr:
    """An input named ``name`` (a Python identifier), bound by keyword when the kernel is called."""
    if not isinstance(name, str) or not name.isidentifier():
        raise CodegenError(f"var: argument 'name' expected a Python identifier, got {name!r}")
    return Expr("var", (), name)


def const(value: Any) -> Expr:
    """A scalar constant (stored exactly, as float64 hex; used in the kernel's compute dtype)."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, (bool, int, float, np.integer, np.floating)):
        return Expr("const", (), float(value).hex())
    raise CodegenError(
        f"const: argument 'value' expected a real scalar, got {type(value).__name__} {value!r}"
    )


def apply(op: str, *args: Any) -> Expr:
    """The node ``op(*args)``; Python numbers become constants; unknown ops and arities are errors."""
    spec = OPS.get(op)
    if spec is None:
        raise CodegenError(f"codegen: unknown op {op!r}; known ops: {', '.join(sorted(OPS))}")
    if len(args) != spec.arity:
        raise CodegenError(f"{op}: expected {spec.arity} argument(s), got {len(args)}")
    nodes = tuple(const(a) for a in args)
    for i, a in enumerate(nodes):
        if a.op.startswith("reduce_"):
            raise CodegenError(f"{op}: argument {i} expected an elementwise expression, got a reduction "
                               f"({a.op}); a reduction may only be the final op")  # fmt: skip
    if op == "where" and kind(nodes[0]) != "b":
        raise CodegenError(f"where: argument 'cond' expected a comparison (bool), got {nodes[0]!r}")
    return Expr(op, nodes)


def reduction(op: str, e: Any, axis: int | None) -> Expr:
    """A final ``reduce_sum``/``reduce_mean``/``reduce_max`` of ``e`` over ``axis`` (None: all)."""
    if axis is not None and (isinstance(axis, bool) or not isinstance(axis, (int, np.integer))):
        raise CodegenError(f"{op}: argument 'axis' expected an int or None, got {axis!r}")
    node = apply(op, e)
    return Expr(op, node.args, None if axis is None else int(axis))


def kind(e: Expr) -> str:
    """``b`` for comparisons, ``f`` for everything else (inputs are read as floats)."""
    return OPS[e.op].kind if e.op in OPS else "f"


# --------------------------------------------------------------------------- simplification


def _c(e: Expr) -> float | None:
    return e.value if e.op == "const" else None


def _int_power(x: Expr, n: int) -> Expr:
    """x**n (n >= 1) by repeated squaring; equal squares are one node, so the generator computes them once."""
    if n == 1:
        return x
    half = _int_power(x, n // 2)
    sq = Expr("mul", (half, half))
    return Expr("mul", (sq, x)) if n % 2 else sq


def _fold(op: str, args: tuple[Expr, ...]) -> Expr | None:
    spec = OPS[op]
    if spec.fold is None or not args or any(a.op != "const" for a in args):
        return None
    with np.errstate(all="ignore"):
        try:
            return const(spec.fold(*(a.value for a in args)))
        except (OverflowError, ValueError, ZeroDivisionError):
            return None  # leave it to the kernel, which gives the IEEE answer


def _rewrite(op: str, args: tuple[Expr, ...]) -> Expr:
    """Algebraic rewrites of one node whose children are already simplified."""
    a, b = (*args, None, None)[:2]
    cb = _c(b) if b is not None else None
    if op == "pow" and cb is not None:
        if math.isfinite(cb) and cb == int(cb) and 1 <= abs(cb) <= 16:
            p = _int_power(a, int(abs(cb)))
            return p if cb > 0 else Expr("div", (const(1.0), p))
        if cb == 0.5:
            return Expr("sqrt", (a,))
        if cb == -0.5:
            return Expr("rsqrt", (a,))
    if op == "div" and cb is not None and cb != 0 and math.isfinite(1.0 / cb):
        return _rewrite("mul", (a, const(1.0 / cb)))
    if op in COMMUTATIVE and _c(a) is not None and cb is None:
        a, b, args = b, a, (b, a)  # constant second: one rule below covers both orders
        cb = _c(b)
    if (op == "mul" and cb == 1.0) or (op in ("add", "sub") and cb == 0.0):
        return a
    if op == "mul" and cb == -1.0:
        return _rewrite("neg", (a,))
    if op == "neg" and a.op == "neg":
        return a.args[0]
    if op in COMMUTATIVE and cb is None and a.digest > b.digest:
        args = (b, a)  # canonical order, so x*y and y*x are one subexpression
    return Expr(op, args)


def _simplify_node(e: Expr, args: tuple[Expr, ...]) -> Expr:
    if e.op in ("var", "const"):
        return e
    if e.op.startswith("reduce_"):
        return Expr(e.op, args, e.attr)
    if e.op not in ("where", "to_float") and kind(e) == "f" and any(kind(a) == "b" for a in args):
        return _rewrite(e.op, tuple(Expr("to_float", (a,)) if kind(a) == "b" else a for a in args))
    folded = _fold(e.op, args)
    return folded if folded is not None else _rewrite(e.op, args)


def simplify(e: Expr) -> Expr:
    """The simplified equivalent of ``e``: bottom-up, shared subtrees once, iterative (no depth limit)."""
    memo: dict[Expr, Expr] = {}
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        n, ready = stack.pop()
        if n in memo:
            continue
        if not ready and n.args:
            stack.append((n, True))
            stack.extend((a, False) for a in n.args if a not in memo)
            continue
        memo[n] = _simplify_node(n, tuple(memo[a] for a in n.args))
    return memo[e]


def variables(e: Expr) -> list[str]:
    """Input names in order of first appearance (depth-first, left to right)."""
    seen: dict[str, None] = {}
    stack = [e]
    visited: set[Expr] = set()
    order: list[Expr] = []
    while stack:  # iterative pre-order, so deep chains do not hit the recursion limit
        n = stack.pop()
        if n in visited:
            continue
        visited.add(n)
        order.append(n)
        stack.extend(reversed(n.args))
    for n in order:
        if n.op == "var":
            seen.setdefault(n.attr, None)
    return list(seen)
