"""Test and benchmark helpers: models with independent branches, random DAG models (seeded, built in code).

Needs the ``onnx`` package (through :class:`opstrata.graph.testing.ModelBuilder`).
"""

from __future__ import annotations

from typing import Any

from opstrata.graph.testing import ModelBuilder

__all__ = ["DAG_KINDS", "branches_model", "random_dag_model"]

_UNARY = ("Relu", "Tanh", "Neg", "Sigmoid", "Abs")
_BINARY = ("Add", "Mul", "Sub", "MatMul")
#: the op kinds :func:`random_dag_model` accepts
DAG_KINDS: tuple[str, ...] = (*_UNARY, *_BINARY, "Reshape", "Transpose")


def branches_model(
    *, branches: int = 2, size: int = 256, depth: int = 2, batch: int = 256, seed: int = 0
) -> Any:
    """``x`` [batch, size] -> ``branches`` independent chains of ``depth`` (MatMul, Tanh) -> summed into ``y``.

    The branches share only ``x``, so a stream scheduler can run them concurrently; each MatMul is
    ``2 * batch * size * size`` FLOPs.
    """
    b = ModelBuilder(f"branches{branches}x{depth}", 17, seed)
    x = b.input("x", [batch, size])
    ends = []
    for _ in range(branches):
        h = x
        for _ in range(depth):
            h = b.op("Tanh", [b.op("MatMul", [h, b.weight([size, size])])])
        ends.append(h)
    y = ends[0]
    for e in ends[1:]:
        y = b.op("Add", [y, e])
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"], name="out"))
    b.output("y")
    return b.build()


def random_dag_model(choices: list[tuple[str, int, int]], *, n: int = 8, seed: int = 0) -> Any:
    """A DAG of float32 ``[n, n]`` values from ``choices``: per node ``(kind, a, b)``.

    ``kind`` is an op type (unary: Relu Tanh Neg Sigmoid Abs; binary: Add Mul Sub MatMul; or
    ``Reshape`` / ``Transpose``, which keep the shape); ``a`` and ``b`` pick inputs among the values so
    far (modulo their count), so any list of choices builds a valid model. Inputs ``x`` and ``z``;
    every value nobody reads is a graph output.
    """
    if not choices:
        raise ValueError("random_dag_model: needs at least one node")
    b = ModelBuilder("random_dag", 17, seed)
    values = [b.input("x", [n, n]), b.input("z", [n, n])]
    shape = b.ints([n, n])
    read: set[str] = set()
    for kind, ia, ib in choices:
        a, c = values[ia % len(values)], values[ib % len(values)]
        if kind in _BINARY:
            out, ins = b.op(kind, [a, c]), [a, c]
        elif kind == "Reshape":
            out, ins = b.op("Reshape", [a, shape]), [a]
        elif kind == "Transpose":
            out, ins = b.op("Transpose", [a], perm=[1, 0]), [a]
        elif kind in _UNARY:
            out, ins = b.op(kind, [a]), [a]
        else:
            raise ValueError(f"random_dag_model: unknown kind {kind!r}; use one of {DAG_KINDS}")
        read.update(ins)
        values.append(out)
    sinks = [v for v in values[2:] if v not in read] or [values[-1]]
    for k, v in enumerate(sinks):
        b.nodes.append(b.onnx.helper.make_node("Identity", [v], [f"out{k}"], name=f"out{k}"))
        b.output(f"out{k}")
    return b.build()
