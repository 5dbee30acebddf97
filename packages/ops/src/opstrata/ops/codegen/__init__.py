"""opstrata.ops.codegen — build elementwise expressions and compile them into fused, blocked kernels.

>>> import numpy as np
>>> from opstrata.ops.codegen import compile_expr, var, tanh
>>> x, b = var("x"), var("b")
>>> k = compile_expr(tanh(x + b) * 2.0)
>>> k(x=np.zeros((2, 3), np.float32), b=np.ones(3, np.float32)).shape
(2, 3)

The IR and simplifier are in ``_codegen_ir``, the generator and cache in ``_codegen``.
"""

from __future__ import annotations

from typing import Any

from .generate import (
    ElementwiseKernel as ElementwiseKernel,
    cache_clear as cache_clear,
    cache_info as cache_info,
    compile_expr as compile_expr,
)
from .ir import (
    OPS as OPS,
    CodegenError as CodegenError,
    Expr as Expr,
    apply as apply,
    const as const,
    reduction as _reduction,
    simplify as simplify,
    var as var,
)

__all__ = [
    "OPS",
    "CodegenError",
    "ElementwiseKernel",
    "Expr",
    "abs",
    "apply",
    "cache_clear",
    "cache_info",
    "compile_expr",
    "const",
    "eq",
    "erf",
    "exp",
    "ge",
    "gelu",
    "gelu_tanh",
    "gt",
    "le",
    "log",
    "lt",
    "maximum",
    "minimum",
    "ne",
    "reduce_max",
    "reduce_mean",
    "reduce_sum",
    "relu",
    "rsqrt",
    "sigmoid",
    "silu",
    "simplify",
    "sqrt",
    "tanh",
    "var",
    "where",
]


def _unary(op: str):
    def f(x: Any) -> Expr:
        return apply(op, x)

    f.__name__ = f.__qualname__ = op
    f.__doc__ = f"Elementwise ``{op}(x)`` node."
    return f


def _binary(op: str):
    def f(a: Any, b: Any) -> Expr:
        return apply(op, a, b)

    f.__name__ = f.__qualname__ = op
    f.__doc__ = f"Elementwise ``{op}(a, b)`` node (broadcasting)."
    return f


abs = _unary("abs")
exp = _unary("exp")
log = _unary("log")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
tanh = _unary("tanh")
erf = _unary("erf")
sigmoid = _unary("sigmoid")
relu = _unary("relu")
gelu = _unary("gelu")
gelu_tanh = _unary("gelu_tanh")
silu = _unary("silu")
maximum = _binary("maximum")
minimum = _binary("minimum")
lt = _binary("lt")
le = _binary("le")
gt = _binary("gt")
ge = _binary("ge")
eq = _binary("eq")
ne = _binary("ne")


def where(cond: Any, a: Any, b: Any) -> Expr:
    """``a`` where the comparison ``cond`` holds, else ``b``."""
    return apply("where", cond, a, b)


def reduce_sum(x: Any, axis: int | None = -1) -> Expr:
    """Final sum over ``axis`` (None: all elements); must be the root of the expression."""
    return _reduction("reduce_sum", x, axis)


def reduce_mean(x: Any, axis: int | None = -1) -> Expr:
    """Final mean over ``axis`` (None: all elements); must be the root of the expression."""
    return _reduction("reduce_mean", x, axis)


def reduce_max(x: Any, axis: int | None = -1) -> Expr:
    """Final max over ``axis`` (None: all elements); must be the root of the expression."""
    return _reduction("reduce_max", x, axis)
