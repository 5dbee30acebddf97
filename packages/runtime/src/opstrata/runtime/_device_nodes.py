"""Graph nodes as calls on a device with its own memory (cuda): which nodes run there, and how.

Each entry maps an IR op type to ``(node, args, device) -> outputs`` through ``opstrata.ops.call`` on
that device, plus a check of the node (dtypes the device takes natively, attributes the mapping
handles). Nodes without an entry, or whose check fails, run on the host (``_device_exec``), counted
as fallbacks. Input positions listed in ``HOST_INPUTS`` (shapes, axes) are read on the host.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

import opstrata.ops as ops
from opstrata.graph import Graph, Node

__all__ = ["HOST_INPUTS", "NODE_KERNELS", "feed_valued", "node_key", "node_runs_on_device"]

OPS_DOMAIN = "ai.opstrata"
Kernel = Callable[[Node, list[Any], str], list[Any]]


def _binary(op: str) -> Kernel:
    return lambda n, x, d: [ops.call(op, x[0], x[1], device=d)]


def _unary(op: str) -> Kernel:
    return lambda n, x, d: [ops.call(op, x[0], device=d)]


_ACT = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "gelu": "gelu", "gelu_tanh": "gelu"}


def _act(y: Any, act: str, d: str) -> Any:
    if act in ("gelu", "gelu_tanh"):
        return ops.call("gelu", y, approximate="tanh" if act == "gelu_tanh" else "none", device=d)
    return ops.call(_ACT[act], y, device=d)


def _linear(n: Node, x: list[Any], d: str) -> list[Any]:
    y = ops.call("linear", x[0], x[1], x[2] if len(x) > 2 else None, device=d)
    act = n.attrs.get("activation") or ""
    return [_act(y, act, d) if act else y]


def _gemm(n: Node, x: list[Any], d: str) -> list[Any]:
    a = n.attrs
    c = x[2] if len(x) > 2 else None
    return [
        ops.call(
            "gemm", x[0], x[1], c, alpha=float(a.get("alpha", 1.0)), beta=float(a.get("beta", 1.0)),
            trans_a=bool(a.get("transA", 0)), trans_b=bool(a.get("transB", 0)), device=d,
        )
    ]  # fmt: skip


def _softmax(op: str) -> Kernel:
    return lambda n, x, d: [ops.call(op, x[0], axis=int(n.attrs.get("axis", -1)), device=d)]


def _layer_norm(n: Node, x: list[Any], d: str) -> list[Any]:
    a = n.attrs
    w, b = (x[1] if len(x) > 1 else None), (x[2] if len(x) > 2 else None)
    return [
        ops.call(
            "layer_norm", x[0], w, b, axis=int(a.get("axis", -1)), eps=float(a.get("epsilon", 1e-5)), device=d
        )
    ]


def _skip_norm(n: Node, x: list[Any], d: str) -> list[Any]:
    eps = n.attrs.get("epsilon")
    if n.op_type == "SkipLayerNorm":
        b = x[3] if len(x) > 3 else None
        y, s = ops.call(
            "add_layer_norm", x[0], x[1], x[2], b, eps=float(eps or 1e-5), return_sum=True, device=d
        )
    else:
        w = x[2] if len(x) > 2 else None
        y, s = ops.call("add_rms_norm", x[0], x[1], w, eps=float(eps or 1e-6), return_sum=True, device=d)
    return [y, s]


def _rms_norm(n: Node, x: list[Any], d: str) -> list[Any]:
    a = n.attrs
    w = x[1] if len(x) > 1 else None
    return [
        ops.call(
            "rms_norm", x[0], w, axis=int(a.get("axis", -1)), eps=float(a.get("epsilon", 1e-6)), device=d
        )
    ]


def conv_geometry(n: Node, x: Any, kernel: Any) -> Any:
    """graph's (strides, dilations, explicit pads) of a Conv / pool node."""
    from opstrata.graph.opdefs.conv import conv_geometry as geometry

    return geometry(n, x, kernel)


def _has_conv_geometry() -> bool:
    try:
        from opstrata.graph.opdefs.conv import conv_geometry  # noqa: F401
    except ImportError:  # opstrata-graph before it: windows (auto_pad) are resolved on the host only
        return False
    return True


