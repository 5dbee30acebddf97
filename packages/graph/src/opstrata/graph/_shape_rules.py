"""The toolkit of shape rules: :class:`RuleContext` and the rules and helpers many ops share.

A rule takes the node and a :class:`RuleContext` and returns one ``(dtype, shape)`` per output (ONNX
semantics, symbolic dims where possible). Each op's own rule lives with the op in
``opstrata.graph.opdefs``; the registry's ``RULES`` table maps IR ops to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ._errors import GraphError
from ._symbolic import Dim, Shape, broadcast_shapes

if TYPE_CHECKING:
    from ._ir import Node, Value

__all__ = [
    "RuleContext",
    "TypeShape",
    "bcast",
    "binary",
    "conv_pads",
    "float_dtype",
    "linear_rule",
    "matmul_shape",
    "pool_out_size",
    "reduce_shape",
    "same_as_input",
    "unary_float",
    "unary_num",
]

TypeShape = tuple["np.dtype | None", "Shape | None"]


class RuleContext:
    """What a rule may ask about its node's inputs: Values, and known int contents of shape tensors."""

    def __init__(self, node: Node, values: Sequence[Value | None], known: dict[str, tuple[Dim, ...]]) -> None:
        self.node, self.values, self._known = node, values, known

    def fail(self, problem: str, fix: str | None = None) -> GraphError:
        """A GraphError naming this node."""
        return GraphError(f"node '{self.node.name}' ({self.node.qualified_type})", problem, fix)

    def value(self, i: int) -> Value | None:
        """The i-th input's Value (None when omitted or absent)."""
        return self.values[i] if i < len(self.values) else None

    def shape(self, i: int) -> Shape | None:
        v = self.value(i)
        return None if v is None else v.shape

    def dtype(self, i: int) -> np.dtype | None:
        v = self.value(i)
        return None if v is None else v.dtype

    def rank(self, i: int) -> int | None:
        s = self.shape(i)
        return None if s is None else len(s)

    def ints(self, i: int) -> tuple[Dim, ...] | None:
        """Known contents of an int input of rank <= 1 (entries may be symbolic), else None."""
        if i >= len(self.node.inputs) or not self.node.inputs[i]:
            return None
        return self._known.get(self.node.inputs[i])

    def static_ints(self, i: int) -> list[int] | None:
        """Contents of an int input when every entry is a known integer."""
        k = self.ints(i)
        return None if k is None or not all(isinstance(d, int) for d in k) else [int(d) for d in k]  # type: ignore[arg-type]

    def same_dtype(self, idx: Sequence[int]) -> np.dtype | None:
        """The common dtype of inputs ``idx`` (a type-mismatch GraphError when they differ)."""
        found: list[tuple[str, np.dtype]] = [
            (self.node.inputs[i], d) for i in idx if (d := self.dtype(i)) is not None
        ]
        for name, d in found[1:]:
            if d != found[0][1]:
                raise self.fail(
                    f"type mismatch: input '{found[0][0]}' is {found[0][1]} but input '{name}' is {d}; "
                    "the op needs one dtype",
                    "insert a Cast so the inputs agree",
                )
        return found[0][1] if found else None

    def need_dtype(self, i: int, kinds: str, what: str) -> np.dtype | None:
        d = self.dtype(i)
        if d is not None and d.kind not in kinds:
            raise self.fail(
                f"type mismatch: input '{self.node.inputs[i]}' must be {what}, got {d}",
                "insert a Cast to a supported dtype",
            )
        return d

    def axis(self, axis: int, rank: int | None, name: str = "axis") -> int | None:
        """``axis`` normalised into ``[0, rank)`` (GraphError when out of range)."""
        if rank is None:
            return None if axis < 0 else axis
        if not -rank <= axis < rank:
            raise self.fail(
                f"attribute {name}={axis} is out of range for rank {rank}", f"use -{rank}..{rank - 1}"
            )
        return axis % rank


def bcast(ctx: RuleContext, idx: Sequence[int]) -> Shape | None:
    shapes = [ctx.shape(i) for i in idx]
    if any(s is None for s in shapes):
        return None
    try:
        return broadcast_shapes(*shapes)  # type: ignore[arg-type]
    except ValueError as exc:
        desc = ", ".join(f"'{ctx.node.inputs[i]}' {ctx.shape(i)}" for i in idx)
        raise ctx.fail(
            f"inconsistent shapes: {desc} do not broadcast ({exc})",
            "fix the shapes so they broadcast (numpy rules)",
        ) from None


