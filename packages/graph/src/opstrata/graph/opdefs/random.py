"""Random generators of the ONNX operator specification: RandomNormal, RandomUniform, their *Like forms,
Bernoulli and Multinomial.

Their outputs differ from run to run, so their OpDefs say ``nondeterministic``: constant folding and
common-subexpression elimination leave them alone (two identical RandomNormal nodes are two samples).
With a ``seed`` attribute a node owns a generator seeded once, so a session's successive runs draw
successive values and a new session repeats the sequence (onnxruntime seeds its kernel the same way,
with its own generator: the values differ from onnxruntime's, the distributions do not). Without a seed
every node draws from fresh OS entropy.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

import opstrata.ops as ops

from .._ir import Node
from .._shape_rules import RuleContext, TypeShape
from ..onnx.context import ImportContext
from ..onnx.types import dtype_from_onnx
from .common import Arr
from .registry import HOST, define

#: dtypes the generators produce (the spec's T: float16, float, double; bfloat16 from opset 22)
_FLOATS = (*(np.dtype(t) for t in ("float16", "float32", "float64")), np.dtype(ops.bfloat16))
_INDEX = (np.dtype(np.int32), np.dtype(np.int64))

_generators: weakref.WeakKeyDictionary[Node, np.random.Generator] = weakref.WeakKeyDictionary()


def _generator(n: Node) -> np.random.Generator:
    """The node's generator: seeded once from its ``seed`` attribute, else from OS entropy."""
    gen = _generators.get(n)
    if gen is None:
        seed = n.attrs.get("seed")
        # the float seed's bits, so 1.5 and 1.25 differ (int() would merge them)
        gen = np.random.default_rng(None if seed is None else int(np.float64(seed).view(np.uint64)))
        _generators[n] = gen
    return gen


def _import_random(ctx: ImportContext) -> None:
    """Every attribute made explicit; ``dtype`` becomes a numpy dtype (absent on *Like: the input's)."""
    attrs: dict[str, Any] = {k: v for k, v in ctx.attrs.items() if k != "dtype"}
    where = f"node '{ctx.name}' ({ctx.op_type})"
    if "dtype" in ctx.attrs:
        attrs["dtype"] = dtype_from_onnx(ctx.attrs["dtype"], where)
    elif not ctx.op_type.endswith("Like") and ctx.op_type != "Bernoulli":
        attrs["dtype"] = np.dtype(np.int32 if ctx.op_type == "Multinomial" else np.float32)
    if ctx.op_type in ("RandomNormal", "RandomUniform") and "shape" not in attrs:
        raise ctx.unsupported(f"{ctx.op_type} without its required 'shape' attribute")
    if "seed" in attrs:
        attrs["seed"] = float(attrs["seed"])
    ctx.emit(ctx.op_type, ctx.inputs, ctx.outputs, attrs)


def _out_dtype(n: Node, ctx: RuleContext, allowed: tuple[np.dtype, ...], what: str) -> np.dtype | None:
    dt = n.attrs.get("dtype")
    dt = np.dtype(dt) if dt is not None else (ctx.dtype(0) if n.inputs else None)
    if dt is not None and dt not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise ctx.fail(f"{n.op_type} produces {what} ({names}), got dtype {dt}", "set the dtype attribute")
    return dt


def _fixed_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    shape = tuple(int(d) for d in n.attrs["shape"])
    if any(d < 0 for d in shape):
        raise ctx.fail(f"{n.op_type} shape {list(shape)} has a negative dim", "use sizes >= 0")
    return [(_out_dtype(n, ctx, _FLOATS, "floats"), shape)]


def _like_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    return [(_out_dtype(n, ctx, _FLOATS, "floats"), ctx.shape(0))]


def _bernoulli_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(0, "f", "a float tensor of probabilities")
    dt = n.attrs.get("dtype")
    return [(np.dtype(dt) if dt is not None else ctx.dtype(0), ctx.shape(0))]


def _multinomial_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(0, "f", "a float tensor of unnormalized log-probabilities")
    x = ctx.shape(0)
    if x is not None and len(x) != 2:
        raise ctx.fail(f"Multinomial takes (batch_size, class_size) log-probabilities, got shape {x}")
    return [
        (_out_dtype(n, ctx, _INDEX, "indices"), (x[0] if x else None, int(n.attrs.get("sample_size", 1))))
    ]


def _draw(n: Node, shape: tuple[int, ...], dtype: np.dtype) -> Arr:
    gen, a = _generator(n), n.attrs
    if n.op_type.startswith("RandomNormal"):
        out = gen.normal(float(a.get("mean", 0.0)), float(a.get("scale", 1.0)), size=shape)
    else:
        out = gen.uniform(float(a.get("low", 0.0)), float(a.get("high", 1.0)), size=shape)
    return out.astype(dtype)


def _run_fixed(n: Node, x: list[Arr]) -> list[Arr]:
    return [_draw(n, tuple(int(d) for d in n.attrs["shape"]), np.dtype(n.attrs["dtype"]))]


def _run_like(n: Node, x: list[Arr]) -> list[Arr]:
    dt = n.attrs.get("dtype")
    return [_draw(n, x[0].shape, np.dtype(dt) if dt is not None else x[0].dtype)]


def _run_bernoulli(n: Node, x: list[Arr]) -> list[Arr]:
    p = np.asarray(x[0], np.float64)
    dt = n.attrs.get("dtype")
    return [(_generator(n).random(p.shape) < p).astype(np.dtype(dt) if dt is not None else x[0].dtype)]


def _run_multinomial(n: Node, x: list[Arr]) -> list[Arr]:
    logits = np.asarray(x[0], np.float64)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    k, gen = int(n.attrs.get("sample_size", 1)), _generator(n)
    out = [gen.choice(probs.shape[1], size=k, p=row) for row in probs]
    return [np.array(out, np.dtype(n.attrs["dtype"])).reshape(len(probs), k)]


_COMMON: dict[str, Any] = {"importer": _import_random, "uses": (HOST,), "nondeterministic": True}
define("RandomNormal", shape=_fixed_rule, kernel=_run_fixed, dtypes="float", doc="N(mean, scale^2) of a fixed shape",
       **_COMMON)  # fmt: skip
define("RandomUniform", shape=_fixed_rule, kernel=_run_fixed, dtypes="float", doc="U[low, high) of a fixed shape",
       **_COMMON)  # fmt: skip
define("RandomNormalLike", shape=_like_rule, kernel=_run_like, dtypes="float", doc="N(mean, scale^2) like input 0",
       **_COMMON)  # fmt: skip
define("RandomUniformLike", shape=_like_rule, kernel=_run_like, dtypes="float", doc="U[low, high) like input 0",
       **_COMMON)  # fmt: skip
define("Bernoulli", shape=_bernoulli_rule, kernel=_run_bernoulli, dtypes="float", doc="1 with probability x, else 0",
       **_COMMON)  # fmt: skip
define("Multinomial", shape=_multinomial_rule, kernel=_run_multinomial, dtypes="float",
       doc="sample_size class indices per row of unnormalized log-probabilities", **_COMMON)  # fmt: skip