def _conv(n: Node, x: list[Any], d: str) -> list[Any]:
    w = x[1]
    stride, dil, pads = conv_geometry(n, x[0], n.attrs.get("kernel_shape") or w.shape[2:])
    b = x[2] if len(x) > 2 else None
    return [
        ops.call(
            "conv2d", x[0], w, b, stride=tuple(stride), padding=tuple(pads), dilation=tuple(dil),
            groups=int(n.attrs.get("group", 1)), device=d,
        )
    ]  # fmt: skip


#: The elementwise steps a FusedElementwise / FusedConv expression may hold to run on the device
#: (Max / Min as ``where(greater(a, b), a, b)``, as graph's own kernel computes them).
STEP_OPS = {
    "Max": "greater", "Min": "less", "Sin": "sin", "Cos": "cos",
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Relu": "relu", "Sigmoid": "sigmoid",
    "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Neg": "neg", "Abs": "abs", "Erf": "erf",
}  # fmt: skip


def _expr(n: Node, x: list[Any], d: str, dtype: Any) -> Any:
    """A fused expression step by step on the device (constants as scalars of the node's dtype)."""
    consts = n.attrs.get("consts") or []
    t: list[Any] = []
    for op, refs in n.attrs["expr"]:
        args = [
            x[int(r[1:])] if r[0] == "x" else t[int(r[1:])] if r[0] == "t" else dtype.type(consts[int(r[1:])])
            for r in refs
        ]
        t.append(_step(op, args, d))
    return t[-1]


def _step(op: str, args: list[Any], d: str) -> Any:
    if op in ("Max", "Min"):
        acc = args[0]
        for b in args[1:]:
            acc = ops.call("where", ops.call(STEP_OPS[op], acc, b, device=d), acc, b, device=d)
        return acc
    return ops.call(STEP_OPS[op], *args, device=d)


def _variadic(n: Node, x: list[Any], d: str) -> list[Any]:
    return [_step(n.op_type, [a for a in x if a is not None], d)]


def _rotary_half(n: Node, x: list[Any], d: str) -> list[Any]:
    return [ops.call("rope_rotate_half", x[0], x[1], x[2], device=d)]


def _expand(n: Node, x: list[Any], d: str) -> list[Any]:
    return [ops.call("expand", x[0], shape=_ints(x[1]), device=d)]


def _fused_elementwise(n: Node, x: list[Any], d: str) -> list[Any]:
    return [_expr(n, x, d, np.dtype(next(a.dtype for a in x if a is not None)))]


_EPILOGUE = ("expr", "consts", "conv_inputs")


def _fused_conv(n: Node, x: list[Any], d: str) -> list[Any]:
    k = int(n.attrs["conv_inputs"])
    attrs = {a: v for a, v in n.attrs.items() if a not in _EPILOGUE}
    y = _conv(Node("Conv", n.inputs[:k], n.outputs[:1], attrs, n.name), x[:k], d)[0]
    return [_expr(n, [y, *x[k:]], d, np.dtype(y.dtype))]


_BHSD = (0, 2, 1, 3)


def _attention(n: Node, x: list[Any], d: str) -> list[Any]:
    a = n.attrs
    into, out = frozenset(int(i) for i in a.get("bshd") or ()), bool(a.get("bshd_out", 0))
    q, k, v = (
        ops.call("transpose", t, perm=_BHSD, device=d) if i in into else t for i, t in enumerate(x[:3])
    )
    mask = x[3] if len(x) > 3 else None
    y = ops.call(
        "attention", q, k, v, causal=bool(a.get("causal", 0)), mask=mask, scale=a.get("scale"), device=d
    )
    return [ops.call("transpose", y, perm=_BHSD, device=d) if out else y]


def _shape(n: Node, x: list[Any], d: str) -> list[Any]:
    """The shape as a host int64 tensor: metadata, nothing read from device memory."""
    dims = x[0].shape
    start = int(n.attrs.get("start", 0))
    end = n.attrs.get("end")
    return [np.array(dims[start : None if end is None else int(end)], np.int64)]


def _where(n: Node, x: list[Any], d: str) -> list[Any]:
    return [ops.call("where", x[0], x[1], x[2], device=d)]


def _pool_window(n: Node, x: Any) -> tuple[dict[str, Any], tuple[int, ...]]:
    """The 2-D pooling kernels' window keywords for node ``n`` on input ``x``, and the node's dilations."""
    k = [int(v) for v in n.attrs["kernel_shape"]]
    stride, dil, pads = conv_geometry(n, x, k)
    window = {"kernel_size": tuple(k), "stride": tuple(stride), "padding": tuple(pads),
              "ceil_mode": bool(n.attrs.get("ceil_mode", 0))}  # fmt: skip
    return window, tuple(dil)


