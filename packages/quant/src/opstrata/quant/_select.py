"""Which nodes a scheme quantizes (op types, exclusions, per-node overrides) and which of their inputs are
activations (quantized at run time) or weights (quantized once, stored as integers)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx

from ._errors import QuantError
from ._model import QUANTIZABLE, ModelInfo, check_names

__all__ = ["Target", "select_targets"]


@dataclass
class Target:
    """One node to quantize: its settings (defaults + overrides), activation and weight input positions."""

    node: onnx.NodeProto
    settings: dict[str, Any]
    activations: list[int] = field(default_factory=list)
    weights: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The node's name."""
        return self.node.name


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def channel_axis(node: onnx.NodeProto, pos: int, rank: int) -> int | None:
    """The output-channel axis of weight input ``pos`` (per-channel scales), None for per-tensor."""
    if pos != 1 or rank < 1:
        return None
    if node.op_type == "Conv":
        return 0
    if node.op_type == "Gemm":
        return 0 if _attr(node, "transB", 0) else 1
    return rank - 1 if rank >= 2 else None


def reduction_axis(node: onnx.NodeProto, pos: int, rank: int) -> int | None:
    """The input-channel (reduction) axis of weight input ``pos`` (per-group blocks run along it)."""
    if pos != 1 or rank < 2:
        return None
    if node.op_type == "Conv":
        return 1
    if node.op_type == "Gemm":
        return 1 if _attr(node, "transB", 0) else 0
    return rank - 2


def _positions(node: onnx.NodeProto) -> tuple[int, ...]:
    return (0, 1)  # MatMul A/B, Gemm A/B, Conv X/W; biases stay float


def select_targets(
    info: ModelInfo,
    *,
    op_types: Iterable[str],
    exclude: Iterable[str],
    overrides: Mapping[str, Mapping[str, Any]] | None,
    defaults: Mapping[str, Any],
    supported: tuple[str, ...] = QUANTIZABLE,
    where: str,
) -> list[Target]:
    """The nodes to quantize, in graph order; raises naming any unknown op type, node or override key."""
    if isinstance(op_types, str):
        op_types = (op_types,)
    ops = tuple(op_types)
    bad = [o for o in ops if o not in supported]
    if bad or not ops:
        raise QuantError(
            f"{where}(op_types)", f"cannot quantize op type(s) {bad or '(none given)'}",
            f"choose among {', '.join(supported)}",
        )  # fmt: skip
    excluded = [exclude] if isinstance(exclude, str) else list(exclude)
    names = info.node_names()
    check_names(excluded, names, "exclude", f"{where}(exclude)")
    over = dict(overrides or {})
    check_names(over, names, "overrides", f"{where}(overrides)")
    for node_name, o in over.items():
        if not isinstance(o, Mapping):
            raise QuantError(f"{where}(overrides)", f"the override for node {node_name!r} is {o!r}, not a dict",
                             f"pass e.g. {{{node_name!r}: {{{next(iter(defaults))!r}: ...}}}}")  # fmt: skip
        unknown = [k for k in o if k not in defaults]
        if unknown:
            raise QuantError(
                f"{where}(overrides)", f"node {node_name!r}: unknown setting(s) {unknown}",
                f"use among {', '.join(defaults)}",
            )  # fmt: skip
        n = info.nodes[node_name]
        if n.op_type not in supported:
            raise QuantError(f"{where}(overrides)", f"node {node_name!r} is a {n.op_type}, which is not quantized",
                             f"override only {', '.join(supported)} nodes")  # fmt: skip
    targets = []
    for n in info.model.graph.node:
        if n.domain not in ("", "ai.onnx") or n.name in excluded:
            continue
        if n.op_type not in ops and n.name not in over:
            continue
        t = Target(n, {**defaults, **over.get(n.name, {})})
        for pos in _positions(n):
            if pos >= len(n.input) or not n.input[pos]:
                continue
            (t.weights if info.is_const(n.input[pos]) else t.activations).append(pos)
        targets.append(t)
    if not targets:
        raise QuantError(
            where, f"nothing to quantize: the model has no {'/'.join(ops)} node outside the exclusions",
            "check op_types= and exclude= (node types present: "
            + ", ".join(sorted({n.op_type for n in info.model.graph.node})) + ")",
        )  # fmt: skip
    return targets
