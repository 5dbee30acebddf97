"""``FusedElementwise`` expressions -> opstrata.ops codegen IR, compiled into one kernel (the cpu path).

A node's ``expr`` (steps ``[op, [refs]]``, refs ``x<i>`` input / ``t<j>`` step / ``c<k>`` folded
constant) becomes one :class:`opstrata.ops.codegen.Expr` tree over ``var("x<i>")``;
:func:`opstrata.ops.codegen.compile_expr` generates, compiles and caches the blocked numpy kernel
by structure and dtype, so every node with the same chain shares one kernel (``kernel.source``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from opstrata.ops import codegen as cg

from .._ir import Node
from . import registry

__all__ = ["CODEGEN", "bind_fused", "fused_expr", "fused_kernel", "run_fused"]

#: Binding kernel name and path of a FusedElementwise node run through the ops code generator.
CODEGEN = "codegen"


_KERNELS: dict[tuple[str, str], cg.ElementwiseKernel] = {}  # (expr/consts text, dtype) -> kernel
_LOCK = threading.Lock()


def codegen_step(op: str, args: Sequence[cg.Expr]) -> cg.Expr:
    """The codegen expression of one fusable ONNX op (its OpDef's ``codegen`` name) over ``args``."""
    d = registry.lookup(op)
    if d is None or d.codegen is None:
        raise KeyError(
            f"{op} has no codegen expression; fusable ops: {sorted(registry.elementwise_ops(codegen=True))}"
        )
    if d.codegen == "reciprocal":  # 1 / x: the generator's div with a constant numerator
        return cg.apply("div", 1.0, args[0])
    return cg.apply(d.codegen, *args)


def fused_expr(expr: Sequence[Sequence[Any]], consts: Sequence[float] = ()) -> cg.Expr:
    """The codegen expression of a FusedElementwise ``expr`` (inputs are ``var("x<i>")``)."""
    t: list[cg.Expr] = []
    for op, refs in expr:
        args = [
            cg.var(r)
            if r[0] == "x"
            else t[int(r[1:])]
            if r[0] == "t"
            else cg.const(float(consts[int(r[1:])]))
            for r in refs
        ]
        t.append(codegen_step(op, args))
    return t[-1]


def fused_kernel(node: Node, dtype: Any) -> cg.ElementwiseKernel:
    """The generated kernel for ``node`` in ``dtype`` (translated once per expression, compiled once)."""
    consts = node.attrs.get("consts") or []
    key = (repr((node.attrs["expr"], [float(c).hex() for c in consts])), np.dtype(dtype).str)
    hit = _KERNELS.get(key)
    if hit is not None:
        return hit
    kernel = cg.compile_expr(fused_expr(node.attrs["expr"], consts), dtype)
    with _LOCK:
        return _KERNELS.setdefault(key, kernel)


def result_dtype(node: Node, dtypes: Sequence[Any]) -> np.dtype:
    """The node's result dtype, as ONNX types it: a step has its operands' type (Pow: its base's)."""
    expr = node.attrs["expr"]

    def of(ref: str) -> np.dtype | None:
        while ref[0] == "t":
            op, refs = expr[int(ref[1:])]
            cand = refs[:1] if op == "Pow" else refs
            known = [r for r in cand if r[0] != "c"]
            if not known:
                return None
            if len(known) > 1 and known[0][0] == "t" and known[1][0] == "x":
                known = known[1:]  # an input names the type without walking further
            ref = known[0]
        return np.dtype(dtypes[int(ref[1:])]) if ref[0] == "x" else None

    return of(f"t{len(expr) - 1}") or np.dtype(np.float32)


def run_fused(node: Node, x: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """Evaluate ``node`` on inputs ``x`` with its generated kernel (into ``out`` when given: the
    inputs' broadcast shape and the node's result dtype; it may be one of the inputs)."""
    kernel = fused_kernel(node, result_dtype(node, [a.dtype for a in x]))
    inputs = {name: x[int(name[1:])] for name in kernel.inputs}
    return kernel(**inputs) if out is None else kernel.into(out, inputs)


def bind_fused(node: Node, x: Sequence[np.ndarray], out: np.ndarray) -> Callable[[], object]:
    """A zero-argument call evaluating ``node`` on these very arrays into ``out`` (the runtime's arena
    views, fixed per input shape): the native VM call with its pointers resolved once, or the generated
    kernel writing ``out`` (which may be one of the inputs: FusedElementwise is planned in place)."""
    kernel = fused_kernel(node, result_dtype(node, [a.dtype for a in x]))
    return kernel.bind(out, {name: x[int(name[1:])] for name in kernel.inputs})
