"""Control flow of the ONNX operator specification: If (1..21), Loop (1..21) and Scan (9..21), with subgraphs.

A GRAPH attribute imports as an IR :class:`Graph` (``then_branch``/``else_branch``/``body``). Outer-scope
values a subgraph reads by name are *captured*: the node's inputs end with them (so validation,
toposort, dead-code elimination and memory planning see the dependency) and ``attrs["captures"]``
holds the names the subgraph reads them by, position for position (a pass that renames the outer
value rewires the node's input; the subgraph keeps its name). The executor kernels run the subgraph
node by node on the same kernel table, on the current ops device. Outputs whose shape depends on
trip counts have unknown dims, so the runtime gives them per-run buffers (MemoryPlan.dynamic).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import GraphError
from .._ir import Graph, Node, Value, free_values
from .._shape_rules import RuleContext, TypeShape
from .._symbolic import Dim, Shape
from ..onnx.context import ImportContext
from ..onnx.export import ExportContext, export_subgraph, register_export
from .registry import HOST, KERNELS, define

__all__ = ["formal_inputs", "run_subgraph"]

Arr = np.ndarray


def _where(node: Node) -> str:
    return f"node '{node.name}' ({node.qualified_type})"


def _node_captures(node: Node) -> list[str]:
    return list(node.attrs.get("captures", []))


def formal_inputs(node: Node, args: list[Any], count: int) -> tuple[list[Any], dict[str, Any]]:
    """Split a control-flow node's arguments into its ``count`` ONNX inputs (omitted ones None) and
    its captured outer values by the name the subgraph reads them."""
    caps = _node_captures(node)
    n_formal = len(args) - len(caps) if caps else len(args)
    formal = list(args[:n_formal]) + [None] * max(0, count - n_formal)
    return formal, dict(zip(caps, args[n_formal:], strict=True))


# --------------------------------------------------------------------------- executing a subgraph


def run_subgraph(g: Graph, feeds: dict[str, Any], where: str) -> list[Any]:
    """Run subgraph ``g`` on ``feeds`` (its inputs and captured outer values by name); its outputs in order."""
    env: dict[str, Any] = dict(g.initializers)
    env.update(feeds)
    for n in g.nodes:
        fn = KERNELS.get(("" if n.domain == "ai.onnx" else n.domain, n.op_type))
        if fn is None:
            raise GraphError(_where(n), "the executor has no implementation for this op type (in a subgraph)")
        args = []
        for x in n.inputs:
            if x and x not in env:
                raise GraphError(
                    _where(n),
                    f"input '{x}' is not defined in its subgraph or any enclosing graph",
                    "wire the node to a value the subgraph or an enclosing graph defines",
                )
            args.append(env[x] if x else None)
        while args and args[-1] is None:
            args.pop()
        for name, val in zip(n.outputs, fn(n, args), strict=False):
            if name:
                env[name] = val
    missing = [o for o in g.outputs if o not in env]
    if missing:
        raise GraphError(where, f"subgraph '{g.name}' does not compute its outputs {missing}")
    return [env[o] for o in g.outputs]


def _own(x: Any) -> Any:
    """A fresh array (results must not alias the node's inputs or a subgraph's initializers)."""
    return np.array(x, copy=True) if isinstance(x, np.ndarray) else x


def _empty_like_output(g: Graph, k: int, lead: tuple[int, ...] = (0,), axis: int = 0) -> Arr:
    """The stacked scan output of zero iterations: per-iteration shape from the body's Value."""
    v = g.values.get(g.outputs[k])
    dtype = v.dtype if v is not None and v.dtype is not None else np.dtype(np.float32)
    shape = [
        d if isinstance(d, int) else 0 for d in (v.shape if v is not None and v.shape is not None else ())
    ]
    shape.insert(axis, 0)
    return np.zeros(shape, dtype)


# --------------------------------------------------------------------------- shape inference of a subgraph