# --------------------------------------------------------------------------- elementwise

FLOAT_KINDS, NUM_KINDS = "f", "fiu"


def float_dtype(ctx: RuleContext, i: int = 0) -> np.dtype | None:
    d = ctx.dtype(i)
    if d is not None and d.kind != "f" and d.name not in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        raise ctx.fail(
            f"type mismatch: input '{ctx.node.inputs[i]}' must be a floating dtype, got {d}",
            "insert a Cast to float32",
        )
    return d


def unary_float(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(float_dtype(ctx), ctx.shape(0))]


def unary_num(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(ctx.dtype(0), ctx.shape(0))]


def binary(n: Node, ctx: RuleContext) -> list[TypeShape]:
    idx = range(len(n.inputs))
    return [(ctx.same_dtype(idx), bcast(ctx, idx))]


# --------------------------------------------------------------------------- linear algebra


def matmul_shape(ctx: RuleContext, a: Shape | None, b: Shape | None) -> Shape | None:
    if a is None or b is None:
        return None
    if len(a) == 0 or len(b) == 0:
        raise ctx.fail("MatMul operands must have rank >= 1, got a scalar", "use Mul for scalars")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    k1, k2 = a2[-1], b2[-2]
    if isinstance(k1, int) and isinstance(k2, int) and k1 != k2:
        raise ctx.fail(
            f"inconsistent shapes: inner dims must match, got {tuple(a)} @ {tuple(b)} ({k1} != {k2})",
            "transpose or reshape an operand so a.shape[-1] == b.shape[-2]",
        )
    try:
        batch = broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError as exc:
        raise ctx.fail(f"inconsistent shapes: batch dims of {tuple(a)} @ {tuple(b)}: {exc}") from None
    out = [*batch, a2[-2], b2[-1]]
    if len(a) == 1:
        out.pop(-2)
    if len(b) == 1:
        out.pop(-1)
    return tuple(out)


def linear_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, w = ctx.shape(0), ctx.shape(1)
    dt = ctx.same_dtype([i for i in range(len(n.inputs)) if n.inputs[i]])
    if x is None or w is None:
        return [(dt, None)]
    if len(w) != 2:
        raise ctx.fail(f"Linear weight must be 2-D (out, in), got {w}")
    if isinstance(x[-1], int) and isinstance(w[1], int) and x[-1] != w[1]:
        raise ctx.fail(f"inconsistent shapes: x {x} has {x[-1]} features but weight {w} expects {w[1]}")
    return [(dt, (*x[:-1], w[0]))]


# --------------------------------------------------------------------------- conv / pool


def conv_pads(
    in_sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
    auto_pad: str,
) -> list[int]:
    """Explicit ONNX pads ``[begin..., end...]`` for ``auto_pad`` (NOTSET keeps ``pads``)."""
    nd = len(kernel)
    if auto_pad in ("NOTSET", ""):
        return list(pads) if pads else [0] * (2 * nd)
    if auto_pad == "VALID":
        return [0] * (2 * nd)
    begin, end = [], []
    for x, k, s, d in zip(in_sizes, kernel, strides, dilations, strict=True):
        out = -(-x // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - x, 0)
        small = total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else total - small)
        end.append(total - begin[-1])
    return begin + end


def pool_out_size(size: int, k: int, s: int, d: int, p0: int, p1: int, ceil: bool) -> int:
    """Output length along one axis (a last window starting inside the end padding is dropped)."""
    span = size + p0 + p1 - d * (k - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + p0:
        out -= 1
    return out


# --------------------------------------------------------------------------- normalisation, softmax


def reduce_shape(ctx: RuleContext, x: Shape | None, axes: Sequence[int] | None, keep: bool) -> Shape | None:
    if x is None:
        return None
    ax = set(range(len(x))) if axes is None else {ctx.axis(a, len(x), "axes") for a in axes}
    if keep:
        return tuple(1 if i in ax else d for i, d in enumerate(x))
    return tuple(d for i, d in enumerate(x) if i not in ax)


# --------------------------------------------------------------------------- shape ops


def same_as_input(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(ctx.dtype(0), ctx.shape(0))]


# --------------------------------------------------------------------------- opstrata fused ops
