"""Per-op shape and dtype rules of the IR vocabulary (ONNX semantics; symbolic dims where possible).

Each rule takes the node and a :class:`RuleContext` and returns one ``(dtype, shape)`` per output.
The keys of :data:`RULES` are the IR's op vocabulary (see docs/graph.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ._errors import GraphError
from ._ir import OPSTRATA_DOMAIN
from ._symbolic import Dim, Shape, broadcast_shapes, dim_div, dim_prod

if TYPE_CHECKING:
    from ._ir import Node, Value

__all__ = ["RULES", "RuleContext", "conv_pads", "pool_out_size"]

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


def _bcast(ctx: RuleContext, idx: Sequence[int]) -> Shape | None:
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


def _float_dtype(ctx: RuleContext, i: int = 0) -> np.dtype | None:
    d = ctx.dtype(i)
    if d is not None and d.kind != "f" and d.name not in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        raise ctx.fail(
            f"type mismatch: input '{ctx.node.inputs[i]}' must be a floating dtype, got {d}",
            "insert a Cast to float32",
        )
    return d


def _unary_float(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(_float_dtype(ctx), ctx.shape(0))]


def _unary_num(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(ctx.dtype(0), ctx.shape(0))]


def _binary(n: Node, ctx: RuleContext) -> list[TypeShape]:
    idx = range(len(n.inputs))
    return [(ctx.same_dtype(idx), _bcast(ctx, idx))]


def _pow(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(_float_dtype(ctx), _bcast(ctx, [0, 1]))]


def _compare(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.same_dtype([0, 1])
    return [(np.dtype(bool), _bcast(ctx, [0, 1]))]


def _logical(n: Node, ctx: RuleContext) -> list[TypeShape]:
    for i in range(len(n.inputs)):
        ctx.need_dtype(i, "b", "bool")
    return [(np.dtype(bool), _bcast(ctx, range(len(n.inputs))))]


def _where(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(0, "b", "bool")
    return [(ctx.same_dtype([1, 2]), _bcast(ctx, [0, 1, 2]))]


def _clip(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(ctx.same_dtype([i for i in range(len(n.inputs)) if n.inputs[i]]), ctx.shape(0))]


def _cast(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(np.dtype(n.attrs["to"]), ctx.shape(0))]


# --------------------------------------------------------------------------- linear algebra


def _matmul_shape(ctx: RuleContext, a: Shape | None, b: Shape | None) -> Shape | None:
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


def _matmul(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(ctx.same_dtype([0, 1]), _matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))]


def _gemm(n: Node, ctx: RuleContext) -> list[TypeShape]:
    a, b = ctx.shape(0), ctx.shape(1)
    dt = ctx.same_dtype([i for i in range(len(n.inputs)) if n.inputs[i]])
    for i, s in ((0, a), (1, b)):
        if s is not None and len(s) != 2:
            raise ctx.fail(
                f"Gemm input '{n.inputs[i]}' must be 2-D, got shape {s}", "use MatMul for batched products"
            )
    if a is None or b is None:
        return [(dt, None)]
    if n.attrs.get("transA"):
        a = a[::-1]
    if n.attrs.get("transB"):
        b = b[::-1]
    out = _matmul_shape(ctx, a, b)
    if ctx.shape(2) is not None and out is not None:
        try:
            broadcast_shapes(out, ctx.shape(2))  # type: ignore[arg-type]
        except ValueError:
            raise ctx.fail(f"inconsistent shapes: C {ctx.shape(2)} does not broadcast to {out}") from None
    return [(dt, out)]


def _linear(n: Node, ctx: RuleContext) -> list[TypeShape]:
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


def _spatial(n: Node, ctx: RuleContext, x: Shape, kernel: Sequence[int]) -> list[Dim]:
    nd = len(kernel)
    strides = n.attrs.get("strides") or [1] * nd
    dil = n.attrs.get("dilations") or [1] * nd
    auto = n.attrs.get("auto_pad", "NOTSET")
    ceil = bool(n.attrs.get("ceil_mode", 0))
    sizes = x[2:]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        return [
            -(-d // s) if isinstance(d, int) else (d if s == 1 else None)
            for d, s in zip(sizes, strides, strict=True)
        ]
    pads = conv_pads([0] * nd, kernel, strides, dil, n.attrs.get("pads") or [], auto)
    out: list[Dim] = []
    for i, d in enumerate(sizes):
        k, s, dl, p0, p1 = kernel[i], strides[i], dil[i], pads[i], pads[i + nd]
        if isinstance(d, int):
            o = pool_out_size(d, k, s, dl, p0, p1, ceil)
            if o <= 0:
                raise ctx.fail(
                    f"inconsistent shapes: spatial dim {i} of size {d} is smaller than the window "
                    f"(kernel {k}, dilation {dl}, pads {p0}+{p1})",
                    "use a larger input or a smaller kernel",
                )
            out.append(o)
        else:
            out.append(d if s == 1 and p0 + p1 == dl * (k - 1) else None)
    return out


def _conv(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = ctx.same_dtype([i for i in range(len(n.inputs)) if n.inputs[i]])
    x, w = ctx.shape(0), ctx.shape(1)
    if x is not None and len(x) != 4:
        raise ctx.fail(f"only 2-D convolution (NCHW input) is supported, got input shape {x}")
    if x is None or w is None:
        return [(dt, None if x is None else (x[0], None if w is None else w[0], None, None))]
    kernel = n.attrs.get("kernel_shape") or list(w[2:])
    if not all(isinstance(k, int) for k in kernel):
        return [(dt, (x[0], w[0], None, None))]
    group = n.attrs.get("group", 1)
    if isinstance(x[1], int) and isinstance(w[1], int) and x[1] != w[1] * group:
        raise ctx.fail(
            f"inconsistent shapes: input has {x[1]} channels but weight {w} with group={group} expects {w[1] * group}"
        )
    return [(dt, (x[0], w[0], *_spatial(n, ctx, x, kernel)))]


def _pool(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x = ctx.shape(0)
    dt = _float_dtype(ctx) if n.op_type == "AveragePool" else ctx.dtype(0)
    if x is None:
        return [(dt, None)]
    if len(x) != 4:
        raise ctx.fail(f"only 2-D pooling (NCHW input) is supported, got input shape {x}")
    return [(dt, (x[0], x[1], *_spatial(n, ctx, x, n.attrs["kernel_shape"])))]


def _global_pool(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x = ctx.shape(0)
    return [(_float_dtype(ctx), None if x is None else (*x[:2], *([1] * (len(x) - 2))))]


# --------------------------------------------------------------------------- normalisation, softmax


def _norm(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(_float_dtype(ctx), ctx.shape(0))]


def _softmax(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.axis(n.attrs.get("axis", -1), ctx.rank(0))
    return [(_float_dtype(ctx), ctx.shape(0))]


def _reduce_shape(ctx: RuleContext, x: Shape | None, axes: Sequence[int] | None, keep: bool) -> Shape | None:
    if x is None:
        return None
    ax = set(range(len(x))) if axes is None else {ctx.axis(a, len(x), "axes") for a in axes}
    if keep:
        return tuple(1 if i in ax else d for i, d in enumerate(x))
    return tuple(d for i, d in enumerate(x) if i not in ax)


def _reduce(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = _float_dtype(ctx) if n.op_type == "ReduceMean" else ctx.dtype(0)
    return [(dt, _reduce_shape(ctx, ctx.shape(0), n.attrs.get("axes"), bool(n.attrs.get("keepdims", 1))))]


def _argmax(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [
        (
            np.dtype(np.int64),
            _reduce_shape(ctx, ctx.shape(0), [n.attrs.get("axis", 0)], bool(n.attrs.get("keepdims", 1))),
        )
    ]


# --------------------------------------------------------------------------- shape ops


def _shape_op(n: Node, ctx: RuleContext) -> list[TypeShape]:
    r = ctx.rank(0)
    if r is None:
        return [(np.dtype(np.int64), (None,))]
    start, end = n.attrs.get("start", 0), n.attrs.get("end", r)
    return [(np.dtype(np.int64), (len(range(r)[slice(start, end)]),))]


def _size(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(np.dtype(np.int64), ())]


def _reshape(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, target = ctx.shape(0), ctx.ints(1)
    ctx.need_dtype(1, "i", "int64")
    if target is None:
        s = ctx.shape(1)
        return [(ctx.dtype(0), None if s is None or not isinstance(s[0], int) else (None,) * s[0])]
    allowzero = n.attrs.get("allowzero", 0)
    out: list[Dim] = []
    for i, t in enumerate(target):
        if t == 0 and not allowzero:
            out.append(x[i] if x is not None and i < len(x) else None)
        else:
            out.append(t)
    if sum(1 for t in out if t == -1) > 1:
        raise ctx.fail(f"Reshape target {list(target)} has more than one -1", "give at most one -1")
    if -1 in out:
        k = out.index(-1)
        known = dim_prod(d for j, d in enumerate(out) if j != k)
        out[k] = dim_div(dim_prod(x), known) if x is not None else None
    elif x is not None:
        a, b = dim_prod(x), dim_prod(out)
        if isinstance(a, int) and isinstance(b, int) and a != b:
            raise ctx.fail(
                f"inconsistent shapes: cannot reshape {x} ({a} elements) to {tuple(out)} ({b} elements)",
                "fix the target shape so the element counts agree",
            )
    return [(ctx.dtype(0), tuple(out))]


def _transpose(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x = ctx.shape(0)
    if x is None:
        return [(ctx.dtype(0), None)]
    perm = n.attrs.get("perm") or list(range(len(x)))[::-1]
    if sorted(perm) != list(range(len(x))):
        raise ctx.fail(f"perm {list(perm)} is not a permutation of the {len(x)} dims of {x}")
    return [(ctx.dtype(0), tuple(x[p] for p in perm))]


def _flatten(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x = ctx.shape(0)
    if x is None:
        return [(ctx.dtype(0), (None, None))]
    a = n.attrs.get("axis", 1)
    a = a + len(x) if a < 0 else a
    return [(ctx.dtype(0), (dim_prod(x[:a]), dim_prod(x[a:])))]


def _squeeze(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, axes = ctx.shape(0), n.attrs.get("axes")
    if x is None:
        return [(ctx.dtype(0), None)]
    if axes is None:
        if any(not isinstance(d, int) for d in x):
            return [(ctx.dtype(0), None)]
        return [(ctx.dtype(0), tuple(d for d in x if d != 1))]
    ax = {ctx.axis(a, len(x), "axes") for a in axes}
    for a in ax:
        if isinstance(x[a], int) and x[a] != 1:
            raise ctx.fail(f"cannot squeeze axis {a} of shape {x}: its size is {x[a]}, not 1")
    return [(ctx.dtype(0), tuple(d for i, d in enumerate(x) if i not in ax))]


def _unsqueeze(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, axes = ctx.shape(0), n.attrs["axes"]
    if x is None:
        return [(ctx.dtype(0), None)]
    r = len(x) + len(axes)
    ax = {ctx.axis(a, r, "axes") for a in axes}
    it = iter(x)
    return [(ctx.dtype(0), tuple(1 if i in ax else next(it) for i in range(r)))]


def _concat(n: Node, ctx: RuleContext) -> list[TypeShape]:
    idx = [i for i in range(len(n.inputs)) if n.inputs[i]]
    dt = ctx.same_dtype(idx)
    shapes = [ctx.shape(i) for i in idx]
    if any(s is None for s in shapes):
        return [(dt, None)]
    r = len(shapes[0])  # type: ignore[arg-type]
    a = ctx.axis(n.attrs["axis"], r)
    out = list(shapes[0])  # type: ignore[arg-type]
    total: Dim = 0
    for i, s in zip(idx, shapes, strict=True):
        assert s is not None
        if len(s) != r:
            raise ctx.fail(
                f"inconsistent shapes: Concat inputs have ranks {r} and {len(s)} ('{n.inputs[i]}' {s})"
            )
        for j in range(r):
            if j != a and isinstance(s[j], int) and isinstance(out[j], int) and s[j] != out[j]:
                raise ctx.fail(
                    f"inconsistent shapes: Concat input '{n.inputs[i]}' {s} differs from {tuple(shapes[0])} "  # type: ignore[arg-type]
                    f"in dim {j} (only axis {a} may differ)"
                )
            if j != a and out[j] is None:
                out[j] = s[j]
        total = total + s[a] if isinstance(total, int) and isinstance(s[a], int) else None  # type: ignore[assignment]
    out[a] = total  # type: ignore[index]
    return [(dt, tuple(out))]


def _split(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, k = ctx.shape(0), len(n.outputs)
    if x is None:
        return [(ctx.dtype(0), None)] * k
    a = ctx.axis(n.attrs.get("axis", 0), len(x))
    assert a is not None
    sizes: list[Dim] | None = n.attrs.get("split")
    d = x[a]
    if sizes is None:
        sizes = [None] * k if not isinstance(d, int) else [-(-d // k)] * (k - 1) + [d - -(-d // k) * (k - 1)]
    elif isinstance(d, int) and sum(sizes) != d:  # type: ignore[arg-type]
        raise ctx.fail(
            f"inconsistent shapes: split sizes {sizes} sum to {sum(sizes)} but axis {a} of {x} is {d}"
        )  # type: ignore[arg-type]
    return [(ctx.dtype(0), (*x[:a], s, *x[a + 1 :])) for s in sizes]


def _slice(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x = ctx.shape(0)
    if x is None:
        return [(ctx.dtype(0), None)]
    starts, ends = ctx.static_ints(1), ctx.static_ints(2)
    axes = ctx.static_ints(3) if len(n.inputs) > 3 and n.inputs[3] else None
    steps = ctx.static_ints(4) if len(n.inputs) > 4 and n.inputs[4] else None
    out = list(x)
    if starts is None or ends is None or (len(n.inputs) > 3 and n.inputs[3] and axes is None):
        if axes is not None:
            for a in axes:
                out[a % len(x)] = None
            return [(ctx.dtype(0), tuple(out))]
        return [(ctx.dtype(0), (None,) * len(x))]
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        a = ctx.axis(a, len(x), "axes")
        if st == 0:
            raise ctx.fail("Slice step 0 is invalid", "use a non-zero step")
        d = x[a]
        if isinstance(d, int):
            out[a] = len(range(d)[slice(max(min(s, 2**62), -(2**62)), max(min(e, 2**62), -(2**62)), st)])
        elif st == 1 and s == 0 and e >= 2**31 - 1:
            out[a] = d
        else:
            out[a] = None
    return [(ctx.dtype(0), tuple(out))]


def _gather(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, idx = ctx.shape(0), ctx.shape(1)
    ctx.need_dtype(1, "iu", "int32 or int64")
    if x is None or idx is None:
        return [(ctx.dtype(0), None)]
    a = ctx.axis(n.attrs.get("axis", 0), len(x))
    assert a is not None
    return [(ctx.dtype(0), (*x[:a], *idx, *x[a + 1 :]))]


def _expand(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, target = ctx.shape(0), ctx.ints(1)
    if target is None:
        s = ctx.shape(1)
        if x is None or s is None or not isinstance(s[0], int):
            return [(ctx.dtype(0), None)]
        return [(ctx.dtype(0), (None,) * max(len(x), s[0]))]
    if x is None:
        return [(ctx.dtype(0), tuple(t if t != 1 else None for t in target))]
    try:
        return [(ctx.dtype(0), broadcast_shapes(x, target))]
    except ValueError as exc:
        raise ctx.fail(f"inconsistent shapes: cannot expand {x} to {tuple(target)} ({exc})") from None


def _range(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = ctx.same_dtype([0, 1, 2])
    vals = [ctx.ints(i) for i in range(3)]
    if not all(v is not None and len(v) == 1 for v in vals):
        return [(dt, (None,))]
    s, lim, d = (v[0] for v in vals)  # type: ignore[index]
    if isinstance(s, int) and isinstance(lim, int) and isinstance(d, int):
        return [(dt, (max(math.ceil((lim - s) / d), 0),))]
    return [(dt, (lim if s == 0 and d == 1 else None,))]


def _constant_of_shape(n: Node, ctx: RuleContext) -> list[TypeShape]:
    value = n.attrs.get("value")
    dt = np.dtype(np.float32) if value is None else np.asarray(value).dtype
    target = ctx.ints(0)
    if target is None:
        s = ctx.shape(0)
        return [(dt, None if s is None or not isinstance(s[0], int) else (None,) * s[0])]
    return [(dt, tuple(target))]


def _trilu(n: Node, ctx: RuleContext) -> list[TypeShape]:
    if ctx.rank(0) is not None and ctx.rank(0) < 2:  # type: ignore[operator]
        raise ctx.fail(f"Trilu needs rank >= 2, got shape {ctx.shape(0)}")
    return [(ctx.dtype(0), ctx.shape(0))]


def _identity_like(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(ctx.dtype(0), ctx.shape(0))]


def _cumsum(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.axis(n.attrs["axis"], ctx.rank(0))
    return [(ctx.dtype(0), ctx.shape(0))]


# --------------------------------------------------------------------------- opstrata fused ops


def _attention(n: Node, ctx: RuleContext) -> list[TypeShape]:
    q, v = ctx.shape(0), ctx.shape(2)
    dt = ctx.same_dtype([0, 1, 2])
    if q is None or v is None:
        return [(dt, None)]
    if len(q) != 4 or len(v) != 4:
        raise ctx.fail(f"Attention expects 4-D (B, H, N, D) q/k/v, got q {q} and v {v}")
    return [(dt, (*q[:3], v[3]))]


RULES: dict[tuple[str, str], Callable[[Node, RuleContext], list[TypeShape]]] = {}


def _reg(ops: str, rule: Callable[[Node, RuleContext], list[TypeShape]], domain: str = "") -> None:
    for op in ops.split():
        RULES[(domain, op)] = rule


_reg("Exp Log Sqrt Tanh Erf Sigmoid Reciprocal Gelu", _unary_float)
_reg("Relu Neg Abs Identity", _unary_num)
_reg("Add Sub Mul Div Max Min Sum", _binary)
_reg("Pow", _pow)
_reg("Equal Less Greater LessOrEqual GreaterOrEqual", _compare)
_reg("And Or Xor Not", _logical)
_reg("Where", _where)
_reg("Clip", _clip)
_reg("Cast", _cast)
_reg("MatMul", _matmul)
_reg("Gemm", _gemm)
_reg("Conv", _conv)
_reg("MaxPool AveragePool", _pool)
_reg("GlobalAveragePool GlobalMaxPool", _global_pool)
_reg("BatchNormalization LayerNormalization", _norm)
_reg("Softmax LogSoftmax", _softmax)
_reg("ReduceSum ReduceMean ReduceMax ReduceMin", _reduce)
_reg("ArgMax", _argmax)
_reg("Shape", _shape_op)
_reg("Size", _size)
_reg("Reshape", _reshape)
_reg("Transpose", _transpose)
_reg("Flatten", _flatten)
_reg("Squeeze", _squeeze)
_reg("Unsqueeze", _unsqueeze)
_reg("Concat", _concat)
_reg("Split", _split)
_reg("Slice", _slice)
_reg("Gather", _gather)
_reg("Expand", _expand)
_reg("Range", _range)
_reg("ConstantOfShape", _constant_of_shape)
_reg("Trilu", _trilu)
_reg("CumSum", _cumsum)
_reg("Linear", _linear, OPSTRATA_DOMAIN)
_reg("RMSNorm", _norm, OPSTRATA_DOMAIN)
_reg("Attention", _attention, OPSTRATA_DOMAIN)


def rule_for(domain: str, op_type: str) -> Callable[[Node, RuleContext], list[TypeShape]] | None:
    """The shape rule of an IR op (``ai.onnx`` and ``""`` are the same domain)."""
    return RULES.get(("" if domain == "ai.onnx" else domain, op_type))