def _infer_subgraph(g: Graph, bound: dict[str, Value | None], node: Node) -> None:
    """Infer ``g`` in place with its inputs typed (only where ONNX left them untyped) and captures bound."""
    from .._shape_infer import infer_shapes

    keep = set(g.inputs) | set(g.initializers)
    for name, v in g.values.items():
        if name not in keep:
            v.dtype, v.shape = None, None
    for name, outer in bound.items():
        if outer is None:
            continue
        v = g.values.get(name)
        if v is None:
            v = g.values[name] = Value(name)
            v.kind = outer.kind
        if name in g.inputs:
            v.dtype = v.dtype if v.dtype is not None else outer.dtype
            v.shape = v.shape if v.shape is not None else outer.shape
        else:
            v.dtype, v.shape, v.kind = outer.dtype, outer.shape, outer.kind
    try:
        infer_shapes(g)
    except GraphError as exc:
        raise GraphError(_where(node), f"its subgraph '{g.name}' does not infer: {exc}") from exc


def _captured(node: Node, ctx: RuleContext) -> dict[str, Value | None]:
    caps = _node_captures(node)
    base = len(node.inputs) - len(caps)
    return {c: ctx.value(base + k) for k, c in enumerate(caps)}


def _out(g: Graph, k: int) -> Value:
    return g.values.get(g.outputs[k]) or Value(g.outputs[k])


def _merge_shapes(a: Shape | None, b: Shape | None) -> Shape | None:
    """Dims both shapes agree on; unknown where they differ (None when the ranks differ)."""
    if a is None or b is None or len(a) != len(b):
        return None
    return tuple(x if x == y else None for x, y in zip(a, b, strict=True))


def _carried(g: Graph, k_in: int, k_out: int) -> Shape | None:
    """Final shape of a loop-carried value: the body's, where every iteration keeps it."""
    return _merge_shapes(g.values[g.inputs[k_in]].shape, _out(g, k_out).shape)


def _check_dtype(ctx: RuleContext, what: str, a: np.dtype | None, b: np.dtype | None) -> np.dtype | None:
    if a is not None and b is not None and a != b:
        raise ctx.fail(f"type mismatch: {what}: {a} vs {b}", "make the subgraph outputs agree in dtype")
    return a if a is not None else b


# --------------------------------------------------------------------------- import helpers


def _count_error(ctx: ImportContext, problem: str) -> GraphError:
    return GraphError(
        f"node '{ctx.name}' ({ctx.op_type})", problem, "check the node against the ONNX operator spec"
    )


def _captures_of(*graphs: Graph) -> list[str]:
    out: dict[str, None] = {}
    for g in graphs:
        out.update(dict.fromkeys(free_values(g)))
    return list(out)


def _emit(ctx: ImportContext, formal: list[str], attrs: dict[str, Any], graphs: list[Graph]) -> None:
    caps = _captures_of(*graphs)
    ins = formal + caps if caps else formal
    node = ctx.emit(ctx.op_type, ins, ctx.outputs, {**attrs, "captures": caps})
    if caps:
        node.inputs = ins  # emit trims trailing omitted inputs; before the captures they keep their place


# --------------------------------------------------------------------------- If


def _import_if(ctx: ImportContext) -> None:
    then_g, else_g = ctx.attrs["then_branch"], ctx.attrs["else_branch"]
    n_out = len(ctx.proto.output)
    for label, g in (("then_branch", then_g), ("else_branch", else_g)):
        if len(g.outputs) != n_out:
            raise _count_error(ctx, f"{label} has {len(g.outputs)} outputs but the node has {n_out}")
    _emit(ctx, [ctx.input(0)], {"then_branch": then_g, "else_branch": else_g}, [then_g, else_g])


