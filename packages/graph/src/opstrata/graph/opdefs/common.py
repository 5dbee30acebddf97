"""Helpers the op definitions share: the executor kernel of an op that is one opstrata.ops call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["Arr", "one"]

Arr = np.ndarray


def one(fn: Callable[..., Any]) -> Callable[[Any, list[Any]], list[Arr]]:
    """The executor kernel ``(node, inputs) -> [fn(*inputs)]`` of an op with no attributes."""
    return lambda n, x: [np.asarray(fn(*x))]