def _max_pool(n: Node, x: list[Any], d: str) -> list[Any]:
    window, dil = _pool_window(n, x[0])
    return [ops.call("max_pool2d", x[0], dilation=dil, device=d, **window)]


def _avg_pool(n: Node, x: list[Any], d: str) -> list[Any]:
    window, _ = _pool_window(n, x[0])  # dilated average pooling stays on the host (_attrs_ok)
    cip = bool(n.attrs.get("count_include_pad", 0))
    return [ops.call("avg_pool2d", x[0], count_include_pad=cip, device=d, **window)]


def _reduce_mean(n: Node, x: list[Any], d: str) -> list[Any]:
    axes = _axes(n, x)
    keep = bool(n.attrs.get("keepdims", 1))
    if not axes and n.attrs.get("noop_with_empty_axes", 0):
        return [x[0]]
    return [ops.call("mean", x[0], axis=tuple(axes) if axes else None, keepdims=keep, device=d)]


def _cast(n: Node, x: list[Any], d: str) -> list[Any]:
    return [ops.call("cast", x[0], dtype=np.dtype(n.attrs["to"]), device=d)]


def _global_avg_pool(n: Node, x: list[Any], d: str) -> list[Any]:
    return [ops.call("mean", x[0], axis=tuple(range(2, x[0].ndim)), keepdims=True, device=d)]