def _if_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    t, e = n.attrs["then_branch"], n.attrs["else_branch"]
    cond = ctx.dtype(0)
    if cond is not None and cond != np.dtype(bool):
        raise ctx.fail(f"type mismatch: cond must be bool, got {cond}", "insert a Cast to bool")
    caps = _captured(n, ctx)
    _infer_subgraph(t, caps, n)
    _infer_subgraph(e, caps, n)
    out = []
    for k in range(len(t.outputs)):
        a, b = _out(t, k), _out(e, k)
        dt = _check_dtype(ctx, f"output {k} of then_branch and else_branch", a.dtype, b.dtype)
        out.append((dt, _merge_shapes(a.shape, b.shape)))
    return out


def _run_if(n: Node, args: list[Any]) -> list[Any]:
    (cond,), outer = formal_inputs(n, args, 1)
    c = np.asarray(cond)
    if c.size != 1:
        raise GraphError(_where(n), f"cond must hold one element, got shape {c.shape}")
    g = n.attrs["then_branch"] if bool(c.reshape(-1)[0]) else n.attrs["else_branch"]
    return [_own(x) for x in run_subgraph(g, outer, _where(n))]


# --------------------------------------------------------------------------- Loop


def _import_loop(ctx: ImportContext) -> None:
    body = ctx.attrs["body"]
    n_dep = max(0, len(ctx.inputs) - 2)
    if len(body.inputs) != 2 + n_dep:
        raise _count_error(
            ctx, f"body has {len(body.inputs)} inputs; it needs 2 + {n_dep} (iteration, cond, loop-carried)"
        )
    if len(body.outputs) < 1 + n_dep:
        raise _count_error(ctx, f"body has {len(body.outputs)} outputs; it needs at least 1 + {n_dep}")
    if len(ctx.proto.output) != len(body.outputs) - 1:
        raise _count_error(
            ctx, f"the node has {len(ctx.proto.output)} outputs but its body computes {len(body.outputs) - 1}"
        )
    formal = [ctx.input(0), ctx.input(1), *ctx.inputs[2:]]
    _emit(ctx, formal, {"body": body}, [body])


def _loop_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    body: Graph = n.attrs["body"]
    n_dep = len(body.inputs) - 2
    bound: dict[str, Value | None] = {
        body.inputs[0]: Value("i", np.int64, ()),
        body.inputs[1]: Value("c", np.bool_, ()),
    }
    for j in range(n_dep):
        bound[body.inputs[2 + j]] = ctx.value(2 + j)
    bound.update(_captured(n, ctx))
    _infer_subgraph(body, bound, n)
    out: list[TypeShape] = []
    for j in range(n_dep):
        dt = _check_dtype(
            ctx, f"loop-carried value {j} (initial vs body output)", ctx.dtype(2 + j), _out(body, 1 + j).dtype
        )
        out.append((dt, _carried(body, 2 + j, 1 + j)))
    lead: Dim = None  # the body's cond may stop the loop early, so the trip count is known only at run time
    for k in range(1 + n_dep, len(body.outputs)):
        v = _out(body, k)
        out.append((v.dtype, None if v.shape is None else (lead, *v.shape)))
    return out


def _run_loop(n: Node, args: list[Any]) -> list[Any]:
    body: Graph = n.attrs["body"]
    n_dep = len(body.inputs) - 2
    formal, outer = formal_inputs(n, args, 2 + n_dep)
    m, cond, carried = formal[0], formal[1], list(formal[2:])
    trip = None if m is None else int(np.asarray(m).reshape(-1)[0])
    keep = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    n_scan = len(body.outputs) - 1 - n_dep
    scans: list[list[Any]] = [[] for _ in range(n_scan)]
    where, i = _where(n), 0
    while keep and (trip is None or i < trip):
        feeds = {**outer, body.inputs[0]: np.array(i, np.int64), body.inputs[1]: np.array(keep)}
        feeds.update(zip(body.inputs[2:], carried, strict=True))
        res = run_subgraph(body, feeds, where)
        keep = bool(np.asarray(res[0]).reshape(-1)[0])  # even without a cond input (as onnxruntime does)
        carried = res[1 : 1 + n_dep]
        for k in range(n_scan):
            scans[k].append(np.asarray(res[1 + n_dep + k]))
        i += 1
    stacked = []
    for k in range(n_scan):
        if not scans[k]:
            stacked.append(_empty_like_output(body, 1 + n_dep + k))
            continue
        shapes = {s.shape for s in scans[k]}
        if len(shapes) > 1:
            raise GraphError(where, f"scan output {k} changes shape across iterations: {sorted(shapes)}")
        stacked.append(np.stack(scans[k]))
    return [_own(x) for x in carried] + stacked


