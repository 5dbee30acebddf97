"""Reference executor: runs a Graph node by node on opstrata.ops kernels (the one IR-op -> kernel map).

Ops that only touch shapes or metadata (Shape, Range, ConstantOfShape, Trilu masks, bool logic,
integer Div of shape arithmetic) run as host numpy code listed in :data:`HOST_OPS`; every other op
calls an opstrata.ops kernel, so the ops fallback policy and audit see it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

import opstrata.ops as ops

from ._errors import GraphError
from ._ir import OPSTRATA_DOMAIN, Graph, Node
from ._shape_rules import conv_pads
from .opdefs.fused_codegen import result_dtype, run_fused

__all__ = ["HOST_OPS", "KERNELS", "run_graph"]

Arr = np.ndarray
Kernel = Callable[[Node, list[Any]], list[Arr]]
KERNELS: dict[tuple[str, str], Kernel] = {}

#: IR ops computed by host numpy code rather than an opstrata.ops kernel (metadata / shape tensors).
HOST_OPS = frozenset(
    "Shape Size Range ConstantOfShape Trilu Not And Or Xor LessOrEqual GreaterOrEqual Div(int)".split()
)


def kernel(ops_names: str, domain: str = "") -> Callable[[Kernel], Kernel]:
    """Register the executor function for IR ops ``ops_names`` (space separated)."""

    def deco(fn: Kernel) -> Kernel:
        for op in ops_names.split():
            KERNELS[(domain, op)] = fn
        return fn

    return deco


def _one(fn: Callable[..., Any]) -> Kernel:
    return lambda n, x: [np.asarray(fn(*x))]


# --------------------------------------------------------------------------- elementwise

for _name, _fn in {
    "Add": ops.add, "Sub": ops.sub, "Mul": ops.mul, "Equal": ops.equal, "Less": ops.less,
    "Greater": ops.greater, "Exp": ops.exp, "Log": ops.log, "Sqrt": ops.sqrt, "Tanh": ops.tanh,
    "Erf": ops.erf, "Sigmoid": ops.sigmoid, "Relu": ops.relu, "Neg": ops.neg, "Abs": ops.abs,
    "Where": ops.where, "MatMul": ops.matmul,
}.items():  # fmt: skip
    KERNELS[("", _name)] = _one(_fn)


@kernel("Div")
def _div(n: Node, x: list[Arr]) -> list[Arr]:
    a, b = x
    if a.dtype.kind in "iu":  # host: integer shape arithmetic, C-style truncation as ONNX Runtime
        q = np.abs(a) // np.abs(b)
        return [np.asarray(np.where((a < 0) ^ (b < 0), -q, q), a.dtype)]
    return [ops.div(a, b)]


@kernel("Pow")
def _pow(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.pow(x[0], x[1].astype(x[0].dtype, copy=False))]


@kernel("Reciprocal")
def _reciprocal(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.div(np.ones((), x[0].dtype), x[0])]


@kernel("Max Min Sum")
def _variadic(n: Node, x: list[Arr]) -> list[Arr]:
    acc = x[0]
    for b in x[1:]:
        if n.op_type == "Sum":
            acc = ops.add(acc, b)
        else:
            pick = ops.greater(acc, b) if n.op_type == "Max" else ops.less(acc, b)
            acc = ops.where(pick, acc, b)
    return [np.asarray(acc)]


@kernel("LessOrEqual GreaterOrEqual")
def _cmp_eq(n: Node, x: list[Arr]) -> list[Arr]:
    strict = ops.less(*x) if n.op_type == "LessOrEqual" else ops.greater(*x)
    return [np.logical_or(strict, ops.equal(*x))]


@kernel("Not And Or Xor")
def _logic(n: Node, x: list[Arr]) -> list[Arr]:
    fn = {"Not": np.logical_not, "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}[n.op_type]
    return [np.asarray(fn(*x))]


@kernel("Clip")
def _clip(n: Node, x: list[Any]) -> list[Arr]:
    lo = x[1] if len(x) > 1 else None
    hi = x[2] if len(x) > 2 else None
    if lo is None and hi is None:
        return [x[0]]
    return [ops.clip(x[0], min=lo, max=hi)]


_FLOAT8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}  # largest finite values


@kernel("Cast")
def _cast(n: Node, x: list[Arr]) -> list[Arr]:
    src = x[0]
    hi = _FLOAT8_MAX.get(np.dtype(n.attrs["to"]).name) if n.attrs.get("saturate") else None
    if (
        hi is not None
        and src.dtype.itemsize > 1
        and (src.dtype.kind == "f" or src.dtype in ops.LOW_PRECISION_DTYPES)
    ):
        # ONNX Cast(saturate=1) to float8: out-of-range and ±inf become ±max; NaN stays NaN
        src = ops.clip(src, min=np.asarray(-hi, src.dtype), max=np.asarray(hi, src.dtype))
    return [ops.cast(src, dtype=n.attrs["to"])]


@kernel("Identity")
def _identity(n: Node, x: list[Arr]) -> list[Arr]:
    return [x[0]]


@kernel("Gelu")
def _gelu(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.gelu(x[0], approximate=n.attrs.get("approximate", "none"))]


# --------------------------------------------------------------------------- linear algebra, conv, pool


@kernel("Gemm")
def _gemm(n: Node, x: list[Any]) -> list[Arr]:
    a = n.attrs
    c = x[2] if len(x) > 2 else None
    return [
        ops.gemm(
            x[0], x[1], c, alpha=a.get("alpha", 1.0), beta=a.get("beta", 1.0),
            trans_a=bool(a.get("transA", 0)), trans_b=bool(a.get("transB", 0)),
        )
    ]  # fmt: skip


def _window(n: Node, x: Arr, kernel_shape: Sequence[int]) -> dict[str, Any]:
    nd = len(kernel_shape)
    strides = n.attrs.get("strides") or [1] * nd
    dil = n.attrs.get("dilations") or [1] * nd
    pads = conv_pads(
        x.shape[2:], kernel_shape, strides, dil, n.attrs.get("pads") or [], n.attrs.get("auto_pad", "NOTSET")
    )
    return {"stride": tuple(strides), "padding": (pads[0], pads[1], pads[2], pads[3]), "dilation": tuple(dil)}


@kernel("Conv")
def _conv(n: Node, x: list[Any]) -> list[Arr]:
    w = x[1]
    b = x[2] if len(x) > 2 else None
    kw = _window(n, x[0], n.attrs.get("kernel_shape") or w.shape[2:])
    return [ops.conv2d(x[0], w, b, groups=n.attrs.get("group", 1), **kw)]


@kernel("MaxPool")
def _max_pool(n: Node, x: list[Arr]) -> list[Arr]:
    k = n.attrs["kernel_shape"]
    kw = _window(n, x[0], k)
    return [ops.max_pool2d(x[0], kernel_size=tuple(k), ceil_mode=bool(n.attrs.get("ceil_mode", 0)), **kw)]


@kernel("AveragePool")
def _avg_pool(n: Node, x: list[Arr]) -> list[Arr]:
    k = n.attrs["kernel_shape"]
    kw = _window(n, x[0], k)
    kw.pop("dilation")
    return [
        ops.avg_pool2d(
            x[0], kernel_size=tuple(k), ceil_mode=bool(n.attrs.get("ceil_mode", 0)),
            count_include_pad=bool(n.attrs.get("count_include_pad", 0)), **kw,
        )
    ]  # fmt: skip


@kernel("GlobalAveragePool")
def _gap(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.global_avg_pool(x[0])]


@kernel("GlobalMaxPool")
def _gmp(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.max(x[0], axis=tuple(range(2, x[0].ndim)), keepdims=True)]


# --------------------------------------------------------------------------- normalisation, softmax, reductions


@kernel("BatchNormalization")
def _batch_norm(n: Node, x: list[Arr]) -> list[Arr]:
    xx, scale, bias, mean, var = x[:5]
    return [ops.batch_norm(xx, mean, var, scale, bias, eps=n.attrs.get("epsilon", 1e-5))]


@kernel("LayerNormalization")
def _layer_norm(n: Node, x: list[Any]) -> list[Arr]:
    b = x[2] if len(x) > 2 else None
    return [ops.layer_norm(x[0], x[1], b, axis=n.attrs.get("axis", -1), eps=n.attrs.get("epsilon", 1e-5))]


@kernel("Softmax LogSoftmax")
def _softmax(n: Node, x: list[Arr]) -> list[Arr]:
    fn = ops.softmax if n.op_type == "Softmax" else ops.log_softmax
    return [fn(x[0], axis=n.attrs.get("axis", -1))]


_REDUCE = {"ReduceSum": ops.sum, "ReduceMean": ops.mean, "ReduceMax": ops.max, "ReduceMin": ops.min}


@kernel("ReduceSum ReduceMean ReduceMax ReduceMin")
def _reduce(n: Node, x: list[Arr]) -> list[Arr]:
    axes = n.attrs.get("axes")
    out = _REDUCE[n.op_type](
        x[0], axis=None if axes is None else tuple(axes), keepdims=bool(n.attrs.get("keepdims", 1))
    )
    return [np.asarray(out).astype(x[0].dtype, copy=False)]  # ONNX keeps the input dtype (ints too)


@kernel("ArgMax")
def _argmax(n: Node, x: list[Arr]) -> list[Arr]:
    return [
        np.asarray(ops.argmax(x[0], axis=n.attrs.get("axis", 0), keepdims=bool(n.attrs.get("keepdims", 1))))
    ]


@kernel("CumSum")
def _cumsum(n: Node, x: list[Arr]) -> list[Arr]:
    a = n.attrs
    out = ops.cumsum(
        x[0], axis=a["axis"], exclusive=bool(a.get("exclusive", 0)), reverse=bool(a.get("reverse", 0))
    )
    return [out.astype(x[0].dtype, copy=False)]


# --------------------------------------------------------------------------- shape ops


@kernel("Shape")
def _shape(n: Node, x: list[Arr]) -> list[Arr]:
    r = x[0].ndim
    return [np.array(x[0].shape[slice(n.attrs.get("start", 0), n.attrs.get("end", r))], np.int64)]


@kernel("Size")
def _size(n: Node, x: list[Arr]) -> list[Arr]:
    return [np.array(x[0].size, np.int64)]


@kernel("Reshape")
def _reshape(n: Node, x: list[Arr]) -> list[Arr]:
    data, target = x[0], [int(t) for t in x[1]]
    if not n.attrs.get("allowzero", 0):  # ONNX: 0 copies the input dim
        target = [data.shape[i] if t == 0 else t for i, t in enumerate(target)]
    return [ops.reshape(data, shape=target)]


@kernel("Flatten")
def _flatten(n: Node, x: list[Arr]) -> list[Arr]:
    a = n.attrs.get("axis", 1)
    a = a + x[0].ndim if a < 0 else a
    return [ops.reshape(x[0], shape=(math.prod(x[0].shape[:a]), math.prod(x[0].shape[a:])))]


@kernel("Squeeze")
def _squeeze(n: Node, x: list[Arr]) -> list[Arr]:
    axes = n.attrs.get("axes")
    r = x[0].ndim
    drop = {a % r for a in axes} if axes is not None else {i for i, d in enumerate(x[0].shape) if d == 1}
    bad = [a for a in drop if x[0].shape[a] != 1]
    if bad:
        raise GraphError(f"node '{n.name}' (Squeeze)", f"axis {bad[0]} of shape {x[0].shape} is not 1")
    return [ops.reshape(x[0], shape=[d for i, d in enumerate(x[0].shape) if i not in drop])]


@kernel("Unsqueeze")
def _unsqueeze(n: Node, x: list[Arr]) -> list[Arr]:
    r = x[0].ndim + len(n.attrs["axes"])
    axes = {a % r for a in n.attrs["axes"]}
    it = iter(x[0].shape)
    return [ops.reshape(x[0], shape=[1 if i in axes else next(it) for i in range(r)])]


@kernel("Transpose")
def _transpose(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.transpose(x[0], perm=n.attrs.get("perm"))]


class _Arrays(list):  # type: ignore[type-arg]
    """A list of arrays that reports its dtype: ops' dispatcher reads ``.dtype`` of the primary
    argument and would otherwise call ``np.asarray`` on pieces of different shapes (which fails)."""

    @property
    def dtype(self) -> np.dtype:
        return self[0].dtype


@kernel("Concat")
def _concat(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.concat(_Arrays(a for a in x if a is not None), axis=n.attrs["axis"])]


@kernel("Split")
def _split(n: Node, x: list[Arr]) -> list[Arr]:
    axis = n.attrs.get("axis", 0)
    sizes = n.attrs.get("split")
    if sizes is None:  # ONNX: equal chunks of ceil(d / k), the last one smaller
        d, k = x[0].shape[axis], len(n.outputs)
        c = -(-d // k)
        sizes = [c] * (k - 1) + [d - c * (k - 1)]
    return list(ops.split(x[0], list(sizes), axis=axis))


@kernel("Slice")
def _slice(n: Node, x: list[Any]) -> list[Arr]:
    opt = [None if i >= len(x) or x[i] is None else [int(v) for v in x[i]] for i in (3, 4)]
    return [
        ops.slice(x[0], starts=[int(v) for v in x[1]], ends=[int(v) for v in x[2]], axes=opt[0], steps=opt[1])
    ]


@kernel("Gather")
def _gather(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.gather(x[0], x[1], axis=n.attrs.get("axis", 0))]


@kernel("Expand")
def _expand(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.expand(x[0], shape=[int(v) for v in x[1]])]


@kernel("Range")
def _range(n: Node, x: list[Arr]) -> list[Arr]:
    start, limit, delta = (v.item() for v in x)
    return [np.arange(start, limit, delta, dtype=x[0].dtype)]


@kernel("ConstantOfShape")
def _constant_of_shape(n: Node, x: list[Arr]) -> list[Arr]:
    value = n.attrs.get("value")
    v = np.zeros(1, np.float32) if value is None else np.asarray(value)
    return [np.full([int(d) for d in x[0]], v.ravel()[0], v.dtype)]


@kernel("Trilu")
def _trilu(n: Node, x: list[Any]) -> list[Arr]:
    k = int(x[1]) if len(x) > 1 and x[1] is not None else 0
    return [np.triu(x[0], k) if n.attrs.get("upper", 1) else np.tril(x[0], k)]


# --------------------------------------------------------------------------- opstrata fused ops


_ACT: dict[str, Callable[[Arr], Arr]] = {
    "relu": ops.relu, "sigmoid": ops.sigmoid, "tanh": ops.tanh,
    "gelu": lambda a: ops.gelu(a, approximate="none"), "gelu_tanh": lambda a: ops.gelu(a, approximate="tanh"),
}  # fmt: skip


@kernel("Linear", OPSTRATA_DOMAIN)
def _linear(n: Node, x: list[Any]) -> list[Arr]:
    y = ops.linear(x[0], x[1], x[2] if len(x) > 2 else None)
    act = n.attrs.get("activation") or ""
    if act:
        if act not in _ACT:
            raise GraphError(
                f"node '{n.name}' ({n.qualified_type})",
                f"unknown activation '{act}'",
                f"use one of {sorted(_ACT)}",
            )
        y = _ACT[act](y)
    return [y]


@kernel("SkipLayerNorm SkipRMSNorm", OPSTRATA_DOMAIN)
def _skip_norm(n: Node, x: list[Any]) -> list[Arr]:
    s = ops.add(x[0], x[1])  # (..., D): the residual sum, also an output
    a = n.attrs
    if n.op_type == "SkipLayerNorm":
        y = ops.layer_norm(
            s, x[2], x[3] if len(x) > 3 else None, axis=a.get("axis", -1), eps=a.get("epsilon", 1e-5)
        )
    else:
        y = ops.rms_norm(s, x[2] if len(x) > 2 else None, axis=a.get("axis", -1), eps=a.get("epsilon", 1e-6))
    return [y, s]


_STEP_NODES: dict[str, Node] = {}


def fused_steps(n: Node, x: list[Any]) -> Arr:
    """A FusedElementwise expression evaluated step by step on the ops kernels of its unfused ops."""
    t: list[Arr] = []
    consts = n.attrs.get("consts") or []
    dt = result_dtype(n, [a.dtype for a in x])
    for op, refs in n.attrs["expr"]:
        args = [
            x[int(r[1:])]
            if r[0] == "x"
            else t[int(r[1:])]
            if r[0] == "t"
            else np.asarray(consts[int(r[1:])], dt)
            for r in refs
        ]
        step = _STEP_NODES.setdefault(op, Node(op, [], [], name=f"{n.name}/{op}"))
        t.append(KERNELS[("", op)](step, args)[0])
    return t[-1]


@kernel("FusedElementwise", OPSTRATA_DOMAIN)
def _fused_elementwise(n: Node, x: list[Any]) -> list[Arr]:
    """On ``cpu``: one generated kernel (opstrata.ops codegen). Elsewhere (``ref``, plugin devices):
    step by step, so that device's own kernels run."""
    if ops.get_default_device() == "cpu":
        return [run_fused(n, x)]
    return [fused_steps(n, x)]


