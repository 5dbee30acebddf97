"""Kernels that write a node's result straight into its arena slot (``out=``) instead of copying it in.

The executor's generic path calls a node's kernel, which returns a fresh array, and copies that
into the node's planned arena view. For GEMMs — the largest results of a transformer block — the
ops kernels take ``out=`` and BLAS writes the arena view itself: no temporary, no copy. Only ops
whose output never aliases an input in the memory plan are listed (Linear and MatMul are not
planned in place), and only activation-free ``Linear`` (an epilogue activation returns a fresh array).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import opstrata.ops as ops
from opstrata.graph import EXECUTOR_KERNELS as KERNELS, OPSTRATA_DOMAIN, Node

__all__ = ["into_kernel"]

Into = Callable[[list[Any], np.ndarray], object]

_LINEAR, _MATMUL = (OPSTRATA_DOMAIN, "Linear"), ("", "MatMul")
#: the graph's kernels these writers stand for; a replaced entry (a test, a user override) wins
_STANDS_FOR = {_LINEAR: KERNELS[_LINEAR], _MATMUL: KERNELS[_MATMUL]}


def _linear(args: list[Any], dst: np.ndarray) -> object:
    return ops.linear(args[0], args[1], args[2] if len(args) > 2 else None, out=dst)


def _matmul(args: list[Any], dst: np.ndarray) -> object:
    return ops.matmul(args[0], args[1], out=dst)


def into_kernel(node: Node) -> Into | None:
    """The ``(args, dst) -> None`` writer for ``node``, or None when it takes the generic path."""
    key = ("" if node.domain == "ai.onnx" else node.domain, node.op_type)
    if key not in _STANDS_FOR or KERNELS.get(key) is not _STANDS_FOR[key]:
        return None
    if len(node.outputs) != 1 or not node.outputs[0]:
        return None
    if key == _LINEAR:
        return None if node.attrs.get("activation") else _linear
    return _matmul