# --------------------------------------------------------------------------- Scan


def _scan_attrs(
    n: Node, n_in: int, n_out: int, where: str
) -> tuple[list[int], list[int], list[int], list[int]]:
    def get(key: str, count: int) -> list[int]:
        v = n.attrs.get(key)
        v = [0] * count if v is None else [int(x) for x in v]
        if len(v) != count:
            raise GraphError(where, f"attribute {key} has {len(v)} entries for {count} scan values")
        return v

    return (
        get("scan_input_axes", n_in),
        get("scan_input_directions", n_in),
        get("scan_output_axes", n_out),
        get("scan_output_directions", n_out),
    )


def _import_scan(ctx: ImportContext) -> None:
    body = ctx.attrs["body"]
    m = int(ctx.attrs["num_scan_inputs"])
    n_state = len(ctx.inputs) - m
    if m < 1 or n_state < 0:
        raise _count_error(ctx, f"num_scan_inputs={m} does not fit its {len(ctx.inputs)} inputs")
    if len(body.inputs) != len(ctx.inputs):
        raise _count_error(
            ctx, f"body has {len(body.inputs)} inputs; it needs {n_state} states + {m} scan inputs"
        )
    if len(body.outputs) < n_state or len(ctx.proto.output) != len(body.outputs):
        raise _count_error(
            ctx, f"the node has {len(ctx.proto.output)} outputs but its body computes {len(body.outputs)}"
        )
    attrs = {k: v for k, v in ctx.attrs.items() if k != "body"}
    _emit(ctx, list(ctx.inputs), {**attrs, "body": body}, [body])


def _axis(axis: int, rank: int | None, what: str, fail: Any) -> int | None:
    if rank is None:
        return axis if axis >= 0 else None
    if not -rank <= axis < rank:
        raise fail(f"{what}={axis} is out of range for rank {rank}")
    return axis % rank


def _scan_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    body: Graph = n.attrs["body"]
    m = int(n.attrs["num_scan_inputs"])
    n_state = len(body.inputs) - m
    n_out = len(body.outputs) - n_state
    in_axes, _, out_axes, _ = _scan_attrs(n, m, n_out, _where(n))
    bound: dict[str, Value | None] = {body.inputs[j]: ctx.value(j) for j in range(n_state)}
    seq: Dim = None
    for j in range(m):
        v = ctx.value(n_state + j)
        if v is None or v.shape is None:
            bound[body.inputs[n_state + j]] = None if v is None else Value("x", v.dtype, None)
            continue
        ax = _axis(in_axes[j], len(v.shape), "scan_input_axes", ctx.fail)
        seq = v.shape[ax] if j == 0 else seq  # type: ignore[index]
        bound[body.inputs[n_state + j]] = Value("x", v.dtype, v.shape[:ax] + v.shape[ax + 1 :])  # type: ignore[index,operator]
    bound.update(_captured(n, ctx))
    _infer_subgraph(body, bound, n)
    out: list[TypeShape] = []
    for j in range(n_state):
        dt = _check_dtype(ctx, f"state {j} (initial vs body output)", ctx.dtype(j), _out(body, j).dtype)
        out.append((dt, _carried(body, j, j)))
    for k in range(n_out):
        v = _out(body, n_state + k)
        if v.shape is None:
            out.append((v.dtype, None))
            continue
        ax = _axis(out_axes[k], len(v.shape) + 1, "scan_output_axes", ctx.fail)
        s = list(v.shape)
        s.insert(ax, seq)  # type: ignore[arg-type]
        out.append((v.dtype, tuple(s)))
    return out