@kernel("RMSNorm", OPSTRATA_DOMAIN)
def _rms_norm(n: Node, x: list[Any]) -> list[Arr]:
    w = x[1] if len(x) > 1 else None
    return [ops.rms_norm(x[0], w, axis=n.attrs.get("axis", -1), eps=n.attrs.get("epsilon", 1e-6))]


@kernel("Attention", OPSTRATA_DOMAIN)
def _attention(n: Node, x: list[Any]) -> list[Arr]:
    mask = x[3] if len(x) > 3 else None
    a = n.attrs
    return [ops.attention(x[0], x[1], x[2], causal=bool(a.get("causal", 0)), mask=mask, scale=a.get("scale"))]


# --------------------------------------------------------------------------- driver


def _check_feeds(graph: Graph, feeds: Mapping[str, Any]) -> dict[str, Arr]:
    unknown = sorted(set(feeds) - set(graph.inputs))
    missing = [x for x in graph.inputs if x not in feeds]
    if unknown or missing:
        raise GraphError(
            f"run_graph('{graph.name}')",
            f"feeds {'name unknown inputs ' + str(unknown) if unknown else ''}"
            f"{' and ' if unknown and missing else ''}{'miss inputs ' + str(missing) if missing else ''}",
            f"feed exactly the graph inputs {graph.inputs}",
        )
    bound: dict[str, tuple[int, str]] = {}
    out: dict[str, Arr] = {}
    for name in graph.inputs:
        arr, v = np.asarray(feeds[name]), graph.values[name]
        where = f"run_graph('{graph.name}'): input '{name}'"
        if v.dtype is not None and arr.dtype != v.dtype:
            raise GraphError(
                where, f"expected dtype {v.dtype}, got {arr.dtype}", f"pass x.astype(np.{v.dtype})"
            )
        if v.shape is not None:
            if arr.ndim != len(v.shape):
                raise GraphError(where, f"expected rank {len(v.shape)} {v.type_str()}, got shape {arr.shape}")
            for i, (d, got) in enumerate(zip(v.shape, arr.shape, strict=True)):
                if isinstance(d, int) and d != got:
                    raise GraphError(where, f"dim {i} must be {d} ({v.type_str()}), got shape {arr.shape}")
                if isinstance(d, str) and d.isidentifier():
                    if d in bound and bound[d][0] != got:
                        raise GraphError(
                            where,
                            f"symbolic dim '{d}' is {got} here but {bound[d][0]} in input '{bound[d][1]}'",
                            f"feed inputs that agree on '{d}'",
                        )
                    bound.setdefault(d, (got, name))
        out[name] = arr
    return out


