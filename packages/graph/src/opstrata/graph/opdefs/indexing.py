"""Index-driven ops (ONNX operator spec): GatherElements, GatherND, ScatterElements, ScatterND, OneHot,
EyeLike, TopK, ReverseSequence, and the data-dependent NonZero, Compress and Unique.

Inputs that set an output size (TopK's ``K``, OneHot's ``depth``) stay inputs of the IR node, as
Reshape's target does: shape inference reads their known contents (initializers, or values computed
from shapes), and a value only known at run time leaves the size unknown (the runtime allocates such
values per run instead of planning them). NonZero's, Compress's and Unique's output sizes always
depend on the data.
"""

from __future__ import annotations

import numpy as np

import opstrata.ops as ops

from .._ir import Node
from .._shape_rules import RuleContext, TypeShape
from .._symbolic import dim_prod
from ..onnx.context import ImportContext
from ..onnx.types import dtype_from_onnx
from .common import Arr
from .registry import HOST, define

# --------------------------------------------------------------------------- gathers and scatters


def _gather_elements_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(1, "iu", "int32 or int64")
    x, idx = ctx.shape(0), ctx.shape(1)
    if x is not None and idx is not None and len(x) != len(idx):
        raise ctx.fail(f"GatherElements indices {idx} must have the rank of data {x}", "reshape the indices")
    ctx.axis(n.attrs.get("axis", 0), ctx.rank(0))
    return [(ctx.dtype(0), idx)]


def _gather_nd_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(1, "i", "int64")
    x, idx, b = ctx.shape(0), ctx.shape(1), n.attrs.get("batch_dims", 0)
    if x is None or idx is None or not isinstance(idx[-1], int):
        return [(ctx.dtype(0), None)]
    k = idx[-1]
    if k > len(x) - b:
        raise ctx.fail(
            f"GatherND indices {idx} index {k} dims but data {x} has {len(x) - b} after batch_dims"
        )
    return [(ctx.dtype(0), (*idx[:-1], *x[b + k :]))]


def _scatter_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(
        1,
        "i" if n.op_type == "ScatterND" else "iu",
        "int64" if n.op_type == "ScatterND" else "int32 or int64",
    )
    return [(ctx.same_dtype([0, 2]), ctx.shape(0))]


def _reduction(n: Node) -> str:
    return str(n.attrs.get("reduction", "none"))


def _run_gather_elements(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.gather_elements(x[0], x[1], axis=n.attrs.get("axis", 0))]


def _run_gather_nd(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.gather_nd(x[0], x[1], batch_dims=n.attrs.get("batch_dims", 0))]


def _run_scatter_elements(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.scatter_elements(x[0], x[1], x[2], axis=n.attrs.get("axis", 0), reduction=_reduction(n))]


def _run_scatter_nd(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.scatter_nd(x[0], x[1], x[2], reduction=_reduction(n))]


# --------------------------------------------------------------------------- OneHot, EyeLike


def _import_one_hot(ctx: ImportContext) -> None:
    depth = ctx.const(1)
    inputs = list(ctx.inputs)
    if depth is not None and depth.dtype != np.int64:  # ONNX allows a float depth: store it as int64
        if np.asarray(depth).size != 1:
            raise ctx.unsupported(f"OneHot depth must be a scalar, got shape {np.asarray(depth).shape}")
        inputs[1] = ctx.fresh("depth")
        ctx.graph.add_initializer(inputs[1], np.array([int(np.asarray(depth).ravel()[0])], np.int64))
    ctx.emit("OneHot", inputs, ctx.outputs, {"axis": int(ctx.attrs.get("axis", -1))})


def _one_hot_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(1, "iuf", "a number")
    x, depth = ctx.shape(0), ctx.ints(1)
    dt = ctx.dtype(2)
    if x is None:
        return [(dt, None)]
    a = ctx.axis(n.attrs.get("axis", -1), len(x) + 1)
    assert a is not None
    d = depth[0] if depth is not None and len(depth) == 1 else None
    return [(dt, (*x[:a], d, *x[a:]))]


def _run_one_hot(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.one_hot(x[0], int(np.asarray(x[1]).ravel()[0]), x[2], axis=n.attrs.get("axis", -1))]


def _import_eye_like(ctx: ImportContext) -> None:
    attrs: dict[str, object] = {"k": int(ctx.attrs.get("k", 0))}
    if "dtype" in ctx.attrs:
        attrs["dtype"] = dtype_from_onnx(ctx.attrs["dtype"], f"node '{ctx.name}'")
    ctx.emit("EyeLike", ctx.inputs, ctx.outputs, attrs)


def _eye_like_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    if ctx.rank(0) not in (None, 2):
        raise ctx.fail(f"EyeLike needs a 2-D input, got shape {ctx.shape(0)}")
    dt = n.attrs.get("dtype")
    return [(np.dtype(dt) if dt is not None else ctx.dtype(0), ctx.shape(0))]


def _run_eye_like(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.eye_like(x[0], k=n.attrs.get("k", 0), dtype=n.attrs.get("dtype"))]


# --------------------------------------------------------------------------- TopK, ReverseSequence, NonZero