def _run_scan(n: Node, args: list[Any]) -> list[Any]:
    body: Graph = n.attrs["body"]
    where = _where(n)
    m = int(n.attrs["num_scan_inputs"])
    n_state = len(body.inputs) - m
    n_out = len(body.outputs) - n_state
    formal, outer = formal_inputs(n, args, n_state + m)
    in_axes, in_dirs, out_axes, out_dirs = _scan_attrs(n, m, n_out, where)
    state = list(formal[:n_state])
    xs = [np.asarray(x) for x in formal[n_state:]]

    def fail(msg: str) -> GraphError:
        return GraphError(where, msg)

    axes = [_axis(a, x.ndim, "scan_input_axes", fail) for a, x in zip(in_axes, xs, strict=True)]
    lengths = {x.shape[a] for x, a in zip(xs, axes, strict=True)}  # type: ignore[index]
    if len(lengths) != 1:
        raise GraphError(where, f"the scan inputs have different sequence lengths {sorted(lengths)}")
    seq = lengths.pop()
    scans: list[list[Any]] = [[] for _ in range(n_out)]
    for t in range(seq):
        feeds = {**outer, **dict(zip(body.inputs[:n_state], state, strict=True))}
        for j, (x, a) in enumerate(zip(xs, axes, strict=True)):
            feeds[body.inputs[n_state + j]] = np.take(x, seq - 1 - t if in_dirs[j] else t, axis=a)  # type: ignore[arg-type]
        res = run_subgraph(body, feeds, where)
        state = res[:n_state]
        for k in range(n_out):
            scans[k].append(np.asarray(res[n_state + k]))
    stacked = []
    for k in range(n_out):
        items = scans[k][::-1] if out_dirs[k] else scans[k]
        if not items:
            v = _out(body, n_state + k)
            rank = len(v.shape) if v.shape is not None else 0
            stacked.append(
                _empty_like_output(
                    body, n_state + k, axis=_axis(out_axes[k], rank + 1, "scan_output_axes", fail) or 0
                )
            )
            continue
        stacked.append(np.stack(items, axis=_axis(out_axes[k], items[0].ndim + 1, "scan_output_axes", fail)))  # type: ignore[arg-type]
    return [_own(x) for x in state] + stacked


# --------------------------------------------------------------------------- export


def _export_control(node: Node, ctx: ExportContext) -> None:
    caps = _node_captures(node)
    n_formal = len(node.inputs) - len(caps)
    bound = dict(zip(caps, node.inputs[n_formal:], strict=True))
    attrs: dict[str, Any] = {}
    for k, v in node.attrs.items():
        if k == "captures":
            continue
        attrs[k] = export_subgraph(v, ctx, bound) if isinstance(v, Graph) else v
    formal = list(node.inputs[:n_formal])
    while formal and not formal[-1]:
        formal.pop()
    ctx.emit(node.op_type, formal, node.outputs, **attrs)


define(
    "If",
    importer=_import_if,
    shape=_if_rule,
    kernel=_run_if,
    uses=(HOST,),
    dtypes="all",
    doc="runs then_branch or else_branch (subgraphs) on a bool cond; captured outer values are inputs",
)
define(
    "Loop",
    importer=_import_loop,
    shape=_loop_rule,
    kernel=_run_loop,
    uses=(HOST,),
    dtypes="all",
    doc="runs its body while iteration < M and cond; loop-carried values, stacked scan outputs",
)
define(
    "Scan",
    attrs={"scan_input_axes": None, "scan_input_directions": None, "scan_output_axes": None,
           "scan_output_directions": None},
    importer=_import_scan,
    shape=_scan_rule,
    kernel=_run_scan,
    uses=(HOST,),
    dtypes="all",
    doc="runs its body once per slice of the scan inputs (axes, directions); state values, stacked outputs",
)  # fmt: skip
for _op in ("If", "Loop", "Scan"):
    register_export(_op, _export_control)