def _split(n: Node, x: list[Any], d: str) -> list[Any]:
    axis = int(n.attrs.get("axis", 0)) % x[0].ndim
    sizes = _ints(x[1]) if len(x) > 1 and x[1] is not None else n.attrs.get("split")
    if sizes is None:  # ONNX: equal chunks of ceil(d / k), the last one smaller
        dim, parts = x[0].shape[axis], len(n.outputs)
        c = -(-dim // parts)
        sizes = [c] * (parts - 1) + [dim - c * (parts - 1)]
    out, start = [], 0
    for size in sizes:
        index = [slice(None)] * x[0].ndim
        index[axis] = slice(start, start + int(size))
        out.append(x[0][tuple(index)])
        start += int(size)
    return out


def _ints(v: Any) -> list[int]:
    return [int(i) for i in np.asarray(v).reshape(-1)]


def _reshape(n: Node, x: list[Any], d: str) -> list[Any]:
    shape, src = _ints(x[1]), x[0].shape
    if not n.attrs.get("allowzero", 0):
        shape = [src[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x[0].reshape(tuple(shape))]


def _flatten(n: Node, x: list[Any], d: str) -> list[Any]:
    ax = int(n.attrs.get("axis", 1)) % (x[0].ndim + 1) if x[0].ndim else 0
    s = x[0].shape
    return [x[0].reshape(math.prod(s[:ax]), math.prod(s[ax:]))]


def _axes(n: Node, x: list[Any]) -> list[int]:
    if len(x) > 1 and x[1] is not None:
        return _ints(x[1])
    return [int(i) for i in n.attrs.get("axes") or ()]


def _squeeze(n: Node, x: list[Any], d: str) -> list[Any]:
    s = x[0].shape
    axes = {a % len(s) for a in _axes(n, x)} or {i for i, v in enumerate(s) if v == 1}
    return [x[0].reshape(tuple(v for i, v in enumerate(s) if i not in axes))]


def _unsqueeze(n: Node, x: list[Any], d: str) -> list[Any]:
    s = list(x[0].shape)
    rank = len(s) + len(_axes(n, x))
    for a in sorted(a % rank for a in _axes(n, x)):
        s.insert(a, 1)
    return [x[0].reshape(tuple(s))]


def _transpose(n: Node, x: list[Any], d: str) -> list[Any]:
    perm = n.attrs.get("perm")
    return [ops.call("transpose", x[0], perm=None if perm is None else tuple(perm), device=d)]


def _concat(n: Node, x: list[Any], d: str) -> list[Any]:
    return [ops.call("concat", [t for t in x if t is not None], axis=int(n.attrs.get("axis", 0)), device=d)]


def _gather(n: Node, x: list[Any], d: str) -> list[Any]:
    """Row lookups (axis 0 of a 2-D table: embeddings) as ``embedding``, any other gather as ``gather``."""
    axis = int(n.attrs.get("axis", 0))
    if axis == 0 and x[0].ndim == 2:
        return [ops.call("embedding", x[1], x[0], device=d)]
    return [ops.call("gather", x[0], x[1], axis=axis, device=d)]


#: (domain, op type) -> (kernel, the ops ops it calls: each must be native on the device for the node's dtype)
NODE_KERNELS: dict[tuple[str, str], tuple[Kernel, tuple[str, ...]]] = {
    **{("", k): (_binary(v), (v,)) for k, v in {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}.items()},
    **{
        ("", k): (_unary(v), (v,))
        for k, v in {
            "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
            "Neg": "neg", "Abs": "abs", "Erf": "erf",
        }.items()
    },
    ("", "MatMul"): (lambda n, x, d: [ops.call("matmul", x[0], x[1], device=d)], ("matmul",)),
    ("", "Gemm"): (_gemm, ("gemm",)),
    ("", "Softmax"): (_softmax("softmax"), ("softmax",)),
    ("", "LogSoftmax"): (_softmax("log_softmax"), ("log_softmax",)),
    ("", "LayerNormalization"): (_layer_norm, ("layer_norm",)),
    ("", "Conv"): (_conv, ("conv2d",)),
    ("", "GlobalAveragePool"): (_global_avg_pool, ("mean",)),
    ("", "Split"): (_split, ()),
    ("", "Cast"): (_cast, ("cast",)),
    ("", "Max"): (_variadic, ("greater", "where")),
    ("", "Min"): (_variadic, ("less", "where")),
    ("", "Sin"): (_unary("sin"), ("sin",)),
    ("", "Cos"): (_unary("cos"), ("cos",)),
    ("", "Expand"): (_expand, ("expand",)),
    (OPS_DOMAIN, "RotaryHalf"): (_rotary_half, ("rope_rotate_half",)),
    ("", "MaxPool"): (_max_pool, ("max_pool2d",)),
    ("", "AveragePool"): (_avg_pool, ("avg_pool2d",)),
    ("", "ReduceMean"): (_reduce_mean, ("mean",)),
    ("", "Shape"): (_shape, ()),
    ("", "Where"): (_where, ("where",)),
    (OPS_DOMAIN, "FusedConv"): (_fused_conv, ("conv2d",)),
    (OPS_DOMAIN, "FusedElementwise"): (_fused_elementwise, ()),
    ("", "Reshape"): (_reshape, ()),
    ("", "Flatten"): (_flatten, ()),
    ("", "Squeeze"): (_squeeze, ()),
    ("", "Unsqueeze"): (_unsqueeze, ()),
    ("", "Identity"): (lambda n, x, d: [x[0]], ()),
    ("", "Transpose"): (_transpose, ("transpose",)),
    ("", "Concat"): (_concat, ("concat",)),
    ("", "Gather"): (_gather, ("embedding", "gather")),
    (OPS_DOMAIN, "Linear"): (_linear, ("linear",)),
    (OPS_DOMAIN, "SkipLayerNorm"): (_skip_norm, ("add_layer_norm",)),
    (OPS_DOMAIN, "SkipRMSNorm"): (_skip_norm, ("add_rms_norm",)),
    (OPS_DOMAIN, "RMSNorm"): (_rms_norm, ("rms_norm",)),
    (OPS_DOMAIN, "Attention"): (_attention, ("attention",)),
}  # fmt: skip

#: Inputs read on the host (small integer tensors: shapes, axes), never moved to the device.
HOST_INPUTS: dict[tuple[str, str], frozenset[int]] = {
    ("", "Reshape"): frozenset({1}),
    ("", "Squeeze"): frozenset({1}),
    ("", "Unsqueeze"): frozenset({1}),
    ("", "Split"): frozenset({1}),
    ("", "Expand"): frozenset({1}),
    ("", "ReduceMean"): frozenset({1}),
}


#: Inputs whose dtype decides placement, where not all of them: the table of Gather, the values of Where.
DTYPE_INPUTS: dict[tuple[str, str], frozenset[int]] = {
    ("", "Gather"): frozenset({0}),
    ("", "Where"): frozenset({1, 2}),
}


#: Float dtypes a device session computes in (float8 stays on the host).
_DEVICE_FLOATS = frozenset(np.dtype(d) for d in ("float16", "float32", "float64")) | {np.dtype(ops.bfloat16)}


def node_key(n: Node) -> tuple[str, str]:
    """(domain, op type) as the kernel tables key it: the ONNX domain as ""."""
    return ("" if n.domain in ("", "ai.onnx") else n.domain, n.op_type)


def _attrs_ok(n: Node, graph: Graph) -> str:
    """ "" when the mapping handles the node's attributes and arity, else why not."""
    t, a = n.op_type, n.attrs
    if t == "LayerNormalization" and sum(1 for o in n.outputs[1:] if o) > 0:
        return "mean / inverse-std outputs are computed on the host"
    if t == "Cast" and (np.dtype(a["to"]) not in _DEVICE_FLOATS or a.get("saturate")):
        return f"casts to {np.dtype(a['to'])} run on the host"
    if t in ("Conv", "FusedConv", "MaxPool", "AveragePool") and not _has_conv_geometry():
        return "this opstrata-graph has no conv_geometry (windows resolve on the host)"
    if t in ("MaxPool", "AveragePool"):
        k = a.get("kernel_shape") or ()
        if len(k) != 2 or sum(1 for o in n.outputs[1:] if o):
            return "only 2-D pooling (max pooling without indices) runs on the device"
        dil = a.get("dilations") or (1, 1)
        if t == "AveragePool" and any(int(v) != 1 for v in dil):
            return "dilated average pooling runs on the host"
        pads = a.get("pads") or (0, 0, 0, 0)
        eff = [dl * (kk - 1) + 1 for kk, dl in zip(k, dil, strict=True)]
        if max(pads[0], pads[2]) > eff[0] // 2 or max(pads[1], pads[3]) > eff[1] // 2:
            return "pads wider than half the window run on the host"
    if t in ("Conv", "FusedConv"):
        if len(graph.values[n.inputs[1]].shape or ()) != 4:
            return "only 2-D convolutions run on the device"
    if t in ("FusedConv", "FusedElementwise"):
        missing = sorted({op for op, _ in a.get("expr") or () if op not in STEP_OPS})
        if missing:
            return f"its expression holds {missing}, which run on the host"
    if t == "Gather":
        idx = graph.values.get(n.inputs[1])
        if idx is None or idx.dtype is None or np.dtype(idx.dtype).kind not in "iu":
            return "indices must be integers"
    if t in ("SkipLayerNorm", "SkipRMSNorm") and int(a.get("axis", -1)) != -1:
        return "a residual norm over more than the last axis runs on the host"
    return ""


def feed_valued(graph: Graph) -> set[str]:
    """Values that depend on what the feeds hold, not only on their shapes (Shape / Size read metadata)."""
    out = set(graph.inputs)
    for n in graph.nodes:
        if node_key(n) not in (("", "Shape"), ("", "Size")) and any(x in out for x in n.inputs if x):
            out.update(o for o in n.outputs if o)
    return out


def node_runs_on_device(n: Node, graph: Graph, device: str) -> tuple[bool, str]:
    """(runs on ``device``, why not): the mapping exists, its attributes are handled, and every ops op it
    calls is native on ``device`` for the node's first float input dtype."""
    entry = NODE_KERNELS.get(node_key(n))
    if entry is None:
        return False, f"no {device} mapping for {n.qualified_type}"
    why = _attrs_ok(n, graph)
    if why:
        return False, why
    if node_key(n) == ("", "Shape"):
        return True, ""  # reads metadata only: the tensor stays where it is
    host = HOST_INPUTS.get(node_key(n), frozenset())
    keyed = DTYPE_INPUTS.get(node_key(n))
    dts = [
        graph.values[x].dtype
        for i, x in enumerate(n.inputs)
        if x and i not in host and x in graph.values and (keyed is None or i in keyed)
    ]
    if any(dt is None for dt in dts):
        return False, "an input of unknown dtype"
    dt = np.dtype(dts[0]) if dts else None
    if dt is not None and any(np.dtype(d) != dt for d in dts):
        return False, f"mixed input dtypes {sorted({str(np.dtype(d)) for d in dts})}"
    if dt is not None and dt not in ops.FLOAT_DTYPES:
        return False, f"{dt} tensors are computed on the host"
    uses = entry[1]
    if node_key(n) in ((OPS_DOMAIN, "FusedConv"), (OPS_DOMAIN, "FusedElementwise")):
        uses = (*uses, *sorted({STEP_OPS[op] for op, _ in n.attrs["expr"]}))
    if node_key(n) == (OPS_DOMAIN, "Attention") and (n.attrs.get("bshd") or n.attrs.get("bshd_out")):
        uses = (*uses, "transpose")
    for op in uses:
        path = ops.dispatch_path(op, device, dt)
        if path != "native":
            return False, f"ops.{op} on {device} for {dt} takes the {path} path"
    return True, ""