def _top_k_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(1, "i", "int64")
    x, k = ctx.shape(0), ctx.ints(1)
    if x is None:
        return [(ctx.dtype(0), None), (np.dtype(np.int64), None)]
    a = ctx.axis(n.attrs.get("axis", -1), len(x))
    assert a is not None
    kk = k[0] if k is not None and len(k) == 1 else None
    if isinstance(kk, int) and isinstance(x[a], int) and not 0 <= kk <= x[a]:
        raise ctx.fail(
            f"TopK K={kk} is outside [0, {x[a]}] (axis {a} of {x})", "use a K no larger than the axis"
        )
    out = (*x[:a], kk, *x[a + 1 :])
    return [(ctx.dtype(0), out), (np.dtype(np.int64), out)]


def _run_top_k(n: Node, x: list[Arr]) -> list[Arr]:
    a = n.attrs
    values, idx = ops.top_k(
        x[0],
        k=int(np.asarray(x[1]).ravel()[0]),
        axis=a.get("axis", -1),
        largest=bool(a.get("largest", 1)),
        sorted=bool(a.get("sorted", 1)),
    )
    return [values, idx]


def _reverse_sequence_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(1, "i", "int64")
    return [(ctx.dtype(0), ctx.shape(0))]


def _run_reverse_sequence(n: Node, x: list[Arr]) -> list[Arr]:
    a = n.attrs
    return [
        ops.reverse_sequence(x[0], x[1], time_axis=a.get("time_axis", 0), batch_axis=a.get("batch_axis", 1))
    ]


def _non_zero_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(np.dtype(np.int64), (ctx.rank(0), None))]


def _run_non_zero(n: Node, x: list[Arr]) -> list[Arr]:
    return [np.array(np.nonzero(x[0]), np.int64).reshape(x[0].ndim, -1)]


def _compress_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(1, "b", "bool")
    x, axis = ctx.shape(0), n.attrs.get("axis")
    if axis is None or x is None:
        return [(ctx.dtype(0), (None,) if axis is None else None)]
    a = ctx.axis(axis, len(x))
    return [(ctx.dtype(0), tuple(None if i == a else d for i, d in enumerate(x)))]


def _run_compress(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.compress(x[0], x[1], axis=n.attrs.get("axis"))]


def _unique_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, axis, i64 = ctx.shape(0), n.attrs.get("axis"), np.dtype(np.int64)
    if axis is None:
        y: tuple | None = (None,)
        inverse = (dim_prod(x),) if x is not None else (None,)
    elif x is None:
        y, inverse = None, (None,)
    else:
        a = ctx.axis(axis, len(x))
        y, inverse = tuple(None if i == a else d for i, d in enumerate(x)), (x[a],)  # type: ignore[index]
    return [(ctx.dtype(0), y), (i64, (None,)), (i64, inverse), (i64, (None,))][: len(n.outputs)]


def _run_unique(n: Node, x: list[Arr]) -> list[Arr]:
    outs = ops.unique(x[0], axis=n.attrs.get("axis"), sorted=bool(n.attrs.get("sorted", 1)))
    return list(outs)[: len(n.outputs)]


define("GatherElements", attrs={"axis": 0}, shape=_gather_elements_rule, kernel=_run_gather_elements,
       uses=("gather_elements",), dtypes="all")  # fmt: skip
define("GatherND", attrs={"batch_dims": 0}, shape=_gather_nd_rule, kernel=_run_gather_nd, uses=("gather_nd",),
       dtypes="all")  # fmt: skip
define("ScatterElements", attrs={"axis": 0, "reduction": "none"}, shape=_scatter_rule,
       kernel=_run_scatter_elements, uses=("scatter_elements",), dtypes="all")  # fmt: skip
define("ScatterND", attrs={"reduction": "none"}, shape=_scatter_rule, kernel=_run_scatter_nd,
       uses=("scatter_nd",), dtypes="all")  # fmt: skip
define("OneHot", importer=_import_one_hot, shape=_one_hot_rule, kernel=_run_one_hot, uses=("one_hot",),
       dtypes="all")  # fmt: skip
define("EyeLike", importer=_import_eye_like, shape=_eye_like_rule, kernel=_run_eye_like, uses=("eye_like",),
       dtypes="all")  # fmt: skip
define("TopK", attrs={"axis": -1, "largest": 1, "sorted": 1}, shape=_top_k_rule, kernel=_run_top_k,
       uses=("top_k",), dtypes="numeric")  # fmt: skip
define("ReverseSequence", attrs={"time_axis": 0, "batch_axis": 1}, shape=_reverse_sequence_rule,
       kernel=_run_reverse_sequence, uses=("reverse_sequence",), dtypes="all")  # fmt: skip
define("Compress", shape=_compress_rule, kernel=_run_compress, uses=("compress",), dtypes="all",
       doc="output size depends on the data (allocated per run)")  # fmt: skip
define("Unique", attrs={"sorted": 1}, shape=_unique_rule, kernel=_run_unique, uses=("unique",), dtypes="all",
       doc="output sizes depend on the data (allocated per run)")  # fmt: skip
define("NonZero", shape=_non_zero_rule, kernel=_run_non_zero, uses=(HOST,), dtypes="all",
       doc="output size depends on the data (allocated per run)")  # fmt: skip