def run_graph(
    graph: Graph,
    feeds: Mapping[str, Any],
    device: str | None = None,
    *,
    outputs: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """Execute ``graph`` on ``feeds`` with opstrata.ops kernels; returns ``{output name: array}``.

    ``device`` selects the ops device (default: the current one); ``outputs`` may name any values
    (intermediates too) to return instead of the graph outputs.
    """
    env: dict[str, Any] = dict(graph.initializers)
    env.update(_check_feeds(graph, feeds))
    wanted = list(outputs) if outputs is not None else list(graph.outputs)
    last_use: dict[str, int] = {}
    for i, n in enumerate(graph.nodes):
        for x in n.inputs:
            last_use[x] = i
    keep = set(wanted) | set(graph.initializers)
    ctx = ops.device(device) if device is not None else contextlib.nullcontext()
    with ctx:
        for i, n in enumerate(graph.nodes):
            fn = KERNELS.get(("" if n.domain == "ai.onnx" else n.domain, n.op_type))
            if fn is None:
                raise GraphError(
                    f"node '{n.name}' ({n.qualified_type})",
                    "the executor has no implementation for this op type",
                    "lower it to supported ops first; supported: "
                    + ", ".join(sorted(op if not d else f"{d}::{op}" for d, op in KERNELS)),
                )
            args = []
            for x in n.inputs:
                if x and x not in env:
                    raise GraphError(
                        f"node '{n.name}' ({n.op_type})",
                        f"input '{x}' has not been computed",
                        "call graph.validate()",
                    )
                args.append(env[x] if x else None)
            while args and args[-1] is None:
                args.pop()
            results = fn(n, args)
            for name, val in zip(n.outputs, results, strict=False):
                if name:
                    env[name] = val
            for x in n.inputs:
                if x and last_use.get(x) == i and x not in keep:
                    env.pop(x, None)
    missing = [w for w in wanted if w not in env]
    if missing:
        raise GraphError(
            f"run_graph('{graph.name}')",
            f"values {missing} were not computed",
            "name values the graph produces",
        )
    return {w: env[w] for w in wanted}
