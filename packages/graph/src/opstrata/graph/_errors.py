"""Errors raised by opstrata.graph: each names the node or value, the expected, the actual and the fix."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["GraphError", "UnsupportedOpError"]


class GraphError(ValueError):
    """A graph (or a model being imported) is malformed, inconsistent or cannot be handled."""

    def __init__(self, where: str, problem: str, fix: str | None = None) -> None:
        self.where, self.problem, self.fix = where, problem, fix
        super().__init__(f"{where}: {problem}" + (f". Fix: {fix}" if fix else ""))


class UnsupportedOpError(GraphError):
    """An ONNX node has an op type (or a form of one) that opstrata.graph does not import."""

    def __init__(
        self,
        op_type: str,
        domain: str,
        opset: int,
        node: str,
        supported: Iterable[str],
        detail: str | None = None,
    ) -> None:
        self.op_type, self.domain, self.opset, self.node = op_type, domain, opset, node
        self.supported = sorted(supported)
        dom = domain or "ai.onnx"
        what = detail or f"op type '{op_type}' (domain '{dom}', opset {opset}) is not supported"
        fix = (
            f"rewrite the model without it or register an importer; supported ops in domain "
            f"'{dom}': {', '.join(self.supported) if self.supported else '(none)'}"
        )
        super().__init__(f"node '{node}' ({dom}::{op_type}, opset {opset})", what, fix)
