"""Activations of the ONNX operator specification beyond Relu/Sigmoid/Gelu: HardSigmoid, HardSwish, Elu,
Selu, Celu, LeakyRelu, PRelu, ThresholdedRelu, Softplus, Softsign, Mish, Swish, Shrink and Hardmax.

Each is one row: ONNX attribute defaults (filled by the passthrough importer), shape rule, executor
kernel (one opstrata.ops call with the node's attributes) and elementwise class. None has a codegen
expression: the generator's ops take no attributes, so these never join a FusedElementwise chain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import opstrata.ops as ops

from .._ir import Node
from .._shape_rules import RuleContext, TypeShape, float_dtype, unary_float, unary_num
from ..onnx import context as _context  # noqa: F401  (installs the passthrough importer these rows use)
from .common import Arr
from .registry import define


def _attr_kernel(fn: Callable[..., Any], **names: str) -> Callable[[Node, list[Arr]], list[Arr]]:
    """The executor kernel ``[fn(x, kwarg=node.attrs[attr], ...)]`` (``names`` maps kwarg -> ONNX attribute)."""

    def kernel(n: Node, x: list[Arr]) -> list[Arr]:
        return [np.asarray(fn(x[0], **{k: n.attrs[a] for k, a in names.items()}))]

    return kernel


def _prelu_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    x, s = ctx.shape(0), ctx.shape(1)
    if x is not None and s is not None:
        ok = len(s) <= len(x) and all(
            not isinstance(b, int) or not isinstance(a, int) or b in (1, a)
            for a, b in zip(x[len(x) - len(s) :], s, strict=True)
        )
        if not ok:
            raise ctx.fail(
                f"inconsistent shapes: slope {s} does not broadcast to x {x}",
                "give slope a shape that broadcasts to x (unidirectional)",
            )
    return [(ctx.same_dtype([0, 1]), x)]


def _hardmax_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    dt = float_dtype(ctx)
    if ctx.rank(0) == 0:
        raise ctx.fail("Hardmax needs an input of rank >= 1, got a scalar", "Reshape the input to rank 1")
    ctx.axis(n.attrs["axis"], ctx.rank(0))
    return [(dt, ctx.shape(0))]


def _run_prelu(n: Node, x: list[Arr]) -> list[Arr]:
    return [ops.prelu(x[0], x[1])]


# ONNX name -> (opstrata.ops kernel, ONNX attribute defaults; each attribute is the kernel's keyword of that name)
_FLOAT_ACTS: dict[str, tuple[str, dict[str, Any]]] = {
    "HardSigmoid": ("hard_sigmoid", {"alpha": 0.2, "beta": 0.5}),
    "HardSwish": ("hard_swish", {}),
    "Elu": ("elu", {"alpha": 1.0}),
    "Selu": ("selu", {"alpha": ops.SELU_ALPHA, "gamma": ops.SELU_GAMMA}),
    "Celu": ("celu", {"alpha": 1.0}),
    "LeakyRelu": ("leaky_relu", {"alpha": 0.01}),
    "ThresholdedRelu": ("thresholded_relu", {"alpha": 1.0}),
    "Softplus": ("softplus", {}),
    "Softsign": ("softsign", {}),
    "Mish": ("mish", {}),
    "Swish": ("swish", {"alpha": 1.0}),
}

for _name, (_fn, _attrs) in _FLOAT_ACTS.items():
    define(
        _name, attrs=_attrs, shape=unary_float, kernel=_attr_kernel(getattr(ops, _fn), **{a: a for a in _attrs}),
        uses=(_fn,), elementwise="unary", dtypes="float",
    )  # fmt: skip
define(
    "Shrink", attrs={"bias": 0.0, "lambd": 0.5}, shape=unary_num,
    kernel=_attr_kernel(ops.shrink, bias="bias", lambd="lambd"), uses=("shrink",), elementwise="unary",
    dtypes="numeric",
)  # fmt: skip
define(
    "PRelu", shape=_prelu_rule, kernel=_run_prelu, uses=("prelu",), elementwise="binary", dtypes="numeric",
    doc="slope broadcasts to x (unidirectional)",
)  # fmt: skip
define(
    "Hardmax", attrs={"axis": -1}, shape=_hardmax_rule, kernel=_attr_kernel(ops.hardmax, axis="axis"),
    uses=("hardmax",), dtypes="float", doc="one-hot of the first maximum along axis (opset 13+)",
)  # fmt: skip
